"""The patches beyond the two platform checks, each named after the error it fixes (hybrid_patches imports
MORE_PATCHES). Test setup only."""
from __future__ import annotations

import os
import sys


def log(msg):
    print(f"[hybrid pid={os.getpid()}] {msg}", file=sys.stderr, flush=True)


def patch_fused_norm_gate(m):
    # FusedRMSNormGated's Triton kernel uses tl.make_block_ptr, which Triton 3.9's interpreter refuses
    # ("Block pointers have been removed in favor of the tensor descriptor API"); take SGLang's own CPU
    # branch instead (torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu, implemented in sgl_kernel/cpu_ops.py).
    m._use_cpu = True
    log("fused_norm_gate._use_cpu = True (-> sgl_kernel.fused_rmsnorm_gated_cpu)")


def patch_dflash_worker_v2(m):
    # Observation only: log every DFlash verify commit (pre, commit_len, post, the step extra_buffer tracks),
    # computed as _update_target_mamba_state_after_verify computes it, then call the original.
    # DFlashWorkerV2.forward_batch_generation calls batch.seq_lens.record_stream(current_stream()); a CPU
    # tensor refuses it ("RuntimeError: unknown parameter type"). On CPU there are no streams to order: no-op.
    import torch

    if not getattr(torch.Tensor.record_stream, "_hybrid", False):
        orig_record = torch.Tensor.record_stream

        def record_stream(self, stream):
            if self.device.type == "cpu":
                return None
            return orig_record(self, stream)

        record_stream._hybrid = True
        torch.Tensor.record_stream = record_stream
        log("torch.Tensor.record_stream: no-op for CPU tensors")
    cls = m.DFlashWorkerV2
    orig = cls._update_target_mamba_state_after_verify

    def logged(self, *, batch, seq_lens_pre_verify, seq_lens_post_verify, commit_lens):
        try:
            from sglang.srt.runtime_context import mamba_track_grid

            pre = seq_lens_pre_verify.tolist()
            post = seq_lens_post_verify.tolist()
            cl = commit_lens.tolist()
            if batch.mamba_track_indices is not None:
                I = mamba_track_grid(batch.tree_cache.page_size)
                steps = []
                for a, p_, c in zip(pre, post, cl, strict=True):
                    step = max(p_ // I * I - a - 1, 0)
                    steps.append(step if a // I != p_ // I and step < c else -1)
                track = [int(t) for t in batch.mamba_track_indices.tolist()]
            else:
                I, steps, track = None, None, None
            log(f"VERIFY pre={pre} commit_len={cl} post={post} interval={I} step_to_track={steps} "
                f"track_slots={track} need_commit={self._need_mamba_verify_commit}")
        except Exception as e:  # noqa: BLE001
            log(f"VERIFY log failed: {e!r}")
        if os.environ.get("SPECGATE_HYBRID_INJECT_37817") == "1":
            # fault injection: bug #37817 (0.5.18/0.5.19) compared against the lengths before the verify
            seq_lens_post_verify = seq_lens_pre_verify
        return orig(self, batch=batch, seq_lens_pre_verify=seq_lens_pre_verify,
                    seq_lens_post_verify=seq_lens_post_verify, commit_lens=commit_lens)

    cls._update_target_mamba_state_after_verify = logged

    if os.environ.get("SPECGATE_HYBRID_DFLASH_TRITON") == "1":
        # (4) run DFlash's own Triton kernels (prepare_block, accept+bonus, compact rebuild) under
        # TRITON_INTERPRET=1 instead of the eager torch paths the worker picks on CPU.
        orig_init = cls.__init__

        def __init__(self, *a, **kw):
            orig_init(self, *a, **kw)
            self._use_triton_prepare_block = True
            self._use_triton_accept_bonus = True
            self._use_triton_compact_rebuild = True
            log("DFlashWorkerV2: _use_triton_prepare_block/_accept_bonus/_compact_rebuild = True")

        cls.__init__ = __init__
    log("wrapped DFlashWorkerV2._update_target_mamba_state_after_verify (logging)")


def patch_model_runner(m):
    # ModelRunner._extend_forward_kwargs casts input_embeds with a hard-coded .bfloat16() (harmless on a bf16 GPU
    # model); the DFlash draft block passes input_embeds, and an fp32 drafter then fails in F.linear
    # ("expected m1 and m2 to have the same dtype, but got: c10::BFloat16 != float"). Cast to the runner's dtype.
    from hybrid_patches import rewrite_method

    rewrite_method(m, "ModelRunner", "_extend_forward_kwargs",
                   [("forward_batch.input_embeds.bfloat16()",
                     "forward_batch.input_embeds.to(getattr(self, 'dtype', None) or torch.bfloat16)")])


def patch_torch_native_backend(m):
    # TorchNativeAttnBackend.forward_extend is not speculative-aware: in TARGET_VERIFY (DFlash's draft block and the
    # target's verify) forward_batch.extend_prefix_lens is None and it fails
    # (`assert seq_lens.shape[0] == extend_prefix_lens.shape[0]`: 'NoneType' object has no attribute 'shape').
    # Added here: the verify case as the Triton backend computes it. Per request i: seq_lens[i] = L committed
    # tokens, B = tokens per request; keys/values = req_to_token[req, :L] ++ this block's out_cache_loc; query j
    # sees all L + (j + 1) keys (causal, the target) or all L + B (ENCODER_ONLY: DFlash's bidirectional drafter);
    # a spec_info.custom_mask, when given, is used instead ([B, L + B] per request, flattened).
    import torch
    from sglang.srt.layers.radix_attention import AttentionType
    from torch.nn.functional import scaled_dot_product_attention

    cls = m.TorchNativeAttnBackend
    orig = cls.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if not forward_batch.forward_mode.is_target_verify():
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache)
        cache_loc = forward_batch.out_cache_loc
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, m.KVWriteLoc(cache_loc, self.swa_out_cache_loc), k, v)
        H, Hk, D, Dv = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim, layer.v_head_dim
        o = q.new_empty((q.shape[0], H * Dv))
        q_, o_ = q.view(-1, H, D), o.view(-1, H, Dv)
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        req_to_token = self.req_to_token_pool.req_to_token
        seq_lens = forward_batch.seq_lens.tolist()
        bs = len(seq_lens)
        B = q_.shape[0] // bs
        causal = not (layer.is_cross_attention or layer.attn_type == AttentionType.ENCODER_ONLY)
        custom_mask = getattr(forward_batch.spec_info, "custom_mask", None)
        mask_off = 0
        for i, L in enumerate(seq_lens):
            L = int(L)
            req = int(forward_batch.req_pool_indices[i])
            kv_loc = torch.cat([req_to_token[req, :L].to(torch.int64), cache_loc[i * B:(i + 1) * B].to(torch.int64)])
            kk = k_cache[kv_loc].movedim(0, 1).to(q_.dtype)  # [Hk, L+B, D]
            vv = v_cache[kv_loc].movedim(0, 1).to(q_.dtype)
            qq = q_[i * B:(i + 1) * B].movedim(0, 1)  # [H, B, D]
            if custom_mask is not None:
                mask = custom_mask[mask_off:mask_off + B * (L + B)].view(B, L + B).bool()
                mask_off += B * (L + B)
            elif causal:
                mask = torch.ones(B, L + B, dtype=torch.bool).tril(diagonal=L)
            else:
                mask = None
            out = scaled_dot_product_attention(qq.unsqueeze(0), kk.unsqueeze(0), vv.unsqueeze(0), attn_mask=mask,
                                               scale=layer.scaling, enable_gqa=H != Hk)
            o_[i * B:(i + 1) * B] = out.squeeze(0).movedim(0, 1)
        return o

    cls.forward_extend = forward_extend
    log("TorchNativeAttnBackend.forward_extend: + TARGET_VERIFY (causal target / bidirectional drafter)")


