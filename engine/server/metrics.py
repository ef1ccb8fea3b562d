"""Prometheus text exposition of the engine's stats (GET /metrics).

Besides specgate's own names, a speculative server exports its speculation
counters under the names vLLM's and SGLang's dashboards read
(`vllm:spec_decode_*_total`, `sglang:spec_accept_length`, `sglang:spec_accept_rate`),
labelled with the served model id as those engines label theirs.
"""

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
    ("accepted_tokens", "specgate_spec_accepted_tokens_total", "counter",
     "Draft tokens the target accepted in verify steps (the bonus token not counted)."),
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


def _line(name: str, kind: str, doc: str, value: float, labels: str = "") -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name}{labels} {float(value)!r}\n"


def label_value(text: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def peer_spec_metrics(stats: dict, model_name: str, draft_tokens_per_step: int) -> list[str]:
    """The speculation counters under vLLM's and SGLang's names (vllm/v1/spec_decode/metrics.py, SGLang's
    metrics collector). vLLM: drafts = verify steps, draft tokens = steps x (B - 1), accepted = drafts the target
    agreed with. SGLang: accept length = 1 + accepted / steps (with the bonus token), accept rate = accepted /
    draft tokens; SGLang reports them over recent batches, these are since start."""
    steps, accepted = stats.get("verify_steps"), stats.get("accepted_tokens")
    if steps is None or accepted is None:
        return []
    drafted = steps * draft_tokens_per_step
    name = label_value(model_name)
    vllm, sglang = f'{{engine="0",model_name="{name}"}}', f'{{model_name="{name}"}}'
    return [
        _line("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", steps, vllm),
        _line("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", drafted, vllm),
        _line("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", accepted, vllm),
        _line("sglang:spec_accept_length", "gauge", "Mean acceptance length of speculative decoding (accepted "
              "drafts + bonus token per verify step), since start.", 1 + accepted / steps if steps else 0.0, sglang),
        _line("sglang:spec_accept_rate", "gauge", "Speculative acceptance rate (accepted drafts / proposed drafts), "
              "since start.", accepted / drafted if drafted else 0.0, sglang),
    ]


def render(stats: dict, server: dict, peer: list[str] | None = None) -> str:
    """Prometheus text for engine `stats`, server-level gauges/counters in `server`, and `peer` (the lines of
    peer_spec_metrics, for a speculative server)."""
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
    return "".join(parts + (peer or []))
