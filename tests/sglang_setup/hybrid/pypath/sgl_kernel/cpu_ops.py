"""Readable torch implementations of the sgl_kernel CPU ops SGLang 0.5.23's hybrid (Gated DeltaNet) path calls.

Each follows the semantics of the GPU kernel SGLang uses on CUDA (read from the 0.5.23 wheel):
  causal_conv1d_fn_cpu        <- sglang/kernels/ops/mamba/causal_conv1d_triton.py causal_conv1d_fn (varlen prefill)
  causal_conv1d_update_cpu    <- same file, causal_conv1d_update (decode; verify with intermediate_conv_window)
  fused_gdn_gating_cpu        <- sglang/kernels/ops/attention/linear/fused_gdn_gating.py
  chunk_gated_delta_rule_cpu  <- sglang/kernels/ops/attention/fla/chunk.py chunk_gated_delta_rule (returns o, None, h)
  fused_sigmoid_gating_delta_rule_update_cpu
                              <- sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py
  copy_all_layer_kv_cache_cpu <- sglang/kernels/ops/kvcache/cache_move.py copy_all_layer_kv_cache_tiled
Call sites: sglang/srt/layers/attention/linear/gdn_backend.py (conv, gating) and
linear/kernels/gdn_triton.py (delta rule); the KV copy in mem_cache/memory_pool.py.

Layouts (SGLang's): conv state pool [slots, dim, width-1]; SSM state pool [slots, HV, V, K] (note V before K);
q, k [1, T, H, K]; v [1, T, HV, V]; a, b [T, HV]; the recurrence keeps S as [K, V] per v-head:
    S <- S * exp(g_t);  u_t = beta_t * (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T (scale * q_t)
with q, k L2-normalised (eps 1e-6 inside the sqrt) when use_qk_l2norm_in_kernel. Maths in fp32.
The chunked prefill is computed token by token (exact, slow); it returns the per-chunk states h
[1, NT, HV, V, K] (h[c] = state before chunk c of its sequence, CHUNK = 64) that extra_buffer tracking reads.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

__all__ = [
    "causal_conv1d_fn_cpu",
    "causal_conv1d_update_cpu",
    "fused_gdn_gating_cpu",
    "chunk_gated_delta_rule_cpu",
    "fused_sigmoid_gating_delta_rule_update_cpu",
    "copy_all_layer_kv_cache_cpu",
]

CHUNK = 64
PAD_SLOT_ID = -1


def _act(x: torch.Tensor, activation) -> torch.Tensor:
    if activation in (True, "silu", "swish"):
        return F.silu(x)
    if activation in (None, False):
        return x
    raise NotImplementedError(f"activation {activation!r}")


# ---- convolution ----------------------------------------------------------------------------------------

def causal_conv1d_fn_cpu(x, weight, bias=None, activation="silu", conv_states=None, has_initial_state=None,
                         cache_indices=None, query_start_loc=None, seq_lens_cpu=None, pad_slot_id=PAD_SLOT_ID,
                         **unused):
    """Varlen causal depthwise conv. x [dim, total] (a transposed view is fine); weight [dim, width].
    For sequence i: window = (conv_states[cache_indices[i]] if has_initial_state[i] else 0) ++ x_i;
    out_i[t] = act(bias + sum_j weight[:, j] * window[t + j]); conv_states[slot] <- last width-1 of window.
    Returns out [dim, total] in x's dtype."""
    if x.dim() == 3:  # (batch, dim, seqlen): equal-length batch
        outs = [causal_conv1d_fn_cpu(x[i], weight, bias, activation, conv_states,
                                     None if has_initial_state is None else has_initial_state[i:i + 1],
                                     None if cache_indices is None else cache_indices[i:i + 1], None, None,
                                     pad_slot_id) for i in range(x.shape[0])]
        return torch.stack(outs)
    dim, total = x.shape
    width = weight.shape[1]
    if query_start_loc is None:
        starts = [0, total]
    else:
        starts = [int(s) for s in query_start_loc.tolist()]
    out = torch.zeros(dim, total, dtype=x.dtype)
    w = weight.float()
    for i in range(len(starts) - 1):
        s, e = starts[i], starts[i + 1]
        if e <= s:
            continue
        slot = int(cache_indices[i]) if cache_indices is not None else i
        if slot == pad_slot_id:
            continue
        xi = x[:, s:e].float()
        init = torch.zeros(dim, width - 1)
        if conv_states is not None and has_initial_state is not None and bool(has_initial_state[i]):
            init = conv_states[slot, :, -(width - 1):].float()
        window = torch.cat([init, xi], dim=1)  # [dim, width-1+L]
        # out[t] = sum_j w[:, j] * window[:, t + j]
        acc = F.conv1d(window.unsqueeze(0), w.unsqueeze(1), None, groups=dim).squeeze(0)  # [dim, L]
        if bias is not None:
            acc = acc + bias.float()[:, None]
        out[:, s:e] = _act(acc, activation).to(x.dtype)
        if conv_states is not None:
            conv_states[slot, :, -(width - 1):] = window[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                             conv_state_indices=None, num_accept_tokens=None, intermediate_conv_window=None,
                             intermediate_state_indices=None, retrieve_next_token=None, retrieve_next_sibling=None,
                             retrieve_parent_token=None, pad_slot_id=PAD_SLOT_ID, **unused):
    """x [batch, dim] or [batch, dim, seqlen]. Per row: window = conv_state[slot] ++ x; out[t] uses the width
    inputs ending at token t; conv_state[slot] <- the last width-1 inputs (after all seqlen tokens);
    intermediate_conv_window[istate_idx, t] <- the width-1 inputs ending at token t (verify)."""
    if cache_seqlens is not None or num_accept_tokens is not None:
        raise NotImplementedError("causal_conv1d_update_cpu: circular buffer / num_accept_tokens")
    if retrieve_next_token is not None:
        raise NotImplementedError("causal_conv1d_update_cpu: tree (EAGLE) verify")
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    out = torch.zeros_like(x)
    w = weight.float()
    for i in range(batch):
        slot = int(conv_state_indices[i]) if conv_state_indices is not None else i
        if slot == pad_slot_id:
            continue
        window = torch.cat([conv_state[slot].float(), x[i].float()], dim=1)  # [dim, state_len+seqlen]
        for t in range(seqlen):
            end = state_len + t + 1  # exclusive end of the inputs seen after token t
            taps = window[:, end - width:end]  # [dim, width]
            acc = (taps * w).sum(-1)
            if bias is not None:
                acc = acc + bias.float()
            out[i, :, t] = _act(acc, activation).to(x.dtype)
            if intermediate_conv_window is not None:
                j = int(intermediate_state_indices[i])
                if j >= 0:
                    intermediate_conv_window[j, t] = window[:, end - (width - 1):end].to(intermediate_conv_window.dtype)
        conv_state[slot] = window[:, -state_len:].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