def patch_mamba_state_scatter(m):
    # The verify commit (scatter_mamba_states_after_mtp_verify) refuses CPU tensors in its Python wrappers
    # ("fused_mamba_state_scatter_with_mask only supports CUDA/XPU tensors."); the kernels themselves are plain
    # tl.load/tl.store, so lift the device check and let them run under TRITON_INTERPRET=1.
    from hybrid_patches import rewrite_function

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("hybrid patches: the mamba scatter kernels need TRITON_INTERPRET=1 on CPU")
    rewrite_function(m, "fused_mamba_state_scatter_with_mask",
                     [("if not (dst.is_cuda or dst.is_xpu) or dst.device != src.device:",
                       "if dst.device != src.device:")])
    rewrite_function(m, "fused_conv_window_scatter_with_mask",
                     [("if not (dst.is_cuda or dst.is_xpu) or dst.device != src.device:",
                       "if dst.device != src.device:")])


MORE_PATCHES = {
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton": patch_mamba_state_scatter,
    "sglang.srt.layers.attention.torch_native_backend": patch_torch_native_backend,
    "sglang.srt.model_executor.model_runner": patch_model_runner,
    "sglang.srt.speculative.dflash_worker_v2": patch_dflash_worker_v2,
    "sglang.kernels.ops.attention.fla.fused_norm_gate": patch_fused_norm_gate,
}
