"""The config schema as dataclasses: the one source of every default, checked before anything starts.

Every option of a component group (algorithm, policy, runner, replay_buffer) is a dataclass whose
`_target_` names the class Hydra's `instantiate` builds and whose other fields are that class's
arguments. They are registered in Hydra's ConfigStore (`register_configs`); the packaged YAML files
extend them through their defaults list and hold only what differs. An algorithm's schema sits in its
own file (maze_cli/algorithms/<name>.py) and registers itself there (`register_schema`) when the
command imports the algorithms (`maze_cli.cli.settings.register_configs`): nothing here imports them.

Each key is declared with its type, limits, default and help (maze_cli.config.fields);
`validate` (maze_cli.cli.settings) checks a run's config against them. Nothing here imports torch; the algorithms' files,
imported to register their schemas, do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Optional

from maze_cli.config.fields import Fraction, Gt, Le, NonNegativeFloat, NonNegativeInt, OneOf, PositiveFloat, PositiveInt, key
from maze_cli.start_methods import START_METHODS


CORE_INPUTS = ("obs", "prev_action", "prev_reward")
CONV_ENCODERS = ("auto", "impala", "nature", "small", "board")  # policy.encoder (maze_cli.policies.cnn)
# Keys of a group's config that maze_cli itself reads, whatever class `_target_` names.
OWN_KEYS = {"policy": ("core_inputs",)}


@dataclass
class EvalConfig:
    interval: NonNegativeInt = key(1,
                                    "epochs between evaluations (the last epoch is always evaluated); 0: off, and "
                                    "target_return is then judged on the mean of the last target_window training "
                                    "episodes")
    interval_env_steps: Optional[PositiveInt] = key(None,
                                                     "env steps between evaluations, in place of interval's epochs "
                                                     "(an evaluation at the first epoch's end past them): a cadence "
                                                     "that does not change with an algorithm's epoch length; null: "
                                                     "by epochs")
    interval_s: Optional[PositiveFloat] = key(None,
                                               "seconds of training between evaluations, likewise (with the above: "
                                               "whichever comes first)")
    episodes: PositiveInt = key(10, "episodes per evaluation, the same env seeds every time")
    max_episode_steps: Optional[PositiveInt] = key(27_000,
                                                    "steps after which an evaluation episode the env has not ended "
                                                    "is cut short, its return as it stood (said once in the log): an "
                                                    "env without a time limit whose policy loops would never end "
                                                    "its evaluation; as long as Atari's limit (108,000 frames); null: "
                                                    "no cut")
    deterministic: bool = key(True,
                               "true: the policy's most likely action; false: sampled (seeded, so the same weights "
                               "play the same episodes): for a policy whose most likely action can loop (MiniGrid: "
                               "docs/runs.md)")
    background: Optional[bool] = key(None,
                                      "evaluate a copy of the weights in a thread while the learner trains on (its "
                                      "result joins a later epoch's row, eval/snapshot_env_steps naming the weights "
                                      "judged; best.pt is written from them); null: on where a core is left over "
                                      "(actors in processes of their own, more cores than actors + learner threads), "
                                      "off otherwise")
    video: bool = key(False, "record the first evaluation episode to videos/epoch_<n>.mp4 and TensorBoard")
    video_interval: PositiveInt = key(1, "record every n-th evaluation")


@dataclass
class CheckpointConfig:
    interval: PositiveInt = key(10,
                                 "epochs between writes of last.pt (also written at the end, and on Ctrl-C or "
                                 "SIGTERM)")
    replay_buffer: bool = key(False, "also save the replay buffer (SAC), so that a resumed run keeps it")


@dataclass
class InitFromConfig:
    """Warm start: a new run from a checkpoint's policy (`init_from=<path>` is short for `init_from.path=<path>`)."""

    path: Optional[str] = key(None, "a checkpoint whose policy weights the new run starts from")
    optimizer: bool = key(False, "also the learner's optimizer state (SAC: with its critics and temperature)")
    normalizer: bool = key(False, "also the observation statistics and reward scale (algorithm.normalize_obs/_reward)")


@dataclass
class LearnerConfig:
    """The shared learner of every algorithm (maze_cli/learner.py)."""

    precision: Annotated[str, OneOf("auto", "fp32", "bf16", "fp16")] = key(
        "auto",
        "fp32, bf16 (autocast, CPU and CUDA) or fp16 (autocast with a gradient scaler, CUDA only); auto: bf16 for "
        "conv policies where the hardware computes it faster (a CPU with AMX, an AMD CPU with AVX512-BF16, a GPU "
        "for policies of 500k parameters or more), fp32 elsewhere")
    compile: bool = key(False, "torch.compile each loss function once (needs a C++ compiler; on CUDA, Triton)")
    compile_mode: Annotated[str, OneOf("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")] = key(
        "default",
        "")
    num_learners: PositiveInt = key(1,
                                     "data-parallel learners: each takes its share of runner.n_actors and its own "
                                     "batches; gradients are averaged (torch.distributed: gloo on CPU, NCCL on "
                                     "CUDA), so every learner holds the same weights")
    num_cpus_per_learner: NonNegativeFloat = key(1.0, "runner=ray: what each learner's Ray actor reserves")
    num_gpus_per_learner: NonNegativeFloat = key(0.0, "runner=ray: GPUs of each learner (device=cuda when > 0)")
    collective_timeout_s: PositiveFloat = key(300.0, "a learner that sends nothing for this long stops the run")


