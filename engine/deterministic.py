"""Deterministic inference (`--enable-deterministic-inference`): every token computed as its lone decode step.

In the default mode a token's numerics depend on the forward it is part of: a prefill extend runs
the chunked delta rule over its tokens and carries the state in fp32 across them, a verify carries
fp32 through the block, a decode step batches every running request into one GEMM per linear and
pads their keys to the longest, and the CPU GEMM and attention kernels choose their blocking from
those shapes. So a request's bits move with what else is in its batch, with whether a position was
verified or decoded, and with whether its prefix was restored or prefilled. Each is a few ulps; in
bf16 they are enough to move a log-prob by 1e-2 and flip a near tie.

In this mode the runner computes every token of every forward with the model's own forward over
one sequence and one token (B = 1, T = 1), reading the state the token before it left and storing
its own state rounded to the pools' dtypes, exactly as a decode step of that request alone would:

* a prefill extend of T tokens is T such steps on the working slot; its checkpoint is a copy of
  the working state after the checkpoint's token (so it is the very state a cold prefill holds
  there, and a scan resumed from it continues bit for bit as the cold scan does);
* a decode batch of B requests is B such steps, each on its own slot;
* a verify block is T such steps per request on a scratch copy of its working state, each step's
  state (already rounded to the pool's dtype) stored as the verify intermediate, so the commit
  takes exactly what decoding those tokens would have stored.

Every linear, norm, the LM head and the attention then run with the shapes of a lone decode step
(attention over exactly the keys 0..p, in one fixed reduction order), and a tensor-parallel
all-reduce always reduces one token's row. A token's bits are a function of its sequence alone.
The cost is one model forward per token (docs/engine.md, benchmarks/deterministic_cost.py), so one
engine step (a long prompt's prefill) can take many seconds; each token calls `progress` (the server's
engine loop heartbeat), so that a step making progress is never taken for a stalled loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.cache import ModelCaches, StatePool


class TokenByToken:
    """The deterministic forwards of a ModelRunner (same calls and returns as its extend, decode, verify)."""

    def __init__(self, runner):
        self.r = runner
        self._scratch: ModelCaches | None = None
        self.progress: Callable[[], None] | None = None  # called after every token (engine/server/async_engine.py)

    def _step(self, token: int, pos: int, pages: list[int], slot: int, caches: ModelCaches):
        """One token of one sequence at `pos` through the model, its state in `caches` slot `slot` advancing.
        Returns (final hidden [1, 1, h], captured hidden states or None, its ForwardBatch)."""
        r = self.r
        fb = r._fb([pos], 1, [pages], [slot], verify=False)
        hidden, aux = r.model(torch.tensor([[token]], device=r.device), fb, caches)
        if self.progress is not None:
            self.progress()
        return hidden, aux, fb

    def extend(self, tokens: list[int], start: int, pages: list[int], slot: int, track_slot: int,
               track_offset: int, logits_from: int) -> torch.Tensor:
        r = self.r
        end = start + len(tokens)
        first = logits_from if start <= logits_from < end else end - 1  # the positions whose logits are returned
        rows, auxes = [], []
        st = r.caches.state
        for i, token in enumerate(tokens):
            hidden, aux, _ = self._step(token, start + i, pages, slot, r.caches)
            auxes.append(aux)
            if start + i >= first:
                rows.append(r.model.logits(hidden[:, 0]))
            if i + 1 == track_offset:  # the prefill checkpoint: the state after this token, as stored
                st.rec[:, track_slot] = st.rec[:, slot]  # (no fault bookkeeping here: the scheduler did it)
                st.conv[:, track_slot] = st.conv[:, slot]
        if auxes and auxes[0] is not None:
            r._write_draft_ctx(torch.cat(auxes, 1), r._fb([start], len(tokens), [pages], [slot], verify=False))
        logits = torch.cat(rows)  # [end - first, V]
        return logits if start <= logits_from < end else logits[-1]

    def decode(self, tokens: list[int], starts: list[int], pages: list[list[int]], slots: list[int]) -> torch.Tensor:
        r = self.r
        rows = []
        for token, pos, p, slot in zip(tokens, starts, pages, slots, strict=True):
            hidden, aux, fb = self._step(token, pos, p, slot, r.caches)
            if aux is not None:
                r._write_draft_ctx(aux, fb)
            rows.append(r.model.logits(hidden[:, 0]))
        return torch.cat(rows)

    def verify(self, blocks: list[list[int]], starts: list[int], pages: list[list[int]], slots: list[int]):
        """(logits [B, T, V], the batch's ForwardBatch holding every step's state, captured hidden states)."""
        r = self.r
        T = len(blocks[0])
        fb = r._fb(starts, T, pages, slots, verify=True)
        st, scratch = r.caches.state, self._scratch_caches()
        logits, auxes = [], []
        for b, (block, start, p, slot) in enumerate(zip(blocks, starts, pages, slots, strict=True)):
            scratch.rec[:, 0] = st.rec[:, slot]
            scratch.conv[:, 0] = st.conv[:, slot]
            rows = []
            for t, token in enumerate(block):
                hidden, aux, _ = self._step(token, start + t, p, 0, scratch)
                fb.rec_inter[:, b, t] = scratch.rec[:, 0]
                fb.conv_inter[:, b, t] = scratch.conv[:, 0]
                rows.append(r.model.logits(hidden[:, 0]))
                auxes.append(aux)
            logits.append(torch.cat(rows))
        aux = torch.cat(auxes, 1).reshape(len(blocks), T, -1) if auxes[0] is not None else None
        return torch.stack(logits), fb, aux

    def _scratch_caches(self) -> ModelCaches:
        """The KV pool and a one-slot state pool of the pools' dtypes: a verify's steps run on it."""
        if self._scratch is None:
            st = self.r.caches.state
            L, _, H, Dk, Dv = st.rec.shape
            one = StatePool(L, 1, H, Dk, Dv, st.conv.shape[2], st.conv.shape[3] + 1, device=st.rec.device,
                            ssm_dtype=st.rec.dtype, conv_dtype=st.conv.dtype)
            self._scratch = ModelCaches(self.r.caches.kv, one)
        return self._scratch
