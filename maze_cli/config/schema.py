"""The config schema as dataclasses: checked (types, ranges, unknown keys) before anything starts.

Each field may carry range metadata (`gt`, `ge`, `le`, `choices`); `validate_section` enforces it
and turns every failure into a `ConfigError` naming the key and what is allowed. Nothing here
imports torch, so a bad config fails fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import multiprocessing as mp
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key and what is allowed."""


def _f(default: Any = dataclasses.MISSING, **limits: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=limits)
    return field(default=default, metadata=limits)


@dataclass
class EvalConfig:
    interval: int = _f(1, ge=0)  # epochs between evaluations; 0: off
    episodes: int = _f(10, ge=1)


@dataclass
class CheckpointConfig:
    interval: int = _f(10, ge=1)  # epochs between writes of last.pt (it is also written at the end)
    replay_buffer: bool = False


@dataclass
class TrainConfig:
    """Top-level keys of `train` (the budget and the run)."""

    seed: int = _f(1, ge=0)
    max_env_steps: int = _f(1_000_000, ge=1)
    max_time_s: Optional[float] = _f(None, gt=0)
    target_return: Optional[float] = None
    target_window: int = _f(100, ge=1)
    epoch_length: int = _f(20, ge=1)
    device: str = "cpu"
    torch_threads: int = _f(1, ge=1)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: Optional[str] = None


@dataclass
class ImpalaConfig:
    name: str = "impala"
    lr: float = _f(1e-3, gt=0)
    gamma: float = _f(0.99, ge=0, le=1)
    n_rollout_steps: int = _f(32, ge=1)
    rho_bar: float = _f(1.0, gt=0)
    c_bar: float = _f(1.0, gt=0)
    value_coef: float = _f(0.5, ge=0)
    entropy_coef: float = _f(0.01, ge=0)
    max_grad_norm: float = _f(0.5, gt=0)
    adam_eps: float = _f(1e-5, gt=0)


@dataclass
class SacConfig:
    name: str = "sac"
    lr: float = _f(1e-3, gt=0)
    alpha_lr: float = _f(1e-3, gt=0)
    gamma: float = _f(0.99, ge=0, le=1)
    tau: float = _f(0.005, gt=0, le=1)
    init_alpha: float = _f(1.0, gt=0)
    target_entropy: Optional[float] = None
    target_entropy_scale: float = _f(0.5, gt=0, le=1)
    n_rollout_steps: int = _f(8, ge=1)
    rollouts_per_iteration: int = _f(1, ge=1)
    batch_size: int = _f(256, ge=1)
    replay_ratio: float = _f(1.0, gt=0)
    initial_buffer_size: int = _f(1000, ge=0)
    initial_sampling_policy: Any = None
    split_rollouts_into_transitions: bool = True


@dataclass
class UniformReplayConfig:
    name: str = "uniform"
    capacity: int = _f(1_000_000, ge=1)
    seed: Optional[int] = _f(None, ge=0)


@dataclass
class PrioritizedReplayConfig(UniformReplayConfig):
    name: str = "prioritized"
    alpha: float = _f(0.6, ge=0)
    beta: float = _f(0.4, ge=0, le=1)
    beta_final: float = _f(1.0, ge=0, le=1)
    beta_anneal_samples: int = _f(100_000, ge=1)
    eps: float = _f(1e-6, gt=0)


@dataclass
class MlpPolicyConfig:
    name: str = "mlp"
    hidden_sizes: List[int] = _f([64, 64], ge=1)
    activation: Optional[str] = _f(None, choices=("tanh", "relu", "elu"))  # None: the algorithm's choice
    shared_torso: bool = False


@dataclass
class SequentialRunnerConfig:
    name: str = "sequential"
    n_actors: int = _f(2, ge=1)
    envs_per_actor: Optional[int] = _f(None, ge=1)  # None: the algorithm's choice
    batch_size: int = _f(2, ge=1)
    actor_env_seeds: Optional[List[int]] = None
    actor_agent_seeds: Optional[List[int]] = None
    max_restarts: int = _f(3, ge=0)
    rollout_timeout_s: Optional[float] = _f(120.0, gt=0)


@dataclass
class SubprocRunnerConfig(SequentialRunnerConfig):
    name: str = "subproc"
    queue_out_of_sync_factor: float = _f(1.0, gt=0)
    start_method: Optional[str] = _f(None, choices=("forkserver", "spawn", "fork"))


@dataclass
class RayRunnerConfig(SequentialRunnerConfig):
    name: str = "ray"
    address: Optional[str] = None
    num_cpus_per_actor: float = _f(1.0, ge=0)
    num_gpus_per_actor: float = _f(0.0, ge=0)
    resources: Optional[Dict[str, float]] = None
    max_in_flight_per_actor: int = _f(2, ge=1)


