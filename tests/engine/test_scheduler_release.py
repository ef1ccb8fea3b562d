"""Scheduler as a unit: abort, reap and release (what the radix tree keeps, what goes back), flush."""

from __future__ import annotations

from engine.faults import INSERT_WORKING_STATE
from tests.engine.sched_fakes import A, gen, make, pools, prefill_tree, run, step, tree_size


def test_abort_waiting_and_running():
    sched, _ = make(max_running_requests=1)
    r0, r1 = sched.add(gen("r0", A[:12], 8)), sched.add(gen("r1", A[:4]))
    step(sched, {"r0": [65]})  # r0 prefilled (no checkpoint: its extend is under one 64-token chunk), r1 waiting
    assert sched.abort("r1")
    assert (r1.out.finished, r1.out.finish_reason) == (True, {"type": "abort", "message": "aborted by client"})
    assert not sched.waiting and sched.counters["aborted"] == 1
    assert not sched.abort("nope")
    assert sched.abort("r0", "client went away") and not r0.out.finished
    assert sched.reap() == [r0]
    assert r0.out.finish_reason == {"type": "abort", "message": "client went away"}
    assert (sched.counters["aborted"], sched.counters["finished"]) == (2, 1)
    assert r0.last_track_seqlen is None and sched.radix.cached_pages == 0  # nothing tracked, nothing inserted
    assert pools(sched) == (0, 0) and sched.radix.root.lock_ref == 1
    assert (r0.pages, r0.track_slots, r0.working_slot, r0.prefix_node) == ([], [], None, None)


def test_release_keeps_the_adopted_checkpoint_and_the_tree_pages_only():
    sched, runner = make()
    r = sched.add(gen("r", A[:13], 8))  # 6 pages, slots 0 (working), 1 and 2 (tracking)
    assert run(sched, {"r": list(range(65, 73))}) == [r]
    assert r.out.finish_reason == {"type": "length", "length": 8}
    # committed 13 + 7 = 20 tokens: the prefill (13) takes no checkpoint, the decode to 16 does (slot 1)
    assert runner.calls == [("zero", [0, 1, 2]), ("copy", 0, 1)]
    node = sched.radix.match_prefix(A[:13] + list(range(65, 73))).node
    assert (node.depth, node.pages, node.checkpoint, node.lock_ref) == (16, [0, 1, 2, 3], 1, 0)
    assert (sched.radix.cached_pages, sched.radix.cached_checkpoints) == (4, 1)
    assert (sched.kv.free_pages, sched.state.free_slots) == (12, 7)  # pages 4, 5 and slots 0, 2 went back
    assert sched.radix.root.lock_ref == 1
    assert pools(sched) == tree_size(sched)  # nothing leaked, nothing freed twice

    # the next turn resumes at 16 from slot 1, and does not insert again (nothing tracked past 16)
    runner.calls.clear()
    prompt2 = A[:13] + list(range(65, 68)) + [90, 91, 92]
    r2 = sched.add(gen("r2", prompt2, 4))
    sched.admit()
    assert (r2.out.cached_tokens, r2.pages, r2.own_pages_from) == (16, [0, 1, 2, 3, 4, 5], 4)
    assert runner.calls == [("zero", [0, 2, 3]), ("copy", 1, 0)] and node.lock_ref == 1
    assert run(sched, {"r2": [70, 71, 72, 73]}) == [r2]
    assert (sched.radix.cached_pages, sched.radix.cached_checkpoints, node.lock_ref) == (4, 1, 0)
    assert pools(sched) == tree_size(sched)  # nothing leaked, nothing freed twice


def test_release_of_a_deeper_turn_keeps_only_its_own_new_pages():
    sched, _ = make(num_pages=64, max_context=128)
    sched.add(gen("r", A[:13], 8))
    run(sched, {"r": list(range(65, 73))})  # the tree holds its first 16 tokens (4 pages)
    prefix = A[:13] + list(range(65, 68))  # the 16 cached tokens
    prompt = prefix + A[100:170]  # 86 tokens: extends 16..80 (a checkpoint at 80) and 80..86
    r2 = sched.add(gen("r2", prompt, 2))
    sched.admit()
    own, first_track = r2.pages[4:], r2.track_slots[0]
    assert run(sched, {"r2": [80, 81]}) == [r2]
    assert r2.last_track_seqlen is None  # the checkpoint at 80 entered the tree while r2 was still running
    node = sched.radix.match_prefix(prompt).node
    assert (node.depth, node.pages, node.checkpoint) == (80, own[:16], first_track)
    assert sched.radix.cached_pages == 20 and sched.radix.cached_checkpoints == 2
    assert pools(sched) == tree_size(sched)  # nothing leaked, nothing freed twice


