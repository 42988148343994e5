"""Turn what can go wrong before training into one line a user can act on."""

from __future__ import annotations

import dataclasses

import yaml
from hydra.errors import ConfigCompositionException, InstantiationException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError

from maze_cli.config.schema import known_keys
from maze_cli.config.validation import expected_type, suggest
from maze_cli.errors import MazeCliError, first_line

# A config file that is no YAML, and an interpolation (${...}) that names nothing, are bad input too.
HYDRA_INPUT_ERRORS = (ConfigCompositionException, MissingConfigException, OverrideParseException, yaml.YAMLError,
                      InterpolationResolutionError)


def _unknown_key(full_key: str, argv: list[str]) -> str:
    section, _, key = full_key.partition(".")
    if section == "env" and not any(a.startswith("+env=") or a.startswith("env=") for a in argv):
        return "no env chosen: add +env=<name> before setting env keys (e.g. +env=cartpole)"
    if not key:
        return f"{full_key}: unknown key{suggest(full_key, known_keys(None)) or '; see docs/reference/config.md for the keys of train'}"
    candidates = known_keys(section)
    head, _, rest = key.partition(".")
    if rest and (head in candidates or section == "callbacks"):  # a new key inside a mapping (env.info_stats.x, env.kwargs.x)
        return f"{full_key}: a key this config does not have yet; add it with +{full_key}=..."
    if key in candidates:  # a key the section takes that its config file leaves out
        return f"{full_key}: not set by this config; add it with +{full_key}=..."
    hint = suggest(key.split(".")[-1], candidates)
    if not hint and candidates:
        hint = f"; known keys: {', '.join(candidates)}"
    return f"{full_key}: unknown key{hint}"


def _refusal_inside(err: BaseException) -> BaseException:
    """Our own error raised by a class that Hydra built from a `_target_` (a policy network refusing its
    config): Hydra wraps it in an InstantiationException; the message is ours, not Hydra's wrapping."""
    if isinstance(err, InstantiationException) and isinstance(err.__cause__, MazeCliError):
        return err.__cause__
    return err


def explain(err: BaseException, argv: list[str]) -> str | None:
    """A one-line message for a user error, or None for anything else (a real crash)."""
    err = _refusal_inside(err)
    if isinstance(err, MazeCliError):
        return str(err)
    if isinstance(err, MissingConfigException):
        group, _, name = str(err.missing_cfg_file or "").rpartition("/")
        options = ", ".join(sorted(o for o in err.options or [] if not o.endswith("_schema")))  # schemas are not choices
        if group:
            return f"{group}={name}: no such {group} config; available: {options}"
        return first_line(str(err))
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return (f"{mark.name}, line {mark.line + 1}: not valid YAML ({err.context or err.problem}; {err.problem}); "
                f"fix the file")
    if isinstance(err, yaml.YAMLError):
        return f"a config file is not valid YAML: {first_line(str(err))}"
    if isinstance(err, InterpolationResolutionError):
        key = getattr(err, "full_key", None)
        return f"{key or 'a config value'}: {first_line(err.msg)}; set it to a value or to an interpolation of an existing key"
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override '{err.override}': {first_line(err.message)}"
    if isinstance(err, ConfigCompositionException):
        cause = err.__cause__ or err.__context__
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and cause.full_key:
            return _unknown_key(str(cause.full_key), argv)
        if isinstance(cause, ConfigKeyError) and str(err).startswith("In '"):  # a config file's own key
            where = str(err).split("'")[1]
            return (f"{where}: {first_line(cause.msg)} (a config that extends a packaged schema takes only its keys; "
                    f"drop the schema from its defaults list to pass your class's own arguments)")
        if isinstance(cause, ValidationError) and cause.full_key and dataclasses.is_dataclass(cause.object_type):
            shown = "" if cause.value is None else f"={cause.value}"
            return f"{cause.full_key}{shown}: expected {expected_type(cause.object_type, str(cause.key))}"
        if isinstance(cause, OmegaConfBaseException):
            key = getattr(cause, "full_key", None)
            return f"{key}: {first_line(cause.msg)}" if key else first_line(str(cause))
        return first_line(str(err))
    return None


def exit_code(err: BaseException) -> int:
    """2 for bad input, 1 for a failure while running."""
    err = _refusal_inside(err)
    if isinstance(err, MazeCliError):
        return err.exit_code
    return 2 if isinstance(err, HYDRA_INPUT_ERRORS) else 1
