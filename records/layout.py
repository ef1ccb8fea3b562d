"""What a run's `records/` directory holds (docs/records.md, "At rest"), named and listed in one place.

    <stem>.jsonl              the journal of one pool (candidate-<pool>, reference, stats): appended to
    sealed-<seq>/<stem>.jsonl journals moved aside by compaction <seq>, until its part is committed
    part-<seq>/<stem>.parquet the records compaction <seq> took from each sealed journal, in journal order
    part-<seq>/prompts.parquet the input ids of every distinct input first seen in that compaction
    .part-<seq>.tmp/          a part being written (never read; removed by recovery)

A part is committed by one rename (.part-<seq>.tmp -> part-<seq>), after which its sealed journals are
garbage. The records of a stem, in the order they were written: its parts by seq, then the journals of
sealed directories whose part is not committed, by seq, then its journal.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

JOURNAL = ".jsonl"
PARQUET = ".parquet"
PROMPTS = "prompts" + PARQUET
_SEQ = re.compile(r"^(part|sealed)-(\d{6})$")
_TMP = re.compile(r"^\.part-(\d{6})\.tmp$")


def part_dir(record_dir: Path, seq: int) -> Path:
    return record_dir / f"part-{seq:06d}"


def sealed_dir(record_dir: Path, seq: int) -> Path:
    return record_dir / f"sealed-{seq:06d}"


def tmp_dir(record_dir: Path, seq: int) -> Path:
    return record_dir / f".part-{seq:06d}.tmp"


def is_request_stem(stem: str) -> bool:
    """Candidate and reference journals hold request records (typed columns); others (stats) JSON rows."""
    return stem.startswith("candidate-") or stem == "reference"


@dataclass(frozen=True)
class Layout:
    """One listing of a records directory."""

    record_dir: Path
    parts: list[tuple[int, Path]] = field(default_factory=list)  # committed, by seq
    sealed: list[tuple[int, Path]] = field(default_factory=list)  # not committed yet, by seq
    stale_sealed: list[Path] = field(default_factory=list)  # their part is committed: garbage
    tmps: list[Path] = field(default_factory=list)  # parts being (or left half) written: garbage
    journals: dict[str, Path] = field(default_factory=dict)  # stem -> its journal

    @property
    def next_seq(self) -> int:
        seqs = [s for s, _ in self.parts + self.sealed] + [int(_TMP.match(p.name)[1]) for p in self.tmps]
        seqs += [int(_SEQ.match(p.name)[2]) for p in self.stale_sealed]
        return max(seqs, default=0) + 1

    def stems(self) -> list[str]:
        """Every stem with records anywhere, in the order the reader visits them (by journal file name)."""
        names = set(self.journals)
        for _, d in self.parts:
            names |= {p.name[:-len(PARQUET)] for p in _files(d, PARQUET) if p.name != PROMPTS}
        for _, d in self.sealed:
            names |= {p.name[:-len(JOURNAL)] for p in _files(d, JOURNAL)}
        return sorted(names, key=lambda s: s + JOURNAL)

    def sources(self, stem: str) -> list[Path]:
        """The files holding `stem`'s records, oldest first: part parquet files, sealed journals, the journal."""
        out = [d / (stem + PARQUET) for _, d in self.parts if (d / (stem + PARQUET)).is_file()]
        out += [d / (stem + JOURNAL) for _, d in self.sealed if (d / (stem + JOURNAL)).is_file()]
        if stem in self.journals:
            out.append(self.journals[stem])
        return out

    def prompt_files(self) -> list[Path]:
        return [d / PROMPTS for _, d in self.parts if (d / PROMPTS).is_file()]


def _files(d: Path, suffix: str) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.name.endswith(suffix) and p.is_file())
    except FileNotFoundError:
        return []


def scan(record_dir: str | Path) -> Layout:
    """List `record_dir` (an absent directory holds nothing)."""
    record_dir = Path(record_dir)
    layout = Layout(record_dir)
    try:
        entries = sorted(os.scandir(record_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return layout
    committed = set()
    sealed = []
    for e in entries:
        if e.is_file() and e.name.endswith(JOURNAL):
            layout.journals[e.name[:-len(JOURNAL)]] = Path(e.path)
        elif e.is_dir() and (m := _SEQ.match(e.name)):
            if m[1] == "part":
                layout.parts.append((int(m[2]), Path(e.path)))
                committed.add(int(m[2]))
            else:
                sealed.append((int(m[2]), Path(e.path)))
        elif e.is_dir() and _TMP.match(e.name):
            layout.tmps.append(Path(e.path))
    for seq, path in sealed:
        (layout.stale_sealed.append(path) if seq in committed else layout.sealed.append((seq, path)))
    return layout


def fsync_dir(path: Path) -> None:
    """Make a rename or an unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
