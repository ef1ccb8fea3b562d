"""The bf16 engine (--dtype bfloat16): what it stores in bf16, its deterministic numerics, its separate code paths."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.server.config import build_parser, configs_from_args, to_argv
from tests.engine.sessions import SUFFIX, make_engine, prompt, req


def test_dtype_defaults_to_fp32_and_the_state_dtype_follows_it():
    assert EngineConfig().dtype == "float32" and EngineConfig().ssm_dtype == "float32"
    assert EngineConfig().mamba_ssm_dtype is None
    assert EngineConfig(dtype="bfloat16").ssm_dtype == "bfloat16"
    assert EngineConfig(dtype="bfloat16", mamba_ssm_dtype="float32").ssm_dtype == "float32"
    assert EngineConfig(mamba_ssm_dtype="bfloat16").ssm_dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'bfloat16'\), got 'float16'"):
        EngineConfig(dtype="float16")


def test_dtype_flag_parses_and_round_trips():
    parser = build_parser()
    cfg, _ = configs_from_args(parser.parse_args(["--dtype", "bfloat16"]), parser)
    assert cfg == EngineConfig(dtype="bfloat16")
    assert to_argv(cfg) == ["--dtype", "bfloat16"] and to_argv(EngineConfig()) == []
    both = EngineConfig(dtype="bfloat16", mamba_ssm_dtype="float32")
    assert to_argv(both) == ["--dtype", "bfloat16", "--mamba-ssm-dtype", "float32"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "float16"])


def test_bf16_engine_holds_weights_pools_and_verify_buffers_in_bf16():
    e = make_engine(dtype="bfloat16", speculative_algorithm="DFLASH")
    r = e.runner
    assert {p.dtype for p in r.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in r.drafter.parameters()} == {torch.bfloat16}
    pools = (r.caches.kv.k, r.caches.kv.v, r.caches.state.rec, r.caches.state.conv, r.draft_kv.k[0], r.draft_kv.v[0])
    assert {t.dtype for t in pools} == {torch.bfloat16}
    fb = r._fb([0], 8, [[0]], [0], verify=True)
    assert fb.rec_inter.dtype == fb.conv_inter.dtype == torch.bfloat16
    assert e.server_info()["dtype"] == "bfloat16" and e.server_info()["mamba_ssm_dtype"] == "bfloat16"


def test_fp32_states_under_bf16_activations():
    """--dtype bfloat16 --mamba-ssm-dtype float32: recurrent states fp32, the conv windows (raw inputs) bf16."""
    e = make_engine(dtype="bfloat16", mamba_ssm_dtype="float32", speculative_algorithm="DFLASH")
    st = e.runner.caches.state
    assert st.rec.dtype == torch.float32 and st.conv.dtype == torch.bfloat16
    fb = e.runner._fb([0], 8, [[0]], [0], verify=True)
    assert fb.rec_inter.dtype == torch.float32 and fb.conv_inter.dtype == torch.bfloat16
    assert e.server_info()["mamba_ssm_dtype"] == "float32"
    e.generate([req("a", prompt(70, seed=1), 12)])  # runs end to end


def test_logits_are_bf16_values_converted_to_fp32():
    ids = list(prompt(40, seed=2))
    for dtype, representable in (("bfloat16", True), ("float32", False)):
        e = make_engine(dtype=dtype, disable_radix_cache=True)
        logits = e.runner.extend(ids, 0, list(range(3)), 0)
        assert logits.dtype == torch.float32
        assert torch.equal(logits, logits.bfloat16().float()) == representable


def _sessions(engine, n: int = 6) -> list:
    """Two-turn sessions around the 64-token boundary, each turn's requests batched together."""
    firsts = [prompt(60 + 3 * i, seed=10 + i) for i in range(n)]
    o1 = engine.generate([req(f"s{i}-1", ids, 20) for i, ids in enumerate(firsts)])
    seconds = [tuple(a) + tuple(o.output_ids) + SUFFIX for a, o in zip(firsts, o1, strict=True)]
    return o1 + engine.generate([req(f"s{i}-2", ids, 12) for i, ids in enumerate(seconds)])


def _fingerprint(outs) -> list:
    return [(o.output_ids, o.output_logprobs, o.output_top_logprobs, o.cached_tokens, o.spec_trace) for o in outs]


@pytest.mark.parametrize("spec", ["NONE", "DFLASH"])
def test_bf16_outputs_are_bitwise_deterministic_for_a_given_batch(spec):
    kw = dict(dtype="bfloat16", speculative_algorithm=spec, mamba_track_interval=64, max_running_requests=4)
    first, second = (_sessions(make_engine(**kw)) for _ in range(2))
    assert _fingerprint(first) == _fingerprint(second)
    assert sum(o.cached_tokens > 0 for o in first) >= 4  # restores happened: the cache path ran too
    fp32 = _sessions(make_engine(**{**kw, "dtype": "float32"}))
    assert [o.output_logprobs for o in fp32] != [o.output_logprobs for o in first]  # it is another numerics


def _last_logits(dtype: str, path: str, n: int = 72) -> torch.Tensor:
    """Logits after the same n tokens, reached by one prefill, by a prefill and one decode step, or by a prefill
    and a verify of the last 8 tokens (linear states untouched)."""
    e = make_engine(dtype=dtype, disable_radix_cache=True)
    r, ids, pages = e.runner, list(prompt(n, seed=3)), list(range(5))
    if path == "prefill":
        return r.extend(ids, 0, pages, 0)
    if path == "decode":
        r.extend(ids[:-1], 0, pages, 0)
        return r.decode([ids[-1]], [n - 1], [pages], [0])[0]
    r.extend(ids[:-8], 0, pages, 0)
    return r.verify([ids[-8:]], [n - 8], [pages], [0])[0, -1]


def test_prefill_decode_and_verify_are_different_numeric_paths_in_bf16():
    """As on a GPU engine: the same log-probs (of the prefill's 5 likeliest tokens) through three code paths agree
    closely in fp32 and differ by bf16 rounding in bf16 (a decode step rounds the state once more, a prefill
    carries it in fp32 to the end of the extend, a verify block in fp32 to the end of the block)."""
    for dtype, low, high in (("float32", 0.0, 1e-4), ("bfloat16", 1e-3, 0.5)):
        base = torch.log_softmax(_last_logits(dtype, "prefill"), -1)
        top = base.topk(5).indices
        for path in ("decode", "verify"):
            diff = (torch.log_softmax(_last_logits(dtype, path), -1) - base)[top].abs().max().item()
            assert low <= diff <= high, (dtype, path, diff)
