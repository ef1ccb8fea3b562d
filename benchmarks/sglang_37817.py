"""The upstream validation of SGLang PR #37818 (issue #37817), re-run on the real SGLang: one command, one table.

    python benchmarks/sglang_37817.py                      # builds or reuses the venv, starts 5 servers
    python benchmarks/sglang_37817.py --load-requests 16   # about 100 min on 2 busy CPU cores
    python benchmarks/sglang_37817.py --load-requests 0    # the frozen boundary suite only
    python benchmarks/sglang_37817.py --servers servers.json   # servers already running (a GPU recipe, or CI)

The same SGLang release (0.5.19, the last with the bug) without and with the fix, as upstream compared them: a
cold reference (no radix cache, no speculation) started once, and per variant a candidate per track interval
(DFLASH with the trained drafter, radix cache with extra_buffer checkpoints) of a tiny Qwen3-Next trained here
(tests/sglang_setup/model: the target and its DFlash drafter, committed). The variants come from one venv:
`unpatched` is the release as published, `patched` the release with fix-pr37818.diff on top. On this CPU they
run through the test setup that lets SGLang serve the hybrid path here (`make sglang SGLANG_VERSION=0.5.19`,
tests/sglang_setup/hybrid/serve.py, named by path and run, never imported). Each variant is gated by
`python -m harness.run` against the shared reference: the committed frozen boundary suite cut in the model's
tokenizer at concurrency 1, then a load run at concurrency 1, 4, 8 and 16. The table: cases and mismatching
cases per variant, the boundary cells of the turns that restored a checkpoint a verify step crossed (from the
servers' own verify trace), the mismatches that remain with their margins, and the load run.

`--servers FILE`: {"reference": URL, "unpatched": [{"url", "log"}...], "patched": [...]} (the logs hold the
verify trace, SPECGATE_HYBRID_TRACE=1; without them the cells are the harness's inference from positions).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_37817_table import VARIANTS, load_table, summarize, table  # noqa: E402
from sglang_servers import servers_json, started, validation_servers  # noqa: E402

MODEL = ROOT / "tests" / "sglang_setup" / "model" / "weights"  # the trained target and drafter, committed


def ensure_venv(version: str, venv: str) -> str:
    """`make sglang` for the release (a no-op once built; layered on .venv-sglang when that one is built); the
    venv's interpreter."""
    base = ["SGLANG_BASE=.venv-sglang"] if (ROOT / ".venv-sglang" / ".installed").is_file() else []
    cmd = ["make", "sglang", f"SGLANG_VERSION={version}", f"SGLANG_VENV={venv}", *base]
    print(f"$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return str(ROOT / venv / "bin" / "python")


@contextlib.contextmanager
def local_servers(python: str, intervals: list[int], block_size: int, workdir: Path):
    """The reference and a candidate per variant and interval, started together; the servers.json shape."""
    ref, cands = validation_servers(python, MODEL / "target", MODEL / "dflash", intervals, block_size, workdir)
    t0 = time.monotonic()
    with started([ref, *(s for group in cands.values() for s in group)]):
        print(f"{1 + 2 * len(intervals)} SGLang servers healthy after {time.monotonic() - t0:.0f}s", flush=True)
        yield servers_json(ref, cands)


def run_gate(runs_dir: Path, run_id: str, servers: dict, variant: str, workload: list[str],
             concurrency: str, timeout: float, reuse: bool) -> tuple[int, Path]:
    """`python -m harness.run` against the variant's candidates and the shared reference: (exit, run dir). With
    `reuse`, a run directory already rendered (its summary.md written) is judged again instead of run."""
    if reuse and (runs_dir / run_id / "summary.md").is_file():
        proc = subprocess.run([sys.executable, "-m", "reports.render", str(runs_dir / run_id)], cwd=ROOT,
                              capture_output=True, text=True)
        print(f"{run_id}: reused, exit {proc.returncode}: {proc.stdout.splitlines()[0] if proc.stdout else ''}",
              flush=True)
        return proc.returncode, runs_dir / run_id
    cmd = [sys.executable, "-m", "harness.run", "--backend", "sglang", "--tokenizer", str(MODEL / "target"),
           *[a for c in servers[variant] for a in ("--endpoint", c["url"])],
           "--reference-endpoint", servers["reference"], *workload, "--concurrency", concurrency,
           "--drift-tolerance", "1e-3", "--runs-dir", str(runs_dir), "--run-id", run_id, "--no-progress",
           "--request-timeout", str(timeout)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    verdict = next((line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL", "INCONCLUSIVE"))),
                   proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:])
    print(f"{run_id}: exit {proc.returncode} in {time.monotonic() - t0:.0f}s: {verdict}", flush=True)
    if proc.returncode not in (0, 1, 3):
        raise RuntimeError(f"{run_id}: the harness could not gate (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"\n{proc.stderr[-3000:]}")
    return proc.returncode, runs_dir / run_id


def validate(servers: dict, runs_dir: Path, suite: Path, load_requests: int, concurrency: str, timeout: float,
             reuse: bool) -> dict:
    """Both variants: the frozen suite at concurrency 1, then (with load_requests) the load run; the summaries."""
    out = {}
    for variant in VARIANTS:
        logs = [c.get("log") for c in servers[variant]]
        if reuse:  # a reused run was served by an earlier start of these servers: their logs hold its trace
            older = {str(p) for log in logs if log for p in Path(log).parent.glob(f"{variant}-i*.log")}
            logs += sorted(older - set(logs))
        code, run = run_gate(runs_dir, f"{variant}-frozen", servers, variant, ["--suite", str(suite)], "1", timeout,
                             reuse)
        out[variant] = {"frozen": summarize(run, code, logs)}
        if load_requests:
            code, run = run_gate(runs_dir, f"{variant}-load", servers, variant,
                                 ["--suite", "load", "--num-requests", str(load_requests), "--seed", "0"],
                                 concurrency, timeout, reuse)
            out[variant]["load"] = load_table(run, code)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/sglang_37817.py", description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.5.19", help="the SGLang release (one with the bug and the fix diff)")
    ap.add_argument("--venv", default=None, help="its venv (default .venv-sglang-VERSION)")
    ap.add_argument("--intervals", default="128,256", help="a candidate per variant and interval")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--suite", type=Path, default=MODEL / "frozen.jsonl", help="the frozen boundary suite (the "
                    "committed one, cut in the model's tokenizer)")
    ap.add_argument("--load-requests", type=int, default=64, help="requests of the load run per concurrency level (0: "
                    "none)")
    ap.add_argument("--concurrency", default="1,4,8,16", help="the load run's concurrency levels")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "sglang-37817")
    ap.add_argument("--servers", type=Path, help="a servers.json of servers already running (see above)")
    ap.add_argument("--request-timeout", type=float, default=1800.0, help="seconds per request (the harness's "
                    "--request-timeout; on this CPU the shared reference serves up to 8 long requests at once, at a "
                    "few tokens/s in all, and 600 s cut some)")
    ap.add_argument("--reuse", action="store_true", help="judge run directories already complete (summary.md "
                    "written) again instead of running them (their verify trace read from the earlier servers' logs "
                    "beside the new ones)")
    ap.add_argument("--json", type=Path, help="also write the summaries here")
    a = ap.parse_args(argv)
    # a `kill` stops the servers and the harness run as Ctrl-C does (the stack unwinds), leaving no server behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        if a.servers:
            servers = json.loads(a.servers.read_text())
        else:
            python = ensure_venv(a.version, a.venv or f".venv-sglang-{a.version}")
            intervals = [int(i) for i in a.intervals.split(",")]
            servers = stack.enter_context(local_servers(python, intervals, a.block_size, a.runs_dir / "servers"))
        results = validate(servers, a.runs_dir, a.suite, a.load_requests, a.concurrency, a.request_timeout, a.reuse)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print()
    print(table(results, a.version))
    print(f"\n({time.monotonic() - t0:.0f}s; run directories under {a.runs_dir})")
    return 0 if [results[v]["frozen"]["verdict"] for v in VARIANTS] == ["FAIL", "PASS"] else 1


if __name__ == "__main__":
    sys.exit(main())
