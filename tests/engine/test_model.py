"""HybridLM: layer pattern, state-exact prefill/decode/verify, determinism, weights I/O."""

import pytest
import torch

from engine.model.config import HybridConfig, preset
from engine.model.hybrid import HybridLM, random_state_dict
from engine.model.weights import WeightsError, load_full_state_dict, load_state, save_weights
from tests.engine.helpers import OneSeq


def _model(name="tiny", seed=0):
    m = HybridLM(preset(name))
    m.init_random(seed)
    return m.eval()


def _ids(n, seed=0):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def test_layer_pattern_is_three_linear_to_one_full():
    cfg = preset("small")
    assert cfg.attention_layers == [3, 7]
    assert cfg.linear_layers == [0, 1, 2, 4, 5, 6]
    n = sum(p.numel() for p in HybridLM(cfg).parameters())
    assert 3_000_000 < n < 10_000_000


@pytest.mark.parametrize("L", [1, 63, 64, 65, 130])
def test_prefill_then_decode_equals_prefill_of_one_more(L):
    m = _model()
    ids = _ids(L + 1, seed=L)
    a = OneSeq(m)
    a.extend(ids[:L])
    la, _ = a.extend(ids[L:])
    b = OneSeq(m)
    lb, _ = b.extend(ids)
    assert _rel(la[-1], lb[-1]) <= 1e-4
    (ra, ca), (rb, cb) = a.states(), b.states()
    assert _rel(ra, rb) <= 1e-4
    assert torch.allclose(ca, cb, atol=1e-5)


def test_whole_sequence_equals_token_by_token():
    m = _model()
    ids = _ids(90, seed=7)
    whole, _ = OneSeq(m).extend(ids)
    s = OneSeq(m)
    steps = torch.cat([s.extend([t])[0] for t in ids])
    # relative to the logit scale (random logits reach ~50, so fp32 ordering noise is ~1e-4 absolute)
    assert _rel(steps, whole) <= 1e-4


def test_verify_steps_equal_prefill_states_and_input_state_untouched():
    m = _model()
    ids = _ids(40, seed=3)
    pre, B = 30, 8
    s = OneSeq(m)
    s.extend(ids[:pre])
    before = s.states()
    _, fb = s.extend(ids[pre : pre + B], verify=True)
    after = s.states()
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    for i in range(B):
        ref = OneSeq(m)
        ref.extend(ids[: pre + i + 1])
        r, c = ref.states()
        assert _rel(fb.rec_inter[:, 0, i], r) <= 1e-4
        assert torch.allclose(fb.conv_inter[:, 0, i], c, atol=1e-5)


def test_two_runs_are_bit_identical():
    ids = _ids(70, seed=1)
    a, _ = OneSeq(_model()).extend(ids)
    b, _ = OneSeq(_model()).extend(ids)
    assert torch.equal(a, b)


def test_weights_round_trip(tmp_path):
    cfg = preset("tiny")
    sd = random_state_dict(cfg, seed=5)
    save_weights(tmp_path, cfg, sd)
    m = HybridLM(cfg)
    load_full_state_dict(m, load_state(tmp_path))
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert HybridConfig.load(tmp_path / "config.json") == cfg


def test_weights_mismatch_names_the_tensors():
    cfg = preset("tiny")
    sd = random_state_dict(cfg, seed=0)
    sd.pop("norm.weight")
    sd["bogus.weight"] = torch.zeros(2)
    sd["embed.weight"] = torch.zeros(3, 3)
    with pytest.raises(WeightsError) as e:
        load_full_state_dict(HybridLM(cfg), sd)
    msg = str(e.value)
    assert "missing tensors: ['norm.weight']" in msg
    assert "unexpected tensors: ['bogus.weight']" in msg
    assert "embed.weight: checkpoint (3, 3)" in msg
