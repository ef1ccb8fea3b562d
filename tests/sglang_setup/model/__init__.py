"""A trained tiny Qwen3-Next and its DFlash drafter, in the formats SGLang loads, for the #37818 validation.

    .venv-sglang/bin/python -m tests.sglang_setup.model build      # ~20 min on 2 shared cores; writes WEIGHTS

Test setup, not product: SGLang serves these (tests/sglang_setup/hybrid) so that drafts are really accepted
through it. The trainer needs `transformers` (the Hugging Face Qwen3-Next is the format SGLang's
Qwen3NextForCausalLM loads), which only the engines' venvs have, so it lives here rather than in `training/`;
it takes the corpus split and the optimisation loop from `training/` (training.data, training.loop), the
same text and schedule the built-in engine's model is trained with. `drafter.py` and `config.py` need torch
only, so the project's tests import them; the rest runs under SGLang's interpreter.
"""

from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights"
TARGET_DIR = WEIGHTS / "target"  # --model-path: config.json, model.safetensors, tokenizer files, card
DRAFTER_DIR = WEIGHTS / "dflash"  # --speculative-draft-model-path: DFlashDraftModel config and weights
