"""Hand-built records (docs/records.md) for the reports tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def input_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def prompt(n: int, seed: int = 0) -> list[int]:
    """`n` printable byte-tokenizer ids; different seeds give different prompts."""
    return [97 + (i * 7 + seed) % 26 for i in range(n)]


def top2(tokens: list[int], margins: dict[int, float] | None = None, default_margin: float = 5.0) -> list:
    """Per position `[[logprob, token], [logprob, runner_up]]` with the given top-1/top-2 margin."""
    margins = margins or {}
    out = []
    for p, tok in enumerate(tokens):
        m = margins.get(p, default_margin)
        runner_up = 32 if tok != 32 else 33
        out.append([[-0.25, tok], [-0.25 - m, runner_up]])
    return out


def candidate(input_ids: list[int], output_ids: list[int], *, pool: str = "i256", interval: int | None = 256,
              concurrency: int = 1, session_id: str = "s0", turn: int = 0, cached_tokens: int = 0,
              spec_trace: list | None = None, error: str | None = None, key: str | None = None,
              t_start: float = 1000.0, e2e: float = 1.0, ttft: float = 0.1, itl: float = 0.01,
              accept: float | None = 3.0, fault: str | None = None, **extra) -> dict:
    rec = {
        "schema": 1, "run_id": "test-run",
        "key": key or f"{pool}-c{concurrency}/{session_id}/{turn}",
        "role": "candidate", "pool": pool,
        "engine": {"interval": interval, "block_size": 8, "strategy": "extra_buffer", "tp": 1, "fault": fault,
                   "speculative": True, "radix_cache": True, "endpoint": None},
        "interval": interval, "concurrency": concurrency, "replica_id": f"{pool}-r0", "node_id": None,
        "suite": "frozen", "case_id": session_id, "session_id": session_id, "turn": turn, "case": {},
        "input_hash": input_hash(input_ids), "input_len": len(input_ids), "input_ids": input_ids,
        "max_new_tokens": len(output_ids), "output_ids": output_ids, "output_text": "",
        "output_logprobs": [-0.25] * len(output_ids), "output_top_logprobs": top2(output_ids),
        "cached_tokens": cached_tokens, "completion_tokens": len(output_ids), "finish_reason": "length",
        "spec_verify_ct": None if accept is None else max(1, round(len(output_ids) / accept)),
        "spec_accept_length": accept, "spec_trace": spec_trace,
        "ttft": ttft, "itl": itl, "e2e": e2e, "t_start": t_start, "retries": 0, "error": error,
        "tokenizer": "byte",
    }
    rec.update(extra)
    return rec


def reference(input_ids: list[int], output_ids: list[int], *, margins: dict[int, float] | None = None,
              error: str | None = None, **extra) -> dict:
    h = input_hash(input_ids)
    rec = candidate(input_ids, output_ids, pool="reference", interval=None, key=f"ref/{h}", error=error,
                    accept=None, **extra)
    rec.update(role="reference", concurrency=None, output_top_logprobs=top2(output_ids, margins))
    rec["engine"].update(speculative=False, radix_cache=False, strategy=None)
    return rec


def write_run(run_dir: Path, records: list[dict], config: dict | None = None) -> Path:
    """Write `records` as a run directory (candidates per pool, references in one file)."""
    (run_dir / "records").mkdir(parents=True, exist_ok=True)
    if config is not None:
        (run_dir / "config.json").write_text(json.dumps(config))
    files: dict[str, list[str]] = {}
    for rec in records:
        name = "reference.jsonl" if rec["role"] == "reference" else f"candidate-{rec['pool']}.jsonl"
        files.setdefault(name, []).append(json.dumps(rec))
    for name, lines in files.items():
        with open(run_dir / "records" / name, "a") as f:
            f.write("\n".join(lines) + "\n")
    return run_dir


def pair(input_ids: list[int], cand_out: list[int], ref_out: list[int] | None = None,
         margins: dict[int, float] | None = None, **cand_kwargs) -> list[dict]:
    """A candidate and its reference (ref_out defaults to the candidate's output: exact).

    Where the tokens differ, the candidate's top-2 is its token and the reference's, the latter at the
    reference's own log-prob: no drift at the flip, so the reference's margin decides (a numerics flip).
    """
    ref_out = cand_out if ref_out is None else ref_out
    cand = candidate(input_ids, cand_out, **cand_kwargs)
    for p, (a, b) in enumerate(zip(cand_out, ref_out, strict=False)):
        if a != b and a != 32:
            cand["output_top_logprobs"][p] = [[-0.25, a], [-0.25, b]]
    return [cand, reference(input_ids, ref_out, margins=margins)]


def spec_trace(input_len: int, n_out: int, commits: list[int], interval: int, fault: bool) -> list[list[int]]:
    """A verify trace after prefill's first token; `fault` models #37817 (nothing tracked)."""
    trace, pre, i = [], input_len + 1, 0
    while pre < input_len + n_out:
        c = min(commits[i % len(commits)], input_len + n_out - pre)
        post = pre + c
        step = post // interval * interval - pre - 1 if pre // interval != post // interval else -1
        trace.append([pre, c, -1 if fault else step])
        pre, i = post, i + 1
    return trace


def synthetic_run(run_dir: Path, fault: bool, intervals=(128, 256), concurrencies=(1, 4),
                  soft_sessions: int = 0, config: dict | None = None) -> Path:
    """Two-turn sessions near every boundary; with `fault`, turn 1 of the sessions whose turn 0 crossed
    the boundary inside a verify step restored a stale checkpoint and diverges (hard)."""
    records, t = [], 1000.0
    for interval in intervals:
        for conc in concurrencies:
            pool = f"i{interval}"
            for s, d in enumerate([-3, -1, 1, 3]):
                sid = f"frozen-{pool}-{s}"
                p0 = prompt(interval + d, seed=s)
                out0 = [100 + (j + s) % 20 for j in range(16)]
                trace0 = spec_trace(len(p0), len(out0), [3, 2, 4], interval, fault)
                crossed = any((a // interval) != ((a + c) // interval) for a, c, _ in trace0)
                records += pair(p0, out0, pool=pool, interval=interval, concurrency=conc, session_id=sid,
                                spec_trace=trace0, t_start=t, e2e=0.5, fault="stale-seq-lens" if fault else None)
                p1 = p0 + out0 + prompt(8, seed=9)
                ref1 = [120 + j % 7 for j in range(12)]
                stale = fault and crossed
                cand1 = [200 + j % 5 for j in range(12)] if stale else list(ref1)
                margins = {}
                if s >= 4 - soft_sessions and not stale:
                    # a numerics flip: a near-tie within twice the fp32 tolerance (reports/numerics.py; 2^-10, exact
                    # in the records' float32), no drift before it, none measurable at it (see pair)
                    cand1[5] = 33
                    margins = {5: 2.0 ** -10}
                cached = interval
                records += pair(p1, cand1, ref1, margins=margins, pool=pool, interval=interval, concurrency=conc,
                                session_id=sid, turn=1, cached_tokens=cached, t_start=t + 0.5, e2e=0.6,
                                spec_trace=spec_trace(len(p1), len(cand1), [4, 3], interval, fault),
                                fault="stale-seq-lens" if fault else None)
                t += 0.3
    # the reference for identical inputs is written once
    seen, unique = set(), []
    for r in records:
        if r["role"] == "reference":
            if r["key"] in seen:
                continue
            seen.add(r["key"])
        unique.append(r)
    cfg = config if config is not None else {"run_id": run_dir.name, "suite": "frozen", "intervals": list(intervals),
                                             "concurrency": list(concurrencies), "block_size": 8}
    return write_run(run_dir, unique, cfg)
