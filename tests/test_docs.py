"""The README's option tables state the defaults the schemas hold (the schemas are their one source)."""

from __future__ import annotations

import re

import pytest
import yaml

from maze_cli.config import schema
from tests.cli import REPO

SECTIONS = {
    "### Top level": schema.TrainConfig,
    "### `algorithm=impala`": schema.ImpalaConfig,
    "### `algorithm=ppo`": schema.PpoConfig,
    "### `algorithm=appo`": schema.AppoConfig,
    "### `algorithm=sac`": schema.SacConfig,
    "### `replay_buffer=uniform`": schema.PrioritizedReplayConfig,
    "### `policy=mlp`": schema.MlpPolicyConfig,
    "### `policy=cnn`": schema.CnnPolicyConfig,
    "### `runner=subproc`": schema.SubprocRunnerConfig,
    "### `runner=ray`": schema.RayRunnerConfig,
}


def default_of(config: type, dotted: str):
    value = config()
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def documented_defaults() -> list[tuple[str, str, str]]:
    """(section, key, default as written) for every row of the README's option tables."""
    rows, section = [], None
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("#"):
            section = next((s for s in SECTIONS if line.startswith(s)), None)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if section is None or len(cells) < 3 or not cells[0].startswith("`"):
            continue
        keys = re.findall(r"`([\w.]+)`", cells[0])
        written = re.sub(r"\s*\(.*\)$", "", cells[1]).replace(",000", "000")
        values = [written] if len(keys) == 1 else [v.strip() for v in written.split(",")]
        rows += [(section, key, value) for key, value in zip(keys, values)]
    return rows


ROWS = documented_defaults()


def test_every_documented_section_has_rows():
    assert {section for section, _, _ in ROWS} == set(SECTIONS)


@pytest.mark.parametrize("section,key,written", ROWS, ids=[f"{s.split('`')[1] if '`' in s else 'top'}:{k}" for s, k, _ in ROWS])
def test_the_readme_states_the_schema_default(section, key, written):
    expected = default_of(SECTIONS[section], key)
    stated = yaml.safe_load(written)
    if isinstance(expected, float) or isinstance(stated, float):
        assert float(stated) == pytest.approx(float(expected)), (key, written)
    else:
        assert stated == expected, (key, written)


def test_the_readme_states_every_trackers_defaults_as_its_yaml_file():
    """The `logger` options have no schema: their YAML files hold the defaults, the README repeats them."""
    rows = {}
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`logger\.\w+\.\w+`", cells[0]):
            rows[cells[0].strip("`")] = yaml.safe_load(cells[1])
    files = {}
    for path in (REPO / "conf" / "logger").glob("*.yaml"):
        for name, options in yaml.safe_load(path.read_text()).items():
            files |= {f"logger.{name}.{key}": value for key, value in options.items() if key != "_target_"}
    assert rows == files
