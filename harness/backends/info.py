"""Reading a server's settings across SGLang versions (pure functions over its /server_info dict).

SGLang renamed `mamba_scheduler_strategy` to `mamba_radix_cache_strategy` in
mid-2026 (the old name stays a deprecated alias), and a DFlash server may report
its block size as `speculative_dflash_block_size` with `speculative_num_draft_tokens`
unset. These helpers read either spelling, so the plan never shows `B=None` for a
server that reports its block size.
"""

from __future__ import annotations

STRATEGY_KEYS = ("mamba_radix_cache_strategy", "mamba_scheduler_strategy")  # current name first
GATED_STRATEGIES = ("extra_buffer", "extra_buffer_lazy")  # the checkpointing path specgate gates (#37817)
STRATEGY_FLAG = "--mamba-radix-cache-strategy extra_buffer (SGLang builds before mid-2026: " \
                "--mamba-scheduler-strategy extra_buffer)"


def strategy_of(info: dict) -> str | None:
    """The mamba radix-cache strategy under either name, or None when the server reports neither."""
    for key in STRATEGY_KEYS:
        if info.get(key) is not None:
            return str(info[key])
    return None


def strategy_source(info: dict) -> str | None:
    """Which key the strategy came from (the deprecated alias is worth a note)."""
    return next((k for k in STRATEGY_KEYS if info.get(k) is not None), None)


def track_interval(info: dict) -> int | None:
    """The mamba checkpoint interval a server runs: None when it reports none, or when it says it uses no mamba
    radix cache (`uses_mamba_radix_cache: false`: a full-attention model such as a Llama, whose radix cache keeps
    every token; SGLang still reports its default `mamba_track_interval` then)."""
    if info.get("uses_mamba_radix_cache") is False or info.get("mamba_track_interval") is None:
        return None
    return int(info["mamba_track_interval"])


def speculative(info: dict) -> bool:
    """Whether the server speculates (`speculative_algorithm` set and not NONE)."""
    return str(info.get("speculative_algorithm") or "NONE").upper() not in ("NONE", "")


def block_size_of(info: dict) -> int | None:
    """The verify block size B: DFlash's speculative_dflash_block_size, else speculative_num_draft_tokens."""
    if not speculative(info):
        return None
    for key in ("speculative_dflash_block_size", "speculative_num_draft_tokens"):
        value = info.get(key)
        if value is not None and not isinstance(value, bool) and int(value) > 0:
            return int(value)
    return None


def streaming_mode(info: dict) -> str:
    """"incremental" when the server streams deltas (SGLang's incremental_streaming_output), else "cumulative"."""
    return "incremental" if info.get("incremental_streaming_output") else "cumulative"


def candidate_problem(info: dict, url: str) -> str | None:
    """Why an SGLang server cannot be a candidate (None when it can): a strategy other than extra_buffer.

    A candidate without speculation or radix cache is refused later by the plan, with its own message; one that
    uses no mamba radix cache (`uses_mamba_radix_cache: false`) has no strategy to check.
    """
    if info.get("disable_radix_cache") or not speculative(info) or info.get("uses_mamba_radix_cache") is False:
        return None
    strategy = strategy_of(info)
    if strategy in GATED_STRATEGIES:
        return None
    what = f"runs mamba radix cache strategy {strategy!r}" if strategy is not None else \
        "reports no mamba_radix_cache_strategy (nor the older mamba_scheduler_strategy)"
    return (f"endpoint {url}: the candidate {what}; specgate gates the extra_buffer checkpoints at every "
            f"track interval (where bug #37817 lives): restart the server with {STRATEGY_FLAG}")


def probe_lines(server_infos) -> list[str]:
    """The dry-run plan's lines about what the pool's servers report (from their `specgate_probe` records)."""
    lines = []
    for info in server_infos:
        rec = info.get("specgate_probe") or {}
        if not rec:
            continue
        what = [f"backend {rec.get('backend')}", f"streaming {rec.get('streaming', 'cumulative')}"]
        if rec.get("block_size") is not None:
            what.append(f"block size {rec['block_size']}")
        lines.append("  reports: " + ", ".join(what))
        if rec.get("unknown"):
            lines.append("  not reported (the report narrows): " + ", ".join(rec["unknown"]))
        lines += [f"  note: {n}" for n in rec.get("notes", [])]
    return lines
