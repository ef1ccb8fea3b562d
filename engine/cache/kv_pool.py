"""Paged KV pool: full-attention K/V for every token, addressed by pages."""

from __future__ import annotations

import torch

from engine.cache.free_list import FreeList


class KVPool:
    """K/V tensors [L_attn, num_pages * page_size, Hkv, D] and a free-page list.

    Pages are owned either by one running request or by the radix tree; the pool
    itself only counts. Allocation is deterministic (lowest free pages first).

    `tainted` is the KV side of StatePool.tainted (host bookkeeping for the fault injections, never read by
    the engine's own logic): pages written by a step that read a fault-corrupted state or page
    (Scheduler._carry_kv_marks). A newly allocated page has no mark.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.page_size = page_size
        self.num_pages = num_pages
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._pages = FreeList(num_pages, "KV page")
        self.tainted: set[int] = set()

    @property
    def free_pages(self) -> int:
        return self._pages.free

    @property
    def used_pages(self) -> int:
        return self._pages.used

    def alloc(self, n: int) -> list[int] | None:
        """n pages (lowest first), or None (nothing taken) when fewer are free."""
        pages = self._pages.alloc(n)
        self.tainted.difference_update(pages or ())
        return pages

    def free(self, pages: list[int]) -> None:
        self._pages.release(pages)

    def slots(self, pages: list[int], start: int, end: int) -> torch.Tensor:
        """KV-pool slot of every position in [start, end) of a sequence with this page table."""
        pos = torch.arange(start, end)
        ps = self.page_size
        table = torch.tensor(pages, dtype=torch.long) if pages else torch.zeros(0, dtype=torch.long)
        return table[pos // ps] * ps + pos % ps
