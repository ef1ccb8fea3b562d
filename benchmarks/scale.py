"""Scale (issue 29): records, render, resume and driver memory at 1k-100k candidates and ~37 / 1,000 output tokens.

    python benchmarks/scale.py --source /tmp/scale-src/src --source /tmp/scale-src/fault \
        [--sizes 1000,10000,100000] [--tokens 0,1000] [--work DIR] [--keep] [--max-rss-gb 8] [--max-disk-gb 12]
        [--before DIR] [--no-render] [--no-driver]
    python benchmarks/scale.py _hwm _analyze RUN_DIR   # one child on a given run (e.g. scale_replicate.py's)
    python benchmarks/scale.py sse [--mb 1,2,4] [--chunk 1024]     # the SSE reader on one large event

Make the sources first (real runs of the built-in engine):
    python -m harness.run --intervals 128 --concurrency 4 --runs-dir /tmp/scale-src --run-id src --no-progress
    python -m harness.run --intervals 128 --concurrency 4 --runs-dir /tmp/scale-src --run-id fault \
        --inject-fault stale-seq-lens --no-progress

Run directories are synthesized from them (benchmarks/scale_synth.py: every candidate with its own
reference, classes and restore links kept; `--tokens 0` keeps the sources' own lengths, ~37 tokens) and
written through RecordFiles as a run writes them. Per size it prints:
  records  bytes on disk of `records/` per output token (candidates' and references' together);
  before   with --before DIR (a source tree of earlier code): its `python -m reports.render` of a JSONL copy;
  render   `python -m reports.render` CPU time and peak RSS (a child process);
  analyze  the streamed analyzer (reports/analyze_run.py) and junit.xml from its frame;
  resume   what harness/run.py loaded on --resume before the driver kept summaries: `load_run(...)
           .candidates_by_key()` and the references;
  state    what a resume loads now (harness/run.py, records/resume.py): `ResumeState.read(...)`;
  scan     where records/ has it, every column of every record as Arrow batches (`RunReader.batches`);
  driver   the real harness.driver against a backend that answers at once with the synthesized answers:
           its bookkeeping is the RSS when Driver.run returns (before the records are closed) less the RSS
           before the run, each read after a garbage collection and malloc_trim (held_rss).
Peak RSS is each child's own VmHWM. A size whose figure is predicted (linearly from the smaller sizes) above
--max-rss-gb / --max-disk-gb / --max-cpu-s / --max-write-s is not run: the prediction is printed, marked
"(extrapolated)". Each size's directory is deleted after it is measured unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if os.environ.get("SCALE_CODE"):  # a child measuring other code (--before): that tree's packages come first
    sys.path.insert(0, os.environ["SCALE_CODE"])


GB = 1 << 30


def child(args: list[str], code: Path | None = None) -> tuple[float, int, str]:
    """Run `python -m MODULE ARGS` or `python scale.py _CMD ARGS` in a child; (CPU seconds from its rusage, its
    peak RSS, its stdout). The peak is the child's own VmHWM: rusage's ru_maxrss would count the parent's
    pages, which a forked child holds until it execs."""
    argv = [sys.executable, __file__, "_hwm", *args]
    env = {**os.environ, "SCALE_CODE": str(code)} if code else None
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 1):  # 1: the gate failed (the fault source's records), still a rendered report
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}")
    lines = out.strip().splitlines()
    return ru.ru_utime + ru.ru_stime, int(lines[-1].split(":", 1)[1]), "\n".join(lines[:-1])


def _hwm(args: list[str]) -> int:
    """Run a module (`-m NAME ARGS`) or one of this script's commands, then print `hwm:<peak RSS bytes>`."""
    import runpy

    code = 0
    try:
        if args[0] == "-m":
            sys.argv = args[1:]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "_driver":
            _driver(int(args[1]), int(args[2]), Path(args[3]), args[4:])
        else:
            from benchmarks import scale_children
            getattr(scale_children, args[0][1:])(*args[1:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    sys.stdout.flush()
    print(f"hwm:{proc_status('VmHWM')}", flush=True)
    return code


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Predictor:
    """Linear extrapolation of one figure over sizes, from what was measured at smaller sizes."""

    def __init__(self) -> None:
        self.points: dict[str, list[tuple[int, float]]] = {}

    def add(self, name: str, n: int, value: float) -> None:
        self.points.setdefault(name, []).append((n, value))

    def predict(self, name: str, n: int) -> float | None:
        pts = self.points.get(name, [])
        if not pts:
            return None
        if len(pts) == 1:
            return pts[0][1] * n / pts[0][0]
        (n0, v0), (n1, v1) = pts[-2], pts[-1]
        slope = (v1 - v0) / (n1 - n0)
        return max(v1 + slope * (n - n1), 0.0)


def fmt_mb(b: float) -> str:
    return f"{b / 1e6:,.0f} MB" if b < 1e9 else f"{b / 1e9:,.2f} GB"


def measure_size(args, templates, positions, config, stats, n: int, tokens: int, pred: Predictor) -> dict:
    from benchmarks import scale_synth
    from benchmarks.scale_children import has_index, has_streamed, jsonl_copy
    label = f"{n // 1000}k x {'native' if tokens == 0 else tokens}"
    row: dict = {"size": label}
    run_dir = args.work / f"scale-{n}-{tokens}"
    shutil.rmtree(run_dir, ignore_errors=True)
    key = f"{tokens}"
    want_disk, want_s = pred.predict(f"disk/{key}", n), pred.predict(f"write/{key}", n)
    built = (want_disk is None or want_disk <= args.max_disk_gb * GB) and (want_s is None or want_s <= args.max_write_s)
    if built:
        t0 = time.perf_counter()
        points = scale_synth.plan(templates, positions, n, tokens)
        n_cand, n_tok = scale_synth.write_run(run_dir, points, config, stats)
        size = disk_bytes(run_dir / "records")
        pred.add(f"write/{key}", n, time.perf_counter() - t0)
        pred.add(f"disk/{key}", n, size)
        pred.add(f"tok/{key}", n, n_tok)
        row["records"] = f"{fmt_mb(size)}, {size / n_tok:.1f} B/token"
        print(f"{label}: {n_cand} candidates, {n_tok / (2 * n_cand):.1f} output tokens per request; records "
              f"{row['records']} ({time.perf_counter() - t0:.0f} s to write)", flush=True)
    else:
        bpt = pred.predict(f"disk/{key}", n) / pred.predict(f"tok/{key}", n)
        why = "over --max-disk-gb" if want_disk > args.max_disk_gb * GB else \
            f"~{want_s:.0f} s to write: over --max-write-s"
        row["records"] = f"~{fmt_mb(want_disk)}, {bpt:.1f} B/token (extrapolated: {why})"
        print(f"{label}: records {row['records']}", flush=True)
    if args.before and built:
        jsonl_copy(run_dir, run_dir.with_name(run_dir.name + "-jsonl"))
    for what, argv in (("before", ["-m", "reports.render", str(run_dir.with_name(run_dir.name + "-jsonl"))]),
                       ("render", ["-m", "reports.render", str(run_dir)]),
                       ("analyze", ["_analyze", str(run_dir)]),
                       ("resume", ["_resume", str(run_dir)]),
                       ("state", ["_state", str(run_dir)]),
                       ("scan", ["_scan", str(run_dir)])):
        if what == "scan" and not has_index() or what in ("analyze", "state") and not has_streamed():
            continue
        if what == "render" and args.no_render or what == "before" and not args.before:
            continue
        row[what] = run_child(what, argv, f"{what}/{key}", n, pred, args, built,
                              args.before if what == "before" else None)
        print(f"  {what:7s} {row[what]}", flush=True)
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(run_dir.with_name(run_dir.name + "-jsonl"), ignore_errors=True)
    if not args.no_driver:
        row["driver"] = driver_figure(args, n, tokens, key, pred)
        print(f"  driver  {row['driver']}", flush=True)
    return row


def run_child(what: str, argv: list[str], key: str, n: int, pred: Predictor, args, built: bool,
              code: Path | None = None) -> str:
    rss, cpu = pred.predict(key + "/rss", n), pred.predict(key + "/cpu", n)
    too_big = rss is not None and rss > args.max_rss_gb * GB or cpu is not None and cpu > args.max_cpu_s
    if not built or too_big:
        if rss is None:
            return "skipped (records not written)"
        why = "records not written" if not built else "over --max-rss-gb / --max-cpu-s"
        return f"~CPU {cpu:.1f} s, ~max RSS {fmt_mb(rss)} (extrapolated: {why})"
    cpu, rss, _ = child(argv, code)
    pred.add(key + "/rss", n, rss)
    pred.add(key + "/cpu", n, cpu)
    return f"CPU {cpu:.1f} s, max RSS {fmt_mb(rss)}"


def driver_figure(args, n: int, tokens: int, key: str, pred: Predictor) -> str:
    mem, cpu = pred.predict(f"driver/{key}/mem", n), pred.predict(f"driver/{key}/cpu", n)
    if (mem is not None and mem > args.max_rss_gb * GB) or (cpu is not None and cpu > args.max_cpu_s):
        return f"~bookkeeping {fmt_mb(mem)}, ~CPU {cpu:.0f} s (extrapolated: over --max-rss-gb / --max-cpu-s)"
    argv = ["_driver", str(n), str(tokens), str(args.work), *map(str, args.source)]
    cpu, _, out = child(argv)
    got = json.loads(out.strip().splitlines()[-1])
    held = got["done"] - got["baseline"]
    pred.add(f"driver/{key}/mem", n, held)
    pred.add(f"driver/{key}/cpu", n, cpu)
    return f"bookkeeping {fmt_mb(held)} (RSS when Driver.run returns {fmt_mb(got['done'])} less " \
           f"{fmt_mb(got['baseline'])} before it), CPU {cpu:.0f} s for {n} candidates and their references"


def _driver(n: int, tokens: int, work: Path, sources: list[str]) -> None:
    """The real Driver over n synthesized candidates, answered at once by a backend that replays them."""
    import asyncio
    import tempfile

    from benchmarks import scale_synth
    from benchmarks.scale_driver import run_driver

    templates, positions, _ = scale_synth.load_templates([Path(s) for s in sources])
    sessions = [s for _, group in scale_synth.plan(templates, positions, n, tokens) for s in group]
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        baseline = held_rss()
        done = asyncio.run(run_driver(sessions, Path(tmp), held_rss))
    print(json.dumps({"baseline": baseline, "done": done}))


def held_rss() -> int:
    """VmRSS after a garbage collection and malloc_trim: what is held, not what the allocator kept of freed
    memory (the answers of requests in flight come and go)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return proc_status("VmRSS")


def proc_status(field: str) -> int:
    """A /proc/self/status memory figure (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def sse(args) -> None:
    from benchmarks.scale_driver import sse_seconds

    for mb in args.mb:
        secs, events = sse_seconds(int(mb * 1_000_000), args.chunk)
        print(f"sse: one {mb} MB event in {args.chunk}-byte chunks: {secs:.2f} s ({events} event)", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_hwm":
        sys.exit(_hwm(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="records", choices=["records", "sse"])
    p.add_argument("--source", type=Path, action="append", help="a real run directory (repeatable)")
    p.add_argument("--sizes", default="1000,10000,100000", help="candidate counts, comma-separated")
    p.add_argument("--tokens", default="0,1000", help="output tokens per request (0: the sources' own)")
    p.add_argument("--work", type=Path, default=Path("/tmp/scale-work"), help="where run directories are made")
    p.add_argument("--keep", action="store_true", help="keep each synthesized run directory")
    p.add_argument("--no-render", action="store_true", help="skip `python -m reports.render` (its figures are "
                   "the analyzer's and the other outputs')")
    p.add_argument("--no-driver", action="store_true", help="skip the driver figure")
    p.add_argument("--before", type=Path, help="a source tree of earlier code (git archive COMMIT | tar -x -C DIR): "
                   "`before` is its `python -m reports.render` of a JSONL copy of each run")
    p.add_argument("--max-rss-gb", type=float, default=8.0)
    p.add_argument("--max-disk-gb", type=float, default=12.0)
    p.add_argument("--max-cpu-s", type=float, default=1500.0)
    p.add_argument("--max-write-s", type=float, default=3600.0, help="skip a size predicted to take longer to write")
    p.add_argument("--mb", default="1,2,4", help="sse: event sizes in MB")
    p.add_argument("--chunk", type=int, default=1024, help="sse: bytes per read")
    args = p.parse_args()
    if args.mode == "sse":
        args.mb = [float(x) for x in args.mb.split(",")]
        return sse(args)
    if not args.source:
        p.error("--source RUN_DIR is required (see the module doc for how to make one)")
    from benchmarks import scale_synth
    from records.jsonl import load_run

    args.work.mkdir(parents=True, exist_ok=True)
    templates, positions, config = scale_synth.load_templates(args.source)
    stats = next(iter(load_run(args.source[0]).stats), None)
    pred, rows = Predictor(), []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        for n in sorted(int(s) for s in args.sizes.split(",")):
            rows.append(measure_size(args, templates, positions, config, stats, n, tokens, pred))
    cols = ["size", "records", "before", "render", "analyze", "resume", "state", "scan", "driver"]
    cols = [c for c in cols if any(c in r for r in rows)]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(r.get(c, "") for c in cols) + " |")


if __name__ == "__main__":
    main()
