"""The three forms of Gated DeltaNet agree (chunked vs recurrent vs verify), and the conv window forms."""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import commit_verified_states, conv_pool_forward, gdn_pool_forward
from engine.kernels.conv_naive import causal_conv1d, causal_conv1d_verify, conv_window_at
from engine.kernels.gdn_chunk import gdn_chunk, state_after
from engine.kernels.gdn_naive import gdn_recurrent, gdn_verify


def _inputs(B, T, H, Dk, Dv, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=gen)
    g = -F.softplus(torch.randn(B, T, H, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    s0 = torch.randn(B, H, Dk, Dv, generator=gen) * 0.1
    return q, k, v, g, beta, s0


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_matches_recurrent(T):
    q, k, v, g, beta, s0 = _inputs(2, T, 3, 16, 8, seed=T)
    s0_before = s0.clone()
    o_ref, s_ref = gdn_recurrent(q, k, v, g, beta, s0, 0.25)
    o, s = gdn_chunk(q, k, v, g, beta, s0, 0.25)
    assert _rel(o, o_ref) <= 1e-4
    assert _rel(s, s_ref) <= 1e-4
    assert torch.equal(s0, s0_before)


def test_verify_steps_equal_prefix_states_and_leave_input_untouched():
    q, k, v, g, beta, s0 = _inputs(2, 8, 2, 16, 16, seed=1)
    s0_before = s0.clone()
    o, states = gdn_verify(q, k, v, g, beta, s0, 0.25)
    assert torch.equal(s0, s0_before)
    for i in range(8):
        o_i, s_i = gdn_recurrent(q[:, : i + 1], k[:, : i + 1], v[:, : i + 1], g[:, : i + 1], beta[:, : i + 1],
                                 s0, 0.25)
        assert torch.equal(states[:, i], s_i)
        assert torch.equal(o[:, : i + 1], o_i)


def test_conv_verify_windows_equal_stepwise_updates():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 5, generator=gen)
    w = torch.randn(5, 4, generator=gen)
    st = torch.randn(2, 5, 3, generator=gen)
    st_before = st.clone()
    y, windows = causal_conv1d_verify(x, st, w)
    assert torch.equal(st, st_before)
    cur = st
    for t in range(6):
        y_t, cur = causal_conv1d(x[:, t : t + 1], cur, w)
        assert torch.allclose(y_t[:, 0], y[:, t], atol=1e-6)
        assert torch.equal(cur, windows[:, t])
    # the window holds the last K-1 raw inputs
    assert torch.equal(windows[:, -1], x[:, -3:].transpose(1, 2))


def test_pool_ops_decode_and_verify_modes():
    q, k, v, g, beta, s0 = _inputs(2, 4, 2, 8, 8, seed=5)
    pool = torch.zeros(5, 2, 8, 8)
    slots = torch.tensor([3, 1])
    pool[slots] = s0
    before = pool.clone()
    inter = torch.empty(2, 4, 2, 8, 8)
    o_v = gdn_pool_forward(q, k, v, g, beta, pool, slots, 0.5, intermediate=inter)
    assert torch.equal(pool, before)
    o_d = gdn_pool_forward(q, k, v, g, beta, pool, slots, 0.5)
    assert _rel(o_d, o_v) <= 1e-4
    assert _rel(pool[slots], inter[:, -1]) <= 1e-4
    assert torch.equal(pool[[0, 2, 4]], before[[0, 2, 4]])
    # conv
    x = torch.randn(2, 4, 6)
    w = torch.randn(6, 4)
    cpool = torch.randn(5, 6, 3)
    cbefore = cpool.clone()
    cinter = torch.empty(2, 4, 6, 3)
    y_v = conv_pool_forward(x, cpool, slots, w, intermediate=cinter)
    assert torch.equal(cpool, cbefore)
    y_d = conv_pool_forward(x, cpool, slots, w)
    assert torch.allclose(y_v, y_d)
    assert torch.equal(cpool[slots], cinter[:, -1])


def test_state_scatter_naiveerence_commits_and_tracks():
    L, N, B, T = 2, 6, 3, 4
    rec = torch.zeros(L, N, 1, 2, 2)
    conv = torch.zeros(L, N, 3, 2)
    rec_inter = torch.arange(L * B * T, dtype=torch.float).reshape(L, B, T, 1, 1, 1).expand(L, B, T, 1, 2, 2)
    conv_inter = torch.arange(L * B * T, dtype=torch.float).reshape(L, B, T, 1, 1).expand(L, B, T, 3, 2)
    working = torch.tensor([0, 2, 4])
    track = torch.tensor([1, 3, 5])
    commit_verified_states(rec, conv, rec_inter.contiguous(), conv_inter.contiguous(), working,
                  torch.tensor([0, 3, 1]), track, torch.tensor([-1, 2, 0]))
    for layer in range(L):
        for b, (cs, ts) in enumerate([(0, -1), (3, 2), (1, 0)]):
            base = layer * B * T + b * T
            assert rec[layer, working[b], 0, 0, 0] == base + cs
            assert conv[layer, working[b], 0, 0] == base + cs
            expect_track = base + ts if ts >= 0 else 0
            assert rec[layer, track[b], 0, 0, 0] == expect_track
            assert conv[layer, track[b], 0, 0] == expect_track


# --- prefill checkpoints: the state at a chunk-aligned position inside an extend ------------------

@pytest.mark.parametrize("T", [64, 100, 128, 200, 256])
def test_chunk_states_are_the_recurrent_prefix_states(T):
    """Entry n of the chunk states is the state after min((n+1)*64, T) tokens, as the recurrence has it."""
    q, k, v, g, beta, s0 = _inputs(1, T, 2, 16, 8, seed=40 + T)
    _, states = gdn_verify(q, k, v, g, beta, s0, 0.25)  # every step's state, the reference
    o, final, chunk_states = gdn_chunk(q, k, v, g, beta, s0, 0.25, return_chunk_states=True)
    assert chunk_states.shape == (1, -(-T // 64), 2, 16, 8)
    assert torch.equal(chunk_states[:, -1], final)
    for tokens in [t for t in range(64, T + 1, 64)] + [T]:
        assert _rel(state_after(chunk_states, tokens, T), states[:, tokens - 1]) <= 1e-4, tokens


@pytest.mark.parametrize("tokens,total", [(63, 200), (65, 200), (0, 200), (201, 200)])
def test_state_after_refuses_positions_the_chunked_form_does_not_hold(tokens, total):
    chunk_states = torch.zeros(1, 4, 1, 2, 2)
    with pytest.raises(ValueError, match="no chunk state"):
        state_after(chunk_states, tokens, total)


def test_conv_window_at_equals_the_stepwise_window():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 5, generator=gen)
    w = torch.randn(5, 4, generator=gen)
    st = torch.randn(2, 5, 3, generator=gen)
    _, windows = causal_conv1d_verify(x, st, w)
    for t in range(1, 10):
        assert torch.equal(conv_window_at(x, st, t), windows[:, t - 1])
    assert torch.equal(conv_window_at(x, st, 0), st)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,offset", [(200, 192), (200, 64), (128, 128), (1, 1)])
def test_pool_forward_checkpoints_inside_an_extend(T, offset, dtype):
    """Extend mode with a track offset: the track slot gets the state there; everything else as without it."""
    q, k, v, g, beta, s0 = _inputs(1, T, 2, 16, 8, seed=T + offset)
    pool = torch.zeros(4, 2, 16, 8, dtype=dtype)
    pool[1] = s0.to(dtype)
    plain = pool.clone()
    slots, track = torch.tensor([1]), torch.tensor([3])
    o = gdn_pool_forward(q, k, v, g, beta, pool, slots, 0.25, track_slots=track, track_offsets=torch.tensor([offset]))
    o_plain = gdn_pool_forward(q, k, v, g, beta, plain, slots, 0.25)
    assert torch.equal(o, o_plain) and torch.equal(pool[1], plain[1])  # tracking changes nothing else
    _, states = gdn_verify(q, k, v, g, beta, s0.to(dtype).float(), 0.25)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert pool.dtype == dtype and _rel(pool[3].float(), states[0, offset - 1]) <= tol
    # conv: the window `offset` tokens into the extend
    x = torch.randn(1, T, 6, generator=torch.Generator().manual_seed(1))
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    cpool = torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(3))
    cplain, window_before = cpool.clone(), cpool[1:2].clone()
    y = conv_pool_forward(x, cpool, slots, w, track_slots=track, track_offsets=torch.tensor([offset]))
    assert torch.equal(y, conv_pool_forward(x, cplain, slots, w)) and torch.equal(cpool[1], cplain[1])
    _, windows = causal_conv1d_verify(x, window_before, w)
    assert torch.equal(cpool[3], windows[0, offset - 1])


@pytest.mark.parametrize("own_state", [False, True])
def test_verify_writes_a_step_major_buffer_in_place_bit_identically(own_state):
    """The engine's verify buffers are step-major ([T, B, ...] memory): the states are written there in
    place, and outputs and states are bit-identical to the copying form; the input state is untouched."""
    B, T, H, Dk, Dv = 3, 5, 2, 8, 4
    q, k, v, g, beta, s0 = _inputs(B, T, H, Dk, Dv, seed=7)
    o_ref, states_ref = gdn_verify(q, k, v, g, beta, s0, 0.25)  # a fresh [B, T, ...] buffer
    contiguous = torch.full((B, T, H, Dk, Dv), float("nan"))
    step_major = torch.full((T, B, H, Dk, Dv), float("nan")).transpose(0, 1)
    for out in (contiguous, step_major):
        state = s0.clone()
        o, states = gdn_verify(q, k, v, g, beta, state, 0.25, states_out=out, own_state=own_state)
        assert states is out
        assert torch.equal(o, o_ref) and torch.equal(out, states_ref)
        if not own_state:
            assert torch.equal(state, s0)
