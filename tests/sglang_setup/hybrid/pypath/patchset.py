"""One patch set per SGLang release: unified diffs against the release's own files, applied in memory.

Test setup only (docs/gate-sglang.md, section 5); the product never imports it, and nothing in a venv is edited.
`patches/<release>/*.diff` is the set that lets that release serve a tiny Qwen3-Next with DFLASH + extra_buffer
on CPU; `patches/<release>/fix-*.diff` are upstream fixes applied on top only when asked (SPECGATE_SGLANG_FIXES,
e.g. `pr37818`), so one venv serves a release with and without the fix. `make sglang SGLANG_VERSION=V` checks
that every hunk of V's set applies to the installed files (`venv.py patches V`); at run time the import hook
(hybrid_hook.py) applies them to each module's source as it is imported.

A hunk applies where its context and removed lines stand exactly (no fuzz), at its line number or the nearest
offset; anything else is a PatchError naming the release, the diff, the file and the hunk. Standard library only:
it runs inside SGLang's processes and under the venv's interpreter while `make sglang` builds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PATCHES = Path(__file__).resolve().parent.parent / "patches"
FIX_PREFIX = "fix-"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(RuntimeError):
    """A patch set that does not apply, or that is missing; the message says which release, diff and hunk."""


@dataclass(frozen=True)
class Hunk:
    """One hunk: where it says it starts (1-based, in the file before it), the lines it expects and writes."""

    header: str
    start: int
    old: tuple[str, ...]  # context and removed lines, newline-terminated
    new: tuple[str, ...]  # context and added lines


@dataclass(frozen=True)
class FilePatch:
    """The hunks one diff makes to one file (`path`: relative to site-packages, e.g. sglang/srt/x.py)."""

    diff: str  # the diff's file name, for messages
    path: str
    hunks: tuple[Hunk, ...]

    @property
    def module(self) -> str:
        """The module the file defines (`sglang/srt/x.py` -> `sglang.srt.x`; a package's `__init__.py` -> it)."""
        parts = self.path[: -len(".py")].split("/")
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse_diff(text: str, name: str) -> list[FilePatch]:
    """The file patches of a unified diff (`--- a/PATH`, `+++ b/PATH`, `@@` hunks)."""
    out: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"{name}: a '--- ' line without its '+++ ' line at line {i + 1}")
        path = lines[i + 1][4:].split("\t")[0].strip()
        path = path[2:] if path.startswith("b/") else path
        i += 2
        hunks = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise PatchError(f"{name}: {path}: malformed hunk header {lines[i].strip()!r}")
            header, old_n = lines[i].strip(), int(m.group(2) or 1)
            new_n = int(m.group(4) or 1)
            old, new = [], []
            i += 1
            while len(old) < old_n or len(new) < new_n:
                if i >= len(lines):
                    raise PatchError(f"{name}: {path}: hunk {header} ends early")
                if lines[i].startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                line = " \n" if lines[i] == "\n" else lines[i]  # an empty context line, whitespace stripped
                tag, body = line[:1], line[1:] if line.endswith("\n") else line[1:] + "\n"
                if tag == " ":
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                else:
                    raise PatchError(f"{name}: {path}: hunk {header}: unexpected line {lines[i]!r}")
                i += 1
            hunks.append(Hunk(header, int(m.group(1)), tuple(old), tuple(new)))
        out.append(FilePatch(name, path, tuple(hunks)))
    return out


def apply(source: str, patch: FilePatch, release: str) -> str:
    """`source` with every hunk of `patch` applied in order; PatchError naming the first hunk that does not."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    shift = 0
    for hunk in patch.hunks:
        want = hunk.start - 1 + shift
        at = _find(lines, hunk.old, want)
        if at is None:
            raise PatchError(f"SGLang {release}: {patch.diff}: {patch.path}: hunk {hunk.header} does not apply (its "
                             f"context and removed lines are not in the installed file); first expected line: "
                             f"{(hunk.old or ('',))[0].rstrip()!r}")
        lines[at:at + len(hunk.old)] = list(hunk.new)
        shift = at - (hunk.start - 1) + len(hunk.new) - len(hunk.old)
    return "".join(lines)


def _find(lines: list[str], block: tuple[str, ...], want: int) -> int | None:
    """The start nearest to `want` where `block` stands in `lines` exactly."""
    n = len(block)
    for delta in range(len(lines) + 1):
        for at in (want - delta, want + delta) if delta else (want,):
            if 0 <= at <= len(lines) - n and tuple(lines[at:at + n]) == block:
                return at
    return None


def releases() -> list[str]:
    """The releases that have a patch set."""
    return sorted(p.name for p in PATCHES.iterdir() if p.is_dir() and any(p.glob("*.diff")))


def fixes(release: str) -> list[str]:
    """The upstream fixes that can be applied on top of `release` (`fix-pr37818.diff` -> `pr37818`)."""
    return sorted(p.stem[len(FIX_PREFIX):] for p in (PATCHES / release).glob(f"{FIX_PREFIX}*.diff"))


def patch_set(release: str, with_fixes: tuple[str, ...] = ()) -> list[FilePatch]:
    """The release's set (its diffs in name order), then the fixes asked for; PatchError when either is missing."""
    folder = PATCHES / release
    if not folder.is_dir():
        raise PatchError(f"SGLang {release}: no hybrid patch set (tests/sglang_setup/hybrid/patches has "
                         f"{', '.join(releases()) or 'none'}); port one from the nearest release")
    diffs = sorted(p for p in folder.glob("*.diff") if not p.name.startswith(FIX_PREFIX))
    for fix in with_fixes:
        path = folder / f"{FIX_PREFIX}{fix}.diff"
        if not path.is_file():
            raise PatchError(f"SGLang {release}: no fix {fix!r} (available: {', '.join(fixes(release)) or 'none'})")
        diffs.append(path)
    return [fp for d in diffs for fp in parse_diff(d.read_text(), d.name)]


def by_module(patches: list[FilePatch]) -> dict[str, list[FilePatch]]:
    """The file patches grouped by the module they change, in application order."""
    out: dict[str, list[FilePatch]] = {}
    for fp in patches:
        out.setdefault(fp.module, []).append(fp)
    return out


def check(release: str, site: Path, with_fixes: tuple[str, ...] | None = None) -> list[str]:
    """Apply the release's set (and, by default, every fix it has) to the files under `site` in memory; the
    problems found (empty: every hunk applies)."""
    problems = []
    wanted = tuple(fixes(release)) if with_fixes is None else with_fixes
    try:
        patches = patch_set(release, wanted)
    except PatchError as e:
        return [str(e)]
    for module, fps in by_module(patches).items():
        path = site / fps[0].path
        if not path.is_file():
            problems.append(f"SGLang {release}: {fps[0].diff}: {fps[0].path} is not installed ({module})")
            continue
        text = path.read_text()
        for fp in fps:
            try:
                text = apply(text, fp, release)
            except PatchError as e:
                problems.append(str(e))
                break
    return problems
