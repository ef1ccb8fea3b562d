"""The record contract (docs/records.md): what one answered request produced, and how a record is built.

`Generation` is what a backend hands over; `build_record` turns it and the request
into the JSON object written to the run's records. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = 1


@dataclass(frozen=True)
class Generation:
    """One finished /generate answer, reduced to what a record needs."""

    output_ids: list[int]
    output_text: str
    output_logprobs: list[float]
    output_top_logprobs: list[list[list]]  # per token: [[logprob, token_id], ...] best first
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    spec_verify_ct: int | None
    spec_accept_length: float | None
    spec_trace: list[list[int]] | None
    ttft: float | None
    itl: float | None
    e2e: float
    abort_message: str | None = None
    ttst: float | None = None  # time to second token: when the stream had delivered two tokens (None: unknown)
    # the prompt tokens' log-probs from the request's logprob_start_len on (SGLang's input_token_logprobs; None
    # where the server computed none: the first, or one the cache covered); None when not asked or not reported
    input_logprobs: list[float | None] | None = None
    # the built-in engine with a fault injected: whether the fault reached this request (meta_info's
    # injected_fault_hit, docs/engine.md); None from any other server
    injected_fault_hit: bool | None = None


def candidate_key(pool: str, concurrency: int, session_id: str, turn: int) -> str:
    """`i128-c4/<session_id>/<turn>`: unique per candidate request of a run (a closed-loop sweep point)."""
    return point_key(pool, f"c{concurrency}", session_id, turn)


def point_key(pool: str, point: str, session_id: str, turn: int) -> str:
    """`i128-<point>/<session_id>/<turn>`, `point` the sweep point's label: `c4` (closed loop, 4 in flight) or
    `r2.5` (open loop, 2.5 requests per second)."""
    return f"{pool}-{point}/{session_id}/{turn}"


def point_label(record: dict) -> str | None:
    """The sweep point label (`c4`, `r2.5`) of a candidate or warmup record, from its key."""
    key, pool = str(record.get("key") or ""), str(record.get("pool") or "")
    head = key.split("/", 2)[1 if key.startswith("warmup/") else 0] if "/" in key else ""
    return head[len(pool) + 1:] if head.startswith(pool + "-") else None


def sweep_point_of(key, concurrency) -> object:
    """A candidate's sweep point: its key's `<pool>-<point>` head (`i128-c4`, `i128-r2.5`: open-loop points all
    have concurrency None), else its concurrency (records without such a key)."""
    return key.split("/", 1)[0] if isinstance(key, str) and "/" in key else concurrency


def reference_key(input_hash: str) -> str:
    return f"ref/{input_hash}"


def case_meta(session) -> dict:
    """The workload case's own metadata, copied into every record of the session."""
    return {"group": session.group, "targets": session.targets, "interval": session.interval, **session.meta}


