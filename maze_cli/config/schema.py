"""The config schema as dataclasses: the one source of every default, checked before anything starts.

Every option of a component group (algorithm, policy, runner, replay_buffer) is a dataclass whose
`_target_` names the class Hydra's `instantiate` builds and whose other fields are that class's
arguments. They are registered in Hydra's ConfigStore (`register_configs`); the packaged YAML files
extend them through their defaults list and hold only what differs. An algorithm's schema sits in its
own file (maze_cli/algorithms/<name>.py) and registers itself there (`register_schema`).

Each field may carry range metadata (`gt`, `ge`, `le`, `choices`); `validate_section` enforces it
and turns every failure into a `ConfigError` naming the key and what is allowed. Nothing here
imports torch; the algorithms' files, imported to register their schemas, do.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError

from maze_cli.errors import RAY_MISSING, ConfigError, first_line
from maze_cli.start_methods import START_METHODS, check_start_method


CORE_INPUTS = ("obs", "prev_action", "prev_reward")
CONV_ENCODERS = ("auto", "impala", "nature", "small", "board")  # policy.encoder (maze_cli.policies.cnn)
# Keys of a group's config that maze_cli itself reads, whatever class `_target_` names.
OWN_KEYS = {"policy": ("core_inputs",)}


def _f(default: Any = dataclasses.MISSING, **limits: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=limits)
    return field(default=default, metadata=limits)


@dataclass
class EvalConfig:
    # epochs between evaluations (the last epoch is always evaluated); 0: off, and target_return is then
    # judged on the mean of the last target_window training episodes
    interval: int = _f(1, ge=0)
    # env steps between evaluations, in place of interval's epochs (an evaluation at the first epoch's end past
    # them): a cadence that does not change with an algorithm's epoch length; null: by epochs
    interval_env_steps: Optional[int] = _f(None, ge=1)
    interval_s: Optional[float] = _f(None, gt=0)  # seconds of training between evaluations, likewise (with the above: whichever comes first)
    episodes: int = _f(10, ge=1)  # episodes per evaluation, the same env seeds every time
    # true: the policy's most likely action; false: sampled (seeded, so the same weights play the same episodes):
    # for a policy whose most likely action can loop (MiniGrid: docs/runs.md)
    deterministic: bool = True
    # evaluate a copy of the weights in a thread while the learner trains on (its result joins a later epoch's row,
    # eval/snapshot_env_steps naming the weights judged; best.pt is written from them); null: on where a core is
    # left over (actors in processes of their own, more cores than actors + learner threads), off otherwise
    background: Optional[bool] = None
    video: bool = False  # record the first evaluation episode to videos/epoch_<n>.mp4 and TensorBoard
    video_interval: int = _f(1, ge=1)  # record every n-th evaluation


@dataclass
class CheckpointConfig:
    interval: int = _f(10, ge=1)  # epochs between writes of last.pt (also written at the end, and on Ctrl-C or SIGTERM)
    replay_buffer: bool = False  # also save the replay buffer (SAC), so that a resumed run keeps it


@dataclass
class InitFromConfig:
    """Warm start: a new run from a checkpoint's policy (`init_from=<path>` is short for `init_from.path=<path>`)."""

    path: Optional[str] = None  # a checkpoint whose policy weights the new run starts from
    optimizer: bool = False  # also the learner's optimizer state (SAC: with its critics and temperature)
    normalizer: bool = False  # also the observation statistics and reward scale (algorithm.normalize_obs/_reward)


