"""A larger run directory made from a synthesized one in seconds: its parquet parts copied `factor` times.

    python benchmarks/scale_replicate.py RUN_DIR FACTOR OUT

Copy c of every part renames what makes a record distinct (`key`, `session_id` with `~c`, `input_hash` and the
stored prompts' hash through one mapping), so OUT holds FACTOR times the candidates, references and prompts,
all distinct, with the same tokens, classes and restore links. Stats records are kept once. For the
analyzer's CPU and memory at sizes benchmarks/scale_synth.py takes hours to write on a loaded machine; the
bytes on disk and the write time are the synthesized run's (each part compresses alone, as it would).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from records import layout as L  # noqa: E402
from records.compact import WRITE_OPTIONS  # noqa: E402


def _hash(h: str | None, copy: int) -> str | None:
    return h if h is None or copy == 0 else hashlib.sha256(f"{h}~{copy}".encode()).hexdigest()[:16]


def _renamed(table: pa.Table, copy: int) -> pa.Table:
    if copy == 0:
        return table
    for name in ("key", "session_id"):
        if name in table.column_names:
            col = table.column(name)
            table = table.set_column(table.column_names.index(name), name,
                                     pc.if_else(pc.is_null(col), col, pc.binary_join_element_wise(
                                         col, pa.scalar(f"~{copy}"), "")))
    if "input_hash" in table.column_names:
        hashes = [_hash(h, copy) for h in table.column("input_hash").to_pylist()]
        table = table.set_column(table.column_names.index("input_hash"), "input_hash", pa.array(hashes, pa.string()))
    return table


def replicate(run_dir: Path, factor: int, out: Path) -> None:
    """Write OUT: RUN_DIR's config and FACTOR renamed copies of each of its parts (see module doc)."""
    layout = L.scan(run_dir / "records")
    if layout.journals or layout.sealed:
        raise SystemExit(f"{run_dir}: compact it first (python -m records.compact {run_dir})")
    shutil.rmtree(out, ignore_errors=True)
    (out / "records").mkdir(parents=True)
    shutil.copy(run_dir / "config.json", out / "config.json")
    seq = 0
    for copy in range(factor):
        for _, part in layout.parts:
            seq += 1
            dest = L.part_dir(out / "records", seq)
            dest.mkdir()
            for f in sorted(part.glob("*.parquet")):
                if f.name.startswith("stats") and copy:
                    continue
                pf = pq.ParquetFile(f)
                writer = pq.ParquetWriter(dest / f.name, pf.schema_arrow, **WRITE_OPTIONS)
                for g in range(pf.num_row_groups):
                    writer.write_table(_renamed(pf.read_row_group(g), copy))
                meta = pf.metadata.metadata or {}
                writer.add_key_value_metadata({k.decode(): v.decode() for k, v in meta.items()
                                               if not k.startswith(b"ARROW")})
                writer.close()


if __name__ == "__main__":
    replicate(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