def build_record(*, run_id: str, key: str, role: str, pool: str, engine: dict, concurrency: int | None,
                 replica_id: str | None, node_id: str | None, session, turn: int, input_ids: list[int],
                 input_hash: str, max_new_tokens: int, gen: Generation | None, t_start: float, retries: int,
                 error: str | None, tokenizer: str, cache_lost: str | None = None, t_planned: float | None = None,
                 request_rate: float | None = None, arrival: str | None = None) -> dict:
    """One JSON-ready record; output fields are empty when `gen` is None (the request failed).

    `cache_lost`: why a later turn of a session could not find the cache its previous turn left on its replica
    ("resume", "replica restart", "fail-over"), so its prefix-cache restore path was not exercised; else None.
    `t_planned`: when the request was planned to be sent (wall time; `t_start` is when it was sent: later when
    its previous turn or the server was late); `request_rate`, `arrival`: the open-loop sweep point's shape
    (None for a closed-loop point, which has `concurrency`).
    """
    g = gen
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "key": key,
        "role": role,
        "pool": pool,
        "engine": engine,
        "interval": engine.get("interval") if role == "candidate" else None,
        "concurrency": concurrency,
        "replica_id": replica_id,
        "node_id": node_id,
        "suite": session.suite,
        "case_id": str(session.meta.get("case_id", session.session_id)),
        "session_id": session.session_id,
        "turn": turn,
        "case": case_meta(session),
        "input_hash": input_hash,
        "input_len": len(input_ids),
        "input_ids": list(input_ids),
        "max_new_tokens": max_new_tokens,
        "output_ids": g.output_ids if g else [],
        "output_text": g.output_text if g else "",
        "output_logprobs": g.output_logprobs if g else [],
        "output_top_logprobs": g.output_top_logprobs if g else [],
        "cached_tokens": g.cached_tokens if g else 0,
        "completion_tokens": g.completion_tokens if g else 0,
        "finish_reason": g.finish_reason if g else None,
        "spec_verify_ct": g.spec_verify_ct if g else None,
        "spec_accept_length": g.spec_accept_length if g else None,
        "spec_trace": g.spec_trace if g else None,
        "ttft": g.ttft if g else None,
        "itl": g.itl if g else None,
        "e2e": g.e2e if g else None,
        "t_start": t_start,
        "retries": retries,
        "error": error,
        "tokenizer": tokenizer,
        "cache_lost": cache_lost,
        "t_planned": t_start if t_planned is None else t_planned,
        "request_rate": request_rate,
        "arrival": arrival,
        "ttst": g.ttst if g else None,
        "injected_fault_hit": g.injected_fault_hit if g else None,
    }



# Per-sweep-point cache counters of one candidate replica (docs/records.md, "Stats records"), read from
# the server's GET /metrics before and after the sweep point; None: the server does not expose it.
CACHE_COUNTERS = ("cache_hit_tokens", "checkpoint_evictions", "kv_evicted_pages")
STATS_FILE = "stats.jsonl"


def stats_key(pool: str, concurrency: int, replica_id: str) -> str:
    """`stats/i128-c4/i128-r0`: one stats record per candidate replica per sweep point."""
    return f"stats/{pool}-c{concurrency}/{replica_id}"


def counter_deltas(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, int | None]:
    """after - before per cache counter; None where either side is unknown or the counter went back (a restart)."""
    out: dict[str, int | None] = {}
    for name in CACHE_COUNTERS:
        a, b = before.get(name), after.get(name)
        out[name] = int(round(b - a)) if a is not None and b is not None and b >= a else None
    return out


def build_stats_record(*, run_id: str, pool: str, concurrency: int, replica_id: str, before: dict, after: dict,
                       t_start: float, t_end: float, partial: bool) -> dict:
    """One JSON-ready stats record: the cache counters' change over one sweep point on one replica.

    `partial`: the sweep point was resumed, so the figures cover only the requests sent by this process.
    """
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "key": stats_key(pool, concurrency, replica_id),
        "role": "stats",
        "pool": pool,
        "concurrency": concurrency,
        "replica_id": replica_id,
        "counters": counter_deltas(before, after),
        "before": {k: before.get(k) for k in CACHE_COUNTERS},
        "after": {k: after.get(k) for k in CACHE_COUNTERS},
        "t_start": t_start,
        "t_end": t_end,
        "partial": partial,
    }


# One record per finished sweep point (role "point"): what it planned, sent, answered, failed and skipped,
# its warmup and why it stopped early (docs/load.md); warmup requests (role "warmup") are kept apart, not gated.
POINTS_FILE = "points.jsonl"
WARMUP_FILE = "warmup.jsonl"


def point_record_key(pool: str, point: str) -> str:
    """`point/i128-c4`: one point record per pool and sweep point."""
    return f"point/{pool}-{point}"


def warmup_key(pool: str, point: str, index: int) -> str:
    """`warmup/i128-c4/<n>`: the n-th warmup request of a sweep point."""
    return f"warmup/{pool}-{point}/{index}"
