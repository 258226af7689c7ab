"""The package's layers: no module imports, at any depth or under TYPE_CHECKING, a module
that imports it back. Settings are the floor: they import nothing of the package but errors."""

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "collapsecheck"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                named |= {a.name for a in node.names}
        graph[name] = {m for m in named if m in modules and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_settings_are_the_floor():
    assert import_graph()["collapsecheck.settings"] <= {"collapsecheck.errors"}


ALLOWED_IN_MEASURES = {"collapsecheck.formatting", "collapsecheck.errors"}
PURE_LIBRARIES = {"numpy", "scipy", "pandas", "math", "itertools", "collections", "dataclasses",
                  "typing", "__future__"}  # fmt: skip


def imported_roots(path: Path) -> set[str]:
    """The top-level names of everything a module imports."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module)
        elif isinstance(node, ast.Import):
            roots |= {a.name for a in node.names}
    return roots


def test_the_measures_stage_is_pure_numpy_with_no_io_and_no_later_stage():
    """measures/ takes arrays: no torch, no files, nothing of the stages around it."""
    for path in sorted((PACKAGE / "measures").glob("*.py")):
        for name in imported_roots(path):
            if name.startswith("collapsecheck"):
                assert name.startswith("collapsecheck.measures") or name in ALLOWED_IN_MEASURES, (
                    f"{path.name} imports {name}"
                )
            else:
                assert name.split(".")[0] in PURE_LIBRARIES, f"{path.name} imports {name}"


LATER_STAGES = ("engines", "measures", "runs", "reports", "integrations", "cli")


def test_the_inputs_stage_imports_no_later_stage():
    """inputs/ is the first stage: a rollout reader needs nothing above it (issue 41)."""
    for path in sorted((PACKAGE / "inputs").rglob("*.py")):
        for name in imported_roots(path):
            stage = name.split(".")[1] if name.startswith("collapsecheck.") else None
            assert stage not in LATER_STAGES, f"{path.relative_to(ROOT)} imports {name}"


def test_the_run_api_is_where_it_was_before_the_stages():
    import collapsecheck
    import collapsecheck.runs

    assert collapsecheck.runs.scan_run is collapsecheck.scan_run
    assert collapsecheck.runs.score_run is collapsecheck.score_run
    assert callable(collapsecheck.runs.cached_scan)


MAX_FUNCTION_LINES = 60


def test_no_function_is_over_sixty_lines():
    """Small functions (issue 31): a long one is split where its stages are."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 60 lines: " + ", ".join(long)