# ---- gating ---------------------------------------------------------------------------------------------

def fused_gdn_gating_cpu(A_log, a, b, dt_bias, beta: float = 1.0, threshold: float = 20.0):
    """g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b). a, b [T, HV] -> both [1, T, HV] fp32."""
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=beta, threshold=threshold)
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


# ---- gated delta rule -----------------------------------------------------------------------------------

def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _delta_step(S, q, k, v, g, beta):
    """One token for all v-heads. S [HV, K, V]; q, k [HV, K] (already normalised, q scaled); v [HV, V];
    g, beta [HV]. Returns (o [HV, V], new S)."""
    S = S * torch.exp(g)[:, None, None]
    u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", S, k))
    S = S + torch.einsum("hk,hv->hkv", k, u)
    o = torch.einsum("hkv,hk->hv", S, q)
    return o, S


def _expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """[..., H, K] -> [..., HV, K]: v-head i_hv reads q/k head i_hv // (HV // H)."""
    H = x.shape[-2]
    return x.repeat_interleave(HV // H, dim=-2) if H != HV else x


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, scale: float | None = None, initial_state=None,
                               initial_state_indices=None, cu_seqlens=None, head_first: bool = False,
                               use_qk_l2norm_in_kernel: bool = False, inplace_update: bool = True, **unused):
    """Prefill. q, k [1, T, H, K]; v [1, T, HV, V]; g, beta [1, T, HV]; initial_state pool [slots, HV, V, K].
    Returns (o [1, T, HV, V] in q's dtype, None, h [1, NT, HV, V, K]); final states written back to the pool."""
    assert not head_first
    B, T, H, K = k.shape
    HV, V = v.shape[-2], v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    if cu_seqlens is None:
        assert B == 1
        starts = [0, T]
    else:
        starts = [int(s) for s in cu_seqlens.tolist()]
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm_in_kernel:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = _expand_heads(qf, HV) * scale, _expand_heads(kf, HV)
    vf, gf, bf = v[0].float(), g.reshape(T, HV).float(), beta.reshape(T, HV).float()
    o = torch.zeros(T, HV, V)
    hs = []
    for i in range(len(starts) - 1):
        s, e = starts[i], starts[i + 1]
        idx = int(initial_state_indices[i]) if initial_state_indices is not None else i
        S = torch.zeros(HV, K, V)
        if initial_state is not None and idx >= 0:
            S = initial_state[idx].float().transpose(-1, -2).clone()  # [HV, V, K] -> [HV, K, V]
        for t in range(s, e):
            if (t - s) % CHUNK == 0:
                hs.append(S.transpose(-1, -2).clone())  # state before this chunk, as [HV, V, K]
            o[t], S = _delta_step(S, qf[t], kf[t], vf[t], gf[t], bf[t])
        if initial_state is not None and idx >= 0 and inplace_update:
            initial_state[idx] = S.transpose(-1, -2).to(initial_state.dtype)
    h = torch.stack(hs).unsqueeze(0).to(k.dtype) if hs else k.new_zeros(1, 0, HV, V, K)
    return o.unsqueeze(0).to(q.dtype), None, h


