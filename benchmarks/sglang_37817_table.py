"""What benchmarks/sglang_37817.py prints: each variant's run read back, and the upstream table's shape.

A run directory's requests.csv (reports/analyze.py: one row per candidate request, its class, its restore and
where the restored checkpoint came from) and the candidate servers' verify trace (the test setup's
SPECGATE_HYBRID_TRACE lines: each verify step's pre-verify length, commit length and the step SGLang tracked,
per prompt hashed as the harness hashes it). A turn whose restored checkpoint b lies in its previous turn's
generated tokens (`restored_link` "position": some verify step crossed b) gets its cell from the trace: the
previous turn's verify step with pre < b <= pre + commit, at step b - pre - 1. Accepted drafts per verify step
come from the same trace (commit length - 1, over the verify steps that produced output: the overlap scheduler
launches one more after a request's last); SGLang's own `spec_accept_length` counts the bonus token too and is
output tokens per verify step, so a request's last step, cut at max_new_tokens, counts short.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd

VARIANTS = ("unpatched", "patched")
TRACE_PREFIX = "[specgate-verify] "  # tests/sglang_setup/hybrid/pypath/hybrid_trace.py writes these lines
FLAGGED = ("drift", "soft", "hard")
VERDICTS = {0: "PASS", 1: "FAIL", 3: "INCONCLUSIVE"}
VERIFY_LINKS = ("position", "verify")  # the restored checkpoint was crossed inside a verify step


def read_trace(logs: list[str | None]) -> dict[str, list[dict]]:
    """The verify steps that produced output, by prompt hash, from the candidate servers' logs (none without
    logs); ValueError when a server logged a trace error."""
    out: dict[str, list[dict]] = {}
    for log in logs:
        if not log or not Path(log).is_file():
            continue
        for line in Path(log).read_text(errors="replace").splitlines():
            if "[specgate-verify-error]" in line:
                raise ValueError(f"{log}: the verify trace failed: {line.strip()}")
            if TRACE_PREFIX in line:
                row = json.loads(line[line.index(TRACE_PREFIX) + len(TRACE_PREFIX):])
                if row["pre"] < row["prompt_len"] + row["max_new"] - 1:
                    out.setdefault(row["input"], []).append(row)
    return out


def crossing(trace: dict[str, list[dict]], input_hash: str, boundary: int) -> dict | None:
    """The verify step of the prompt `input_hash` that crossed `boundary`: {pre, commit, step, tracked}."""
    for row in trace.get(input_hash, []):
        if row["pre"] < boundary <= row["pre"] + row["commit"]:
            return {"pre": row["pre"], "commit": row["commit"], "step": boundary - row["pre"] - 1,
                    "tracked": row["tracked"]}
    return None


def _previous(df: pd.DataFrame) -> dict:
    """(pool, sweep point, session, turn) -> the row's input hash."""
    point = df["key"].str.split("/", n=1).str[0]
    return {(p, sp, s, int(t)): h for p, sp, s, t, h in zip(df["pool"], point, df["session_id"], df["turn"],
                                                            df["input_hash"], strict=True)}


def restores(df: pd.DataFrame, trace: dict[str, list[dict]]) -> pd.DataFrame:
    """One row per request: its class, what it restored (`verify`, `prefill`, `other`, `nothing`) and, for a
    checkpoint a verify step crossed, that step's cell from the trace (step, commit, tracked; -1: none)."""
    prev = _previous(df)
    rows = []
    for r in df.to_dict("records"):
        kind, cell = "nothing", None
        if r["cached_tokens"] > 0:
            kind = {"position": "verify", "verify": "verify", "prefill": "prefill"}.get(r["restored_link"], "other")
        if kind == "verify":
            h = prev.get((r["pool"], r["key"].split("/", 1)[0], r["session_id"], int(r["turn"]) - 1))
            cell = crossing(trace, h, int(r["cached_tokens"])) if h else None
        rows.append({"key": r["key"], "case": r["case_id"], "turn": int(r["turn"]), "interval": r["interval"],
                     "class": r["class"], "restore": kind, "checkpoint": int(r["cached_tokens"]),
                     "margin": r["ref_margin"], "drift": r["drift"], "prompt_offset": r["prompt_offset"],
                     "window": r.get("window_status"), "window_drift": r.get("window_drift"),
                     **({f"cell_{k}": v for k, v in cell.items()} if cell else {})})
    return pd.DataFrame(rows)


def summarize(run_dir: Path, exit_code: int, logs: list[str | None]) -> dict:
    """A variant's frozen-suite run: verdict, cases, mismatches, restores, cells, acceptance."""
    df = pd.read_csv(run_dir / "requests.csv")
    trace = read_trace(logs)
    rs = restores(df, trace)
    flagged = rs[rs["class"].isin(FLAGGED)]
    verify = rs[rs["restore"] == "verify"]
    steps = [row for h in set(df["input_hash"]) for row in trace.get(h, [])]
    cells: dict[tuple, list[int]] = {}  # (step, commit, tracked) -> [turns restoring it, flagged]
    for r in verify.to_dict("records"):
        if pd.notna(r.get("cell_step")):
            cell = cells.setdefault((int(r["cell_step"]), int(r["cell_commit"]), int(r["cell_tracked"])), [0, 0])
            cell[0] += 1
            cell[1] += int(r["class"] in FLAGGED)
    headline = (run_dir / "summary.md").read_text().splitlines()[2].strip("* ") if (run_dir / "summary.md").is_file() \
        else ""
    return {"verdict": VERDICTS.get(exit_code, f"exit {exit_code}"), "headline": headline, "run": str(run_dir),
            "requests": len(rs), "cases": int(rs["case"].nunique()),
            "mismatching_cases": int(flagged["case"].nunique()), "classes": dict(Counter(rs["class"])),
            "restores": {k: [int((rs["restore"] == k).sum()), int((flagged["restore"] == k).sum())]
                         for k in ("verify", "prefill", "other", "nothing")},
            "verify_restores_flagged": sorted(verify[verify["class"].isin(FLAGGED)]["key"]),
            "verify_restores": sorted(verify["key"]), "flagged": sorted(flagged["key"]),
            "cells": [[*k, *v] for k, v in sorted(cells.items())],
            "verify_steps": len(steps), "accepted_drafts": sum(row["commit"] - 1 for row in steps),
            "sglang_accept_length": round(float(pd.to_numeric(df["spec_accept_length"], errors="coerce").mean()), 3),
            "windows": {k: [int((g["window"] == "flagged").sum()), int(g["window"].isin(["compared", "flagged"]).sum()),
                            float(pd.to_numeric(g["window_drift"], errors="coerce").max())]
                        for k, g in rs.groupby("restore") if k != "nothing"},
            "remaining": flagged[["key", "class", "restore", "margin", "drift", "prompt_offset"]].to_dict("records")}


