"""The run's config as composed and checked before anything starts: the schemas registered with Hydra
(`register_configs`, the algorithms' among them), and `validate` turns the composed config into
`Settings` (the top level as a typed object, each group resolved), or raises a ConfigError naming the
first bad key. Packaged options are checked against their schemas, a user's own class against its
signature, trackers and callbacks against theirs; the runner's cross-key rules are checked here too."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from maze_cli.config.schema import OWN_KEYS, SCHEMAS, TrainConfig, TrainRootConfig
from maze_cli.config.validation import check_arguments, validate_section
from maze_cli.errors import RAY_MISSING, ConfigError
from maze_cli.start_methods import check_start_method


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
        for option, option_schema in options.items():
            store.store(group=group, name=f"{option}_schema", node=option_schema)



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
    check_arguments(section, resolved, own=OWN_KEYS.get(section, ()))
    return resolved


def _default_target(schema: type) -> str | None:
    field_ = {f.name: f for f in dataclasses.fields(schema)}.get("_target_")
    return None if field_ is None else field_.default


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
        check_arguments(f"logger.{name}", options)
        from hydra.utils import get_object

        from maze_cli.stats.trackers import check_installed

        check_installed(name, get_object(options["_target_"]))
    return resolved


def _check_runner(runner: DictConfig) -> None:
    n_actors = runner.get("n_actors")
    for seeds_key in ("actor_env_seeds", "actor_agent_seeds"):
        seeds = runner.get(seeds_key)
        if seeds is not None and n_actors is not None and len(seeds) != n_actors:
            raise ConfigError(f"runner.{seeds_key} has {len(seeds)} seeds: give one per actor (runner.n_actors={n_actors})")
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
        raise ConfigError(f"runner.resources={resources}: expected a mapping of names to numbers, e.g. {{name: 1}}, or null")
    for name, amount in resources.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ConfigError(f"runner.resources.{name}={amount}: expected a number")
        if amount < 0:
            raise ConfigError(f"runner.resources.{name}={amount}: must be >= 0")


MLP_TARGET = "maze_cli.policies.mlp.MlpNetwork"


def choose_cnn(cfg: DictConfig, settings: Settings) -> None:
    """`policy=cnn`'s network in place of the default MLP, for observations that hold images: every policy key the
    run set away from the MLP's defaults is kept (a core, its inputs, hidden sizes), and `cfg` and `settings` both
    hold the result, so config.yaml and checkpoints say what ran."""
    from maze_cli.config.schema import CnnPolicyConfig, MlpPolicyConfig

    defaults = dataclasses.asdict(MlpPolicyConfig())
    kept = {key: value for key, value in OmegaConf.to_container(settings.policy, resolve=True).items()
            if key != "_target_" and value != defaults.get(key)}
    settings.policy = validate_group("policy", OmegaConf.merge(OmegaConf.structured(CnnPolicyConfig), kept))
    with open_dict(cfg):
        cfg.policy = OmegaConf.create(OmegaConf.to_container(settings.policy))
