"""Are two runs' outputs identical? Compares output_ids per record key (candidates and references).

Used to show that a performance change left every output unchanged: run the same
suite with the same flags before and after, then

    python benchmarks/compare_runs.py RUN_DIR_BEFORE RUN_DIR_AFTER

Prints the number of records compared and every difference (missing keys, errors,
differing output ids with the first differing position); exits 0 when identical,
1 on any difference, 2 when a run directory holds no records.
"""

from __future__ import annotations

import argparse
import sys

from records.jsonl import load_run


def outputs(run_dir: str) -> dict[str, tuple]:
    """key -> (error, output_ids) for every candidate and reference record of the run."""
    run = load_run(run_dir)
    if run.empty:
        raise SystemExit(f"{run_dir}: no records (expected RUN_DIR/records/*.jsonl)")
    out = {c["key"]: (c["error"], c["output_ids"]) for c in run.candidates}
    out.update({r["key"]: (r["error"], r["output_ids"]) for r in run.references.values()})
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    """The first index where a and b differ (the shorter length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare(a: dict[str, tuple], b: dict[str, tuple]) -> list[str]:
    """One line per difference between two runs' outputs (empty: identical)."""
    lines = [f"only in A: {k}" for k in sorted(a.keys() - b.keys())]
    lines += [f"only in B: {k}" for k in sorted(b.keys() - a.keys())]
    for k in sorted(a.keys() & b.keys()):
        (ea, oa), (eb, ob) = a[k], b[k]
        if ea != eb:
            lines.append(f"{k}: error {ea!r} vs {eb!r}")
        elif oa != ob:
            lines.append(f"{k}: output_ids differ at token {first_difference(oa, ob)} (lengths {len(oa)}, {len(ob)})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    args = ap.parse_args()
    try:
        a, b = outputs(args.run_a), outputs(args.run_b)
    except SystemExit as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    diffs = compare(a, b)
    for line in diffs:
        print(line)
    print(f"{len(a.keys() & b.keys())} records compared ({len(a)} in A, {len(b)} in B): "
          + ("identical" if not diffs else f"{len(diffs)} differences"))
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
