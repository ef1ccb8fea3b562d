"""Cache counters per sweep point: each candidate replica's GET /metrics before and after, as stats records.

The figures (prefix-cache hit tokens, checkpoint evictions, KV page evictions) say whether a
run put the cache under pressure at all. A server that does not expose a counter gives None
("unknown" in configs.csv), never 0.
"""

from __future__ import annotations

import asyncio

import aiohttp

from records.schema import CACHE_COUNTERS, build_stats_record

# cache counter -> Prometheus metric names that carry it (the built-in engine's, then SGLang's)
METRIC_NAMES = {
    "cache_hit_tokens": ("specgate_cached_tokens_total", "sglang:cached_tokens_total", "vllm:prefix_cache_hits_total"),
    "checkpoint_evictions": ("specgate_checkpoint_evictions_total",),
    "kv_evicted_pages": ("specgate_kv_evicted_pages_total",),
}
assert set(METRIC_NAMES) == set(CACHE_COUNTERS)


def cache_counters(metrics: dict[str, float] | None) -> dict[str, float | None]:
    """The cache counters found in a server's counters (None where the server exposes none of the names)."""
    out: dict[str, float | None] = {}
    for counter, names in METRIC_NAMES.items():
        found = [metrics[n] for n in names if metrics and n in metrics]
        out[counter] = found[0] if found else None
    return out


async def snapshot(http: aiohttp.ClientSession, pool) -> dict[str, dict]:
    """replica_id -> cache counters of every healthy replica of `pool` now (unknown when /metrics fails)."""
    replicas = [r for r in pool.replicas if r.healthy]
    found = await asyncio.gather(*(pool.backend.counters(http, r.url) for r in replicas))
    return {r.replica_id: cache_counters(c) for r, c in zip(replicas, found, strict=True)}


def stats_records(*, run_id: str, pool: str, concurrency: int, before: dict[str, dict], after: dict[str, dict],
                  t_start: float, t_end: float, partial: bool) -> list[dict]:
    """One stats record per replica seen before and after the sweep point."""
    return [build_stats_record(run_id=run_id, pool=pool, concurrency=concurrency, replica_id=rid,
                               before=before[rid], after=after.get(rid, {}), t_start=t_start, t_end=t_end,
                               partial=partial)
            for rid in sorted(before)]
