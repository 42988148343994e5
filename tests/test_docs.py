"""The docs stay true to the code: the configuration reference is the one the schema generates, the
README is a front page whose set-up commands are the ones CI runs, and every page a link names exists."""

from __future__ import annotations

import difflib
import importlib.util
import re
import subprocess
import sys

import pytest

from tests.cli import REPO

README = REPO / "README.md"
REFERENCE_SCRIPT = REPO / "scripts" / "config_reference.py"
README_MAX_BYTES = 15_000


def _reference_module():
    spec = importlib.util.spec_from_file_location("config_reference", REFERENCE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there while they are defined
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_configuration_reference_is_the_one_the_schema_generates(tmp_path):
    """`scripts/config_reference.py --check`, run as a script from outside the checkout, as anyone
    with a fresh clone runs it: docs/reference/config.md must be what it would write."""
    result = subprocess.run([sys.executable, str(REFERENCE_SCRIPT), "--check"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return
    module = _reference_module()
    committed = module.PAGE.read_text().splitlines() if module.PAGE.is_file() else []
    diff = difflib.unified_diff(committed, module.render().splitlines(), "committed", "generated", lineterm="", n=1)
    pytest.fail(f"{result.stderr.strip()} (exit code {result.returncode})\n" + "\n".join(list(diff)[:80]))


def _readme_commands() -> list[str]:
    """The commands of the README's first code block, before any section."""
    text = README.read_text()
    block = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    assert block is not None, "the README starts with no ```bash block of set-up commands"
    assert "\n## " not in text[:block.start()], "the set-up commands come before the README's first section"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; move detail into docs/ (at most {README_MAX_BYTES:,})"


def test_the_readmes_test_command_is_the_one_ci_runs():
    commands = _readme_commands()
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if "-m pytest" in line]
    assert len(commands) >= 2 and len(ci) == 1
    assert commands[1] == ci[0]


def test_the_readmes_first_command_trains_with_no_extras():
    """A fresh machine trains CartPole after installing the package alone, without the dev extra."""
    first = _readme_commands()[0]
    install = re.search(r"pip install (.*?) &&", first)
    assert install is not None, first
    assert install.group(1).split()[-1] == ".", f"the first command installs extras: {install.group(1)}"
    assert first.endswith(".venv/bin/train +env=cartpole runner=subproc"), first


def _markdown_links(path) -> list[str]:
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()) if "://" not in target and not target.startswith("#")]


def test_the_readmes_links_lead_to_files():
    missing = [t for t in _markdown_links(README) if not (REPO / t.split("#")[0]).exists()]
    assert not missing


def test_every_docs_page_the_code_names_exists():
    """Comments and messages point readers at docs pages (`docs/benchmarks.md`): those pages exist."""
    named = set()
    for folder in ("maze_cli", "conf", "scripts", "benchmarks", ".ci"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yaml", ".md", "") and "__pycache__" not in path.parts:
                named |= {(m, path.relative_to(REPO)) for m in re.findall(r"\bdocs/[\w./-]+\.md\b", path.read_text(errors="ignore"))}
    missing = sorted(f"{page} (named in {source})" for page, source in named if not (REPO / page).is_file())
    assert not missing


def test_ci_has_what_the_docs_build_needs():
    """`.ci/run` builds the docs with the dev extra's packages, so the dev extra holds the docs extra."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["docs"]) <= set(extras["dev"])
    assert "mkdocs build --strict" in (REPO / ".ci" / "run").read_text()