SCHEMAS: dict[str, dict[str, type]] = {
    "algorithm": {"impala": ImpalaConfig, "sac": SacConfig},
    "policy": {"mlp": MlpPolicyConfig},
    "runner": {"sequential": SequentialRunnerConfig, "subproc": SubprocRunnerConfig, "ray": RayRunnerConfig},
    "replay_buffer": {"uniform": UniformReplayConfig, "prioritized": PrioritizedReplayConfig},
}


def known_keys(section: str | None) -> list[str]:
    """Every key any schema of `section` (None: top level) accepts, for spelling suggestions."""
    nested = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig) if f.default_factory is not dataclasses.MISSING}
    if section in nested:
        return sorted(f.name for f in dataclasses.fields(nested[section]()))
    schemas = [TrainConfig] if section is None else list(SCHEMAS.get(section, {}).values())
    keys = {f.name for s in schemas for f in dataclasses.fields(s)}
    if section is None:
        keys |= set(SCHEMAS) | {"env"}
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


def _expected(schema: type, path: str) -> str:
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
        raise ConfigError(f"{prefix}{path}{shown}: expected {_expected(schema, path)}") from None
    _check_all_limits(instance, prefix)
    return instance


def _check_all_limits(instance: Any, prefix: str) -> None:
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            _check_all_limits(value, f"{prefix}{f.name}.")
        else:
            _check_limits(prefix, f.name, value, dict(f.metadata))


def validate_group(section: str, values: DictConfig) -> Any:
    """Validate one config group (algorithm, policy, runner) against the schema its `name` selects."""
    if not isinstance(values, (DictConfig, dict)):
        raise ConfigError(f"{section}: expected a config group, got {values!r}; choose one with {section}=<name>")
    options = SCHEMAS[section]
    name = values.get("name")
    if name not in options:
        raise ConfigError(f"{section}.name={name}: unknown {section}; available: {', '.join(options)}")
    return validate_section(options[name], values, f"{section}.", f"{section} '{name}'")


class NoEnvError(ConfigError):
    """`train` was run without `+env=...`."""

    def __init__(self, options: list[str]):
        listed = ", ".join(options) if options else "(none found)"
        super().__init__(f"no env chosen: add +env=<name>, one of: {listed} (or your own env config via --config-dir)")


@dataclass
class Settings:
    """The validated config of a run, as plain typed objects."""

    train: TrainConfig
    env: dict[str, Any]
    algorithm: Any
    policy: Any
    runner: Any
    replay_buffer: Any


def validate(cfg: DictConfig, env_options: list[str]) -> Settings:
    """Check every key of the composed config; raise ConfigError naming the first bad one."""
    if cfg.get("env") is None:
        raise NoEnvError(env_options)
    top = {k: cfg[k] for k in cfg if k not in SCHEMAS and k != "env"}
    train = validate_section(TrainConfig, top, "", "train")
    try:
        env = OmegaConf.to_container(cfg.env, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"env.{err.key}: a value is required (e.g. +env=gym env.id=Acrobot-v1)") from None
    if not isinstance(env, dict):
        raise ConfigError(f"env: expected a mapping of env settings, got {env!r}")
    groups = {section: validate_group(section, cfg[section]) for section in SCHEMAS}
    runner = groups["runner"]
    for key in ("actor_env_seeds", "actor_agent_seeds"):
        seeds = getattr(runner, key)
        if seeds is not None and len(seeds) != runner.n_actors:
            raise ConfigError(f"runner.{key} has {len(seeds)} seeds: give one per actor (runner.n_actors={runner.n_actors})")
    if runner.name == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("runner=ray needs Ray, an optional extra: pip install 'maze_cli[ray]' (or pip install ray)")
    start_method = getattr(runner, "start_method", None)
    if start_method is not None and start_method not in mp.get_all_start_methods():
        raise ConfigError(f"runner.start_method={start_method}: not available here; use one of {', '.join(mp.get_all_start_methods())}")
    _fill_algorithm_defaults(groups["algorithm"].name, runner)
    return Settings(train=train, env=env, **groups)


# What keys left null become, per algorithm. IMPALA learns from wide batches: a vectorized env makes
# 64 envs per actor nearly free. SAC makes one update per transition: a few envs keep its replay
# data fresh.
ALGORITHM_DEFAULTS = {"impala": {"envs_per_actor": 64}, "sac": {"envs_per_actor": 8}}


def _fill_algorithm_defaults(algorithm: str, runner: Any) -> None:
    if runner.envs_per_actor is None:
        runner.envs_per_actor = ALGORITHM_DEFAULTS[algorithm]["envs_per_actor"]