def load_table(run_dir: Path, exit_code: int) -> dict:
    """A variant's load run: verdict and, per pool and concurrency, requests, flagged, restores and tokens/s."""
    cfg = pd.read_csv(run_dir / "configs.csv")
    rows = [{"pool": r["pool"], "concurrency": int(r["concurrency"]), "requests": int(r["requests"]),
             "flagged": int(r["flagged"]), "hard": int(r["hard"]), "drift": int(r["drift"]), "soft": int(r["soft"]),
             "tok_s": round(float(r["output_tok_s"]), 1)} for r in cfg.to_dict("records")]
    return {"verdict": VERDICTS.get(exit_code, f"exit {exit_code}"), "run": str(run_dir), "points": rows}


def _row(label: str, unpatched, patched) -> str:
    return f"{label:<50}{unpatched!s:>18}{patched!s:>18}"


def table(results: dict, version: str) -> str:
    """The upstream table's shape for both variants."""
    u, p = results["unpatched"]["frozen"], results["patched"]["frozen"]
    lines = [f"SGLang {version} ('unpatched') against {version} + fix-pr37818.diff ('patched'), a trained tiny "
             "Qwen3-Next + DFlash drafter (B=8), fp32, CPU", "",
             _row("frozen boundary suite", "unpatched", "patched"), _row("verdict", u["verdict"], p["verdict"]),
             _row("cases (sessions)", u["cases"], p["cases"]), _row("requests", u["requests"], p["requests"]),
             _row("mismatching cases", u["mismatching_cases"], p["mismatching_cases"])]
    lines += [_row(f"  requests {cls}", u["classes"].get(cls, 0), p["classes"].get(cls, 0)) for cls in FLAGGED]
    lines.append(_row("requests failed (an error, not judged)", u["classes"].get("error", 0),
                      p["classes"].get("error", 0)))
    names = {"verify": "restored a verify-crossed checkpoint", "prefill": "restored a prefill checkpoint",
             "other": "restored another request's checkpoint", "nothing": "restored nothing"}
    lines += [_row(f"  {name}: flagged", "{1}/{0}".format(*u["restores"][k]), "{1}/{0}".format(*p["restores"][k]))
              for k, name in names.items()]
    for kind in ("verify", "prefill"):
        cells = ["{}/{}, max {:.0e}".format(*s["windows"][kind]) if kind in s["windows"] else "-" for s in (u, p)]
        lines.append(_row(f"  restore windows past tolerance ({kind})", *cells))
    lines += [_row("accepted drafts per verify step (server trace)",
                   *(f"{s['accepted_drafts'] / max(1, s['verify_steps']):.2f}" for s in (u, p))),
              _row("  verify steps", u["verify_steps"], p["verify_steps"]),
              _row("  SGLang accept length (output tokens per step)", f"{u['sglang_accept_length']:.2f}",
                   f"{p['sglang_accept_length']:.2f}")]
    lines += ["", "boundary cells of the restored checkpoints (the verify step that crossed them, from the servers' "
              "trace): step, commit length, step SGLang tracked (-1: none), turns restoring it (flagged)"]
    for name, s in (("unpatched", u), ("patched", p)):
        text = ", ".join(f"({step}, {commit}, {tracked}): {n} ({f})" for step, commit, tracked, n, f in s["cells"])
        lines.append(f"  {name}: {text or 'none'}")
    lines += ["", "remaining mismatches (patched): " + ("none" if not p["remaining"] else "")]
    for r in p["remaining"]:
        lines.append(f"  {r['key']}: {r['class']}, restored {r['restore']}, reference top-1/top-2 margin "
                     f"{r['margin']}, drift {r['drift']}, prompt offset to its boundary {r['prompt_offset']}")
    if "load" in results["unpatched"]:
        lines += ["", f"load run: {'pool':<6}{'conc':>6}{'requests':>10}{'flagged unpatched':>20}"
                  f"{'flagged patched':>18}{'tok/s (patched)':>17}"]
        pts = {(r["pool"], r["concurrency"]): r for r in results["patched"]["load"]["points"]}
        for r in results["unpatched"]["load"]["points"]:
            q = pts.get((r["pool"], r["concurrency"]), {})
            lines.append(f"          {r['pool']:<6}{r['concurrency']:>6}{r['requests']:>10}{r['flagged']:>20}"
                         f"{q.get('flagged', '-'):>18}{q.get('tok_s', '-'):>17}")
        lines.append(f"          verdict: unpatched {results['unpatched']['load']['verdict']}, patched "
                     f"{results['patched']['load']['verdict']}")
    return "\n".join(lines)
