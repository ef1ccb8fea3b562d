"""GET /metrics (Prometheus text): speculation and prefix-cache counters, and what vLLM reports of its settings.

vLLM has no /server_info; its /metrics carries `vllm:cache_config_info` (an
info gauge whose labels are the cache settings: block_size,
enable_prefix_caching, mamba_block_size, mamba_cache_mode) and, when
speculating, `vllm:spec_decode_num_accepted_tokens_per_pos_total` with one
`position` label per draft token: enough to plan a run against it.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp

# counters worth keeping before and after a run (summed over label sets)
COUNTERS = (
    "specgate_spec_verify_steps_total", "specgate_generation_tokens_total", "specgate_prompt_tokens_total",
    "specgate_cached_tokens_total", "specgate_checkpoint_evictions_total", "specgate_kv_evicted_pages_total",
    "sglang:cached_tokens_total",
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:spec_accept_length",
    "sglang:cache_hit_rate",
)
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line; comments and malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), value))
    return out


def counters(samples) -> dict[str, float]:
    """The known counters present in `samples`, summed over their label sets."""
    out: dict[str, float] = {}
    for name, _, value in samples:
        if name in COUNTERS:
            out[name] = out.get(name, 0.0) + value
    return out


def _int(value) -> int | None:
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if n > 0 else None


def vllm_settings(samples) -> tuple[dict, list[str]]:
    """(settings under SGLang's names, notes) that vLLM's /metrics reveals; ({}, []) for a server without them."""
    cache = next((labels for name, labels, _ in samples if name == "vllm:cache_config_info"), None)
    positions = {labels.get("position") for name, labels, _ in samples
                 if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
    spec = positions or any(name.startswith("vllm:spec_decode_") for name, _, _ in samples)
    if cache is None and not spec:
        return {}, []
    info: dict = {"speculative_algorithm": "VLLM" if spec else "NONE"}
    notes = []
    if positions:
        info["speculative_num_draft_tokens"] = len(positions) + 1  # k drafts + the bonus token per verify
        notes.append(f"block size {len(positions) + 1} from {len(positions)} spec_decode positions in /metrics")
    if cache is not None:
        info["disable_radix_cache"] = cache.get("enable_prefix_caching") != "True"
        mode = cache.get("mamba_cache_mode")
        # Where hits land: vLLM's resolved alignment when it reports one, else the (attention) block, which align
        # mode raises so one page holds a state page. Not mamba_block_size: measured on vLLM 0.32 (CPU, Qwen3-Next,
        # block_size 256, mamba_block_size 16), cached_tokens come in multiples of 256.
        interval = None
        if not info["disable_radix_cache"]:
            interval = next((_int(cache.get(k)) for k in ("cache_hit_alignment_tokens", "prefix_match_unit",
                                                          "block_size", "mamba_block_size")
                             if _int(cache.get(k))), None)
        if interval:
            info["mamba_track_interval"] = interval
            notes.append(f"interval {interval} from vllm:cache_config_info (the prefix cache's block granularity"
                         f"{', mamba_cache_mode ' + mode if mode else ''})")
        if mode:
            info["mamba_radix_cache_strategy"] = f"vllm-{mode}"
    return info, notes


async def fetch_samples(http: aiohttp.ClientSession, url: str, headers: dict, timeout: float = 10.0) -> list:
    """The samples of GET /metrics, or [] when the server has none."""
    try:
        async with http.get(f"{url}/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return []
            return parse_prometheus(await resp.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        return []


async def fetch_counters(http: aiohttp.ClientSession, url: str, headers: dict) -> dict[str, float]:
    """The known counters of GET /metrics ({} when there are none)."""
    return counters(await fetch_samples(http, url, headers))


async def snapshot(http: aiohttp.ClientSession, pools) -> dict:
    """{pool name: {url: counters}} of every replica's /metrics (pools: objects with .name, .replicas, .backend)."""
    out: dict = {}
    for pool in pools:
        for r in pool.replicas:
            out.setdefault(pool.name, {})[r.url] = await pool.backend.counters(http, r.url)
    return out


def counter_report(before: dict, after: dict) -> dict:
    """server_counters.json: per pool and URL the counters before and after driving, their deltas, and the
    mean accepted length per verify step where the server counts drafts (vLLM: 1 + accepted / drafts)."""
    out: dict = {}
    for pool, urls in after.items():
        for url, end in urls.items():
            start = before.get(pool, {}).get(url, {})
            delta = {k: v - start.get(k, 0.0) for k, v in end.items()}
            entry = {"before": start, "after": end, "delta": delta}
            drafts = delta.get("vllm:spec_decode_num_drafts_total")
            if drafts:
                entry["mean_accept_length"] = 1 + delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts
            steps = delta.get("specgate_spec_verify_steps_total")
            if steps:
                entry["mean_accept_length"] = delta.get("specgate_generation_tokens_total", 0.0) / steps
            out.setdefault(pool, {})[url] = entry
    return out


def with_earlier_parts(report: dict, earlier: dict | None) -> dict:
    """`report` (counter_report of this part of a run) with the entries of its earlier parts (`earlier`: the run
    directory's server_counters.json before a --resume; its servers' URLs, each entry marked `part: "earlier"`),
    so that the deltas summed over a pool's URLs cover the whole run, not only the part that was resumed. An URL
    in both keeps this part's counters and adds the earlier part's delta."""
    if not isinstance(earlier, dict):
        return report
    out = {pool: dict(urls) for pool, urls in report.items()}
    for pool, urls in earlier.items():
        if not isinstance(urls, dict):
            continue
        for url, entry in urls.items():
            if not isinstance(entry, dict):
                continue
            mine = out.setdefault(pool, {}).get(url)
            if mine is None:
                out[pool][url] = {**entry, "part": "earlier"}
            else:
                delta = {k: mine["delta"].get(k, 0.0) + float(v) for k, v in (entry.get("delta") or {}).items()}
                out[pool][url] = {**mine, "delta": {**mine["delta"], **delta}}
    return out

