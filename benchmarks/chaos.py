"""Chaos run: the frozen suite under faults, each compared with an uninterrupted run.

    python benchmarks/chaos.py --kills 4 --seed 1 [--scenarios kills,node,signals] [--sessions N]
        [harness flags, default: --model-path random --model-preset tiny --intervals 128 --concurrency 1,4]

Runs `python -m harness.run` into one runs directory: `clean`, then one run per
scenario (the node and signal ones are in benchmarks/chaos_faults.py; running the harness and reading a
run's records and verdict, in benchmarks/chaos_run.py):

* `kills`: a seeded monkey kills up to `--kills` replica servers (candidate or
  reference, at random, at least `--gap` seconds apart, once something is recorded);
  Ray restarts them and the driver re-sends what was in flight.
* `node`: the run on a two-node local cluster (`ray.cluster_utils.Cluster`) whose
  worker node is killed (its processes SIGKILLed) once something is recorded.
* `signals`: SIGINT and SIGTERM at three phases each (`probe`: replicas starting;
  `drive`: a third of the records written; `render`: the report being built),
  each run then finished with `--resume`; or one of them, e.g. `sigterm-render`.

`--sessions N` runs the first N sessions of the I = 128 frozen suite (a small run).
Prints the figures per scenario and exits 0 when every scenario's records are
complete, duplicate-free (a raw count of keys, journals and parts), error-free,
its outputs equal the clean run's (every candidate key and every reference input),
its verdict (exit status and headline) is the clean run's, and nothing of it
serves after the harness exited; else 1.

Equal outputs means equal token ids, or a tie flip: at the first token where the
two runs part, each run's choice and the other's are tied within `--tie-margin`
(default 1e-3, the built-in engine's drift tolerance) in its own top-k log-probs.
A request re-sent after a kill shares batches with other requests than before,
and the engine's CPU kernels are not batch-invariant: on the tiny random model
a top-2 pair 1e-5 apart swaps (the analyzer classes it `soft`). So the headline
is compared without its soft count, which such a flip moves; the flips are
listed as `tie_flips`. A candidate's flip changes its session's later turns (their
input is its output): those are listed as `after_tie_flip`, and their references,
which then exist in one run only, as `unmatched_refs`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos_faults import SIGNAL_SCENARIOS, node_scenario, signal_scenarios  # noqa: E402
from chaos_run import gated, headline, records, run_harness  # noqa: E402

from reports.oracle import DRIFT_TOLERANCE as TIE_MARGIN  # noqa: E402
from reports.oracle import tie_flip  # noqa: E402

DEFAULT_ARGS = ["--suite", "frozen", "--model-path", "random", "--model-preset", "tiny", "--intervals", "128",
                "--concurrency", "1,4"]


def differences(clean: list[dict], chaos: list[dict], margin: float = TIE_MARGIN) -> dict:
    """The keys whose output ids differ between two runs' records, split: `outputs_differ` (a real difference),
    `tie_flips` (reports.oracle.tie_flip) and `after_tie_flip` (a later turn of a session whose candidate turn
    tie-flipped: its input is that other output, so its output differs too); and `unmatched_refs`, reference
    keys in one run only whose input only such a later turn sent (its reference has another input hash)."""
    by_key = {r["key"]: r for r in clean}
    mine = {r["key"]: r for r in chaos}
    differ = sorted(k for k in set(by_key) & set(mine) if by_key[k]["output_ids"] != mine[k]["output_ids"])
    flips = [k for k in differ if tie_flip(by_key[k], mine[k], margin)]
    first_flip: dict[str, int] = {}  # point/session -> its first tie-flipped candidate turn
    for k in flips:
        if by_key[k]["role"] == "candidate":
            session, turn = k.rsplit("/", 1)
            first_flip[session] = min(int(turn), first_flip.get(session, int(turn)))

    def after(key: str) -> bool:
        session, _, turn = key.rpartition("/")
        return session in first_flip and turn.isdigit() and int(turn) > first_flip[session]

    later = {k for run in (by_key, mine) for k, r in run.items() if r["role"] == "candidate" and after(k)}
    inputs = {r["input_hash"] for run in (by_key, mine) for k, r in run.items() if k in later}
    others = set(by_key) ^ set(mine)
    return {"outputs_differ": [k for k in differ if k not in flips and k not in later],
            "tie_flips": flips, "after_tie_flip": sorted(later & set(differ)),
            "unmatched_refs": sorted(k for k in others if k.startswith("ref/") and
                                     (by_key.get(k) or mine[k])["input_hash"] in inputs)}


def compare(clean_dir: Path, chaos_dir: Path, margin: float = TIE_MARGIN) -> dict:
    """Figures: record counts, duplicates, errors, retries, cache_lost, outputs that differ, and those that
    differ only through a tie flip (`differences`)."""
    clean, chaos = records(clean_dir), records(chaos_dir)
    keys = Counter((r["role"], r["key"]) for r in chaos)
    by_key = {r["key"]: r for r in clean}
    mine = {r["key"]: r for r in chaos}
    diff = differences(clean, chaos, margin)
    excused = set(diff["unmatched_refs"])
    return {
        "records_clean": len(clean), "records_chaos": len(chaos),
        "duplicates": sum(n - 1 for n in keys.values() if n > 1),
        "missing": sorted(set(by_key) - set(mine) - excused), "extra": sorted(set(mine) - set(by_key) - excused),
        "errors": [r["key"] for r in chaos if r["error"]],
        "retries": sum(r["retries"] for r in chaos),
        "cache_lost": dict(Counter(r.get("cache_lost") for r in chaos if r.get("cache_lost"))),
        **diff,
        "incidents": len((chaos_dir / "incidents.jsonl").read_text().splitlines())
        if (chaos_dir / "incidents.jsonl").exists() else 0,
    }


def ok(figures: dict) -> bool:
    """Complete, duplicate-free, error-free, the clean run's outputs."""
    return not (figures["duplicates"] or figures["missing"] or figures["extra"] or figures["errors"]
                or figures["outputs_differ"])


