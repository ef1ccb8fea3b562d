"""What the drafter learns from: the frozen target's greedy continuations and the features SGLang captures.

`features(model, ids)` is what SGLang's Qwen3-Next hands the DFlash drafter: the residual stream after each of
config.TARGET_LAYER_IDS (SGLang captures the input of layer id + 1), concatenated, per position; read here
with forward hooks on the Hugging Face layers. `speculate` runs greedy DFlash decoding (draft a block, verify
it with the target, commit the agreeing prefix plus the bonus token) to estimate acceptance before SGLang
measures it. Runs under an engine venv's interpreter (transformers).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from tests.sglang_setup.model.config import MASK_ID, TARGET_LAYER_IDS
from tests.sglang_setup.model.drafter import DFlashDrafter, draft_block


@dataclass
class Rollouts:
    ids: torch.Tensor  # [R, L] prompt + greedy continuation, padded with EOS to the longest row
    prompt_lens: torch.Tensor  # [R]
    lengths: torch.Tensor  # [R] prompt + continuation, without the padding
    features: torch.Tensor | None = None  # [R, L, F*h]


@torch.no_grad()
def features(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, T, F*h], logits [N, T, V]) of ids [N, T]."""
    captured: dict[int, torch.Tensor] = {}
    hooks = [model.model.layers[i].register_forward_hook(
        lambda _m, _a, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in TARGET_LAYER_IDS]
    try:
        logits = model(input_ids=ids).logits
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([captured[i] for i in TARGET_LAYER_IDS], dim=-1).float(), logits


def prompts(tokens: torch.Tensor, count: int, lengths: tuple[int, ...], newline_id: set[int], seed: int) -> list:
    """`count` prompts of the training tokens, each starting after a token that ends a line, their lengths
    cycling through `lengths` (equal lengths batch without padding)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        n = lengths[len(out) % len(lengths)]
        start = rng.randrange(len(tokens) - n - 1)
        while start < len(tokens) - n - 1 and int(tokens[start]) not in newline_id:
            start += 1
        if start < len(tokens) - n - 1:
            out.append(tokens[start + 1: start + 1 + n].long())
    return out


@torch.no_grad()
def greedy_rollouts(model, prompt_list: list, new_tokens: int, batch: int = 16) -> Rollouts:
    """Greedy continuations (transformers' generate with its cache) of prompts, batched by equal length."""
    model.eval()
    rows, lens = [], []
    by_len: dict[int, list] = {}
    for p in prompt_list:
        by_len.setdefault(len(p), []).append(p)
    for n, group in sorted(by_len.items()):
        for i in range(0, len(group), batch):
            x = torch.stack(group[i:i + batch])
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            rows += list(out)
            lens += [n] * len(x)
    width = max(len(r) for r in rows)
    padded = torch.stack([torch.cat([r, r.new_zeros(width - len(r))]) for r in rows])  # causal: padding after
    return Rollouts(padded, torch.tensor(lens), torch.tensor([len(r) for r in rows]))


@torch.no_grad()
def speculate(model, drafter: DFlashDrafter, prompt: list[int], new_tokens: int) -> dict:
    """Greedy DFlash decoding of `prompt` for `new_tokens` tokens: the output and each verify step's commit
    length (accepted drafts + the bonus token), as SGLang's DFlash worker commits them."""
    embed, lm_head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    ids = list(prompt)
    feats, logits = features(model, torch.tensor([ids]))
    bonus = int(logits[0, -1].argmax())
    commits = []
    while len(ids) - len(prompt) < new_tokens:
        drafts = draft_block(drafter, feats[0], bonus, embed, lm_head, MASK_ID)
        block = [bonus, *drafts]
        feats_v, logits_v = features(model, torch.tensor([ids + block]))
        target = logits_v[0, len(ids):].argmax(-1).tolist()  # the target's token after each block position
        accepted = next((j for j, d in enumerate(drafts) if d != target[j]), len(drafts))
        ids += block[: accepted + 1]
        bonus = target[accepted]
        feats = feats_v[:, : len(ids)]
        commits.append(accepted + 1)
    return {"output": ids[len(prompt):][:new_tokens], "commits": commits}
