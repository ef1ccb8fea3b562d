"""The README is for users: short, and every doc, image and command it points at exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_fits_a_few_screens_and_holds_no_history():
    assert len(README.splitlines()) < 150
    assert not re.search(r"\bissue \d+|#\d{3,}\b(?!7817)|\b[0-9a-f]{7,40}\b", README.replace("#37817", "")), \
        "issue numbers or commit hashes in README.md"


def test_every_path_the_readme_names_exists():
    named = set(re.findall(r"`((?:docs|harness|engine|tests|benchmarks|workloads)/[\w./-]+)`", README))
    named |= set(re.findall(r"\]\((docs/[\w./-]+)\)", README))
    assert named, "the README names no docs"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"
