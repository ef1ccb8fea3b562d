"""Test helpers: run a model on one sequence with its own small pools."""

from __future__ import annotations

import torch

from engine.cache import ModelCaches
from engine.model.batch import ForwardBatch


class OneSeq:
    """A single sequence with a page table and a state slot, for model-level tests."""

    def __init__(self, model, max_len=512, page_size=16, tp=None):
        kw = {"tp": tp} if tp is not None else {}
        self.model = model
        self.caches = ModelCaches.build(model.cfg, max_len // page_size + 1, page_size, 4, **kw)
        self.pages = self.caches.kv.alloc(max_len // page_size)
        self.slot = self.caches.state.alloc(1)[0]
        self.caches.state.zero([self.slot])
        self.len = 0

    def fb(self, T, verify=False, capture=()):
        kv = self.caches.kv
        pos = torch.arange(self.len, self.len + T)[None]
        fb = ForwardBatch(
            positions=pos, kv_write=kv.slots(self.pages, self.len, self.len + T)[None],
            kv_read=kv.slots(self.pages, 0, self.len + T)[None], kv_lens=torch.tensor([self.len + T]),
            state_slots=torch.tensor([self.slot]), capture_layers=capture,
        )
        if verify:
            st = self.caches.state
            L = st.rec.shape[0]
            fb.rec_inter = torch.empty(L, 1, T, *st.rec.shape[2:])
            fb.conv_inter = torch.empty(L, 1, T, *st.conv.shape[2:])
        return fb

    @torch.no_grad()
    def extend(self, ids, verify=False):
        """Logits [T, V] for new tokens `ids`; advances the sequence unless verify."""
        ids = torch.tensor(ids)[None]
        fb = self.fb(ids.shape[1], verify)
        h, _ = self.model(ids, fb, self.caches)
        if not verify:
            self.len += ids.shape[1]
        return self.model.logits(h)[0], fb

    def states(self):
        st = self.caches.state
        return st.rec[:, self.slot].clone(), st.conv[:, self.slot].clone()
