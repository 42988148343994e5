"""Write docs/reference/config.md, the configuration reference, from the schema and the packaged configs.

The page is generated, never edited by hand. Its sources are the ones `train` itself reads:

- maze_cli/config/schema.py and each algorithm's file (maze_cli/algorithms/, where its schema sits):
  every key's default, its type and limits (under `Annotated`) and its help (`key(default, help)`,
  maze_cli.config.fields);
- conf/train.yaml: which option of each group is the default;
- conf/<group>/<option>.yaml: each packaged option, the schema it extends and what it sets differently;
- conf/env/, conf/logger/ and conf/tuning/: their keys, values and YAML comments;
- the algorithm classes: what `null` becomes for `epoch_length`, `runner.envs_per_actor` and the policy.

A field added to a schema, or a YAML file added to conf/, appears on the page the next time it is written.

    python scripts/config_reference.py           # rewrite the page
    python scripts/config_reference.py --check   # exit 1 if the page differs from what would be written
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO))

from maze_cli.cli.settings import discover_components  # noqa: E402
from maze_cli.config import fields, schema  # noqa: E402

discover_components()  # the algorithms' schemas, registered by their files

PAGE = REPO / "docs" / "reference" / "config.md"
CONF = REPO / "conf"
GROUPS_WITHOUT_DEFAULT = {"env": "required: choose one with `+env=<name>`", "logger": "optional: `+logger=<name>` or `+logger=[a,b]`"}


# -- values, types and limits as the page shows them ---------------------------------------------------
def show(value: Any) -> str:
    """A value as it is written in YAML or on the command line."""
    if value is None:
        return "null"
    if value == "???":  # OmegaConf's mark of a value the user must give
        return "??? (required)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m.group(1) == '-' else ''}{m.group(2)}", repr(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin in (list, typing.List):
        return f"list of {type_name(args[0])}"
    if origin in (dict, typing.Dict):
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def limits(tp: Any) -> dict[str, Any]:
    """The limits a field's type carries under `Annotated` (of the type itself, or of an Optional's or a
    list's items): `gt`, `ge`, `le` and `choices`."""
    found: dict[str, Any] = {}
    if typing.get_origin(tp) is typing.Annotated:
        for mark in typing.get_args(tp)[1:]:
            if isinstance(mark, fields.OneOf):
                found["choices"] = mark.choices
            for name in ("gt", "ge", "le"):
                if hasattr(mark, name):
                    found[name] = getattr(mark, name)
        return found
    for arg in typing.get_args(tp):
        found.update(limits(arg))
    return found


def allowed(tp: Any) -> str:
    """`int >= 1`, `float > 0 or null`, `str: auto, fp32, ...`: the type and the field's limits."""
    bounds_of = limits(tp)
    name = type_name(tp)
    nullable = name.endswith(" or null")
    name = name.removesuffix(" or null")
    bounds = [f"{word} {show(bounds_of[op])}" for op, word in (("gt", ">"), ("ge", ">="), ("le", "<=")) if op in bounds_of]
    text = " ".join([name] + [", ".join(bounds)] if bounds else [name])
    if "choices" in bounds_of:
        text += ": " + ", ".join(show(c) for c in bounds_of["choices"])
    return text + (" or null" if nullable else "")


def cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped, angle brackets kept from being read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").strip() or "-"


def code(text: str) -> str:
    return f"`{text}`".replace("|", "\\|")


# -- the schema's keys ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Key:
    name: str  # dotted, as written on the command line
    default: Any
    allowed: str
    meaning: str
    changed_from: Any = None  # the schema's default where a packaged YAML file sets another
    changed: bool = False


def help_of(cls: type, name: str) -> str:
    """A key's help, from the most derived class that gives one (a subclass may change only the default)."""
    for klass in cls.__mro__:
        own = getattr(klass, "__dataclass_fields__", {}).get(name)
        if own is not None and own.metadata.get("description"):
            return own.metadata["description"]
    return ""


def schema_keys(cls: type, prefix: str = "", overrides: dict[str, Any] | None = None) -> list[Key]:
    """Every key of a schema dataclass, nested dataclasses expanded (`learner.precision`), with the
    defaults a packaged YAML file sets (`overrides`, dotted keys) in place of the schema's."""
    overrides = overrides or {}
    hints = typing.get_type_hints(cls, include_extras=True)
    keys: list[Key] = []
    for f in dataclasses.fields(cls):
        if f.name == "_target_":
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            keys += schema_keys(type(default), f"{prefix}{f.name}.", {k.removeprefix(f"{f.name}."): v for k, v in overrides.items()})
            continue
        key = Key(prefix + f.name, default, allowed(hints[f.name]), help_of(cls, f.name))
        if f.name in overrides and overrides[f.name] != default:
            key.changed, key.changed_from, key.default = True, default, overrides[f.name]
        keys.append(key)
    return keys