@dataclass
class SweepConfig:
    """What `train` returns to Hydra's sweepers (e.g. Optuna's) as the run's objective."""

    objective: Optional[str] = key(None,
                                    "the stat key to judge the run on (any key of stats.jsonl, e.g. "
                                    "eval/success_rate); null: the best eval return (eval/return_mean), or the last "
                                    "training window mean (train/return_window_mean) with eval.interval=0")
    reduce: Annotated[str, OneOf("max", "min", "last", "mean")] = key(
        "max",
        "how the key's values over the run's epochs become one number: max (its best), min, last or mean; with "
        "objective=null it is max for the eval return and last for the window mean")


@dataclass
class SelfPlayConfig:
    """A turn-based game's self-play (docs/multiagent.md): against the current policy, or a pool of earlier versions."""

    pool_size: NonNegativeInt = key(0,
                                     "earlier policy versions each actor keeps as opponents; 0: every seat plays the "
                                     "current policy")
    pool_share: Fraction = key(0.5, "share of games in which the pool plays one seat (once it holds a version)")
    snapshot_every: PositiveInt = key(20, "policy versions between two snapshots into the pool")
    pool_greedy: bool = key(False,
                             "the pool's versions play their most likely move (true) or sample as in training "
                             "(false): a greedy opponent takes every win it sees, so blunders cost the learning "
                             "seats every time")
    opening_moves: NonNegativeInt = key(0,
                                         "training games begin after a number of random legal moves drawn from "
                                         "0..opening_moves (evaluation's at the start): positions off self-play's "
                                         "own lines, where it learns to take the wins and block the threats it meets")


@dataclass
class PbtConfig:
    """Population-based training on Ray Tune (docs/pbt.md): members that copy a better member's weights and perturb its keys."""

    population: NonNegativeInt = key(0,
                                      "members trained together, each an ordinary run with its own actors, under Ray "
                                      "Tune's PBT scheduler; below 2: no PBT")
    mutations: Dict[str, Any] = key({},
                                             "the keys PBT changes and their ranges, {algorithm.<key>: [low, high]} "
                                             "(log-uniform where both are positive and span a decade or more); only "
                                             "keys the learner reads at each update (lr, entropy_coef, clip_range, "
                                             "gamma, ...). Each member starts from the run's own values")
    interval_env_steps: PositiveInt = key(50_000, "env steps of a member between two exploit-and-explore decisions")
    synchronous: bool = key(False,
                             "true: members wait for each other at every interval, so that they are ranked at the "
                             "same env steps and a copy is of the better member's newest weights, but each member's "
                             "run is rebuilt at every interval (Ray Tune stops a paused member's process); false: "
                             "no member waits, and a member behind may copy a slower member's older checkpoint")
    quantile_fraction: Annotated[float, Gt(0), Le(0.5)] = key(0.25,
                                                               "the share of members at the bottom that copy one of "
                                                               "the same share at the top")
    copy_margin: NonNegativeFloat = key(0.0,
                                         "0: a member at the bottom copies one at the top whenever it ranks there (Ray "
                                         "Tune's PBT); above 0: only where the other's score is higher by more than this "
                                         "many standard errors of the difference (from each latest evaluation's spread "
                                         "over eval.episodes, or the training window's over target_window episodes), "
                                         "so that noise alone replaces no member, at the "
                                         "cost of fewer copies, and so fewer explored values")
    resample_probability: Fraction = key(0.25,
                                          "chance that an explored key is drawn anew from its range rather than "
                                          "moved one step, an eighth of its range (of its logarithm on a log scale)")
    score: Annotated[str, OneOf("train", "eval")] = key("train",
                                                       "what members are ranked by: train, the mean return of its "
                                                       "last training episodes, so that a decision needs no "
                                                       "evaluation and a member evaluates on its run's own cadence; "
                                                       "eval, each one's latest evaluation, one at each interval "
                                                       "(greedy returns, which an explored entropy coefficient does "
                                                       "not move, at the cost of an evaluation per interval)")
    scheduler: Annotated[str, OneOf("pbt", "pb2")] = key("pbt",
                                                          "pbt: Ray Tune's PopulationBasedTraining; pb2: its PB2, "
                                                          "which explores with a Gaussian-process bandit (needs "
                                                          "scikit-learn)")


