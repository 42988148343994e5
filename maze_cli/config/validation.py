"""A config section checked against its schema (by pydantic) or against the signature of the class it
names, every failure turned into one line that names the key, what is allowed and, for a near miss,
the key that was meant."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
from typing import Any, Callable, Dict, List, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue
from pydantic import TypeAdapter, ValidationError

from maze_cli.errors import ConfigError, first_line

LIMIT_WORDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than_equal": ("le", "<="),
               "less_than": ("lt", "<")}


def suggest(key: str, candidates: list[str]) -> str:
    """' (did you mean X?)' for a near miss, else ''."""
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def validate_section(schema: type, values: DictConfig | Mapping[str, Any], prefix: str, what: str) -> Any:
    """`values` as an instance of the dataclass `schema`, its defaults filled in; or a ConfigError
    naming the first bad key (`prefix` is the section's dotted path, `what` its name in messages)."""
    names = [f.name for f in dataclasses.fields(schema)]
    for name in values:
        if name not in names:
            raise ConfigError(f"{prefix}{name}: unknown key{suggest(str(name), names)}; {what} takes: {', '.join(names)}")
    try:
        plain = OmegaConf.to_container(values, resolve=True, throw_on_missing=True) if isinstance(values, DictConfig) \
            else OmegaConf.to_container(OmegaConf.create(dict(values)), resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{prefix}{err.full_key}: a value is required") from None
    try:
        return _adapter(schema).validate_python(plain)
    except ValidationError as err:
        raise ConfigError(_one_line(err.errors()[0], schema, prefix)) from None


@functools.cache
def _adapter(schema: type) -> TypeAdapter:
    return TypeAdapter(schema)


def _one_line(error: Any, schema: type, prefix: str) -> str:
    """pydantic's first error as maze_cli's message: `<key>=<value>: <what is allowed>`."""
    parts = [str(p) for p in error["loc"] if not isinstance(p, int)]  # a list's index: the item is the value shown
    path, kind, value = ".".join(parts), error["type"], error.get("input")
    if kind == "unexpected_keyword_argument":  # a dataclass takes no key it does not declare
        section = _dataclass_at(schema, parts[:-1])
        known = [f.name for f in dataclasses.fields(section)] if section else []
        return f"{prefix}{path}: unknown key{suggest(parts[-1], known)}"
    if kind == "missing":
        return f"{prefix}{path}: a value is required"
    shown = "" if value is None else f"={value}"
    if kind in LIMIT_WORDS:
        name, word = LIMIT_WORDS[kind]
        return f"{prefix}{path}{shown}: must be {word} {error['ctx'][name]}"
    if kind == "one_of":
        return f"{prefix}{path}{shown}: must be one of {error['ctx']['choices']}"
    return f"{prefix}{path}{shown}: expected {expected_type(schema, path)}"


def _dataclass_at(schema: type, parts: list[str]) -> type | None:
    tp: Any = schema
    for part in parts:
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        tp = _unwrap_optional(hints.get(part))
    return tp if dataclasses.is_dataclass(tp) else None


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


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)][0]
        return f"{_type_name(inner)} or null"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, List):
        return f"a list of {_type_name(args[0]).removeprefix('an ').removeprefix('a ')}s"
    if origin in (dict, Dict):
        return f"a mapping of names to {_type_name(args[1]).removeprefix('an ').removeprefix('a ')}s, e.g. {{name: 1}}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


def keyword_arguments(obj: Callable) -> list[str] | None:
    """The arguments `obj` takes by name; None where it takes any (`**kwargs`) or has no signature to read."""
    try:
        parameters = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return [n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL and n != "self"]


def check_arguments(section: str, values: DictConfig | Mapping[str, Any], own: tuple[str, ...] = ()) -> None:
    """The class named by `_target_` exists and accepts every other key but `own` (keys maze_cli reads
    itself and does not pass), so a misspelt key fails before anything starts, not in a subprocess."""
    from hydra.utils import get_object

    target = values["_target_"]
    try:
        obj = get_object(target)
    except Exception as err:  # noqa: BLE001 - an import error of any kind is the user's to fix
        cause = err.__cause__ or err
        raise ConfigError(f"{section}._target_={target}: cannot import it ({type(cause).__name__}: {first_line(cause)})") from None
    names = keyword_arguments(obj)
    if names is None:
        return
    for key in values:
        if key != "_target_" and key not in names and key not in own:
            raise ConfigError(f"{section}.{key}: unknown key{suggest(str(key), names)}; {target} takes: {', '.join(names)}")