@dataclass
class LearnerConfig:
    """The shared learner of every algorithm (maze_cli/learner.py)."""

    # fp32, bf16 (autocast, CPU and CUDA) or fp16 (autocast with a gradient scaler, CUDA only); auto:
    # bf16 where it was measured faster and learning as well (conv policies on a CPU with AMX or on an AMD
    # CPU with AVX512-BF16; conv policies of 500k parameters or more on a GPU with bf16), fp32 elsewhere
    precision: str = _f("auto", choices=("auto", "fp32", "bf16", "fp16"))
    compile: bool = False  # torch.compile each loss function once (needs a C++ compiler; on CUDA, Triton)
    compile_mode: str = _f("default", choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    # data-parallel learners: each takes its share of runner.n_actors and its own batches; gradients are
    # averaged (torch.distributed: gloo on CPU, NCCL on CUDA), so every learner holds the same weights
    num_learners: int = _f(1, ge=1)
    num_cpus_per_learner: float = _f(1.0, ge=0)  # runner=ray: what each learner's Ray actor reserves
    num_gpus_per_learner: float = _f(0.0, ge=0)  # runner=ray: GPUs of each learner (device=cuda when > 0)
    collective_timeout_s: float = _f(300.0, gt=0)  # a learner that sends nothing for this long stops the run


@dataclass
class SweepConfig:
    """What `train` returns to Hydra's sweepers (e.g. Optuna's) as the run's objective."""

    # the stat key to judge the run on (any key of stats.jsonl, e.g. eval/success_rate); null: the best eval
    # return (eval/return_mean), or the last training window mean (train/return_window_mean) with eval.interval=0
    objective: Optional[str] = None
    # how the key's values over the run's epochs become one number: max (its best), min, last or mean; with
    # objective=null it is max for the eval return and last for the window mean
    reduce: str = _f("max", choices=("max", "min", "last", "mean"))


@dataclass
class SelfPlayConfig:
    """A turn-based game's self-play (docs/multiagent.md): against the current policy, or a pool of earlier versions."""

    # earlier policy versions each actor keeps as opponents; 0: every seat plays the current policy
    pool_size: int = _f(0, ge=0)
    pool_share: float = _f(0.5, ge=0, le=1)  # share of games in which the pool plays one seat (once it holds a version)
    snapshot_every: int = _f(20, ge=1)  # policy versions between two snapshots into the pool
    # the pool's versions play their most likely move (true) or sample as in training (false): a greedy
    # opponent takes every win it sees, so blunders cost the learning seats every time
    pool_greedy: bool = False
    # training games begin after a number of random legal moves drawn from 0..opening_moves (evaluation's at the
    # start): positions off self-play's own lines, where it learns to take the wins and block the threats it meets
    opening_moves: int = _f(0, ge=0)


@dataclass
class TrainConfig:
    """Top-level keys of `train` (the budget and the run)."""

    # master seed: every actor's env and action-sampling seeds, the learner's, the replay buffer's and the
    # evaluation envs' seeds derive from it (each can be set on its own)
    seed: int = _f(1, ge=0)
    max_env_steps: int = _f(1_000_000, ge=1)  # env steps budget (the packaged env configs set their own)
    max_time_s: Optional[float] = _f(None, gt=0)  # wall-clock budget of the training loop, in seconds; null: none
    # stop once the return reaches this; null: run for the budget. With evaluation on (eval.interval > 0) it is
    # judged on each evaluation's mean return, with eval.interval=0 on the mean of the last target_window
    # training episodes (train/return_window_mean). The packaged env configs set their own.
    target_return: Optional[float] = None
    target_window: int = _f(100, ge=1)  # training episodes that train/return_window_mean averages
    # learner iterations per epoch (an iteration: one batch learned from; SAC: the gradient steps one rollout
    # pays for); an epoch is one row of stats and, with evaluation on, an evaluation; null: the algorithm's choice
    epoch_length: Optional[int] = _f(None, ge=1)
    device: str = "cpu"  # the learner's torch device (cpu, cuda, cuda:1, ...); actors always run on CPU
    # torch threads in the learner's process; null: the cores the actors leave it while it learns, that is
    # every core (divided among the learners) for an algorithm whose actors wait for its update (PPO), else 1;
    # 1 in reproducible mode, whose results depend on it. More threads pay only for a wide network
    torch_threads: Optional[int] = _f(1, ge=1)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None  # a run dir to continue in place, with its saved config
    init_from: InitFromConfig = field(default_factory=InitFromConfig)
    # true: checkpoints read by this run (resume, init_from, algorithm.initial_sampling_policy) may hold pickled
    # objects and name any class: this runs code from the file; only for files from people you trust
    trust_checkpoint: bool = False
    sweep: SweepConfig = field(default_factory=SweepConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)


@dataclass
class TrainRootConfig(TrainConfig):
    """The composed config of `train`: the top-level keys plus one node per group (filled by the
    groups' own schemas). `conf/train.yaml` extends it and picks the groups' defaults."""

    env: Any = None  # not in the defaults list: `+env=<name>`
    algorithm: Any = None
    policy: Any = None
    runner: Any = None
    replay_buffer: Any = None
    logger: Any = None  # not in the defaults list: `+logger=mlflow`, `+logger=[mlflow,wandb]`
    # code at every epoch's end: callbacks.<name>._target_=<class> (maze_cli.callbacks); a YAML in
    # --config-dir chosen with +callbacks=<name>
    callbacks: Any = field(default_factory=dict)


# -- replay_buffer ----------------------------------------------------------------------------------
@dataclass
class UniformReplayConfig:
    _target_: str = "maze_cli.buffers.UniformReplayBuffer"
    capacity: int = _f(1_000_000, ge=1)  # items; the storage is preallocated, so its memory follows from the shapes
    seed: Optional[int] = _f(None, ge=0)  # the sampling seed; null: derived from the master seed


@dataclass
class PrioritizedReplayConfig(UniformReplayConfig):
    _target_: str = "maze_cli.buffers.PrioritizedReplayBuffer"
    alpha: float = _f(0.6, ge=0)  # P(i) proportional to (abs(TD error) + eps) ^ alpha
    beta: float = _f(0.4, ge=0, le=1)  # the importance-weight exponent at the start
    beta_final: float = _f(1.0, ge=0, le=1)  # ... annealed linearly to this
    beta_anneal_samples: int = _f(100_000, ge=1)  # ... over this many sampled batches
    eps: float = _f(1e-6, gt=0)  # keeps every priority above zero


# -- policy -----------------------------------------------------------------------------------------
@dataclass
class MlpPolicyConfig:
    """The policy network: each algorithm puts its heads (action distribution, value, Q) on top."""

    _target_: str = "maze_cli.policies.mlp.MlpNetwork"
    hidden_sizes: List[int] = _f([64, 64], ge=1)  # hidden layers, each followed by the activation
    activation: Optional[str] = _f(None, choices=("tanh", "relu", "elu"))  # null: the algorithm's choice
    core: str = _f("identity", choices=("identity", "lstm", "gru"))  # lstm / gru: a recurrent core (memory); SAC refuses it
    core_size: Optional[int] = _f(None, ge=1)  # units of a recurrent core; null: 128
    # what the network sees: the observation, and optionally the previous action and reward (as
    # IMPALA feeds its LSTM); they reach it as two more observation keys (maze_cli.envs.core_inputs)
    core_inputs: List[str] = _f(["obs"], choices=CORE_INPUTS)


@dataclass
class CnnPolicyConfig(MlpPolicyConfig):
    """Conv encoders for image observations (HWC or CHW), the other keys flattened, then the MLP and core."""

    _target_: str = "maze_cli.policies.cnn.CnnNetwork"
    encoder: str = _f("auto", choices=CONV_ENCODERS)  # auto: board below 8 a side, small below 32, else impala
    hidden_sizes: List[int] = _f([256], ge=1)  # hidden layers after the encoders
    activation: Optional[str] = _f("relu", choices=("tanh", "relu", "elu"))  # of the hidden layers
    channels_last: Optional[bool] = None  # HWC (true) or CHW (false); null: the channel axis is the smaller of first and last


# -- runner -----------------------------------------------------------------------------------------
@dataclass
class SequentialRunnerConfig:
    _target_: str = "maze_cli.parallel.SequentialDistributedActors"
    n_actors: int = _f(2, ge=1)  # actors (runner=subproc: processes; runner=ray: Ray actors)
    # envs each actor steps together, with one batched forward pass a step; null: the algorithm's choice
    envs_per_actor: Optional[int] = _f(None, ge=1)
    batch_size: int = _f(2, ge=1)  # rollouts per learner update (SAC takes algorithm.rollouts_per_iteration instead)
    actor_env_seeds: Optional[List[int]] = None  # one env seed per actor; null: derived from seed
    actor_agent_seeds: Optional[List[int]] = None  # one action-sampling seed per actor; null: derived from seed
    # failed actors restarted per run (fresh envs, seeds derived from the actor's and its restart count, the lost
    # rollouts dropped); one more failure, or any with 0, ends the run with the error in one message
    max_restarts: int = _f(3, ge=0)
    # an actor that sent no rollout this long counts as failed and is restarted; null: never. runner=sequential:
    # a rollout running this long is interrupted (main thread only); runner=ray: the clock of a (re)started
    # actor starts when it is created, so keep it above Ray's actor start-up
    rollout_timeout_s: Optional[float] = _f(120.0, gt=0)
    # true: a run is a function of its seed on every runner (the same stats rows apart from timings, the same
    # weights): each actor collects its rollouts with policy versions fixed in advance (one update behind the
    # learner, PPO's the current one) and the learner takes them in a fixed order, waiting for a slow actor
    # instead of taking the next rollout ready (docs/runs.md, Reproducible runs)
    reproducible: bool = False


@dataclass
class SubprocRunnerConfig(SequentialRunnerConfig):
    _target_: str = "maze_cli.parallel.SubprocDistributedActors"
    # the pool holds this x batch_size + n_actors rollout slots, all that may be collected ahead of the learner:
    # it bounds policy lag
    queue_out_of_sync_factor: float = _f(1.0, gt=0)
    start_method: Optional[str] = _f(None, choices=START_METHODS)  # null: forkserver where available
    # where the rollout slots and weights the actors share live: shm (/dev/shm), file (a nameless file in the temp
    # dir, TMPDIR, mapped by every process), or auto: /dev/shm when it holds them, else a file with a warning
    shared_memory: str = _f("auto", choices=("auto", "shm", "file"))


@dataclass
class RayRunnerConfig(SequentialRunnerConfig):
    _target_: str = "maze_cli.parallel.ray_backend.RayDistributedActors"
    # null: start a Ray on this machine and shut it down at the end; auto or host:port: join a running
    # cluster (left running)
    address: Optional[str] = None
    num_cpus_per_actor: float = _f(1.0, ge=0)  # CPUs each Ray actor reserves
    num_gpus_per_actor: float = _f(0.0, ge=0)  # GPUs each Ray actor reserves (for placement; actors act on CPU)
    resources: Any = None  # custom Ray resources each actor needs, {name: amount}, e.g. runner.resources={big_mem: 1}
    max_in_flight_per_actor: int = _f(2, ge=1)  # rollouts requested ahead from each actor; bounds policy lag


# The packaged options of each group: registered in Hydra's ConfigStore as `<group>/<option>_schema`,
# which the YAML file `conf/<group>/<option>.yaml` extends.
SCHEMAS: dict[str, dict[str, type]] = {
    "algorithm": {},  # each algorithm's file registers its own (`register_schema`)
    "policy": {"mlp": MlpPolicyConfig, "cnn": CnnPolicyConfig},
    "runner": {"sequential": SequentialRunnerConfig, "subproc": SubprocRunnerConfig, "ray": RayRunnerConfig},
    "replay_buffer": {"uniform": UniformReplayConfig, "prioritized": PrioritizedReplayConfig},
}


def option(default: Any = dataclasses.MISSING, **limits: Any) -> Any:
    """A schema field with its default and limits (`gt`, `ge`, `le`, `choices`), checked by `validate_section`."""
    return _f(default, **limits)


def register_schema(group: str, name: str, schema: type) -> None:
    """Make `schema` the packaged option `<group>=<name>` (its YAML, conf/<group>/<name>.yaml, extends
    `<name>_schema`). An algorithm's file calls this for its own config, beside its code."""
    SCHEMAS[group][name] = schema


def discover_components() -> None:
    """Import every module of maze_cli.algorithms, so that each algorithm registers its schema
    (idempotent: Python imports a module once)."""
    import importlib
    import pkgutil

    import maze_cli.algorithms as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


def register_configs() -> None:
    """Put every schema into Hydra's ConfigStore (idempotent; called before composing)."""
    from hydra.core.config_store import ConfigStore

    discover_components()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainRootConfig)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=group, name=f"{option}_schema", node=schema)


