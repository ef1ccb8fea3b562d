"""Radix prefix cache whose resume points are linear-state checkpoints.

Full-attention KV can be reused for any prefix, but a hybrid model also needs
the linear ("mamba") state at the exact prefix length, and that state exists
only where a checkpoint was saved. So a node may hold KV pages and, separately,
a checkpoint slot in the state pool; `match_prefix` resumes at the deepest
matched node that holds a checkpoint. KV and checkpoints are evicted
separately (LRU): a node whose checkpoint was evicted keeps its KV but is no
longer a resume point (SGLang's mamba_radix_cache does the same).

Keys are compared page by page, so every node boundary is page-aligned.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.cache.kv_pool import KVPool
from engine.cache.state_pool import StatePool
from engine.faults import MATCH_PAST_CHECKPOINT, active


@dataclass(eq=False)
class Node:
    key: tuple[int, ...] = ()  # tokens on the edge into this node
    pages: list[int] = field(default_factory=list)  # KV pages of those tokens
    parent: Node | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)  # first page of tokens -> child
    checkpoint: int | None = None  # state-pool slot with the linear state at this node's depth
    depth: int = 0  # prefix length at the end of this node
    lock_ref: int = 0
    last_access: int = 0


@dataclass(frozen=True)
class MatchResult:
    cached_len: int  # resume length (multiple of the page size, 0 = nothing reusable)
    pages: tuple[int, ...]  # KV pages covering [0, cached_len)
    checkpoint: int | None  # state slot to restore
    node: Node  # lock this while the request uses the prefix
    kv_len: int = 0  # tokens whose KV matched (>= cached_len): past a deeper node without a checkpoint too


@dataclass(frozen=True)
class InsertResult:
    dup_pages: tuple[int, ...]  # caller's pages already present in the tree: caller frees them
    checkpoint_adopted: bool  # False: the node already had one; caller frees its slot
    node: Node | None = None  # the node ending at the inserted length (lock it to keep the prefix)
    pages: tuple[int, ...] = ()  # the tree's pages for the inserted tokens (the caller's page table prefix)
    splits: tuple[tuple[Node, Node], ...] = ()  # (upper, lower) of each edge this insertion split, root first


class RadixCache:
    def __init__(self, kv: KVPool, state: StatePool, page_size: int, inject_fault: str | None = None):
        self.kv, self.state, self.page_size = kv, state, page_size
        self.inject_fault = inject_fault  # engine/faults.py: the match-side fault hook reads it
        self.root = Node()
        self.root.lock_ref = 1  # never evicted
        self._clock = itertools.count(1)
        self.kv_evictions = 0  # pages freed by eviction
        self.checkpoint_evictions = 0

    # --- lookup -------------------------------------------------------------
    def _page_key(self, tokens, i: int) -> tuple[int, ...]:
        return tuple(tokens[i : i + self.page_size])

    def match_prefix(self, tokens: list[int], max_len: int | None = None) -> MatchResult:
        """Deepest checkpointed node whose prefix matches `tokens`, not deeper than `max_len`.

        `kv_len` also counts KV matched past it (node ends without a checkpoint, and the
        matching pages of a partly matched edge): SGLang's match walks as far as the KV goes
        and derives the branching point from that. The matched path is touched as SGLang's
        `reset_node_and_parents_mru` does, deeper nodes more recent, so eviction takes
        checkpoints nearer the root first.
        """
        limit = len(tokens) if max_len is None else min(max_len, len(tokens))
        node, pos, pages, path = self.root, 0, [], []
        best = MatchResult(0, (), None, self.root)
        kv_len = 0
        tokens = list(tokens[:limit])
        while pos + self.page_size <= limit:
            child = node.children.get(self._page_key(tokens, pos))
            if child is None:
                break
            n = self._common(child.key, tokens, pos)
            kv_len = pos + n
            if n < len(child.key):
                break  # resume points sit at node ends only
            pos += n
            pages.extend(child.pages)
            node = child
            path.append(node)
            if node.checkpoint is not None:
                best = MatchResult(pos, tuple(pages), node.checkpoint, node)
        for n in path:
            n.last_access = next(self._clock)
        if active(self, MATCH_PAST_CHECKPOINT) and best.checkpoint is not None and pos > best.cached_len:
            # the walked whole nodes' KV with the shallower checkpoint's state (#22935's rule broken)
            return MatchResult(pos, tuple(pages), best.checkpoint, node, max(kv_len, pos))
        return MatchResult(best.cached_len, best.pages, best.checkpoint, best.node, max(kv_len, best.cached_len))

    def _common(self, key, tokens, pos) -> int:
        """Matched length in whole pages."""
        n = 0
        ps = self.page_size
        while n + ps <= len(key) and tuple(key[n : n + ps]) == tuple(tokens[pos + n : pos + n + ps]):
            n += ps
        return n

    def lock(self, node: Node) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "radix node unlocked more than locked"
            node = node.parent

    # --- insertion ----------------------------------------------------------
    def insert(self, tokens: list[int], pages: list[int], checkpoint: int | None) -> InsertResult:
        """Insert tokens (len a multiple of the page size) with their KV pages and end-state checkpoint.

        The tree takes ownership of pages it did not have and of the checkpoint
        if the end node had none.
        """
        ps = self.page_size
        assert len(tokens) % ps == 0 and len(pages) == len(tokens) // ps
        node, pos, dups, splits = self.root, 0, [], []
        now = next(self._clock)
        while pos < len(tokens):
            child = node.children.get(self._page_key(tokens, pos))
            if child is None:
                new = Node(key=tuple(tokens[pos:]), pages=list(pages[pos // ps :]), parent=node,
                           depth=len(tokens), last_access=now)
                node.children[new.key[:ps]] = new
                node, pos = new, len(tokens)
                break
            n = self._common(child.key, tokens, pos)
            if n < len(child.key):
                lower = child
                child = self._split(child, n)
                splits.append((child, lower))
            dups.extend(p for p, q in zip(pages[pos // ps : (pos + n) // ps], child.pages, strict=True) if p != q)
            pos += n
            node = child
            node.last_access = now
        adopted = False
        if checkpoint is not None and node is not self.root:
            if node.checkpoint is None:
                node.checkpoint = checkpoint
                adopted = True
        return InsertResult(tuple(dups), adopted, node, tuple(self._path_pages(node)), tuple(splits))

    def _path_pages(self, node: Node) -> list[int]:
        """The KV pages of the prefix ending at `node`, root first."""
        chunks = []
        while node is not None:
            chunks.append(node.pages)
            node = node.parent
        return [p for chunk in reversed(chunks) for p in chunk]

    def _split(self, child: Node, n: int) -> Node:
        """Split `child` after n tokens; returns the new upper node (no checkpoint: it is mid-edge)."""
        ps = self.page_size
        upper = Node(key=child.key[:n], pages=child.pages[: n // ps], parent=child.parent,
                     depth=child.depth - len(child.key) + n, lock_ref=child.lock_ref,
                     last_access=child.last_access)
        child.parent.children[upper.key[:ps]] = upper
        child.key, child.pages, child.parent = child.key[n:], child.pages[n // ps :], upper
        upper.children[child.key[:ps]] = child
        return upper

    # --- eviction -----------------------------------------------------------
    def _nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def evict_kv(self, num_pages: int) -> int:
        """Free at least num_pages by dropping least-recently-used unlocked leaves; returns pages freed."""
        freed = 0
        while freed < num_pages:
            leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0 and n is not self.root]
            if not leaves:
                break
            victim = min(leaves, key=lambda n: n.last_access)
            freed += len(victim.pages)
            self.kv.free(victim.pages)
            if victim.checkpoint is not None:
                self.state.free([victim.checkpoint])
                self.checkpoint_evictions += 1
            del victim.parent.children[victim.key[: self.page_size]]
        self.kv_evictions += freed
        return freed

    def evict_checkpoints(self, num_slots: int) -> int:
        """Free checkpoint slots of least-recently-used unlocked nodes, keeping their KV."""
        cands = sorted((n for n in self._nodes() if n.checkpoint is not None and n.lock_ref == 0),
                       key=lambda n: n.last_access)
        freed = 0
        for n in cands[:num_slots]:
            self.state.free([n.checkpoint])
            n.checkpoint = None
            freed += 1
        self.checkpoint_evictions += freed
        return freed

    def flush(self) -> None:
        """Drop everything (the caller guarantees no request is running)."""
        for n in list(self._nodes()):
            if n is self.root:
                continue
            self.kv.free(n.pages)
            if n.checkpoint is not None:
                self.state.free([n.checkpoint])
        self.root.children.clear()

    @property
    def cached_pages(self) -> int:
        return sum(len(n.pages) for n in self._nodes())

    @property
    def cached_checkpoints(self) -> int:
        return sum(n.checkpoint is not None for n in self._nodes())