def show(figures: dict) -> None:
    for k, v in figures.items():
        print(f"  {k}: {v if not isinstance(v, list) or len(v) < 10 else f'{len(v)} ({v[:10]} ...)'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=4, help="replica servers to kill at most")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gap", type=float, default=8.0, help="mean seconds between kills")
    p.add_argument("--runs-dir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--scenarios", default="kills", help="comma list of kills, node, signals (default: kills)")
    p.add_argument("--sessions", type=int, default=None, help="the first N sessions of the I = 128 frozen suite")
    p.add_argument("--tie-margin", type=float, default=TIE_MARGIN,
                   help="log-prob gap within which two runs' different tokens are a tie flip, not a difference")
    args, harness_args = p.parse_known_args()
    harness_args = harness_args or DEFAULT_ARGS
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="specgate-chaos-"))
    if args.sessions:
        harness_args = with_suite(harness_args, small_suite(runs_dir / "suite.jsonl", args.sessions))
    scenarios = args.scenarios.split(",")
    unknown = set(scenarios) - {"kills", "node", "signals", *SIGNAL_SCENARIOS}
    if unknown:
        p.error(f"--scenarios: unknown {', '.join(sorted(unknown))} (kills, node, signals, or one of "
                f"{', '.join(SIGNAL_SCENARIOS)})")
    tag = f"{os.getpid()}"
    rc_clean, t_clean, _, out_clean = run_harness(runs_dir, f"clean-{tag}", harness_args)
    verdict = (rc_clean, gated(headline(out_clean)))
    print(f"clean: exit {rc_clean} in {t_clean:.1f}s, verdict {verdict[1]!r}")
    # a gate verdict: PASS, or INCONCLUSIVE where a small --sessions run crosses too few boundary cells; every
    # interrupted run must end with the same
    good = rc_clean in (0, 3)
    if "kills" in scenarios:
        rc_chaos, t_chaos, killed, out = run_harness(runs_dir, f"chaos-{tag}", harness_args, args.kills, args.seed,
                                                     args.gap)
        figures = compare(runs_dir / f"clean-{tag}", runs_dir / f"chaos-{tag}", args.tie_margin)
        print(f"clean: exit {rc_clean} in {t_clean:.1f}s; chaos: exit {rc_chaos} in {t_chaos:.1f}s, "
              f"{len(killed)} kill(s) at {[t for t, _ in killed]} s")
        show(figures)
        good &= (rc_chaos, gated(headline(out))) == verdict and ok(figures)
    results = []
    if "node" in scenarios:
        results.append(node_scenario(runs_dir, f"node-{tag}", harness_args))
    signals = SIGNAL_SCENARIOS if "signals" in scenarios else [s for s in SIGNAL_SCENARIOS if s in scenarios]
    if signals:
        results += signal_scenarios(runs_dir, tag, harness_args, signals)
    for r in results:
        figures = compare(runs_dir / f"clean-{tag}", runs_dir / r["run_id"], args.tie_margin)
        same = (r["exit"], gated(r["verdict"])) == verdict
        print(f"scenario {r['name']}: {r['what']}; final exit {r['exit']}, verdict {r['verdict']!r} "
              f"({'same as' if same else 'DIFFERS from'} the clean run); left serving after exit: {r['left']}")
        show(figures)
        good &= same and ok(figures) and not r["left"]
    print("OK: complete, duplicate-free, outputs equal the uninterrupted run's" if good else "FAILED")
    return 0 if good else 1


def small_suite(path: Path, n: int) -> Path:
    """The first `n` I = 128 sessions of the committed frozen suite, as a workload file."""
    import json

    from workloads.corpus import DATA_DIR

    rows = [ln for ln in (DATA_DIR / "frozen.jsonl").read_text().splitlines() if json.loads(ln)["interval"] == 128]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows[:n]) + "\n")
    return path


def with_suite(args: list[str], suite: Path) -> list[str]:
    """`args` with `--suite` set to `suite`."""
    out = list(args)
    if "--suite" in out:
        out[out.index("--suite") + 1] = str(suite)
    else:
        out += ["--suite", str(suite)]
    return out


if __name__ == "__main__":
    sys.exit(main())
