"""docs/harness.md documents every flag `python -m harness.run --help` offers, once, in its Flags section."""

from __future__ import annotations

import re
from pathlib import Path

from harness.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "harness.md"


def documented_flags() -> list[str]:
    """The flags named in the first column of the Flags section's tables, in order."""
    text = DOC.read_text()
    section = text[text.index("## Flags\n"):]
    section = section[:section.index("\n## ", 1)]
    return [flag for row in re.findall(r"^\| `(--[a-z-]+)", section, re.M) for flag in [row]]


def help_flags() -> set[str]:
    return {opt for action in build_parser()._actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"}


def test_every_flag_of_help_is_documented_once():
    documented = documented_flags()
    missing = sorted(help_flags() - set(documented) - {"--model"})  # --model: the alias, on --model-path's row
    repeated = sorted({f for f in documented if documented.count(f) > 1})
    stale = sorted(set(documented) - help_flags())
    assert not missing, f"flags of --help missing from docs/harness.md's Flags section: {missing}"
    assert not repeated, f"flags documented more than once: {repeated}"
    assert not stale, f"documented flags that --help does not have: {stale}"