def keys_table(keys: list[Key]) -> list[str]:
    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for k in keys:
        default = code(show(k.default))
        if k.changed:
            default += f" (schema: {code(show(k.changed_from))})"
        rows.append(f"| {code(k.name)} | {default} | {cell(k.allowed)} | {cell(k.meaning)} |")
    return rows


# -- the packaged YAML files ------------------------------------------------------------------------------
@dataclasses.dataclass
class YamlFile:
    path: Path
    header: str  # the comment lines above the first key (`# @package` left out)
    values: dict[str, Any]  # every leaf, dotted (the `defaults` list left out)
    comments: dict[str, str]  # dotted key -> its comment (above it, or at the end of its line)
    defaults: list[Any]
    global_package: bool


def _comment_text(comment: str) -> str:
    return comment.lstrip("#").strip()


_KEY_LINE = re.compile(r"^(\s*)([^\s#:-][^:#]*?):(?:\s+|$)(.*)$")


def read_yaml(path: Path) -> YamlFile:
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    header: list[str] = []
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    seen_key = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("-"):  # a blank line or a list item (the defaults list)
            pending = []
            continue
        if stripped.startswith("#"):
            words = _comment_text(stripped)
            if words.startswith("@package"):
                continue
            (pending if seen_key else header).append(words)
            continue
        match = _KEY_LINE.match(line)
        if not match:
            pending = []
            continue
        seen_key = True
        indent, key, rest = len(match.group(1)), match.group(2).strip(), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        trailing = re.search(r"(?:^|\s)#\s?(.*)$", rest)
        words = pending + ([trailing.group(1).strip()] if trailing else [])
        if words:
            comments[".".join(k for _, k in stack)] = " ".join(words)
        pending = []
    return YamlFile(path, " ".join(header), flatten({k: v for k, v in data.items() if k != "defaults"}),
                    comments, list(data.get("defaults") or []), "@package _global_" in text)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def default_options() -> dict[str, str]:
    """group -> its default option, from conf/train.yaml's defaults list."""
    entries = read_yaml(CONF / "train.yaml").defaults
    return {group: option for entry in entries if isinstance(entry, dict) for group, option in entry.items()
            if isinstance(option, str) and (CONF / group).is_dir()}


def schema_of(group: str, config: YamlFile) -> type | None:
    """The registered schema a group's YAML file extends (`<option>_schema` in its defaults list)."""
    for entry in config.defaults:
        if isinstance(entry, str) and entry.endswith("_schema"):
            return schema.SCHEMAS[group][entry.removesuffix("_schema")]
    return None


def own_docstring(cls: type) -> str:
    """The class's docstring, if it wrote one (a dataclass without one gets its signature as docstring)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{cls.__name__}(") else inspect.cleandoc(doc)


def without_pointer(header: str) -> str:
    """A group YAML file's header without its sentence that points to the schema (this page shows the keys)."""
    return " ".join(s for s in re.split(r"(?<=\.)\s+", header) if not s.startswith("Keys and defaults"))


def paragraph(text: str) -> list[str]:
    return [text.replace("<", "&lt;"), ""] if text else []


# -- what null becomes, per algorithm ---------------------------------------------------------------------
def algorithm_choices() -> list[str]:
    """The algorithm classes' answers to the keys whose default is null: the algorithm's choice."""
    from hydra.utils import get_object

    rows = ["| algorithm | `epoch_length` | `runner.envs_per_actor` | `policy.*` |", "|---|---|---|---|"]
    for path in sorted((CONF / "algorithm").glob("*.yaml")):
        cls = schema_of("algorithm", read_yaml(path))
        if cls is None:
            continue
        algorithm = get_object(next(f.default for f in dataclasses.fields(cls) if f.name == "_target_"))
        network = ", ".join(f"{k}: {show(v)}" for k, v in algorithm.network_defaults.items())
        rows.append(f"| `algorithm={path.stem}` | {algorithm.epoch_length} | {algorithm.envs_per_actor} | {cell(network)} |")
    return rows


