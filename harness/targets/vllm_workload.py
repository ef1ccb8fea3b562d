"""Boundary sessions for vLLM's prefix-cache rules, derived from the block its servers report (`--suite
vllm-boundary`).

vLLM keeps a hybrid model's linear state only at block boundaries, and only where a
scheduled step (a prefill chunk, a decode or verify step) ends exactly on one
(shared/reference/vllm-cpu.md); a full-attention model keeps every full block.
So the cases sit at offsets around multiples of the block the server reports in
`vllm:cache_config_info`: a prompt ending on a boundary, a few tokens before it
(decoding, and verify steps of width B, cross it), a few after it. Turn 1 extends
turn 0 (prompt + output + a short suffix), so it can restore what turn 0 left;
the records' `cached_tokens` say what vLLM actually restored. Prompts are held-out
text in the target's own tokens, at exact token lengths.
"""

from __future__ import annotations

from pathlib import Path

from protocol.hf_tokenizer import load_tokenizer
from workloads.schema import Session, Turn

SUITE = "vllm-boundary"
HELDOUT = Path(__file__).resolve().parents[2] / "workloads" / "data" / "heldout.txt"
SUFFIX_TOKENS = 16


def offsets(block_size: int | None) -> list[int]:
    """Prompt-length offsets from a boundary: on it, just before (decode crosses it; with speculation, a verify
    step of width B crosses it from B+1 before), just after."""
    b = block_size or 1
    return sorted({-(b + 1), -b, -2, -1, 0, 1, b})


def boundary_sessions(model_dir: str, interval: int, block_size: int | None, max_model_len: int = 2048,
                      max_boundaries: int = 3) -> list[Session]:
    """Two-turn sessions around the first `max_boundaries` multiples of `interval` that fit `max_model_len`."""
    if interval < 2:
        raise ValueError(f"block {interval}: too small to place cases around")
    tok = load_tokenizer(model_dir)
    ids = tok.encode(HELDOUT.read_text(encoding="utf-8"))
    max_new = 2 * (block_size or 1) + 8
    sessions = []
    for k in range(1, max_boundaries + 1):
        boundary = k * interval
        for off in offsets(block_size):
            n = boundary + off
            if n < 8 or n + max_new + SUFFIX_TOKENS + max_new > max_model_len or n + SUFFIX_TOKENS > len(ids):
                continue
            start = (len(sessions) * 997) % (len(ids) - n - SUFFIX_TOKENS)  # distinct text: no sharing across cases
            prompt = tuple(ids[start:start + n])
            suffix = tuple(ids[start + n:start + n + SUFFIX_TOKENS])
            sessions.append(Session(
                session_id=f"{SUITE}-b{interval}-k{k}-o{off:+d}", suite=SUITE, interval=interval, group="offset",
                targets=f"Prompt of {n} tokens, {off:+d} from block boundary {boundary} (block {interval}); turn 1 "
                        "extends turn 0 and may restore the state vLLM kept there.",
                meta={"boundary_offset": off, "boundary": boundary, "k": k, "turn0_len": n,
                      "block_size": block_size, "tokenizer": str(model_dir)},
                turns=(Turn(max_new, input_ids=prompt, text=tok.decode(prompt)),
                       Turn(max_new, suffix_ids=suffix, suffix_text=tok.decode(suffix)))))
    if not sessions:
        raise ValueError(f"block {interval}: no boundary case fits --max-model-len {max_model_len}")
    return sessions