@dataclass
class TrainConfig:
    """Top-level keys of `train` (the budget and the run)."""

    seed: NonNegativeInt = key(1,
                                "master seed: every actor's env and action-sampling seeds, the learner's, the replay "
                                "buffer's and the evaluation envs' seeds derive from it (each can be set on its own)")
    max_env_steps: PositiveInt = key(1_000_000, "env steps budget (the packaged env configs set their own)")
    max_time_s: Optional[PositiveFloat] = key(None, "wall-clock budget of the training loop, in seconds; null: none")
    target_return: Optional[float] = key(None,
                                          "stop once the return reaches this; null: run for the budget. With "
                                          "evaluation on (eval.interval > 0) it is judged on each evaluation's mean "
                                          "return, with eval.interval=0 on the mean of the last target_window "
                                          "training episodes (train/return_window_mean). The packaged env configs "
                                          "set their own.")
    target_window: PositiveInt = key(100, "training episodes that train/return_window_mean averages")
    epoch_length: Optional[PositiveInt] = key(None,
                                               "learner iterations per epoch (an iteration: one batch learned from; "
                                               "SAC: the gradient steps one rollout pays for); an epoch is one row "
                                               "of stats and, with evaluation on, an evaluation; null: the "
                                               "algorithm's choice")
    device: str = key("cpu", "the learner's torch device (cpu, cuda, cuda:1, ...); actors always run on CPU")
    torch_threads: Optional[PositiveInt] = key(1,
                                                "torch threads in the learner's process; null: the cores the actors "
                                                "leave it while it learns, that is every core (divided among the "
                                                "learners) for an algorithm whose actors wait for its update (PPO), "
                                                "else 1; 1 in reproducible mode, whose results depend on it. More "
                                                "threads pay only for a wide network")
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = key(None, "a run dir to continue in place, with its saved config")
    init_from: InitFromConfig = field(default_factory=InitFromConfig)
    trust_checkpoint: bool = key(False,
                                  "true: checkpoints read by this run (resume, init_from, "
                                  "algorithm.initial_sampling_policy) may hold pickled objects and name any class: "
                                  "this runs code from the file; only for files from people you trust")
    sweep: SweepConfig = field(default_factory=SweepConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    pbt: PbtConfig = field(default_factory=PbtConfig)


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
    capacity: PositiveInt = key(1_000_000, "items; the storage is preallocated, so its memory follows from the shapes")
    seed: Optional[NonNegativeInt] = key(None, "the sampling seed; null: derived from the master seed")


@dataclass
class PrioritizedReplayConfig(UniformReplayConfig):
    _target_: str = "maze_cli.buffers.PrioritizedReplayBuffer"
    alpha: NonNegativeFloat = key(0.6, "P(i) proportional to (abs(TD error) + eps) ^ alpha")
    beta: Fraction = key(0.4, "the importance-weight exponent at the start")
    beta_final: Fraction = key(1.0, "... annealed linearly to this")
    beta_anneal_samples: PositiveInt = key(100_000, "... over this many sampled batches")
    eps: PositiveFloat = key(1e-6, "keeps every priority above zero")


# -- policy -----------------------------------------------------------------------------------------
@dataclass
class MlpPolicyConfig:
    """The policy network: each algorithm puts its heads (action distribution, value, Q) on top."""

    _target_: str = "maze_cli.policies.mlp.MlpNetwork"
    hidden_sizes: List[PositiveInt] = key([64, 64], "hidden layers, each followed by the activation")
    activation: Optional[Annotated[str, OneOf("tanh", "relu", "elu")]] = key(None, "null: the algorithm's choice")
    core: Annotated[str, OneOf("identity", "lstm", "gru")] = key(
        "identity",
        "lstm / gru: a recurrent core (memory); SAC refuses it")
    core_size: Optional[PositiveInt] = key(None, "units of a recurrent core; null: 128")
    core_inputs: List[Annotated[str, OneOf(*CORE_INPUTS)]] = key(
        ["obs"],
        "what the network sees: the observation, and optionally the previous action and reward (as IMPALA feeds its "
        "LSTM); they reach it as two more observation keys (maze_cli.envs.core_inputs)")


@dataclass
class CnnPolicyConfig(MlpPolicyConfig):
    """Conv encoders for image observations (HWC or CHW), the other keys flattened, then the MLP and core."""

    _target_: str = "maze_cli.policies.cnn.CnnNetwork"
    encoder: Annotated[str, OneOf(*CONV_ENCODERS)] = key("auto",
                                                          "auto: board below 8 a side, small below 32, else impala")
    hidden_sizes: List[PositiveInt] = key([256], "hidden layers after the encoders")
    activation: Optional[Annotated[str, OneOf("tanh", "relu", "elu")]] = key("relu", "of the hidden layers")
    channels_last: Optional[bool] = key(None,
                                         "HWC (true) or CHW (false); null: the channel axis is the smaller of first "
                                         "and last")


# -- runner -----------------------------------------------------------------------------------------
@dataclass
class SequentialRunnerConfig:
    _target_: str = "maze_cli.parallel.SequentialDistributedActors"
    n_actors: PositiveInt = key(2, "actors (runner=subproc: processes; runner=ray: Ray actors)")
    envs_per_actor: Optional[PositiveInt] = key(None,
                                                 "envs each actor steps together, with one batched forward pass a "
                                                 "step; null: the algorithm's choice")
    batch_size: PositiveInt = key(2, "rollouts per learner update (SAC takes algorithm.rollouts_per_iteration instead)")
    actor_env_seeds: Optional[List[int]] = key(None, "one env seed per actor; null: derived from seed")
    actor_agent_seeds: Optional[List[int]] = key(None, "one action-sampling seed per actor; null: derived from seed")
    max_restarts: NonNegativeInt = key(3,
                                        "failed actors restarted per run (fresh envs, seeds derived from the actor's "
                                        "and its restart count, the lost rollouts dropped); one more failure, or any "
                                        "with 0, ends the run with the error in one message")
    rollout_timeout_s: Optional[PositiveFloat] = key(120.0,
                                                      "an actor that sent no rollout this long counts as failed and "
                                                      "is restarted; null: never. runner=sequential: a rollout "
                                                      "running this long is interrupted (main thread only); "
                                                      "runner=ray: the clock of a (re)started actor starts when it "
                                                      "is created, so keep it above Ray's actor start-up")
    reproducible: bool = key(False,
                              "true: a run is a function of its seed on every runner (the same stats rows apart from "
                              "timings, the same weights): each actor collects its rollouts with policy versions "
                              "fixed in advance (one update behind the learner, PPO's the current one) and the "
                              "learner takes them in a fixed order, waiting for a slow actor instead of taking the "
                              "next rollout ready (docs/runs.md, Reproducible runs)")


@dataclass
class SubprocRunnerConfig(SequentialRunnerConfig):
    _target_: str = "maze_cli.parallel.SubprocDistributedActors"
    queue_out_of_sync_factor: PositiveFloat = key(1.0,
                                                   "the pool holds this x batch_size + n_actors rollout slots, all "
                                                   "that may be collected ahead of the learner: it bounds policy lag")
    start_method: Optional[Annotated[str, OneOf(*START_METHODS)]] = key(None, "null: forkserver where available")
    shared_memory: Annotated[str, OneOf("auto", "shm", "file")] = key(
        "auto",
        "where the rollout slots and weights the actors share live: shm (/dev/shm), file (a nameless file in the "
        "temp dir, TMPDIR, mapped by every process), or auto: /dev/shm when it holds them, else a file with a "
        "warning")


@dataclass
class RayRunnerConfig(SequentialRunnerConfig):
    _target_: str = "maze_cli.parallel.ray_backend.RayDistributedActors"
    address: Optional[str] = key(None,
                                  "null: start a Ray on this machine and shut it down at the end; auto or host:port: "
                                  "join a running cluster (left running)")
    num_cpus_per_actor: NonNegativeFloat = key(1.0, "CPUs each Ray actor reserves")
    num_gpus_per_actor: NonNegativeFloat = key(0.0, "GPUs each Ray actor reserves (for placement; actors act on CPU)")
    resources: Any = key(None,
                          "custom Ray resources each actor needs, {name: amount}, e.g. runner.resources={big_mem: 1}")
    max_in_flight_per_actor: PositiveInt = key(2, "rollouts requested ahead from each actor; bounds policy lag")


# The packaged options of each group: registered in Hydra's ConfigStore as `<group>/<option>_schema`,
# which the YAML file `conf/<group>/<option>.yaml` extends.
SCHEMAS: dict[str, dict[str, type]] = {
    "algorithm": {},  # each algorithm's file registers its own (`register_schema`)
    "policy": {"mlp": MlpPolicyConfig, "cnn": CnnPolicyConfig},
    "runner": {"sequential": SequentialRunnerConfig, "subproc": SubprocRunnerConfig, "ray": RayRunnerConfig},
    "replay_buffer": {"uniform": UniformReplayConfig, "prioritized": PrioritizedReplayConfig},
}


def register_schema(group: str, name: str, schema: type) -> None:
    """Make `schema` the packaged option `<group>=<name>` (its YAML, conf/<group>/<name>.yaml, extends
    `<name>_schema`). An algorithm's file calls this for its own config, beside its code."""
    SCHEMAS[group][name] = schema


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