# -- the page ---------------------------------------------------------------------------------------------
def top_level() -> list[str]:
    lines = ["## Top level (`conf/train.yaml`)", "",
             f"{cell(inspect.getdoc(schema.TrainConfig) or '')} Set them as `key=value`, nested ones as "
             "`learner.precision=bf16`. Schema: `TrainConfig` and the dataclasses it nests.", ""]
    lines += keys_table(schema_keys(schema.TrainConfig))
    lines += ["", "### What `null` becomes", "",
              "Keys whose default is `null`, \"the algorithm's choice\", take these values from the algorithm's class:", ""]
    lines += algorithm_choices()
    return lines + [""]


def group_section(group: str, default: str | None) -> list[str]:
    lines = [f"## `{group}`", ""]
    options = sorted((CONF / group).glob("*.yaml"), key=lambda p: (p.stem != default, p.stem))
    names = ", ".join(f"`{p.stem}`" + (" (default)" if p.stem == default else "") for p in options)
    lines += [f"Options: {names}. Choose one with `{group}=<option>`.", ""]
    for path in options:
        config = read_yaml(path)
        cls = schema_of(group, config)
        lines += [f"### `{group}={path.stem}`", ""]
        if cls is None:  # an option with no registered schema: its YAML holds its keys
            lines += paragraph(config.header) + [f"Builds `{config.values.get('_target_', '?')}`.", ""]
            lines += yaml_table({k: v for k, v in config.values.items() if k != "_target_"}, config.comments, f"{group}.")
            lines.append("")
            continue
        target = next(f.default for f in dataclasses.fields(cls) if f.name == "_target_")
        lines += paragraph(own_docstring(cls) or without_pointer(config.header))
        lines += [f"Builds `{target}`; schema `{cls.__name__}` ({cls.__module__}), file `conf/{group}/{path.name}`.", ""]
        overrides = {k: v for k, v in config.values.items() if k != "_target_"}
        lines += keys_table(schema_keys(cls, f"{group}.", overrides)) + [""]
    return lines


def yaml_table(values: dict[str, Any], comments: dict[str, str], prefix: str = "", fallback=None) -> list[str]:
    rows = ["| key | value | meaning |", "|---|---|---|"]
    for key, value in values.items():
        meaning = comments.get(key) or (fallback(prefix + key) if fallback else "") or ""
        rows.append(f"| {code(prefix + key)} | {code(show(value))} | {cell(meaning)} |")
    return rows


@functools.lru_cache(maxsize=None)
def _schema_meanings() -> dict[str, str]:
    """Dotted key -> meaning for the top-level keys and the keys of every packaged group option, so that a
    YAML file setting a schema key without a comment of its own still says what the key is."""
    meanings = {k.name: k.meaning for k in schema_keys(schema.TrainConfig)}
    for group, options in schema.SCHEMAS.items():
        for cls in options.values():
            for k in schema_keys(cls, f"{group}."):
                meanings.setdefault(k.name, k.meaning)
    return meanings


def env_section() -> list[str]:
    from maze_cli.envs import keys

    lines = ["## `env` (required: `+env=<name>`)", "",
             "The packaged env configs (`conf/env/`). Each is a `# @package _global_` file: besides `env.*` it "
             "may set top-level keys and choose other groups' options. Your own: a YAML file in `--config-dir` "
             "(see [Envs](../envs.md)).", "",
             "Every key below is set as `env.<key>=<value>` on any env config, whether or not its file has the "
             "key. Any other key of a `_target_` env config is an argument of that callable; an `id` config takes "
             "these alone. [Envs](../envs.md) says more of each.", "",
             "| key | default | with | meaning |", "|---|---|---|---|"]
    with_ = {"id": "`env.id`", "any": "either kind", "multiagent": "a PettingZoo `_target_`"}
    for key, spec in keys.ENV_KEYS.items():
        if spec.kind != "internal":
            lines.append(f"| `env.{key}` | {code(show(spec.default))} | {with_[spec.kind]} | {cell(spec.help)} |")
    lines.append("")
    for path in sorted((CONF / "env").glob("*.yaml")):
        config = read_yaml(path)
        lines += [f"### `+env={path.stem}`", ""] + paragraph(config.header)
        chosen = [f"`{k.split('/')[-1]}={v}`" for entry in config.defaults if isinstance(entry, dict) for k, v in entry.items()]
        if chosen:
            lines += ["Chooses " + ", ".join(chosen) + ".", ""]
        values = config.values if config.global_package else {f"env.{k}": v for k, v in config.values.items()}
        comments = config.comments if config.global_package else {f"env.{k}": v for k, v in config.comments.items()}
        lines += yaml_table(values, comments, fallback=_schema_meanings().get) + [""]
    return lines


