"""The trained tiny Qwen3-Next and its DFlash drafter (tests/sglang_setup/model): the committed files, the
drafter's batched training forward, and the committed suite cut in the model's tokenizer.

The drafter forward is checked against itself one block at a time (a block sees only the context before its
anchor and its own block), its RoPE against the engine's independent one; that SGLang computes the same drafts
is measured through SGLang (tests/e2e/test_sglang_37818.py: accepted drafts per verify step; and the build's
simulated commit lengths equalled SGLang's verify trace step for step when this was written).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from engine.model.layers import rope as engine_rope
from protocol.hf_tokenizer import load_tokenizer
from tests.sglang_setup.model import DRAFTER_DIR, TARGET_DIR, WEIGHTS
from tests.sglang_setup.model.config import MASK_ID, MASK_TOKEN, TARGET, TARGET_LAYER_IDS, drafter_config
from tests.sglang_setup.model.distill import block_loss, block_weights
from tests.sglang_setup.model.drafter import DFlashDrafter, block_mask, rope
from workloads.frozen import main as frozen_main
from workloads.schema import WorkloadError


def _drafter(seed: int = 0) -> DFlashDrafter:
    d = DFlashDrafter(drafter_config(8, 1))
    d.init_weights(seed)
    return d.eval()


def test_committed_files_are_small_and_what_sglang_loads():
    sizes = {p.relative_to(WEIGHTS).as_posix(): p.stat().st_size for p in WEIGHTS.rglob("*") if p.is_file()}
    assert sum(sizes.values()) < 20 * 2 ** 20, sizes
    target = json.loads((TARGET_DIR / "config.json").read_text())
    assert (target["architectures"], target["full_attention_interval"]) == (["Qwen3NextForCausalLM"], 4)
    assert target["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert {k: target[k] for k in ("vocab_size", "hidden_size", "num_experts")} == {
        k: TARGET[k] for k in ("vocab_size", "hidden_size", "num_experts")}
    card = json.loads((TARGET_DIR / "specgate_model.json").read_text())
    assert card["sglang_args"] == ["--dtype", "float32"] and card["trained"] is True
    drafter = json.loads((DRAFTER_DIR / "config.json").read_text())
    assert drafter["architectures"] == ["DFlashDraftModel"] and drafter["hidden_size"] == target["hidden_size"]
    assert drafter["dflash_config"] == {"target_layer_ids": list(TARGET_LAYER_IDS), "mask_token": MASK_TOKEN,
                                        "mask_token_id": MASK_ID, "block_size": 8}
    assert max(TARGET_LAYER_IDS) + 1 < target["num_hidden_layers"]  # SGLang captures before layer id + 1
    assert load_tokenizer(str(TARGET_DIR)).encode(MASK_TOKEN) != [MASK_ID]  # typed text never becomes the mask
    assert json.loads((TARGET_DIR / "tokenizer.json").read_text())["added_tokens"][MASK_ID]["content"] == MASK_TOKEN


def test_the_drafter_weights_are_sglangs_names_and_load_strictly():
    cfg = json.loads((DRAFTER_DIR / "config.json").read_text())
    state = load_file(DRAFTER_DIR / "model.safetensors")
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.0.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight"} <= set(state)
    DFlashDrafter(cfg).load_state_dict(state, strict=True)


def test_training_report_meets_the_acceptance_goal():
    report = json.loads((WEIGHTS / "training.json").read_text())
    assert report["wall_seconds"] <= 30 * 60
    assert report["target"]["steps"] > 0 and report["drafter"]["steps"] > 0
    assert report["acceptance"]["mean_accepted_drafts"] >= 2.0  # simulated; tests/e2e measures it through SGLang


def test_rope_is_the_engines_rotate_half_rope():
    gen = torch.Generator().manual_seed(0)
    x, pos = torch.randn(2, 5, 3, 32, generator=gen), torch.randint(0, 500, (2, 5), generator=gen)
    assert torch.allclose(rope(x, pos, 10000.0), engine_rope(x, pos, 10000.0), atol=1e-5)


def test_block_mask_sees_the_context_before_its_anchor_and_its_own_block():
    mask = block_mask(torch.tensor([[2, 5]]), B=2, C=6)[0]
    assert mask.tolist() == [
        [True, True, False, False, False, False, True, True, False, False],
        [True, True, False, False, False, False, True, True, False, False],
        [True, True, True, True, True, False, False, False, True, True],
        [True, True, True, True, True, False, False, False, True, True]]


def test_blocks_drafted_together_equal_blocks_drafted_alone():
    """What training computes for many anchors at once is what serving computes for one block: features past an
    anchor never reach its block, nor do the other blocks."""
    d, gen = _drafter(), torch.Generator().manual_seed(1)
    feats, embeds = torch.randn(1, 40, 3 * 128, generator=gen), torch.randn(1, 3, 8, 128, generator=gen)
    anchors = torch.tensor([[7, 20, 31]])
    together = d(feats, embeds, anchors)
    for a in range(3):
        p = int(anchors[0, a])
        alone = d(feats[:, :p], embeds[:, a:a + 1], anchors[:, a:a + 1])
        assert torch.allclose(together[:, a], alone[:, 0], atol=1e-5)


def test_distillation_lowers_the_block_loss():
    torch.manual_seed(0)
    d = _drafter().train()
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 64, (2, 40), generator=gen)
    feats, embed, head = torch.randn(2, 40, 3 * 128, generator=gen), torch.randn(64, 128, generator=gen), torch.randn(
        64, 128, generator=gen)
    anchors, w = torch.tensor([[5, 20], [9, 30]]), block_weights(8, 5.0)
    opt = torch.optim.Adam(d.parameters(), lr=3e-3)
    first = block_loss(d, ids, feats, anchors, embed, head, w).item()
    for _ in range(30):
        opt.zero_grad()
        block_loss(d, ids, feats, anchors, embed, head, w).backward()
        opt.step()
    assert block_loss(d, ids, feats, anchors, embed, head, w).item() < 0.5 * first


def test_the_committed_suite_is_the_generators_in_the_models_tokenizer(capsys):
    args = ["--file", str(WEIGHTS / "frozen.jsonl"), "--tokenizer", str(TARGET_DIR)]
    assert frozen_main(["--check", *args]) == 0
    assert frozen_main(["--describe", *args]) == 0
    assert "total: 72 sessions (36 at I=128, 36 at I=256), 148 requests" in capsys.readouterr().out
    with pytest.raises(WorkloadError, match="outside the vocabulary 0..259"):  # read as the byte tokenizer's
        frozen_main(["--describe", "--file", str(WEIGHTS / "frozen.jsonl")])
