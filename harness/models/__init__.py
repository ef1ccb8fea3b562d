"""Tiny models built locally for real engines (vLLM, SGLang): a BPE tokenizer, a config, seeded random weights.

`python -m harness.models build DIR --arch {llama,qwen3_next,mamba2}` trains a
byte-level BPE on the held-out text with `tokenizers`, writes the architecture's
config and seeded random weights (LM head scaled so greedy decoding is not
tie-bound) with `transformers`, and a greedy fp32 continuation by transformers of
a few held-out prompts (`reference.json`), an oracle independent of the engine.
Nothing is downloaded. transformers is not a dependency of the project: the
build runs `hf_build.py` under an engine's interpreter, which has it (`--python`;
default: `make vllm`'s .venv-vllm, else `make sglang`'s .venv-sglang). The model
card (`specgate_model.json`) holds the flags each engine needs for the model:
`vllm_args` (--engine vllm adds them) and `sglang_args` (--engine sglang).
"""

from __future__ import annotations

# arch -> vLLM flags the model needs on this machine (shared/reference/vllm-cpu.md)
ARCHS = {
    "llama": ("--dtype", "float32"),
    "qwen3_next": ("--dtype", "bfloat16"),  # vLLM's CPU Gated DeltaNet kernel requires bf16
    "mamba2": ("--dtype", "float32"),
}
# arch -> SGLang flags: fp32 as built (SGLang's default --dtype auto serves an fp32 checkpoint as fp16)
SGLANG_ARGS = {arch: ("--dtype", "float32") for arch in ARCHS}
MODEL_CARD = "specgate_model.json"  # what was built and the engines' flags it needs


def card_args(model_dir: str, key: str) -> tuple[str, tuple[str, ...]]:
    """(the model directory, resolved; the flags its model card asks one engine for under `key`, `vllm_args` or
    `sglang_args`): none where the directory has no readable card."""
    import json
    from pathlib import Path

    path = Path(model_dir).expanduser().resolve()
    card = path / MODEL_CARD
    extra: tuple[str, ...] = ()
    if card.is_file():
        try:
            extra = tuple(json.loads(card.read_text()).get(key) or ())
        except (OSError, ValueError):
            extra = ()
    return str(path), extra
