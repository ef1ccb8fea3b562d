"""RadixCache as a unit, over small real pools (page size 4): match, insert, split, adoption, locks, eviction.

Every test also checks the pools: once the caller (the test) has freed what the
tree did not take, the pools count exactly what the tree holds as used, so a
leak or a double free shows up at the operation that caused it.
"""

from __future__ import annotations

import pytest

from engine.cache.kv_pool import KVPool
from engine.cache.radix import RadixCache
from engine.cache.state_pool import StatePool

PS = 4
A = list(range(100, 132))  # 8 pages of distinct tokens
B = list(range(200, 232))


class Tree:
    """A RadixCache with its two pools and the pages/slots the test itself still owns."""

    def __init__(self, num_pages: int = 16, num_slots: int = 8):
        self.kv = KVPool(num_layers=1, num_pages=num_pages, page_size=PS, num_kv_heads=1, head_dim=2)
        self.st = StatePool(num_layers=1, num_slots=num_slots, num_v_heads=1, head_k_dim=2, head_v_dim=2,
                            conv_dim=2, conv_kernel=2)
        self.radix = RadixCache(self.kv, self.st, PS)

    def insert(self, tokens, checkpoint: bool = True, pages=None):
        """Insert like the scheduler does: own pages for `tokens`, free what the tree did not take."""
        pages = self.kv.alloc(len(tokens) // PS) if pages is None else pages
        slot = self.st.alloc(1)[0] if checkpoint else None
        res = self.radix.insert(tokens, pages, slot)
        self.kv.free(list(res.dup_pages))
        if slot is not None and not res.checkpoint_adopted:
            self.st.free([slot])
        self.check()
        return pages, slot, res

    def check(self) -> None:
        """Nothing leaked, nothing freed twice: what the pools count as used is what the tree holds."""
        assert (self.kv.used_pages, self.st.used_slots) == (self.radix.cached_pages, self.radix.cached_checkpoints)


def edges(node) -> list[tuple]:
    """The tree as a sorted list of (depth, first token, key length, pages, checkpoint, lock_ref)."""
    out = []
    for c in node.children.values():
        out += [(c.depth, c.key[0], len(c.key), tuple(c.pages), c.checkpoint, c.lock_ref), *edges(c)]
    return sorted(out)


def test_insert_new_node_takes_pages_and_checkpoint():
    t = Tree()
    m = t.radix.match_prefix(A[:12])
    assert (m.cached_len, m.pages, m.checkpoint, m.node, t.radix.root.lock_ref) == (0, (), None, t.radix.root, 1)
    pages, slot, res = t.insert(A[:12])
    assert (pages, slot) == ([0, 1, 2], 0)
    assert (res.dup_pages, res.checkpoint_adopted) == ((), True)
    assert edges(t.radix.root) == [(12, 100, 12, (0, 1, 2), 0, 0)]
    assert (t.radix.cached_pages, t.radix.cached_checkpoints, t.kv.used_pages, t.st.used_slots) == (3, 1, 3, 1)


def build_match_tree() -> tuple[Tree, dict]:
    """A[:8] (ckpt) -> A[8:16] (ckpt) -> A[16:24] (none); and A[:8] -> B[:8] (none)."""
    t = Tree()
    p8, s8, _ = t.insert(A[:8])
    p16, s16, r16 = t.insert(A[:16], pages=p8 + t.kv.alloc(2))
    assert r16.dup_pages == ()  # the caller handed the tree's own prefix pages back: nothing to free
    p24, _, _ = t.insert(A[:24], checkpoint=False, pages=p16 + t.kv.alloc(2))
    pb, _, rb = t.insert(A[:8] + B[:8], checkpoint=False, pages=p8 + t.kv.alloc(2))
    assert (p8, p16, p24, pb) == ([0, 1], [0, 1, 2, 3], [0, 1, 2, 3, 4, 5], [0, 1, 6, 7])
    return t, {8: (s8, (0, 1)), 16: (s16, (0, 1, 2, 3))}


MATCH_CASES = [
    # (case, tokens, max_len, expected resume length)
    ("deepest-checkpoint", A[:24], None, 16),
    ("longer-than-tree", A[:32], None, 16),
    ("exact-node-end", A[:16], None, 16),
    ("max-len-at-node-end", A[:24], 16, 16),
    ("max-len-one-short", A[:24], 15, 8),
    ("max-len-below-first-node", A[:24], 7, 0),
    ("max-len-zero", A[:24], 0, 0),
    ("partial-last-page", A[:10], None, 8),
    ("less-than-a-page", A[:3], None, 0),
    ("short-of-first-node-end", A[:7], None, 0),
    ("mid-node-only", A[:12] + B[:8], None, 8),  # resume points are node ends
    ("diverges-mid-page", A[:9] + [999] + A[10:16], None, 8),
    ("branch-without-checkpoint", A[:8] + B[:8], None, 8),
    ("first-page-differs", [999] + A[1:16], None, 0),
    ("empty", [], None, 0),
]


@pytest.mark.parametrize("tokens,max_len,want", [c[1:] for c in MATCH_CASES], ids=[c[0] for c in MATCH_CASES])
def test_match_prefix_resumes_at_deepest_checkpointed_node_end(tokens, max_len, want):
    t, ckpts = build_match_tree()
    m = t.radix.match_prefix(tokens, max_len=max_len)
    assert m.cached_len == want
    if want == 0:
        assert (m.pages, m.checkpoint, m.node) == ((), None, t.radix.root)
    else:
        slot, pages = ckpts[want]
        assert (m.pages, m.checkpoint, m.node.depth, m.node.checkpoint) == (pages, slot, want, slot)
    t.check()  # a lookup allocates and frees nothing


def test_split_in_the_middle_of_an_edge():
    t = Tree()
    pages, slot, _ = t.insert(A[:12])  # pages 0,1,2, checkpoint 0
    lower = t.radix.match_prefix(A[:12]).node
    t.radix.lock(lower)
    # A[:4] + B[:4]: the first page is already in the tree, under the caller's page 3
    own, _, res = t.insert(A[:4] + B[:4], checkpoint=False)
    assert own == [3, 4] and res.dup_pages == (3,)
    upper = lower.parent
    assert (upper.key, upper.pages, upper.depth, upper.checkpoint) == (tuple(A[:4]), [0], 4, None)
    assert upper.lock_ref == 1  # copied: the lock on `lower` runs through it
    assert upper.parent is t.radix.root and set(upper.children.values()) == {lower, upper.children[tuple(B[:4])]}
    assert (lower.key, lower.pages, lower.depth, lower.checkpoint) == (tuple(A[4:12]), [1, 2], 12, slot)
    assert edges(t.radix.root) == [(4, 100, 4, (0,), None, 1), (8, 200, 4, (4,), None, 0),
                                   (12, 104, 8, (1, 2), 0, 1)]
    # the upper node is mid-edge of what was inserted with a checkpoint: not a resume point
    assert t.radix.match_prefix(A[:11]).cached_len == 0
    assert t.radix.match_prefix(A[:12]).cached_len == 12
    t.radix.unlock(lower)
    assert (lower.lock_ref, upper.lock_ref, t.radix.root.lock_ref) == (0, 0, 1)
    assert (t.kv.used_pages, t.kv.free_pages) == (4, 12)  # 0,1,2 + 4; the duplicate 3 went back
    t.check()


def test_insert_with_checkpoint_mid_edge_splits_and_adopts():
    t = Tree()
    _, s12, _ = t.insert(A[:12])
    _, s8, res = t.insert(A[:8], pages=[0, 1])
    assert (res.dup_pages, res.checkpoint_adopted, s8) == ((), True, 1)
    assert edges(t.radix.root) == [(8, 100, 8, (0, 1), 1, 0), (12, 108, 4, (2,), 0, 0)]
    assert t.radix.match_prefix(A[:16]).checkpoint == s12
    assert t.radix.match_prefix(A[:16], max_len=11).checkpoint == s8
    t.check()


DUP_CASES = [
    # (case, pages the caller passes for A[:12] the second time, expected dup_pages)
    ("all-fresh", "fresh", (3, 4, 5)),
    ("tree-pages-handed-back", "tree", ()),
    ("mixed", "mixed", (4, 5)),
]


@pytest.mark.parametrize("kind,want", [c[1:] for c in DUP_CASES], ids=[c[0] for c in DUP_CASES])
def test_duplicate_pages_are_returned_to_the_caller(kind, want):
    t = Tree()
    tree_pages, _, _ = t.insert(A[:12])
    fresh = t.kv.alloc(3)
    pages = {"fresh": fresh, "tree": tree_pages, "mixed": tree_pages[:1] + fresh[1:]}[kind]
    if kind == "mixed":
        t.kv.free(fresh[:1])
    elif kind == "tree":
        t.kv.free(fresh)
    _, _, res = t.insert(A[:12], checkpoint=False, pages=pages)
    assert res.dup_pages == want
    assert edges(t.radix.root) == [(12, 100, 12, (0, 1, 2), 0, 0)]  # the tree kept its own pages
    assert (t.kv.used_pages, t.kv.free_pages) == (3, 13)


ADOPT_CASES = [
    # (case, first insert has a checkpoint, second insert's tokens, second has one, adopted, checkpoints after)
    ("end-node-has-none", False, A[:8], True, True, 1),
    ("end-node-has-one", True, A[:8], True, False, 1),
    ("no-checkpoint-given", True, A[:8], False, False, 1),
    ("new-deeper-node", True, A[:12], True, True, 2),
    ("root-never-adopts", True, [], True, False, 1),
]


@pytest.mark.parametrize("first,tokens,second,adopted,after", [c[1:] for c in ADOPT_CASES],
                         ids=[c[0] for c in ADOPT_CASES])
def test_checkpoint_adoption(first, tokens, second, adopted, after):
    t = Tree()
    _, s1, _ = t.insert(A[:8], checkpoint=first)
    pages = [0, 1, 2][: len(tokens) // PS]
    if len(tokens) > 8:
        pages[2:] = t.kv.alloc(1)
    _, s2, res = t.insert(tokens, checkpoint=second, pages=pages)  # frees s2 itself when not adopted
    assert res.checkpoint_adopted is adopted
    assert t.radix.cached_checkpoints == after
    node = t.radix.match_prefix(A[:8]).node
    assert node.checkpoint == (s1 if first else s2 if adopted else None)
    t.check()


def test_lock_counts_along_the_path_and_unlocking_too_often_asserts():
    t, _ = build_match_tree()
    n24 = t.radix.match_prefix(A[:24] + [0] * 4).node.children[tuple(A[16:20])]
    path = [n24, n24.parent, n24.parent.parent, t.radix.root]
    assert [n.depth for n in path] == [24, 16, 8, 0]
    branch = t.radix.match_prefix(A[:8]).node.children[tuple(B[:4])]
    t.radix.lock(n24)
    t.radix.lock(n24.parent)
    assert [n.lock_ref for n in path] == [1, 2, 2, 3]
    assert branch.lock_ref == 0
    t.radix.unlock(n24)
    t.radix.unlock(n24.parent)
    assert [n.lock_ref for n in path] == [0, 0, 0, 1]
    with pytest.raises(AssertionError, match="radix node unlocked more than locked"):
        t.radix.unlock(n24)


def lru_tree() -> Tree:
    """Three leaves under the root, each 2 pages with a checkpoint; accessed in the order B, A, C."""
    t = Tree(num_pages=8, num_slots=4)
    t.insert(A[:8])  # pages 0,1 slot 0
    t.insert(B[:8])  # pages 2,3 slot 1
    t.insert([7] * 8)  # pages 4,5 slot 2
    for toks in (B[:8], A[:8], [7] * 8):
        assert t.radix.match_prefix(toks).cached_len == 8
    return t


EVICT_KV_CASES = [
    # (case, pages asked, locked leaf (first token) or None, pages freed, first tokens left, free pages, free slots)
    ("one-page-frees-a-whole-leaf", 1, None, 2, [7, 100], 4, 2),
    ("two-leaves", 3, None, 4, [7], 6, 3),
    ("everything", 100, None, 6, [], 8, 4),
    ("locked-lru-skipped", 1, 200, 2, [7, 200], 4, 2),
    ("locked-never-evicted", 100, 200, 4, [200], 6, 3),
    ("nothing-asked", 0, None, 0, [7, 100, 200], 2, 1),
]


@pytest.mark.parametrize("ask,locked,freed,left,free_pages,free_slots", [c[1:] for c in EVICT_KV_CASES],
                         ids=[c[0] for c in EVICT_KV_CASES])
def test_evict_kv_drops_least_recently_used_unlocked_leaves(ask, locked, freed, left, free_pages, free_slots):
    t = lru_tree()
    if locked is not None:
        t.radix.lock(t.radix.root.children[(locked, locked + 1, locked + 2, locked + 3)])
    assert t.radix.evict_kv(ask) == freed
    assert sorted(n.key[0] for n in t.radix.root.children.values()) == left
    assert (t.kv.free_pages, t.st.free_slots) == (free_pages, free_slots)
    assert (t.radix.kv_evictions, t.radix.checkpoint_evictions) == (freed, freed // 2)
    t.check()


def test_evict_kv_takes_a_parent_once_its_children_are_gone():
    t = Tree()
    t.insert(A[:8])  # pages 0,1 slot 0
    t.insert(A[:16], pages=[0, 1, *t.kv.alloc(2)])  # pages 2,3 slot 1 (a child of the first node)
    t.insert(B[:4])  # page 4 slot 2, inserted last...
    assert t.radix.match_prefix(B[:4]).cached_len == 4
    assert t.radix.match_prefix(A[:16]).cached_len == 16  # ...but A's path is the most recent now
    assert t.radix.evict_kv(1) == 1  # B: the only LRU leaf
    assert t.radix.evict_kv(3) == 4  # A[8:16], then its parent A[:8], now a leaf
    assert t.radix.root.children == {}
    assert (t.kv.free_pages, t.st.free_slots, t.radix.kv_evictions, t.radix.checkpoint_evictions) == (16, 8, 5, 3)
    assert t.radix.evict_kv(1) == 0  # nothing left to evict
    t.check()


def test_evict_checkpoints_keeps_kv_and_drops_resume_points():
    t = lru_tree()
    t.insert(A[:16], pages=[0, 1, *t.kv.alloc(2)])  # A[:8] gets a child A[8:16]; both touched after C
    t.radix.lock(t.radix.root.children[tuple(B[:4])])
    assert (t.kv.free_pages, t.st.free_slots) == (0, 0)
    assert t.radix.evict_checkpoints(1) == 1  # C: the least recently used
    assert (t.radix.cached_pages, t.kv.free_pages) == (8, 0)  # KV stays
    assert (t.radix.cached_checkpoints, t.st.free_slots, t.radix.checkpoint_evictions) == (3, 1, 1)
    assert t.radix.match_prefix([7] * 8).cached_len == 0  # no longer a resume point
    assert t.radix.evict_checkpoints(5) == 2  # both A nodes; B is locked
    assert (t.radix.cached_pages, t.radix.cached_checkpoints, t.st.free_slots) == (8, 1, 3)
    assert t.radix.match_prefix(A[:16]).cached_len == 0
    assert t.radix.match_prefix(B[:8]).cached_len == 8
    assert (t.radix.kv_evictions, t.radix.checkpoint_evictions) == (0, 3)
    t.check()


def test_evicting_a_deeper_checkpoint_falls_back_to_the_shallower_one():
    t = Tree()
    t.insert(A[:8])  # slot 0
    t.insert(A[:16], pages=[0, 1, *t.kv.alloc(2)])  # slot 1
    assert t.radix.match_prefix(A[:8]).cached_len == 8  # touches A[:8] only: A[8:16] is now the LRU
    assert t.radix.evict_checkpoints(1) == 1
    m = t.radix.match_prefix(A[:16])
    assert (m.cached_len, m.checkpoint, m.pages) == (8, 0, (0, 1))
    assert (t.radix.cached_pages, t.kv.used_pages, t.st.free_slots) == (4, 4, 7)
    t.check()


def test_flush_returns_everything_to_the_pools():
    t, _ = build_match_tree()
    assert (t.radix.cached_pages, t.radix.cached_checkpoints) == (8, 2)
    t.radix.flush()
    assert (t.radix.root.children, t.radix.cached_pages, t.radix.cached_checkpoints) == ({}, 0, 0)
    assert (t.kv.free_pages, t.st.free_slots) == (16, 8)
    assert t.radix.match_prefix(A[:24]).cached_len == 0
    t.insert(A[:8])  # usable again, from the lowest pages
    assert edges(t.radix.root) == [(8, 100, 8, (0, 1), 0, 0)]


def _fan_tree(fault: str | None = None) -> tuple[Tree, list[int]]:
    """A[:16] (ckpt at 16), then a sibling leaving it at 10 inserted to 16 (ckpt): the split node at depth 8
    has no checkpoint. Returns the tree and the insertion's splits."""
    t = Tree()
    t.radix.inject_fault = fault
    t.insert(A[:16])
    _, _, res = t.insert(A[:10] + B[:6])
    return t, res


def test_an_insertion_reports_the_edges_it_split():
    t, res = _fan_tree()
    [(upper, lower)] = res.splits
    assert (upper.depth, upper.checkpoint, lower.depth, lower.checkpoint, lower.parent is upper) == (8, None, 16, 0,
                                                                                                       True)
    assert t.insert(A[:16])[2].splits == ()  # all there: nothing split


def test_a_match_ending_at_a_split_node_resumes_at_the_ancestor():
    t, _ = _fan_tree()
    _, s4, r4 = t.insert(A[:4])  # a checkpoint above the split node: the split node itself has none
    m = t.radix.match_prefix(A[:9] + B[:7])  # passes the split node (depth 8) whole, matches neither child
    assert (m.cached_len, m.checkpoint, m.kv_len, m.pages) == (4, s4, 8, r4.pages)


def test_match_past_checkpoint_returns_the_walked_nodes_kv():
    t, _ = _fan_tree("match-past-checkpoint")
    _, s4, _ = t.insert(A[:4])
    m = t.radix.match_prefix(A[:9] + B[:7])
    assert (m.cached_len, m.checkpoint, m.kv_len, len(m.pages), m.node.depth) == (8, s4, 8, 2, 8)
    # where the deepest whole node holds the checkpoint, or none is on the path, the fault changes nothing
    assert t.radix.match_prefix(A[:17]).cached_len == 16
    assert t.radix.match_prefix(B[:8]).cached_len == 0
