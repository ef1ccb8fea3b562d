"""FreeList, KVPool and StatePool as units: deterministic lowest-first allocation, all-or-nothing, checked frees."""

from __future__ import annotations

import pytest
import torch

from engine.cache.free_list import FreeList
from engine.cache.kv_pool import KVPool
from engine.cache.state_pool import StatePool


def kv_pool(num_pages: int = 6, page_size: int = 4) -> KVPool:
    return KVPool(num_layers=1, num_pages=num_pages, page_size=page_size, num_kv_heads=1, head_dim=2)


def state_pool(num_slots: int = 4) -> StatePool:
    return StatePool(num_layers=2, num_slots=num_slots, num_v_heads=1, head_k_dim=2, head_v_dim=3, conv_dim=2,
                     conv_kernel=3)


# --- FreeList -----------------------------------------------------------------------------------
# (steps, what each alloc returns): ("a", k) allocates k, ("f", [..]) frees; free lists are of size 6
FREE_LIST_SCRIPTS = [
    ("lowest-first", [("a", 2), ("a", 3)], [[0, 1], [2, 3, 4]]),
    ("all-at-once", [("a", 6)], [[0, 1, 2, 3, 4, 5]]),
    ("zero", [("a", 0), ("a", 1)], [[], [0]]),
    ("short-is-none", [("a", 4), ("a", 3)], [[0, 1, 2, 3], None]),
    ("short-takes-nothing", [("a", 4), ("a", 3), ("a", 2)], [[0, 1, 2, 3], None, [4, 5]]),
    ("freed-reused-lowest-first", [("a", 5), ("f", [3, 1]), ("a", 2)], [[0, 1, 2, 3, 4], [1, 3]]),
    ("free-order-irrelevant", [("a", 6), ("f", [5, 0, 2]), ("a", 1), ("a", 2)], [[0, 1, 2, 3, 4, 5], [0], [2, 5]]),
    ("free-then-exact-refill", [("a", 6), ("a", 1), ("f", [4]), ("a", 1)], [[0, 1, 2, 3, 4, 5], None, [4]]),
    ("free-empty-is-noop", [("a", 2), ("f", []), ("a", 1)], [[0, 1], [2]]),
]


@pytest.mark.parametrize("steps,expected", [c[1:] for c in FREE_LIST_SCRIPTS], ids=[c[0] for c in FREE_LIST_SCRIPTS])
def test_free_list_allocation_order(steps, expected):
    fl = FreeList(6, "thing")
    got, held = [], set()
    for op, arg in steps:
        if op == "a":
            out = fl.alloc(arg)
            got.append(out)
            held |= set(out or ())
        else:
            fl.release(arg)
            held -= set(arg)
        assert (fl.used, fl.free) == (len(held), 6 - len(held))
    assert got == expected


@pytest.mark.parametrize("what", ["KV page", "state slot"])
@pytest.mark.parametrize("alloc,free", [(2, [1, 1]), (2, [0]), (0, [3])], ids=["same-call", "twice", "never-used"])
def test_double_free_raises_naming_what(what, alloc, free):
    fl = FreeList(4, what)
    taken = fl.alloc(alloc)
    if free == [0]:  # free a page once, then again
        fl.release([taken[0]])
    with pytest.raises(AssertionError, match=f"^{what} freed twice$"):
        fl.release(free)


# --- KVPool -------------------------------------------------------------------------------------
def test_kv_pool_counts_and_all_or_nothing():
    kv = kv_pool(num_pages=6)
    assert (kv.num_pages, kv.free_pages, kv.used_pages) == (6, 6, 0)
    assert kv.alloc(4) == [0, 1, 2, 3]
    assert kv.alloc(3) is None
    assert (kv.free_pages, kv.used_pages) == (2, 4)
    kv.free([2, 0])
    assert kv.alloc(3) == [0, 2, 4]
    assert (kv.free_pages, kv.used_pages) == (1, 5)
    with pytest.raises(AssertionError, match="KV page freed twice"):
        kv.free([5, 5])
    assert kv.k.shape == kv.v.shape == (1, 24, 1, 2)


SLOT_CASES = [
    # (page table, start, end, KV-pool slot of each position); page size 4
    ("empty-table", [], 0, 0, []),
    ("first-page", [0], 0, 4, [0, 1, 2, 3]),
    ("mapped-page", [3], 0, 4, [12, 13, 14, 15]),
    ("across-pages", [5, 2], 2, 7, [22, 23, 8, 9, 10]),
    ("middle-only", [1, 4, 0], 5, 9, [17, 18, 19, 0]),
    ("single-position", [1, 4, 0], 11, 12, [3]),
    ("empty-range", [1, 4], 3, 3, []),
]


@pytest.mark.parametrize("pages,start,end,want", [c[1:] for c in SLOT_CASES], ids=[c[0] for c in SLOT_CASES])
def test_kv_pool_slots_address_table(pages, start, end, want):
    slots = kv_pool(page_size=4).slots(pages, start, end)
    assert slots.dtype == torch.long
    assert slots.tolist() == want


def test_kv_pool_slots_past_the_page_table_is_an_error():
    with pytest.raises(IndexError):
        kv_pool(page_size=4).slots([1], 0, 5)


# --- StatePool ----------------------------------------------------------------------------------
def fill(st: StatePool, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    st.rec.copy_(torch.randn(st.rec.shape, generator=g))
    st.conv.copy_(torch.randn(st.conv.shape, generator=g))


def test_state_pool_counts_and_all_or_nothing():
    st = state_pool(num_slots=4)
    assert (st.num_slots, st.free_slots, st.used_slots) == (4, 4, 0)
    assert st.alloc() == [0]
    assert st.alloc(2) == [1, 2]
    assert st.alloc(2) is None
    assert (st.free_slots, st.used_slots) == (1, 3)
    st.free([1])
    assert st.alloc(2) == [1, 3]
    assert (st.free_slots, st.used_slots) == (0, 4)
    with pytest.raises(AssertionError, match="state slot freed twice"):
        st.free([0, 2, 0])


def test_state_pool_alloc_does_not_zero_but_zero_does():
    st = state_pool()
    fill(st)
    before_rec, before_conv = st.rec.clone(), st.conv.clone()
    slots = st.alloc(2)
    assert torch.equal(st.rec, before_rec) and torch.equal(st.conv, before_conv)  # bookkeeping only
    st.zero(slots)
    assert st.rec[:, slots].abs().sum() == 0 and st.conv[:, slots].abs().sum() == 0
    rest = [2, 3]
    assert torch.equal(st.rec[:, rest], before_rec[:, rest]) and torch.equal(st.conv[:, rest], before_conv[:, rest])


def test_state_pool_copy_moves_both_states_of_every_layer():
    st = state_pool()
    fill(st, seed=1)
    before_rec, before_conv = st.rec.clone(), st.conv.clone()
    st.copy(2, 0)
    assert torch.equal(st.rec[:, 0], before_rec[:, 2]) and torch.equal(st.conv[:, 0], before_conv[:, 2])
    assert torch.equal(st.rec[:, 1:], before_rec[:, 1:]) and torch.equal(st.conv[:, 1:], before_conv[:, 1:])
    st.rec[:, 2] += 1  # a copy, not a view: the source moving on leaves the checkpoint alone
    assert torch.equal(st.rec[:, 0], before_rec[:, 2])