def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                                               initial_state_indices, cu_seqlens=None, scale=None,
                                               use_qk_l2norm_in_kernel: bool = False, softplus_beta: float = 1.0,
                                               softplus_threshold: float = 20.0, is_kda: bool = False,
                                               lower_bound=None, disable_state_update: bool = False,
                                               intermediate_states_buffer=None, intermediate_state_indices=None,
                                               cache_steps=None, retrieve_parent_token=None, **unused):
    """Decode / target-verify recurrence with the gating fused in. q, k [1, T, H, K]; v [1, T, HV, V];
    a, b [T, HV]; state pool [slots, HV, V, K], read at initial_state_indices[n] (< 0: zeros, no write).
    Verify: disable_state_update=True keeps the pool; intermediate_states_buffer[j, step] <- S after each
    token (j = intermediate_state_indices[n], skipped when < 0). Returns o [1, T, HV, V]."""
    if is_kda or lower_bound is not None:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: KDA gating")
    if retrieve_parent_token is not None:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: tree verify")
    B, T, H, K = k.shape
    HV, V = v.shape[-2], v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    if cu_seqlens is None:
        starts = [n * T for n in range(B + 1)]
        qf, kf, vf = q.reshape(B * T, H, K), k.reshape(B * T, H, K), v.reshape(B * T, HV, V)
    else:
        starts = [int(s) for s in cu_seqlens.tolist()]
        qf, kf, vf = q[0], k[0], v[0]
    qf, kf, vf = qf.float(), kf.float(), vf.float()
    if use_qk_l2norm_in_kernel:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = _expand_heads(qf, HV) * scale, _expand_heads(kf, HV)
    af, bf = a.reshape(-1, HV).float(), b.reshape(-1, HV).float()
    g = -torch.exp(A_log.float()) * F.softplus(af + dt_bias.float(), beta=softplus_beta,
                                               threshold=softplus_threshold)
    beta = torch.sigmoid(bf)
    o = torch.zeros(qf.shape[0], HV, V)
    for n in range(len(starts) - 1):
        s, e = starts[n], starts[n + 1]
        idx = int(initial_state_indices[n])
        S = torch.zeros(HV, K, V)
        if initial_state_source is not None and idx >= 0:
            S = initial_state_source[idx].float().transpose(-1, -2).clone()
        j = int(intermediate_state_indices[n]) if intermediate_states_buffer is not None else -1
        for step, t in enumerate(range(s, e)):
            o[t], S = _delta_step(S, qf[t], kf[t], vf[t], g[t], beta[t])
            if j >= 0:
                intermediate_states_buffer[j, step] = S.transpose(-1, -2).to(intermediate_states_buffer.dtype)
        if not disable_state_update and initial_state_source is not None and idx >= 0:
            initial_state_source[idx] = S.transpose(-1, -2).to(initial_state_source.dtype)
    out_shape = (B, T, HV, V) if cu_seqlens is None else (1, qf.shape[0], HV, V)
    return o.reshape(out_shape).to(q.dtype)


