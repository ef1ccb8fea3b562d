"""The training code: its forward equals the engine's, gradients reach every parameter, resume is exact,
and held-out text stays out of training."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.model.config import preset
from engine.model.drafter import DFlashDrafter, random_drafter_state_dict
from engine.model.hybrid import HybridLM
from protocol.tokenizer import MASK_ID
from tests.engine.helpers import OneSeq
from training.data import Corpus, load_corpus
from training.forward import drafter_train_forward, target_forward
from training.target import TargetTrainConfig, TargetTrainer
from workloads.corpus import heldout_documents, is_heldout


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_training_forward_matches_the_engine_path():
    cfg = preset("small")
    model = HybridLM(cfg).eval()
    model.init_random(3)
    ids = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h, aux = target_forward(model, ids, cfg.drafter_target_layers)
        seq = OneSeq(model, max_len=512)
        fb = seq.fb(300, capture=cfg.drafter_target_layers)
        h_ref, aux_ref = model(ids, fb, seq.caches)
    assert _rel(model.logits(h), model.logits(h_ref)) <= 1e-4
    assert _rel(aux, aux_ref) <= 1e-4
    # and continuing token by token from the pools gives the same next-token logits
    seq2 = OneSeq(model, max_len=512)
    first, _ = seq2.extend(ids[0, :200].tolist())
    rest = torch.stack([seq2.extend([t])[0][0] for t in ids[0, 200:230].tolist()])
    assert _rel(torch.cat([first, rest]), model.logits(h)[0, :230]) <= 1e-4


def test_training_gradients_flow_to_every_target_parameter():
    model = HybridLM(preset("tiny"))
    model.init_random(0)
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))
    h, _ = target_forward(model, ids)
    model.logits(h).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_batched_drafter_forward_matches_one_block_at_a_time():
    cfg = preset("small")
    target = HybridLM(cfg).eval()
    target.init_random(0)
    drafter = DFlashDrafter(cfg).eval()
    drafter.load_state_dict(random_drafter_state_dict(cfg, 0))
    L, bs = 96, 8
    ids = torch.randint(0, 256, (1, L), generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([[5, 40, 41, 80]])
    with torch.no_grad():
        _, aux = target_forward(target, ids, cfg.drafter_target_layers)
        block = torch.full((1, 4, bs), MASK_ID)
        block[..., 0] = ids[0, anchors[0]]
        batched = drafter_train_forward(drafter, target.embed, aux, block, anchors)
        for n, p in enumerate(anchors[0].tolist()):
            ctx = drafter.context_kv(aux[:, :p], torch.arange(p)[None])
            one = drafter(target.embed, block[:, n], (p + torch.arange(bs))[None], ctx, torch.tensor([p]))
            assert _rel(batched[:, n], one) <= 1e-4


class _Interrupted(Exception):
    pass


def test_resume_gives_the_same_weights_as_an_uninterrupted_run():
    text = torch.tensor(list(b"def f(x):\n    return x + 1\n" * 40), dtype=torch.uint8)
    corpus = Corpus(text, text, 1, 1, 0)
    tc = TargetTrainConfig(steps=3, seq_len=32, batch_size=2, seed=5)
    cfg = preset("tiny")
    straight = TargetTrainer(cfg, tc, corpus)
    straight.train(lambda t: None)
    saved = []

    def checkpoint_then_die(t):
        saved.append(copy.deepcopy(t.state_dict()))
        if t.step == 2:
            raise _Interrupted

    first = TargetTrainer(cfg, tc, corpus)
    with pytest.raises(_Interrupted):
        first.train(checkpoint_then_die, every_s=0)
    resumed = TargetTrainer(cfg, tc, corpus)
    resumed.load_state_dict(saved[-1])
    resumed.train(lambda t: None)
    assert resumed.step == 3
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_split_keeps_heldout_files_out_of_training():
    corpus = load_corpus()
    assert corpus.heldout_files > 0 and corpus.validation_files > 0
    assert b"# file: " in bytes(corpus.train[:100].tolist())
    # no held-out file's header appears in the training or validation text
    train = corpus.train.numpy().tobytes() + corpus.validation.numpy().tobytes()
    for doc in heldout_documents()[:20]:
        assert is_heldout(doc.relpath)
        assert f"# file: {doc.relpath}\n".encode() not in train
    share = corpus.validation_files / (corpus.train_files + corpus.validation_files)
    assert 0.01 < share < 0.06
