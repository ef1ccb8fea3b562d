"""FreeList: the bookkeeping both pools share (which pages or slots are free), deterministic and checked."""

from __future__ import annotations


class FreeList:
    """Indices 0..n-1, handed out lowest first; freeing one twice is an error, not a silent leak."""

    def __init__(self, n: int, what: str):
        self.n, self.what = n, what
        self._free = list(range(n - 1, -1, -1))  # pop() yields the lowest index

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.n - len(self._free)

    def alloc(self, k: int) -> list[int] | None:
        """k indices, or None (nothing taken) when fewer are free."""
        if k > len(self._free):
            return None
        return [self._free.pop() for _ in range(k)]

    def release(self, items: list[int]) -> None:
        if not items:
            return
        self._free.extend(items)
        self._free.sort(reverse=True)
        assert len(self._free) == len(set(self._free)) <= self.n, f"{self.what} freed twice"
