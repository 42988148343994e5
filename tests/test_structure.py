"""How the package is put together: no import circle between its packages, no objective that reaches
into its learner, modules of one job each. Read from the source with `ast`, so each check names the
file and line that break it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "maze_cli"
MAX_LINES = 400


def _node(module: str) -> str:
    """A subpackage (maze_cli.envs) or a module of the package's root (maze_cli.learner)."""
    return ".".join(module.split(".")[:2])


def _imports() -> dict[tuple[str, str], list[str]]:
    """Every import of maze_cli by maze_cli, module-level, function-level and TYPE_CHECKING alike:
    {(importing node, imported node): ["file:line", ...]}."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("maze_cli."):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("maze_cli.")]
            else:
                continue
            for name in names:
                if _node(module) != _node(name):
                    edges[(_node(module), _node(name))].append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return edges


def _circles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_packages():
    edges = _imports()
    circles = _circles(edges)
    where = [f"{a} -> {b} ({edges[(a, b)][0]})" for circle in circles for a in circle for b in circle if (a, b) in edges]
    assert not circles, "import circles: " + "; ".join(where)


def test_the_circle_check_finds_a_circle():
    assert _circles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [["a", "b", "c"]]


def test_no_objective_reaches_into_its_learner():
    """An update reads what it needs from its UpdateContext (maze_cli.contract), never from a learner it holds."""
    offending = [f"{path.relative_to(PACKAGE)}:{n}" for path in (PACKAGE / "algorithms").rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if "self.learner" in line]
    assert not offending, offending


def test_modules_hold_one_job_each_none_over_400_lines():
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, over
