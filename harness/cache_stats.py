"""Cache counters per sweep point: each candidate replica's GET /metrics before and after, as stats records.

The figures (prefix-cache hit tokens, checkpoint evictions, KV page evictions) say whether a
run put the cache under pressure at all. A server that does not expose a counter gives None
("unknown" in configs.csv), never 0.
"""

from __future__ import annotations

import asyncio

import aiohttp

from harness.backends import sglang as client
from records.schema import CACHE_COUNTERS, build_stats_record

# cache counter -> Prometheus metric names that carry it (the built-in engine's, then SGLang's)
METRIC_NAMES = {
    "cache_hit_tokens": ("specgate_cached_tokens_total", "sglang:cached_tokens_total"),
    "checkpoint_evictions": ("specgate_checkpoint_evictions_total",),
    "kv_evicted_pages": ("specgate_kv_evicted_pages_total",),
}
assert set(METRIC_NAMES) == set(CACHE_COUNTERS)


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets, from Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def cache_counters(metrics: dict[str, float] | None) -> dict[str, float | None]:
    """The cache counters found in parsed metrics (None where the server exposes none of the names)."""
    out: dict[str, float | None] = {}
    for counter, names in METRIC_NAMES.items():
        found = [metrics[n] for n in names if metrics and n in metrics]
        out[counter] = found[0] if found else None
    return out


async def snapshot(http: aiohttp.ClientSession, pool, api_key: str | None) -> dict[str, dict]:
    """replica_id -> cache counters of every healthy replica of `pool` now (unknown when /metrics fails)."""
    replicas = [r for r in pool.replicas if r.healthy]
    texts = await asyncio.gather(*(client.metrics(http, r.url, api_key) for r in replicas))
    return {r.replica_id: cache_counters(parse_prometheus(t) if t is not None else None)
            for r, t in zip(replicas, texts, strict=True)}


def stats_records(*, run_id: str, pool: str, concurrency: int, before: dict[str, dict], after: dict[str, dict],
                  t_start: float, t_end: float, partial: bool) -> list[dict]:
    """One stats record per replica seen before and after the sweep point."""
    return [build_stats_record(run_id=run_id, pool=pool, concurrency=concurrency, replica_id=rid,
                               before=before[rid], after=after.get(rid, {}), t_start=t_start, t_end=t_end,
                               partial=partial)
            for rid in sorted(before)]