def logger_section() -> list[str]:
    lines = ["## `logger` (optional: `+logger=<name>`, `+logger=[mlflow,wandb]`)", "",
             "TensorBoard and `stats.jsonl` are always written; each tracker is one more writer of the same epoch "
             "stats. Each is an optional extra, imported only when chosen.", ""]
    for path in sorted((CONF / "logger").glob("*.yaml")):
        config = read_yaml(path)
        lines += [f"### `+logger={path.stem}`", ""] + paragraph(config.header)
        values = {k: v for k, v in config.values.items() if not k.endswith("._target_")}
        targets = [v for k, v in config.values.items() if k.endswith("._target_")]
        lines += [f"Builds `{targets[0]}`.", ""] if targets else []
        lines += yaml_table({f"logger.{k}": v for k, v in values.items()}, {f"logger.{k}": v for k, v in config.comments.items()})
        lines.append("")
    return lines


def callbacks_section() -> list[str]:
    from maze_cli import callbacks

    lines = ["## `callbacks` (optional: `+callbacks.<name>._target_=<class>`, `+callbacks=<name>`)", "",
             "Each `callbacks.<name>` builds its `_target_` class with its other keys as arguments; hooks (each "
             "optional): " + ", ".join(f"`{hook}`" for hook in callbacks.HOOKS) + ". No packaged callbacks: a YAML file "
             "`callbacks/<name>.yaml` in `--config-dir` holds `<name>: {_target_: ..., ...}`. "
             "[Your own components](../components.md#code-at-every-epochs-end) says when each hook is called.", ""]
    return lines


def tuning_values(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """What a tuning file sets, the files it includes (its defaults list) first."""
    config = read_yaml(path)
    values: dict[str, Any] = {}
    comments: dict[str, str] = {}
    for entry in config.defaults:
        if isinstance(entry, str) and (path.parent / f"{entry}.yaml").is_file():
            included, notes = tuning_values(path.parent / f"{entry}.yaml")
            values |= included
            comments |= notes
    return values | config.values, comments | config.comments


def tuning_section() -> list[str]:
    lines = ["## Tuning files (`conf/tuning/<env>_<algorithm>.yaml`)", "",
             "Settings for one pair of env and algorithm, picked by themselves for that pair only (the "
             "`optional tuning: ${env}_${algorithm}` entry of `conf/train.yaml`); the command line still "
             "overrides them. Any other pair gets the algorithm's own defaults.", "",
             "| file | picked for | sets | why |", "|---|---|---|---|"]
    for path in sorted((CONF / "tuning").glob("*.yaml")):
        env, _, algorithm = path.stem.rpartition("_")
        values, comments = tuning_values(path)
        sets = ", ".join(code(f"{k}={show(v)}") for k, v in values.items())
        why = read_yaml(path).header
        notes = "; ".join(f"`{k}`: {v}" for k, v in comments.items())
        lines.append(f"| `{path.name}` | `+env={env} algorithm={algorithm}` | {sets} | {cell(' '.join(p for p in (why, notes) if p))} |")
    return lines + [""]


def render() -> str:
    defaults = default_options()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/config_reference.py from the schemas (maze_cli/config/schema.py, maze_cli/algorithms/) "
        "and conf/: do not edit "
        "by hand; run `python scripts/config_reference.py` after changing them. -->",
        "",
        "Every key `train` takes, with its default and meaning. Set any of them on the command line "
        "(`key=value`); choose a group's option with `group=option`. Types and limits are checked before "
        "anything starts: a bad value ends in one line naming the key and what is allowed. "
        "`train +env=cartpole --cfg job` prints the composed config of a command.",
        "",
        "This page is generated from the schemas (`maze_cli/config/schema.py`, and each algorithm's own in its "
        "file in `maze_cli/algorithms/`: defaults, limits and the comment beside each field) and the packaged "
        "YAML files in `conf/`.",
        "",
        "Groups: " + ", ".join(f"`{g}` ({GROUPS_WITHOUT_DEFAULT.get(g) or f'default `{defaults[g]}`'})"
                               for g in ["env", *schema.SCHEMAS, "logger"]) + ".",
        "",
    ]
    lines += top_level()
    for group in schema.SCHEMAS:
        lines += group_section(group, defaults.get(group))
    lines += env_section() + logger_section() + callbacks_section() + tuning_section()
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale, without writing it")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(REPO)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
