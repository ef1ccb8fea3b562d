"""Prometheus text exposition of the engine's stats (GET /metrics)."""

from __future__ import annotations

# (stats key, metric name, type, help); counters end in _total as Prometheus expects
ENGINE_METRICS: list[tuple[str, str, str, str]] = [
    ("requests", "specgate_requests_total", "counter", "Requests submitted to the engine."),
    ("finished", "specgate_requests_finished_total", "counter", "Requests that left the engine (any reason)."),
    ("aborted", "specgate_requests_aborted_total", "counter", "Requests aborted (client gone, shutdown)."),
    ("prompt_tokens", "specgate_prompt_tokens_total", "counter", "Prompt tokens received."),
    ("generation_tokens", "specgate_generation_tokens_total", "counter", "Tokens generated."),
    ("cached_tokens", "specgate_cached_tokens_total", "counter", "Prompt tokens served from the radix cache."),
    ("verify_steps", "specgate_spec_verify_steps_total", "counter", "Speculative verify steps."),
    ("avg_accept_length", "specgate_spec_accept_length", "gauge",
     "Average generated tokens per verify step since start (0 without speculation)."),
    ("running", "specgate_num_running_reqs", "gauge", "Requests in the running batch."),
    ("waiting", "specgate_num_queue_reqs", "gauge", "Requests waiting for admission (queue depth)."),
    ("kv_pages_used", "specgate_kv_pages_used", "gauge", "KV pool pages in use (requests and radix cache)."),
    ("kv_pages_total", "specgate_kv_pages_total", "gauge", "KV pool capacity in pages."),
    ("state_slots_used", "specgate_state_slots_used", "gauge", "Linear-state pool slots in use."),
    ("state_slots_total", "specgate_state_slots_total", "gauge", "Linear-state pool capacity in slots."),
    ("radix_pages", "specgate_radix_pages", "gauge", "KV pages held only by the radix cache."),
    ("radix_checkpoints", "specgate_radix_checkpoints", "gauge", "Linear-state checkpoints held by the radix cache."),
    ("kv_evicted_pages", "specgate_kv_evicted_pages_total", "counter", "KV pages evicted from the radix cache."),
    ("checkpoint_evictions", "specgate_checkpoint_evictions_total", "counter",
     "Checkpoints evicted from the radix cache."),
]


def _line(name: str, kind: str, doc: str, value: float) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name} {float(value)!r}\n"


def render(stats: dict, server: dict) -> str:
    """Prometheus text for engine `stats` plus server-level gauges/counters in `server`."""
    parts = [_line(name, kind, doc, stats[key]) for key, name, kind, doc in ENGINE_METRICS if key in stats]
    total = stats.get("kv_pages_total") or 0
    if total:
        parts.append(_line("specgate_token_usage", "gauge", "Fraction of the KV pool in use.",
                           stats.get("kv_pages_used", 0) / total))
    parts.append(_line("specgate_http_inflight_requests", "gauge", "Generation requests the server is answering.",
                       server["inflight"]))
    parts.append(_line("specgate_client_disconnects_total", "counter",
                       "Generation requests aborted because the client went away.", server["disconnects"]))
    parts.append(_line("specgate_engine_healthy", "gauge", "1 while the engine loop is alive.", server["healthy"]))
    parts.append(_line("specgate_draining", "gauge", "1 once shutdown has begun.", server["draining"]))
    return "".join(parts)
