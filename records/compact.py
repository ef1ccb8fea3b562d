"""Compaction: journals into a parquet part, so that a kill at any instant loses and doubles nothing.

    python -m records.compact RUN_DIR     # converts a run directory's journals (an older run's too)

One compaction `seq` (records/layout.py names the files):
  1. seal: mkdir sealed-<seq>; each journal (fsynced, closed by its writer) is renamed into it; from
     here on new records go to fresh journals;
  2. build: .part-<seq>.tmp/ gets one parquet file per sealed journal (records/columns.py; streamed in
     row groups of bounded size) and prompts.parquet (the input ids of inputs no earlier part holds);
     every file fsynced;
  3. commit: rename .part-<seq>.tmp -> part-<seq> (atomic), fsync records/;
  4. clean: remove sealed-<seq>/.
The reader reads a sealed journal until its part is committed and never reads a tmp directory, so each
record is read from exactly one place at every instant. `recover` finishes what a killed compaction left:
it removes tmp directories and sealed directories whose part is committed, and builds the rest.
`hook(step)` is called before every step that changes the disk (tests kill the process there).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from records import layout as L
from records.columns import GENERIC_SCHEMA, PROMPT_SCHEMA, REQUEST_SCHEMA, generic_batch, to_batch
from records.journal import iter_jsonl, truncate_partial_line

FORMAT = "1"  # the parts' key-value metadata `specgate.records`
BATCH_ROWS, BATCH_BYTES = 4096, 8 << 20  # one row group: at most this many records / journal bytes (~50 MB of dicts)
_FLOAT_LISTS = ("output_logprobs", "top_logprobs")  # no dictionary: one of unique floats only costs
# LZ4: decoding is a render's largest cost, and a third cheaper than zstd's for ~20% more bytes (docs/records.md)
WRITE_OPTIONS = {"compression": "lz4"}
Hook = Callable[[str], None]


def _nohook(step: str) -> None:
    pass


def fingerprint(ids: list[int]) -> bytes:
    """16 bytes that tell two id lists apart (blake2b of their int32 bytes)."""
    return hashlib.blake2b(np.asarray(ids, dtype=np.int32).tobytes(), digest_size=16).digest()


class PromptStore:
    """The prompts committed parts hold: input_hash -> fingerprint of its input ids."""

    def __init__(self, record_dir: Path) -> None:
        self.known: dict[str, bytes] = {}
        for path in L.scan(record_dir).prompt_files():
            t = pq.read_table(path, columns=["input_hash", "fingerprint"])
            self.known.update(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


class _PartWriter:
    """The files of one part being built; prompts first seen in it are collected in `new`."""

    def __init__(self, tmp: Path, store: PromptStore) -> None:
        self.tmp, self.store = tmp, store
        self.new: dict[str, bytes] = {}
        self.prompt_rows: list[tuple[str, bytes, list[int]]] = []
        self.prompts: pq.ParquetWriter | None = None

    def inline_ids(self, rec: dict) -> bool:
        """False when the record's input ids are (or now become) its input_hash's stored prompt."""
        h, ids = rec.get("input_hash"), rec["input_ids"]
        if type(h) is not str:
            return True
        fp = fingerprint(ids)
        have = self.store.known.get(h) or self.new.get(h)
        if have is None:
            self.new[h] = fp
            self.prompt_rows.append((h, fp, ids))
            return False
        return have != fp  # another input under the same hash: kept with its record

    def flush_prompts(self) -> None:
        if not self.prompt_rows:
            return
        if self.prompts is None:
            self.prompts = pq.ParquetWriter(self.tmp / L.PROMPTS, PROMPT_SCHEMA, **WRITE_OPTIONS)
        h, fp, ids = zip(*self.prompt_rows, strict=True)
        self.prompts.write_batch(pa.RecordBatch.from_arrays(
            [pa.array(h, pa.string()), pa.array(fp, pa.binary()), pa.array(ids, pa.list_(pa.int32()))],
            schema=PROMPT_SCHEMA))
        self.prompt_rows = []


def _batches(journal: Path) -> Iterator[tuple[list[dict], list[str]]]:
    """The journal's records in bounded groups, with the corrupt lines ("file:line") met in each."""
    records, problems, size = [], [], 0
    for rec, problem, n in iter_jsonl(journal):
        if rec is not None:
            records.append(rec)
            size += n
        elif problem.startswith("corrupt:"):
            problems.append(problem.split(":", 1)[1])
        if len(records) >= BATCH_ROWS or size >= BATCH_BYTES:
            yield records, problems
            records, problems, size = [], [], 0
    if records or problems:
        yield records, problems


