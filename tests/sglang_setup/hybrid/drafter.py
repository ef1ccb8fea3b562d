"""`python drafter.py TARGET_DIR OUT_DIR [--block-size 4]`: a DFlash drafter directory for a target built with
`python -m harness.models build DIR --arch qwen3_next`, as SGLang reads one (shared/reference/sglang-cpu.md).

One Qwen3-style layer at the target's hidden size; `dflash_config.target_layer_ids` [0, L - 2] (SGLang adds 1 to
each id, so L - 2 is the highest it accepts); the mask token is the vocabulary's last id; the target's tokenizer.
No weights: serve it with `--speculative-draft-load-format dummy` (a drafter that almost never agrees, so its
verify steps commit one token each unless SGLANG_SIMULATE_ACC_LEN forces longer commits). Test setup only.
Standard library only: it runs under any interpreter.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def drafter_config(target: dict, block_size: int) -> dict:
    layers = target["num_hidden_layers"]
    if layers < 2:
        raise ValueError(f"the target has {layers} layer(s); DFlash reads hidden states of at least 2")
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": target["hidden_size"], "intermediate_size": 2 * target["hidden_size"],
        "num_hidden_layers": 1, "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"], "head_dim": target["head_dim"],
        "hidden_act": "silu", "rms_norm_eps": target["rms_norm_eps"],
        "max_position_embeddings": target["max_position_embeddings"], "rope_theta": 10000.0,
        "attention_bias": False, "tie_word_embeddings": False, "vocab_size": target["vocab_size"],
        "torch_dtype": target.get("dtype", "float32"), "dtype": target.get("dtype", "float32"),
        "block_size": block_size, "num_target_layers": layers,
        "dflash_config": {"target_layer_ids": [0, layers - 2], "mask_token_id": target["vocab_size"] - 1,
                          "block_size": block_size},
    }


def write_drafter(target_dir: Path, out: Path, block_size: int = 4) -> Path:
    target = json.loads((target_dir / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(drafter_config(target, block_size), indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(target_dir / name, out / name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--block-size", type=int, default=4, help="draft block (= --speculative-num-draft-tokens)")
    args = p.parse_args()
    print(write_drafter(args.target, args.out, args.block_size))


if __name__ == "__main__":
    main()
