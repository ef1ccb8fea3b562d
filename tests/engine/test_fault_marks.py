"""The KV side of the engine's fault marks (`injected_fault_hit`): what attention reads carries a mark too.

A fault corrupts a linear state; a request that computes from it writes full-attention KV that is wrong as well,
and the radix tree hands those pages to every later request whose prefix matches them, at admission or when an
insertion points a running request's page table at the tree's copy of its prefix. Such a request computes wrong
tokens from a clean state, so it must report the hit, and so must what it writes and checkpoints. The scenarios
mark pages by hand (as a faulted step would) on an engine whose injected fault cannot bite them (`stale-seq-lens`
acts only in the DFlash verify; these engines decode without speculation), so every mark comes from the rule
under test.
"""

from __future__ import annotations

from tests.engine.sessions import SUFFIX, make_engine, prompt, req

# fault bookkeeping on, the fault itself out of reach (no speculation)
INERT = dict(inject_fault="stale-seq-lens", mamba_track_interval=64)


def _run(e, rid: str, ids, n: int = 8):
    return e.generate([req(rid, ids, n)])[0]


def test_restoring_a_clean_checkpoint_over_marked_kv_is_a_hit_and_marks_what_follows():
    e = make_engine(**INERT)
    a = prompt(150, seed=1)
    first = _run(e, "a", a)
    assert first.injected_fault_hit is False
    b_ids = tuple(a) + tuple(first.output_ids) + SUFFIX
    clean = make_engine(**INERT)
    _run(clean, "a", a)
    assert _run(clean, "b", b_ids).injected_fault_hit is False  # the control: nothing marked, nothing hit

    e.sched.kv.tainted.update(e.sched.tree.match(list(b_ids)).pages)
    assert not e.sched.state.tainted  # the checkpoint b restores is clean: only its KV is marked
    b = _run(e, "b", b_ids, n=40)
    assert b.cached_tokens > 0 and b.injected_fault_hit is True
    # b's own pages and checkpoints carry the mark on: a request that restores b's deepest checkpoint is hit
    c_ids = b_ids + tuple(b.output_ids) + SUFFIX
    c = _run(e, "c", c_ids)
    assert c.cached_tokens > len(b_ids) and c.injected_fault_hit is True
    assert _run(e, "d", prompt(120, seed=2)).injected_fault_hit is False  # an unrelated prompt reads no mark


def test_a_running_request_pointed_at_marked_pages_by_an_insertion_is_a_hit():
    """x and y share a 256-token stem and are admitted together (neither matches anything); x prefills first and
    inserts the stem, then its pages are marked; y's own insertion of the stem points y's page table at x's
    copy, so y reads the marked KV from its next step on, though it never restored anything."""
    stem = prompt(256, seed=3)
    x_ids, y_ids = tuple(stem) + tuple(prompt(20, seed=4)), tuple(stem) + tuple(prompt(20, seed=5))

    def run(mark: bool):
        e = make_engine(**INERT, chunked_prefill_size=128)
        x, y = e.sched.add(req("x", x_ids, 8)), e.sched.add(req("y", y_ids, 8))
        marked = False
        while e.has_work:
            e.step()
            if mark and not marked and e.sched.radix.cached_pages and y.seq_len < 128:
                e.sched.kv.tainted.update(e.sched.tree.match(list(y_ids)).pages)
                marked = True
        assert not mark or marked
        assert x.out.cached_tokens == y.out.cached_tokens == 0
        return x.out, y.out

    x, y = run(mark=True)
    assert x.injected_fault_hit is True  # x reads the pages it wrote: marked from then on
    assert y.injected_fault_hit is True  # y, through its page table only
    assert [o.injected_fault_hit for o in run(mark=False)] == [False, False]


def test_a_page_written_under_a_running_request_that_still_reads_it_marks_that_request():
    """The KV of a prefix freed under a request that still reads it (what evict-matched-checkpoint's late lock
    allows) and handed to another request is overwritten by that request's prefill: the first request is hit, the
    writer is not."""
    e = make_engine(**INERT)
    q = e.sched.add(req("q", prompt(100, seed=6), 40))
    while not q.out.output_ids:
        e.step()
    assert q.out.injected_fault_hit is False
    stolen = q.pages[0]
    e.sched.kv.free([stolen])  # freed under q, as an eviction of its unlocked prefix would
    r = e.sched.add(req("r", prompt(60, seed=7), 4))
    while r.seq_len == 0:  # the step that prefills r (the engine is left there: q and r now share a page)
        e.step()
    assert stolen in r.pages
    assert q.out.injected_fault_hit is True
    assert r.out.injected_fault_hit is False