def known_keys(section: str | None) -> list[str]:
    """Every key any schema of `section` (None: top level) accepts, for spelling suggestions."""
    nested = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig) if f.default_factory is not dataclasses.MISSING}
    if section in nested:
        return sorted(f.name for f in dataclasses.fields(nested[section]()))
    schemas = [TrainConfig] if section is None else list(SCHEMAS.get(section, {}).values())
    keys = {f.name for s in schemas for f in dataclasses.fields(s)}
    if section is None:
        keys |= set(SCHEMAS) | {"env", "logger", "callbacks"}
    return sorted(keys)


def suggest(key: str, candidates: list[str]) -> str:
    """' (did you mean X?)' for a near miss, else ''."""
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)][0]
        return f"{_type_name(inner)} or null"
    if origin in (list, List):
        return f"a list of {_type_name(args[0]).removeprefix('an ').removeprefix('a ')}s"
    if origin in (dict, Dict):
        return f"a mapping of names to {_type_name(args[1]).removeprefix('an ').removeprefix('a ')}s, e.g. {{name: 1}}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def expected_type(schema: type, path: str) -> str:
    """What the schema wants at a dotted path, in words."""
    tp: Any = schema
    for part in path.split("."):
        tp = _unwrap_optional(tp)
        if typing.get_origin(tp) in (dict, Dict):  # a free key of a mapping: its value type
            tp = typing.get_args(tp)[1]
            continue
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        if part not in hints:
            return "another value"
        tp = hints[part]
    return _type_name(tp)


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


