"""DESIGN.md section 2: the packages and the one-way import rule between them.

`protocol` imports no project package; `engine`, `workloads` and `records` import only
`protocol`; `reports` imports `records` and `protocol`; `harness` may import all but
`training`; `training` imports `engine`, `workloads` and `protocol`. Every import counts,
also those inside functions. Within every package (the scripts of `benchmarks/` and the tests
included), no module imports itself back through others (an import circle), counting every
import: inside functions and under `if TYPE_CHECKING:` too, since a reader follows those as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "protocol": set(),
    "engine": {"protocol"},
    "workloads": {"protocol"},
    "records": {"protocol"},
    "reports": {"records", "protocol"},
    "harness": {"protocol", "engine", "workloads", "records", "reports"},
    "training": {"engine", "workloads", "protocol"},
}
CIRCLE_FREE = (*ALLOWED, "benchmarks", "tests")  # packages (and script folders) checked for import circles
MAX_MODULE_LINES = 300


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level project package) of every import in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n.split(".")[0]) for n in names if n.split(".")[0] in ALLOWED]
    return found


def violations(root: Path = ROOT) -> list[str]:
    """`file:line: pkg imports other` for every import against the rule."""
    out = []
    for pkg, allowed in ALLOWED.items():
        for path in sorted((root / pkg).rglob("*.py")):
            for line, target in project_imports(path):
                if target != pkg and target not in allowed:
                    out.append(f"{path.relative_to(root)}:{line}: {pkg} imports {target} "
                               f"(allowed: {', '.join(sorted(allowed)) or 'nothing'})")
    return out


def import_graph(root: Path, pkg: str) -> dict[str, set[str]]:
    """Module -> the modules of `pkg` it imports: `import a.b` and `from a.b import c` are edges to the module
    `a.b`, or to `a.b.c` where that is a module itself (parent packages are not counted). In a folder of scripts
    (no `__init__.py`: benchmarks/) a script imports its neighbours by their bare names."""
    files = {}
    for path in sorted((root / pkg).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    scripts = not (root / pkg / "__init__.py").exists()
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph[module] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from this module's package, `level - 1` packages up
                    parts = module.split(".")[:len(module.split(".")) - node.level + is_package]
                    base = ".".join(parts + ([base] if base else []))
                edges |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        if scripts:
            edges |= {f"{pkg}.{e}" for e in edges if f"{pkg}.{e}" in files}
        edges &= set(files) - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), as `[a, b, ..., a]`, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_circle(graph, g) for g in groups)


def _circle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest circle through the group's first module, for the message."""
    start, paths = group[0], {group[0]: [group[0]]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & set(group)):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start}")


def test_every_package_exists():
    assert all((ROOT / pkg / "__init__.py").is_file() for pkg in ALLOWED)


def test_imports_follow_the_data_flow():
    bad = violations()
    assert not bad, "imports against DESIGN.md section 2:\n" + "\n".join(bad)


def test_the_rule_catches_a_backward_import(tmp_path):
    """The checker itself: a workloads module importing the engine is reported with its line."""
    for pkg in ALLOWED:
        (tmp_path / pkg).mkdir()
    (tmp_path / "workloads" / "bad.py").write_text("import json\n\n\ndef f():\n    from engine.x import y\n")
    (tmp_path / "harness" / "ok.py").write_text("from reports.gate import EXIT_PASS\nimport training.loop\n")
    assert violations(tmp_path) == [
        "workloads/bad.py:5: workloads imports engine (allowed: protocol)",
        "harness/ok.py:2: harness imports training (allowed: engine, protocol, records, reports, workloads)",
    ]


@pytest.mark.parametrize("pkg", CIRCLE_FREE)
def test_no_import_circles(pkg):
    circles = import_cycles(import_graph(ROOT, pkg))
    assert not circles, "import circles (move the shared part down into a module both import):\n" + "\n".join(
        " -> ".join(c) for c in circles)


def test_the_circle_check_sees_imports_inside_functions_and_for_type_checking(tmp_path):
    """The checker itself: a circle closed by an import inside a function, one through a package's `__init__`,
    and one closed by an import for type checking only are all found."""
    pkg = tmp_path / "harness"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from harness.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from harness import a\n")
    (pkg / "sub" / "__init__.py").write_text("from harness.sub.c import y\n")
    (pkg / "sub" / "c.py").write_text("from harness.sub import z\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.d import T\n")
    (pkg / "d.py").write_text("from harness import typed\n")
    assert import_cycles(import_graph(tmp_path, "harness")) == [
        ["harness.a", "harness.b", "harness.a"], ["harness.d", "harness.typed", "harness.d"],
        ["harness.sub", "harness.sub.c", "harness.sub"]]


@pytest.mark.parametrize("pkg", CIRCLE_FREE)
def test_a_circle_planted_in_any_package_fails_the_check(tmp_path, pkg):
    """Each checked package, copied, then given two modules that import each other (one inside a function, as
    scripts of a folder without `__init__.py` import their neighbours by bare name): the check names them."""
    import shutil

    shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "weights"))
    scripts = not (tmp_path / pkg / "__init__.py").exists()
    first, second = ("planted_a", "planted_b") if scripts else (f"{pkg}.planted_a", f"{pkg}.planted_b")
    (tmp_path / pkg / "planted_a.py").write_text(f"import {second}\n")
    (tmp_path / pkg / "planted_b.py").write_text(f"def f():\n    from {first} import x\n")
    assert [f"{pkg}.planted_a", f"{pkg}.planted_b", f"{pkg}.planted_a"] in import_cycles(import_graph(tmp_path, pkg))


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_modules_stay_small(pkg):
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them):\n" + "\n".join(long)
