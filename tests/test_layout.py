"""DESIGN.md section 2: the packages and the one-way import rule between them.

`protocol` imports no project package; `engine`, `workloads` and `records` import only
`protocol`; `reports` imports `records` and `protocol`; `harness` may import all but
`training`; `training` imports `engine`, `workloads` and `protocol`. Every import counts,
also those inside functions.
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


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_modules_stay_small(pkg):
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them):\n" + "\n".join(long)