def test_release_of_a_duplicate_frees_its_pages_and_unadopted_checkpoint():
    sched, _ = make(num_pages=16, num_slots=8)
    r0, r1 = sched.add(gen("r0", A[:13], 4)), sched.add(gen("r1", A[:13], 4))
    done = run(sched, {"r0": [65, 66, 67, 68], "r1": [65, 66, 67, 68]})
    assert done == [r0, r1]  # together, in one batch; r0 inserts first
    assert (r0.last_track_seqlen, r1.last_track_seqlen) == (16, 16)
    node = sched.radix.match_prefix(A[:13] + [65, 66, 67, 68]).node
    assert (node.depth, node.pages, node.checkpoint) == (16, [0, 1, 2, 3], 1)  # r0's pages and its slot 1
    assert (sched.radix.cached_pages, sched.radix.cached_checkpoints) == (4, 1)
    assert pools(sched) == tree_size(sched)  # nothing leaked, nothing freed twice


def test_insert_working_state_fault_inserts_the_working_slot():
    sched, _ = make(inject_fault=INSERT_WORKING_STATE)
    r = sched.add(gen("r", A[:13], 8))
    run(sched, {"r": list(range(65, 73))})
    node = sched.radix.match_prefix(A[:13] + list(range(65, 73))).node
    # tracked at 16 into slot 1, but the tree got slot 0: the working state, 4 tokens past the boundary
    assert (r.last_track_seqlen, node.depth, node.checkpoint) == (16, 16, 0)
    assert (sched.radix.cached_pages, sched.radix.cached_checkpoints) == (4, 1)
    assert pools(sched) == tree_size(sched)  # nothing leaked, nothing freed twice


def test_no_buffer_strategy_inserts_the_full_length_with_the_working_slot():
    sched, runner = make(num_pages=64, num_slots=4, mamba_radix_cache_strategy="no_buffer", page_size=1)
    r = sched.add(gen("r", A[:13], 8))
    run(sched, {"r": list(range(65, 73))})
    # one working slot, no tracking; after the prefill its state at 13 is snapshotted into the tree (slot 1)
    assert runner.calls == [("zero", [0]), ("copy", 0, 1)]
    assert r.seq_len == 20  # the last token is never run
    assert sched.radix.match_prefix(A[:13] + [99]).checkpoint == 1
    m = sched.radix.match_prefix(A[:13] + list(range(65, 73)))
    assert (m.cached_len, m.checkpoint, m.pages) == (20, 0, tuple(range(20)))
    assert (sched.kv.used_pages, sched.state.used_slots) == (20, 2)  # pages 20, 21 went back
    assert pools(sched) == tree_size(sched)  # nothing leaked, nothing freed twice


def test_no_insert_without_radix_cache_and_everything_freed():
    sched, _ = make(disable_radix_cache=True)
    sched.add(gen("r", A[:13], 8))
    run(sched, {"r": list(range(65, 73))})
    assert sched.radix is None and pools(sched) == (0, 0)


def test_flush_refused_while_running_or_waiting():
    sched, _ = make(max_running_requests=1)
    prefill_tree(sched, A[:8])
    sched.add(gen("r0", A[20:24]))
    sched.add(gen("r1", A[24:28]))
    assert not sched.flush()  # both waiting
    sched.admit()
    assert not sched.flush()  # one running
    assert sched.radix.cached_pages == 2
    run(sched, {"r0": [65] * 4, "r1": [65] * 4})
    assert sched.flush()
    assert (sched.radix.cached_pages, sched.radix.cached_checkpoints) == (0, 0) and pools(sched) == (0, 0)
