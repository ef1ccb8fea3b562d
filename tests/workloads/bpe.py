"""A small byte-level BPE tokenizer trained on the held-out text with HF `tokenizers` (no download)."""

from __future__ import annotations

from pathlib import Path

from protocol.hf_tokenizer import load_tokenizer
from workloads.corpus import heldout_documents

VOCAB = 800


def train_bpe(directory: Path):
    """Train, save as `directory/tokenizer.json` (with an `<eos>` special token) and load it as specgate does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((d.text for d in heldout_documents()), trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tok.save(str(path))
    return load_tokenizer(path)
