"""The shapes of the tiny target and its drafter, and their config.json as SGLang reads them.

The target is a Qwen3-Next (Hugging Face `Qwen3NextForCausalLM`): 3 Gated DeltaNet layers and one full-attention
layer (full_attention_interval 4), sparse MoE in every layer as SGLang's Qwen3-Next builds it, a byte-level BPE
vocabulary with `<|endoftext|>` (id 0) and `<|mask|>` (id 1, DFlash's mask token, never in the text). The
drafter is a DFlashDraftModel (SGLang's models/dflash.py): Qwen3-style layers at the target's hidden size, a
projection `fc` of the captured target features with `hidden_norm`, a final `norm`; the target's embedding and
LM head. `target_layer_ids` [0, 1, 2]: SGLang captures the residual stream before layer id + 1, i.e. the output
of layer id, so with 4 target layers 2 is the deepest it can capture.
"""

from __future__ import annotations

EOS_TOKEN, MASK_TOKEN = "<|endoftext|>", "<|mask|>"
EOS_ID, MASK_ID = 0, 1
VOCAB = 1024
HIDDEN = 128
TARGET_LAYERS = 4
TARGET_LAYER_IDS = (0, 1, 2)
BLOCK_SIZE = 8

TARGET = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 256, "num_hidden_layers": TARGET_LAYERS,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "full_attention_interval": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": [],
    "tie_word_embeddings": False, "eos_token_id": EOS_ID, "bos_token_id": EOS_ID, "pad_token_id": EOS_ID,
    "attention_bias": False,
}

DRAFTER_LAYERS = 2
DRAFTER = {
    "hidden_size": HIDDEN, "intermediate_size": 512, "num_hidden_layers": DRAFTER_LAYERS,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}


def drafter_config(block_size: int = BLOCK_SIZE, layers: int = DRAFTER_LAYERS) -> dict:
    """config.json of the drafter directory: a Qwen3 body named DFlashDraftModel with its dflash_config."""
    d = {**DRAFTER, "num_hidden_layers": layers}
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", **d,
        "rope_parameters": {"rope_type": "default", "rope_theta": d["rope_theta"]},
        "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "vocab_size": VOCAB,
        "max_position_embeddings": TARGET["max_position_embeddings"], "torch_dtype": "float32", "dtype": "float32",
        "block_size": block_size, "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"target_layer_ids": list(TARGET_LAYER_IDS), "mask_token": MASK_TOKEN,
                          "mask_token_id": MASK_ID, "block_size": block_size},
    }