def _write_stem(journal: Path, out: Path, part: _PartWriter, hook: Hook) -> None:
    stem = journal.name[:-len(L.JOURNAL)]
    request = L.is_request_stem(stem)
    schema = REQUEST_SCHEMA if request else GENERIC_SCHEMA
    corrupt: list[str] = []
    writer = pq.ParquetWriter(out, schema, use_dictionary=[n for n in schema.names if n not in _FLOAT_LISTS],
                              **WRITE_OPTIONS)
    try:
        for i, (records, bad) in enumerate(_batches(journal)):
            corrupt += bad
            if not records:
                continue
            batch = to_batch(records, part.inline_ids) if request else generic_batch(records)
            part.flush_prompts()
            writer.write_batch(batch)
            hook(f"build:{stem}:batch{i}")
        # what the reader reports of the journal it replaces: its corrupt lines, by their journal line numbers
        writer.add_key_value_metadata({"specgate.records": FORMAT, "specgate.journal": journal.name,
                                       "specgate.corrupt": json.dumps(corrupt)})
    finally:
        writer.close()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(record_dir: Path, stems: list[str] | None = None, hook: Hook = _nohook) -> tuple[int, Path] | None:
    """Step 1: move the journals (of `stems`, default all) with records into a new sealed directory; returns
    its (seq, path), or None when there was nothing to seal. The journals' writers must be closed."""
    layout = L.scan(record_dir)
    journals = []
    for stem, p in layout.journals.items():
        if stems is None or stem in stems:
            truncate_partial_line(p)  # a killed writer's half line is no record: it is not carried over
            if p.stat().st_size > 0:
                journals.append(p)
    if not journals:
        return None
    seq = layout.next_seq
    sealed = L.sealed_dir(record_dir, seq)
    hook("seal:mkdir")
    sealed.mkdir()
    L.fsync_dir(record_dir)
    for p in journals:
        hook(f"seal:{p.name}")
        _fsync(p)
        os.rename(p, sealed / p.name)
    L.fsync_dir(sealed)
    L.fsync_dir(record_dir)
    return seq, sealed


def build(record_dir: Path, seq: int, sealed: Path, store: PromptStore, hook: Hook = _nohook) -> Path:
    """Steps 2-4 for sealed directory `seq`: write, commit and clean its part; returns the part's path."""
    tmp = L.tmp_dir(record_dir, seq)
    hook("build:start")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    part = _PartWriter(tmp, store)
    try:
        for journal in sorted(sealed.glob("*" + L.JOURNAL)):
            _write_stem(journal, tmp / (journal.name[:-len(L.JOURNAL)] + L.PARQUET), part, hook)
        part.flush_prompts()
    finally:
        if part.prompts is not None:
            part.prompts.close()
    hook("build:fsync")
    for p in tmp.iterdir():
        _fsync(p)
    L.fsync_dir(tmp)
    hook("commit")
    final = L.part_dir(record_dir, seq)
    os.rename(tmp, final)
    L.fsync_dir(record_dir)
    store.known.update(part.new)
    _remove(sealed, hook)
    L.fsync_dir(record_dir)
    return final


def _remove(sealed: Path, hook: Hook) -> None:
    for p in sorted(sealed.iterdir()):
        hook(f"clean:{p.name}")
        p.unlink()
    hook("clean:rmdir")
    sealed.rmdir()


def recover(record_dir: Path, store: PromptStore | None = None, hook: Hook = _nohook) -> list[Path]:
    """Finish what killed compactions left in `record_dir`; returns the parts it committed."""
    layout = L.scan(record_dir)
    for tmp in layout.tmps:
        hook(f"recover:rm {tmp.name}")
        shutil.rmtree(tmp)
    for sealed in layout.stale_sealed:
        _remove(sealed, hook)
    if not layout.sealed:
        return []
    store = store or PromptStore(record_dir)
    return [build(record_dir, seq, sealed, store, hook) for seq, sealed in layout.sealed]


def compact_run(run_dir: str | Path, hook: Hook = _nohook) -> list[Path]:
    """Recover, then compact every journal of a run directory (no writer may be running); returns new parts."""
    record_dir = Path(run_dir) / "records"
    if not record_dir.is_dir():
        return []
    store = PromptStore(record_dir)
    parts = recover(record_dir, store, hook)
    sealed = seal(record_dir, hook=hook)
    return parts + ([build(record_dir, *sealed, store, hook)] if sealed else [])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m records.compact RUN_DIR  (compacts its records/*.jsonl into parquet)",
              file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    if not (run_dir / "records").is_dir():
        print(f"error: {run_dir} has no records/ directory", file=sys.stderr)
        return 2
    from records.lock import RunLock, RunLocked

    try:
        with RunLock.acquire(run_dir, command="python -m records.compact"):
            parts = compact_run(run_dir)
    except RunLocked as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{run_dir}: {len(parts)} part(s) written" + (f": {', '.join(p.name for p in parts)}" if parts else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
