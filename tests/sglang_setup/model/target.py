"""The target: a byte-level BPE tokenizer and a Hugging Face Qwen3-Next trained on the built-in model's corpus.

Runs under an engine venv's interpreter (transformers). The text is training.data's split of the stdlib source
(held-out files never read: workload prompts come from them); the tokenizer is trained on the training text; the
model on random windows of it, next-token cross entropy, with training.loop's AdamW, schedule and step loop.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.sglang_setup.model.config import EOS_TOKEN, MASK_TOKEN, TARGET, VOCAB
from training.data import sample_windows, step_generator
from training.loop import StepLoop, make_optimizer


@dataclass(frozen=True)
class TargetConfig:
    """Budget and optimiser of the target phase (a config StepLoop reads)."""

    minutes: float = 10.0  # used when steps == 0
    steps: int = 250  # > 0: a fixed number of steps (reproducible), the schedule follows it
    seq_len: int = 512
    batch_size: int = 4
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: float = 0.03
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0


def train_tokenizer(text: str, out: Path):
    """A byte-level BPE of VOCAB ids over the training text (every byte representable), with `<|endoftext|>`
    (id 0) and `<|mask|>` (id 1) as special tokens; saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS_TOKEN, MASK_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   mask_token=MASK_TOKEN)
    fast.save_pretrained(out)
    return tok


def new_model(seed: int):
    """A freshly initialised Qwen3-Next of config.TARGET (transformers' own init, seeded), fp32."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    fields = {k: v for k, v in TARGET.items() if k not in ("architectures", "model_type", "full_attention_interval")}
    return Qwen3NextForCausalLM(Qwen3NextConfig(**fields)).float()


def lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy (nats) of windows ids [B, T]."""
    logits = model(input_ids=ids[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class TargetTrainer(StepLoop):
    """The target phase: random windows of the token stream, one StepLoop step each."""

    desc = "target"

    def __init__(self, model, tc: TargetConfig, tokens: torch.Tensor) -> None:
        super().__init__()
        self.module = model
        self.tc = tc
        self.tokens = tokens
        self.budget_s = tc.minutes * 60
        self.opt = make_optimizer(list(model.named_parameters()), tc.lr, tc.weight_decay)

    def loss(self) -> torch.Tensor:
        gen = step_generator(self.tc.seed, self.step)
        return lm_loss(self.module, sample_windows(self.tokens, self.tc.batch_size, self.tc.seq_len + 1, gen))


@torch.no_grad()
def validation_loss(model, tokens: torch.Tensor, windows: int = 16, length: int = 512) -> float:
    """Mean next-token loss (nats) on evenly spaced windows of the validation tokens."""
    model.eval()
    stride = (len(tokens) - length - 1) // windows
    ids = torch.stack([tokens[i * stride: i * stride + length + 1] for i in range(windows)]).long()
    return float(torch.stack([lm_loss(model, ids[i:i + 4]) for i in range(0, windows, 4)]).mean())


def save(model, out: Path) -> None:
    """model.safetensors + config.json, with the fields SGLang's Qwen3-Next reads that transformers 5 omits
    (full_attention_interval)."""
    model.save_pretrained(out, safe_serialization=True)
    config = json.loads((out / "config.json").read_text())
    config["full_attention_interval"] = TARGET["full_attention_interval"]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def bits_per_byte(loss_nats: float, bytes_per_token: float) -> float:
    return loss_nats / math.log(2) / bytes_per_token