# ---- KV copy --------------------------------------------------------------------------------------------

def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer b (base address data_ptrs[b], row pitch strides[b] bytes): row tgt_loc[i] <- row
    src_loc[i], all sources read before any write (safe in place)."""
    tgt, src = [int(t) for t in tgt_loc.tolist()], [int(s) for s in src_loc.tolist()]
    for base, pitch in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        base, pitch = int(base), int(pitch)
        rows = [ctypes.string_at(base + s * pitch, pitch) for s in src]
        for t, row in zip(tgt, rows, strict=True):
            ctypes.memmove(base + t * pitch, row, pitch)


# ---- gated RMSNorm (Qwen3-Next's linear-attention output norm) -------------------------------------------

def fused_rmsnorm_gated_cpu(x, weight, gate, eps: float = 1e-6):
    """y = weight * (x / sqrt(mean(x^2) + eps)) * silu(gate), per row of the last dim (norm before gate), as
    sglang/kernels/ops/attention/fla/fused_norm_gate.py computes it with activation silu; fp32 maths."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * weight.float() * F.silu(gate.float())
    return y.to(x.dtype)


__all__.append("fused_rmsnorm_gated_cpu")


# ---- request -> token-slot bookkeeping (sglang/srt/mem_cache/allocation.py, kernels/ops/speculative/cache_locs.py)

def _ranges(start_offset, end_offset):
    starts, ends = [int(s) for s in start_offset.tolist()], [int(e) for e in end_offset.tolist()]
    offs, acc = [], 0
    for s, e in zip(starts, ends, strict=True):
        offs.append(acc)
        acc += e - s
    return starts, ends, offs


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """req_to_token[req_pool_indices[i], start[i]:end[i]] <- the i-th run of out_cache_loc (runs packed in order)."""
    starts, ends, offs = _ranges(start_offset, end_offset)
    for i, (s, e, o) in enumerate(zip(starts, ends, offs, strict=True)):
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[o:o + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """The inverse: the i-th run of out_cache_loc <- req_to_token[req_pool_indices[i], start[i]:end[i]]."""
    starts, ends, offs = _ranges(start_offset, end_offset)
    for i, (s, e, o) in enumerate(zip(starts, ends, offs, strict=True)):
        out_cache_loc[o:o + e - s] = req_to_token[int(req_pool_indices[i]), s:e].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk,
                                           num_cols):
    """out_cache_loc[i*n:(i+1)*n] <- req_to_token[req_pool_indices[i], seq_lens[i]:seq_lens[i]+n], n = topk*num_cols."""
    n = int(topk) * int(num_cols)
    for i in range(seq_lens.shape[0]):
        s = int(seq_lens[i])
        out_cache_loc[i * n:(i + 1) * n] = req_to_token[int(req_pool_indices[i]), s:s + n].to(out_cache_loc.dtype)


__all__ += ["assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu", "assign_draft_cache_locs_contiguous_cpu"]