def _check_limits(prefix: str, name: str, value: Any, limits: dict[str, Any]) -> None:
    if value is None:
        return
    for item in value if isinstance(value, list) else [value]:
        allowed = limits.get("choices")
        if allowed is not None and item not in allowed:
            raise ConfigError(f"{prefix}{name}={item}: must be one of {', '.join(map(str, allowed))}")
        for op, ok, word in (("gt", lambda a, b: a > b, ">"), ("ge", lambda a, b: a >= b, ">="), ("le", lambda a, b: a <= b, "<=")):
            if op in limits and not ok(item, limits[op]):
                raise ConfigError(f"{prefix}{name}={item}: must be {word} {limits[op]}")


def validate_section(schema: type, values: DictConfig | dict, prefix: str, what: str) -> Any:
    """Merge `values` into `schema`; return the dataclass instance or raise ConfigError."""
    names = [f.name for f in dataclasses.fields(schema)]
    for key in values:
        if key not in names:
            raise ConfigError(f"{prefix}{key}: unknown key{suggest(str(key), names)}; {what} takes: {', '.join(names)}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), values)
        instance = OmegaConf.to_object(merged)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{prefix}{err.full_key}: a value is required") from None
    except (ValidationError, ConfigKeyError) as err:
        path = str(err.full_key or "?").split("[")[0]
        if isinstance(err, ConfigKeyError):
            raise ConfigError(f"{prefix}{path}: unknown key{suggest(path.split('.')[-1], known_keys(path.split('.')[0]))}") from None
        shown = "" if err.value is None else f"={err.value}"
        raise ConfigError(f"{prefix}{path}{shown}: expected {expected_type(schema, path)}") from None
    _check_all_limits(instance, prefix)
    return instance


def _check_all_limits(instance: Any, prefix: str) -> None:
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            _check_all_limits(value, f"{prefix}{f.name}.")
        else:
            _check_limits(prefix, f.name, value, dict(f.metadata))


def validate_group(section: str, values: DictConfig) -> DictConfig:
    """Validate one component group (algorithm, policy, runner, replay_buffer) and return it resolved.

    A packaged option (its YAML extends a registered schema) is checked against the schema: types,
    ranges, unknown keys. A user's own option (a YAML file with a `_target_` of its own) is checked
    against the signature of the class it names, so a misspelt key fails here, not in a subprocess."""
    if not isinstance(values, (DictConfig, dict)):
        raise ConfigError(f"{section}: expected a config group, got {values!r}; choose one with {section}=<name>")
    target = values.get("_target_")
    if not target:
        raise ConfigError(f"{section}: its config has no _target_; name the class to build, e.g. {section}._target_=my_pkg.MyClass")
    schema = OmegaConf.get_type(values) if isinstance(values, DictConfig) else None
    if not (dataclasses.is_dataclass(schema) and target == _default_target(schema)):
        # e.g. a saved config.yaml (resume), or a user's file naming a packaged class without its schema
        schema = next((s for s in SCHEMAS[section].values() if _default_target(s) == target), None)
    if schema is not None:
        instance = validate_section(schema, values, f"{section}.", f"{section} {target}")
        return OmegaConf.create(dataclasses.asdict(instance))
    resolved = OmegaConf.create(OmegaConf.to_container(values, resolve=True) if isinstance(values, DictConfig) else values)
    check_arguments(section, resolved)
    return resolved


def _default_target(schema: type) -> str | None:
    field_ = {f.name: f for f in dataclasses.fields(schema)}.get("_target_")
    return None if field_ is None else field_.default


def check_arguments(section: str, values: DictConfig | dict, passed: tuple[str, ...] = ()) -> None:
    """The class named by `_target_` exists and accepts every other key (plus `passed`, the
    arguments maze_cli supplies itself, such as the spaces)."""
    import inspect

    from hydra.utils import get_object

    target = values["_target_"]
    try:
        obj = get_object(target)
    except Exception as err:  # noqa: BLE001 - an import error of any kind is the user's to fix
        cause = err.__cause__ or err
        raise ConfigError(f"{section}._target_={target}: cannot import it ({type(cause).__name__}: {first_line(cause)})") from None
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    names = [n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL and n != "self"]
    for key in values:
        if key != "_target_" and key not in names and key not in OWN_KEYS.get(section, ()):
            raise ConfigError(f"{section}.{key}: unknown key{suggest(str(key), names)}; {target} takes: {', '.join(names)}")


class NoEnvError(ConfigError):
    """`train` was run without `+env=...`."""

    def __init__(self, options: list[str]):
        listed = ", ".join(options) if options else "(none found)"
        super().__init__(f"no env chosen: add +env=<name>, one of: {listed} (or your own env config via --config-dir)")


@dataclass
class Settings:
    """The validated config of a run: the top level as a typed object, every group as a resolved
    config whose `_target_` names the class to build."""

    train: TrainConfig
    env: dict[str, Any]
    algorithm: DictConfig
    policy: DictConfig
    runner: DictConfig
    replay_buffer: DictConfig
    logger: dict[str, Any] = field(default_factory=dict)  # tracker name -> its config (`+logger=mlflow`)
    callbacks: dict[str, Any] = field(default_factory=dict)  # callback name -> its config (`callbacks.<name>._target_`)


def validate(cfg: DictConfig, env_options: list[str]) -> Settings:
    """Check every key of the composed config; raise ConfigError naming the first bad one."""
    discover_components()  # the algorithms' schemas (a process that composed no config may not have them yet)
    if cfg.get("env") is None:
        raise NoEnvError(env_options)
    top = {k: cfg[k] for k in cfg if k not in SCHEMAS and k not in ("env", "logger", "callbacks")}
    train = validate_section(TrainConfig, top, "", "train")
    try:
        env = OmegaConf.to_container(cfg.env, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        example = "env._target_=pettingzoo.classic.tictactoe_v3.env" if err.key == "_target_" else "+env=gym env.id=Acrobot-v1"
        raise ConfigError(f"env.{err.key}: a value is required (e.g. {example})") from None
    if not isinstance(env, dict):
        raise ConfigError(f"env: expected a mapping of env settings, got {env!r}")
    groups = {section: validate_group(section, cfg[section]) for section in SCHEMAS}
    _check_runner(groups["runner"])
    return Settings(train=train, env=env, logger=validate_loggers(cfg.get("logger")), callbacks=validate_callbacks(cfg.get("callbacks")),
                    **groups)


def _named_targets(section: str, value: Any, expected: str, hint: str) -> dict[str, dict[str, Any]]:
    """`<section>.<name>` entries (callbacks, trackers) as plain dicts, each a mapping with a `_target_`;
    anything else is one line naming the entry, with `expected` (what the section takes) or `hint` (the
    rest of the line, formatted with the entry's name: how to give an entry its `_target_`)."""
    if not isinstance(value, (DictConfig, dict)):
        raise ConfigError(f"{section}: expected {expected}, got {value!r}")
    resolved = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else dict(value)
    for name, options in resolved.items():
        if not isinstance(options, dict) or "_target_" not in options:
            raise ConfigError(f"{section}.{name}: expected a mapping with _target_{hint.format(name=name)}")
    return resolved


def validate_callbacks(callbacks: Any) -> dict[str, Any]:
    """`callbacks.<name>`: a mapping whose `_target_` is a class built from its other keys, with at
    least one of the hooks (maze_cli.callbacks.HOOKS)."""
    if not callbacks:
        return {}
    resolved = _named_targets("callbacks", callbacks, "callbacks.<name>._target_=<class> (or +callbacks=<name>)",
                              ", e.g. +callbacks.{name}._target_=my_pkg.MyCallback")
    from maze_cli.callbacks import HOOKS

    for name, options in resolved.items():
        check_arguments(f"callbacks.{name}", options)
        from hydra.utils import get_object

        if not any(callable(getattr(get_object(options["_target_"]), hook, None)) for hook in HOOKS):
            raise ConfigError(f"callbacks.{name}._target_={options['_target_']}: has none of the hooks {', '.join(HOOKS)}")
    return resolved


def validate_loggers(loggers: Any) -> dict[str, Any]:
    """`logger.<name>` for each chosen tracker: a mapping whose `_target_` accepts its other keys
    (besides run_dir and config, which maze_cli passes)."""
    if loggers is None:
        return {}
    resolved = _named_targets("logger", loggers, "trackers chosen with +logger=<name> (or +logger=[a,b])",
                              " (a writer class with write(stats) and close())")
    for name, options in resolved.items():
        check_arguments(f"logger.{name}", options, passed=("run_dir", "config"))
        from hydra.utils import get_object

        from maze_cli.stats.trackers import check_installed

        check_installed(name, get_object(options["_target_"]))
    return resolved


def _check_runner(runner: DictConfig) -> None:
    n_actors = runner.get("n_actors")
    for key in ("actor_env_seeds", "actor_agent_seeds"):
        seeds = runner.get(key)
        if seeds is not None and n_actors is not None and len(seeds) != n_actors:
            raise ConfigError(f"runner.{key} has {len(seeds)} seeds: give one per actor (runner.n_actors={n_actors})")
    if "ray_backend" in runner._target_ and importlib.util.find_spec("ray") is None:
        raise ConfigError(RAY_MISSING)
    _check_resources(runner.get("resources"))
    if runner.get("start_method") is not None:
        try:
            check_start_method(runner.start_method)
        except ValueError as err:
            raise ConfigError(f"runner.{err}") from None


def _check_resources(resources: Any) -> None:
    """`runner.resources`: null or a mapping of resource names to amounts. (Typed `Any` in the schema:
    a typed mapping would be closed to new names under Hydra's struct mode.)"""
    if resources is None:
        return
    if not isinstance(resources, (DictConfig, dict)):
        raise ConfigError(f"runner.resources={resources}: expected {_type_name(Optional[Dict[str, float]])}")
    for name, amount in resources.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ConfigError(f"runner.resources.{name}={amount}: expected a number")
        if amount < 0:
            raise ConfigError(f"runner.resources.{name}={amount}: must be >= 0")
