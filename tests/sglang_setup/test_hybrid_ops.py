"""The hybrid setup's torch implementations of SGLang's CPU ops (hybrid/pypath/sgl_kernel/cpu_ops.py) against the
project's own references (engine/kernels: gdn_naive, gdn_chunk, conv_naive), on seeded random inputs.

SGLang calls these ops, in its own layouts, on the Gated DeltaNet path of a Qwen3-Next (docs/gate-sglang.md,
"The #37817 path on CPU"); the engine's references are written independently, in the engine's layouts. The
layouts differ: SGLang's SSM state pool is [slots, HV, V, K] (V before K), the engine's state [B, HV, K, V];
SGLang's chunk states h[c] are the states *before* chunk c of a sequence, the engine's chunk_states[c] those
*after* chunk c. cpu_ops imports torch only, so it runs in the project's venv.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

# engine.kernels re-exports functions under the same names as these modules: import the modules themselves
conv_naive = importlib.import_module("engine.kernels.conv_naive")
gdn_chunk = importlib.import_module("engine.kernels.gdn_chunk")
gdn_naive = importlib.import_module("engine.kernels.gdn_naive")

CPU_OPS = Path(__file__).resolve().parent / "hybrid" / "pypath" / "sgl_kernel" / "cpu_ops.py"
TOL = 1e-5  # fp32 maths on both sides, different orders of summation


@pytest.fixture(scope="module")
def ops():
    spec = importlib.util.spec_from_file_location("hybrid_cpu_ops", CPU_OPS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H, HV, K, V = 2, 4, 16, 8  # grouped heads: v-head i reads q/k head i // 2
LENS = [70, 5]  # the first sequence crosses a 64-token chunk
SLOTS = torch.tensor([3, 1])


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = sum(LENS)
    return dict(q=torch.randn(1, T, H, K, generator=g), k=torch.randn(1, T, H, K, generator=g),
                v=torch.randn(1, T, HV, V, generator=g), a=torch.randn(T, HV, generator=g),
                b=torch.randn(T, HV, generator=g), A_log=torch.randn(HV, generator=g) * 0.5,
                dt_bias=torch.randn(HV, generator=g) * 0.5, pool=torch.randn(5, HV, V, K, generator=g) * 0.1)


def _engine_state(pool: torch.Tensor, slot) -> torch.Tensor:
    """SGLang's pool row [HV, V, K] as the engine's state [1, HV, K, V]."""
    return pool[slot].transpose(-1, -2).unsqueeze(0)


def test_gating_is_minus_exp_a_log_softplus_and_sigmoid(ops):
    x = _inputs()
    g, beta = ops.fused_gdn_gating_cpu(x["A_log"], x["a"], x["b"], x["dt_bias"])
    assert g.shape == beta.shape == (1, sum(LENS), HV)
    assert torch.allclose(g[0], -x["A_log"].exp() * F.softplus(x["a"] + x["dt_bias"]), atol=TOL, rtol=0)
    assert torch.allclose(beta[0], x["b"].sigmoid(), atol=TOL, rtol=0)


def test_chunked_prefill_matches_the_recurrence_and_the_engines_chunk_states(ops):
    x = _inputs(1)
    g, beta = ops.fused_gdn_gating_cpu(x["A_log"], x["a"], x["b"], x["dt_bias"])
    pool = x["pool"].clone()
    cu = torch.tensor([0, LENS[0], sum(LENS)], dtype=torch.int32)
    o, none, h = ops.chunk_gated_delta_rule_cpu(x["q"], x["k"], x["v"], g, beta, initial_state=pool,
                                                initial_state_indices=SLOTS, cu_seqlens=cu,
                                                use_qk_l2norm_in_kernel=True)
    assert none is None and h.shape == (1, 3, HV, V, K)  # 2 chunks of the 70-token sequence, 1 of the 5-token one
    qn, kn, scale = ops._l2norm(x["q"]), ops._l2norm(x["k"]), K ** -0.5
    h_off = 0
    for i, (s, e) in enumerate([(0, LENS[0]), (LENS[0], sum(LENS))]):
        st = _engine_state(x["pool"], SLOTS[i])
        args = (qn[:, s:e].repeat_interleave(HV // H, 2), kn[:, s:e].repeat_interleave(HV // H, 2), x["v"][:, s:e],
                g[:, s:e], beta[:, s:e])
        o_ref, s_ref = gdn_naive.gdn_recurrent(*args, st, scale)
        _, _, chunk_states = gdn_chunk.gdn_chunk(*args, st, scale, return_chunk_states=True)
        assert torch.allclose(o[:, s:e], o_ref, atol=TOL, rtol=0)
        assert torch.allclose(pool[SLOTS[i]].transpose(-1, -2), s_ref[0], atol=TOL, rtol=0)  # written back
        n_chunks = -(-(e - s) // ops.CHUNK)
        assert torch.allclose(h[0, h_off].transpose(-1, -2), st[0], atol=TOL, rtol=0)  # before the first chunk
        for c in range(1, n_chunks):  # h[c] = the state after chunk c - 1
            assert torch.allclose(h[0, h_off + c].transpose(-1, -2), chunk_states[0, c - 1], atol=TOL, rtol=0)
        h_off += n_chunks
    untouched = [s for s in range(5) if s not in SLOTS.tolist()]
    assert torch.equal(pool[untouched], x["pool"][untouched])


def test_verify_writes_each_steps_state_and_leaves_the_pool_alone(ops):
    x, D = _inputs(2), 4
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2 * D, H, K, generator=gen), torch.randn(1, 2 * D, H, K, generator=gen)
    v, a, b = torch.randn(1, 2 * D, HV, V, generator=gen), torch.randn(2 * D, HV, generator=gen), torch.randn(
        2 * D, HV, generator=gen)
    pool, inter, iidx = x["pool"].clone(), torch.zeros(6, D, HV, V, K), torch.tensor([2, 5])
    o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=x["A_log"], dt_bias=x["dt_bias"], q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=SLOTS, cu_seqlens=torch.tensor([0, D, 2 * D]), use_qk_l2norm_in_kernel=True,
        disable_state_update=True, intermediate_states_buffer=inter, intermediate_state_indices=iidx, cache_steps=D)
    assert torch.equal(pool, x["pool"])
    g = -x["A_log"].exp() * F.softplus(a + x["dt_bias"])
    for n in range(2):
        sl = slice(n * D, (n + 1) * D)
        o_ref, states = gdn_naive.gdn_verify(ops._l2norm(q[:, sl]).repeat_interleave(HV // H, 2),
                                             ops._l2norm(k[:, sl]).repeat_interleave(HV // H, 2), v[:, sl],
                                             g[None, sl], b[None, sl].sigmoid(), _engine_state(x["pool"], SLOTS[n]),
                                             K ** -0.5)
        assert torch.allclose(o[:, sl], o_ref, atol=TOL, rtol=0)
        assert torch.allclose(inter[iidx[n]].transpose(-1, -2), states[0], atol=TOL, rtol=0)
    assert not inter[[0, 1, 3, 4]].any()


def test_decode_updates_the_pool_as_the_recurrence(ops):
    x = _inputs(4)
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 2, H, K, generator=gen), torch.randn(1, 2, H, K, generator=gen)
    v, a, b = torch.randn(1, 2, HV, V, generator=gen), torch.randn(2, HV, generator=gen), torch.randn(
        2, HV, generator=gen)
    pool = x["pool"].clone()
    o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=x["A_log"], dt_bias=x["dt_bias"], q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=SLOTS, cu_seqlens=torch.tensor([0, 1, 2]), use_qk_l2norm_in_kernel=True)
    g = -x["A_log"].exp() * F.softplus(a + x["dt_bias"])
    for n in range(2):
        o_ref, s_ref = gdn_naive.gdn_recurrent(ops._l2norm(q[:, n:n + 1]).repeat_interleave(HV // H, 2),
                                               ops._l2norm(k[:, n:n + 1]).repeat_interleave(HV // H, 2),
                                               v[:, n:n + 1], g[None, n:n + 1], b[None, n:n + 1].sigmoid(),
                                               _engine_state(x["pool"], SLOTS[n]), K ** -0.5)
        assert torch.allclose(o[:, n:n + 1], o_ref, atol=TOL, rtol=0)
        assert torch.allclose(pool[SLOTS[n]].transpose(-1, -2), s_ref[0], atol=TOL, rtol=0)


def test_conv_prefill_and_verify_match_conv_naive(ops):
    gen = torch.Generator().manual_seed(6)
    C, W, D, T = 12, 4, 4, sum(LENS)
    x, wgt, cpool = torch.randn(T, C, generator=gen), torch.randn(C, W, generator=gen), torch.randn(
        5, C, W - 1, generator=gen)
    cp = cpool.clone()
    y = ops.causal_conv1d_fn_cpu(x.t(), wgt, None, activation="silu", conv_states=cp,
                                 has_initial_state=torch.tensor([True, False]), cache_indices=SLOTS,
                                 query_start_loc=torch.tensor([0, LENS[0], T]), seq_lens_cpu=LENS)
    for i, (s, e) in enumerate([(0, LENS[0]), (LENS[0], T)]):
        init = cpool[SLOTS[i]].unsqueeze(0) if i == 0 else torch.zeros(1, C, W - 1)  # the second starts cold
        y_ref, st_ref = conv_naive.causal_conv1d(x[None, s:e], init, wgt)
        assert torch.allclose(y.t()[s:e], y_ref[0], atol=TOL, rtol=0)
        assert torch.allclose(cp[SLOTS[i]], st_ref[0], atol=TOL, rtol=0)
    cp, xv = cpool.clone(), torch.randn(2, C, D, generator=gen)
    icw, iidx = torch.zeros(6, D, C, W - 1), torch.tensor([2, 5])
    yv = ops.causal_conv1d_update_cpu(xv, cp, wgt, None, "silu", conv_state_indices=SLOTS,
                                      intermediate_conv_window=icw, intermediate_state_indices=iidx)
    for n in range(2):
        y_ref, windows = conv_naive.causal_conv1d_verify(xv[n:n + 1].transpose(1, 2), cpool[SLOTS[n]].unsqueeze(0),
                                                         wgt)
        assert torch.allclose(yv[n].t(), y_ref[0], atol=TOL, rtol=0)
        assert torch.allclose(icw[iidx[n]], windows[0], atol=TOL, rtol=0)
        assert torch.allclose(cp[SLOTS[n]], windows[0, -1], atol=TOL, rtol=0)


def test_ops_the_path_does_not_take_raise(ops):
    """Tree (EAGLE) verify and KDA gating are not implemented: they raise instead of computing something else."""
    with pytest.raises(NotImplementedError, match="tree"):
        ops.causal_conv1d_update_cpu(torch.zeros(1, 2, 1), torch.zeros(1, 2, 3), torch.zeros(2, 4),
                                     retrieve_next_token=torch.zeros(1))
    with pytest.raises(NotImplementedError, match="KDA"):
        ops.fused_sigmoid_gating_delta_rule_update_cpu(None, None, torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4),
                                                       torch.zeros(1, 1, 1, 4), None, None, None, None, is_kda=True)


def test_kv_copy_moves_rows_reading_every_source_first(ops):
    buf = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    expected = buf.clone()
    expected[[1, 2]] = buf[[2, 3]]  # 1 <- 2 and 2 <- 3: row 2 is read before it is overwritten
    ops.copy_all_layer_kv_cache_cpu(torch.tensor([buf.data_ptr()]), torch.tensor([4 * 4]), torch.tensor([1, 2]),
                                    torch.tensor([2, 3]))
    assert torch.equal(buf, expected)
