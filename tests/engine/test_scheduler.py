"""Scheduler as a unit, with a fake runner (real pools, no model): sizing, admission, chunks, tracking, finish.

Checkpoint positions follow SGLang (docs/engine.md): a prefill extend is checkpointed at its deepest
position on the 64-token mamba chunk grid, a decode step at multiples of the track interval (8 here).
"""

from __future__ import annotations

import pytest
import torch

from engine.io_struct import GenerateRequest, SamplingParams
from engine.scheduler import CapacityError
from protocol.tokenizer import BYTE_TOKENIZER, EOS_ID, VOCAB_SIZE
from tests.engine.sched_fakes import PS, A, gen, make, pools, prefill_tree, run, step, tree_size

# --- sizing ---------------------------------------------------------------------------------------
PAGES_CASES = [
    # (case, speculative, prompt, max_new, pages): ceil((prompt + max_new + overshoot) / 4)
    ("plain-fits-exactly", False, 4, 3, 2),
    ("plain-one-over", False, 4, 4, 3),
    ("plain-no-new-tokens", False, 1, 0, 1),
    ("spec-block-overshoot", True, 4, 3, 3),
    ("spec-exact", True, 4, 4, 3),
    ("spec-one-over", True, 5, 4, 4),
]


@pytest.mark.parametrize("spec,prompt,max_new,want", [c[1:] for c in PAGES_CASES], ids=[c[0] for c in PAGES_CASES])
def test_pages_needed_includes_the_speculative_overshoot(spec, prompt, max_new, want):
    kw = dict(speculative_algorithm="DFLASH", speculative_num_draft_tokens=4) if spec else {}
    sched, _ = make(**kw)
    assert sched.overshoot == (4 if spec else 1)
    assert sched.pages_needed(gen("r", A[:prompt], max_new)) == want


SLOT_CASES = [
    ("extra-buffer", {}, True, 3),
    ("no-radix", dict(disable_radix_cache=True), False, 1),
    ("no-buffer", dict(mamba_radix_cache_strategy="no_buffer", page_size=1), False, 1),
]


@pytest.mark.parametrize("kw,tracking,slots", [c[1:] for c in SLOT_CASES], ids=[c[0] for c in SLOT_CASES])
def test_slots_needed_working_plus_two_tracking_slots(kw, tracking, slots):
    sched, _ = make(**kw)
    assert (sched.tracking, sched.slots_needed()) == (tracking, slots)


FIT_CASES = [
    ("empty", [], 4, "input_ids is empty"),
    ("over-context", A[:40], 25, "= 65 exceeds the context length 64"),
    ("over-pool", A[:40], 24, "request needs 17 KV pages, the pool has 16"),
]


@pytest.mark.parametrize("prompt,max_new,msg", [c[1:] for c in FIT_CASES], ids=[c[0] for c in FIT_CASES])
def test_check_fits_refuses_what_can_never_run(prompt, max_new, msg):
    sched, _ = make()
    with pytest.raises(CapacityError, match=msg):
        sched.add(gen("r", prompt, max_new))
    assert not sched.waiting and sched.counters["requests"] == 0


# --- admission ------------------------------------------------------------------------------------
def test_admission_is_fifo_with_head_of_line_blocking_and_takes_nothing_when_short():
    sched, runner = make(num_pages=5, disable_radix_cache=True)
    r0 = sched.add(gen("r0", A[:5], 2))  # 2 pages
    r1 = sched.add(gen("r1", A[:10], 5))  # 4 pages: does not fit next to r0
    r2 = sched.add(gen("r2", A[:2], 1))  # 1 page: would fit, but waits behind r1
    assert sched.admit() == [r0]
    assert list(sched.waiting) == [r1, r2]
    assert (r0.pages, r0.working_slot, r0.track_slots, r0.prefix_node) == ([0, 1], 0, [], None)
    assert pools(sched) == (2, 1)
    assert sched.abort("r0") and [r.rid for r in sched.reap()] == ["r0"]
    assert pools(sched) == (0, 0)
    assert sched.admit() == [r1, r2]
    assert (r1.pages, r2.pages, r1.working_slot, r2.working_slot) == ([0, 1, 2, 3], [4], 0, 1)
    assert runner.calls == [("zero", [0]), ("zero", [0]), ("zero", [1])]


def test_admission_waits_for_state_slots_and_returns_the_pages():
    sched, _ = make(num_pages=10, num_slots=4)  # tracking: 3 slots a request
    r0, r1 = sched.add(gen("r0", A[:4])), sched.add(gen("r1", A[4:8]))
    assert sched.admit() == [r0]
    assert (r0.working_slot, r0.track_slots) == (0, [1, 2])
    assert pools(sched) == (3, 3)  # r1's pages were allocated, then given back
    assert list(sched.waiting) == [r1]


def test_max_running_requests_caps_the_batch():
    sched, _ = make(max_running_requests=2, disable_radix_cache=True)
    reqs = [sched.add(gen(f"r{i}", A[i : i + 3])) for i in range(3)]
    assert sched.admit() == reqs[:2]
    assert sched.admit() == []
    sched.abort("r1")
    sched.reap()
    assert sched.admit() == [reqs[2]]


def test_admission_cold_locks_the_root_and_zeroes_every_slot():
    sched, runner = make()
    r = sched.add(gen("r", A[:12], 4))
    sched.admit()
    assert (r.pages, r.own_pages_from, r.working_slot, r.track_slots) == ([0, 1, 2, 3, 4], 0, 0, [1, 2])
    assert (r.seq_len, r.last_track_seqlen, r.out.cached_tokens) == (0, None, 0)
    assert r.prefix_node is sched.radix.root and sched.radix.root.lock_ref == 2
    assert runner.calls == [("zero", [0, 1, 2])]


HIT_CASES = [
    # (case, prompt, cached tokens): the tree holds A[:8] with a checkpoint
    ("extends-prefix", A[:12], 8),
    ("one-past-prefix", A[:9], 8),
    ("equals-prefix", A[:8], 0),  # one prompt token must run to give the first logits
    ("diverges", A[:4] + [99] * 8, 0),
]


@pytest.mark.parametrize("prompt,cached", [c[1:] for c in HIT_CASES], ids=[c[0] for c in HIT_CASES])
def test_radix_hit_at_admission_shares_pages_and_restores_the_checkpoint(prompt, cached):
    sched, runner = make()
    tree_pages, ckpt = prefill_tree(sched, A[:8])
    r = sched.add(gen("r", prompt, 4))
    sched.admit()
    own = sched.pages_needed(r.req) - cached // PS
    # the restored checkpoint is the tree's already: nothing is pending insertion
    assert (r.out.cached_tokens, r.seq_len, r.last_track_seqlen) == (cached, cached, None)
    assert sched.counters["cached_tokens"] == cached
    assert r.own_pages_from == cached // PS
    assert r.pages == tree_pages[: cached // PS] + list(range(2, 2 + own))
    assert (r.working_slot, r.track_slots) == (1, [2, 3])
    restore = [("copy", ckpt, 1)] if cached else []
    assert runner.calls == [("zero", [1, 2, 3]), *restore]
    node = sched.radix.match_prefix(A[:8]).node
    assert r.prefix_node is (node if cached else sched.radix.root)
    assert node.lock_ref == (1 if cached else 0)
    assert pools(sched) == (2 + own, 4)
    assert [(c.req, c.start, c.end, c.track_len) for c in sched.schedule().prefill] == [(r, cached, len(prompt), None)]


def test_admission_evicts_the_radix_cache_when_the_pool_is_short():
    sched, _ = make()
    prefill_tree(sched, A[:8])
    r = sched.add(gen("r", [99] * 40, 23))  # all 16 pages
    assert sched.admit() == [r]
    assert r.pages == list(range(16))
    assert (sched.radix.cached_pages, sched.radix.kv_evictions, sched.radix.checkpoint_evictions) == (0, 2, 1)


# --- planning and progress ------------------------------------------------------------------------
CHUNK_CASES = [
    # (case, config, prompt lengths, chunks (request index, start, end, checkpoint length) of successive steps)
    ("budget-shared", dict(disable_radix_cache=True, chunked_prefill_size=10), [7, 9, 3],
     [[(0, 0, 7, None)], [(1, 0, 9, None)], [(2, 0, 3, None)]]),  # a cut must be whole pages: 3 -> 0, wait
    ("budget-per-step", dict(disable_radix_cache=True, chunked_prefill_size=8), [20],
     [[(0, 0, 8, None)], [(0, 8, 16, None)], [(0, 16, 20, None)]]),
    ("budget-cut-to-pages", dict(disable_radix_cache=True, chunked_prefill_size=10), [20],
     [[(0, 0, 8, None)], [(0, 8, 16, None)], [(0, 16, 20, None)]]),
    ("tracking-under-one-chunk", dict(chunked_prefill_size=64), [40], [[(0, 0, 40, None)]]),
    ("tracking-deepest-aligned", dict(chunked_prefill_size=256), [150], [[(0, 0, 150, 128)]]),
    ("tracking-cut-extend", dict(chunked_prefill_size=64), [100], [[(0, 0, 64, 64)], [(0, 64, 100, None)]]),
    ("tracking-two-requests", dict(chunked_prefill_size=128), [70, 100],
     [[(0, 0, 70, 64), (1, 0, 56, None)], [(1, 56, 100, None)]]),  # r1's extends are each under one chunk
]


@pytest.mark.parametrize("kw,lengths,steps", [c[1:] for c in CHUNK_CASES], ids=[c[0] for c in CHUNK_CASES])
def test_prefill_chunks(kw, lengths, steps):
    sched, runner = make(num_pages=128, max_context=256, **kw)
    reqs = [sched.add(gen(f"r{i}", A[:n], 1)) for i, n in enumerate(lengths)]
    run(sched, {r.rid: [65] for r in reqs})
    got = [[(reqs.index(c.req), c.start, c.end, c.track_len) for c in b.prefill] for b in runner.batches]
    assert got == steps
    tracked = [(c.track_len, c.track_slot) for b in runner.batches for c in b.prefill if c.track_len is not None]
    assert [("track", n, slot) for n, slot in tracked] == [c for c in runner.calls if c[0] == "track"]


def test_prefill_checkpoint_enters_the_tree_before_the_next_chunk():
    sched, _ = make(num_pages=128, max_context=256, chunked_prefill_size=64)
    r = sched.add(gen("r", A[:100], 1))
    step(sched, {})  # extend 0..64, checkpoint at 64 in the first ping-pong slot
    t0, pages = r.track_slots[0], r.pages[:16]
    assert (r.last_track_seqlen, r.next_track_idx, sched.radix.cached_checkpoints) == (64, 1, 0)
    step(sched, {"r": [65]})  # cache_unfinished_req before planning 64..100: the slot is donated to the tree
    node = sched.radix.match_prefix(A[:100]).node
    assert (node.depth, node.checkpoint, node.pages) == (64, t0, pages)
    assert r.out.finished and pools(sched) == (16, 1)  # r released: the tree keeps 64 tokens and the checkpoint


def test_decode_checkpoints_alternate_the_ping_pong_slots():
    sched, runner = make(num_pages=64, max_context=128)
    r = sched.add(gen("r", A[:13], 21))  # committed length reaches 13 + 20 = 33
    sched.admit()
    w, (t0, t1) = r.working_slot, r.track_slots
    seen = {}
    script = {"r": list(range(65, 86))}
    while not r.out.finished:
        step(sched, script)
        seen[r.seq_len] = r.last_track_seqlen
    assert [seen[n] for n in (13, 15, 16, 23, 24, 31, 32, 33)] == [None, None, 16, 16, 24, 24, 32, 32]
    assert runner.calls == [("zero", [w, t0, t1]), ("copy", w, t0), ("copy", w, t1), ("copy", w, t0)]
    node = sched.radix.match_prefix(A[:13] + list(range(65, 86))).node
    assert (node.depth, node.checkpoint) == (32, t0)  # the last checkpoint, in the slot the last copy wrote


def test_no_tracking_without_the_extra_buffer():
    sched, runner = make(disable_radix_cache=True)
    r = sched.add(gen("r", A[:13], 12))  # decodes through 16 and 24
    run(sched, {"r": list(range(65, 77))})
    assert (r.seq_len, r.last_track_seqlen, runner.calls) == (24, None, [("zero", [0])])


def ids(text: str) -> list[int]:
    return BYTE_TOKENIZER.encode(text)


FINISH_CASES = [
    # (case, sampling, scripted tokens, index of the finishing token, finish_reason)
    ("length", dict(max_new_tokens=3), [65, 66, 67, 68], 2, {"type": "length", "length": 3}),
    ("eos", dict(max_new_tokens=5), [65, EOS_ID, 66], 1, {"type": "stop", "matched": EOS_ID}),
    ("eos-ignored", dict(max_new_tokens=3, ignore_eos=True), [EOS_ID] * 3, 2, {"type": "length", "length": 3}),
    ("stop-token-id", dict(max_new_tokens=5, stop_token_ids=(66,)), [65, 66, 67], 1, {"type": "stop", "matched": 66}),
    ("stop-token-id-despite-ignore-eos", dict(max_new_tokens=5, ignore_eos=True, stop_token_ids=(EOS_ID,)),
     [65, EOS_ID], 1, {"type": "stop", "matched": EOS_ID}),
    ("stop-string", dict(max_new_tokens=9, stop=("lo",)), ids("hello!"), 4, {"type": "stop", "matched": "lo"}),
    ("stop-string-first-listed", dict(max_new_tokens=9, stop=("zz", "b", "ab")), ids("xab"), 2,
     {"type": "stop", "matched": "b"}),
    ("stop-beats-length", dict(max_new_tokens=2), [65, EOS_ID], 1, {"type": "stop", "matched": EOS_ID}),
    # before min_new_tokens a stop string does not end it (EOS and stop tokens are not even sampled: test_sampling)
    ("min-new-tokens-defers-stop-strings", dict(max_new_tokens=5, min_new_tokens=3, stop=("A",)), [65, 65, 65, 66],
     2, {"type": "stop", "matched": "A"}),
    ("one-token-limit", dict(max_new_tokens=1), [65, 66], 0, {"type": "length", "length": 1}),
]


@pytest.mark.parametrize("sp,tokens,at,reason", [c[1:] for c in FINISH_CASES], ids=[c[0] for c in FINISH_CASES])
def test_finish_reasons_end_the_request_at_the_right_token(sp, tokens, at, reason):
    sched, _ = make()
    r = sched.add(GenerateRequest("r", tuple(A[:4]), SamplingParams(**{"temperature": 0.0, **sp})))
    assert run(sched, {"r": list(tokens)}) == [r]
    assert (r.out.finish_reason, r.out.finished, r.out.output_ids) == (reason, True, tokens[: at + 1])
    assert sched.counters["generation_tokens"] == at + 1
    assert r.out.output_logprobs == []  # none asked for
    # what the tree kept (a decode checkpoint at 8 where 4 + the tokens committed reach it) is all that is held
    assert pools(sched) == tree_size(sched) == ((2, 1) if at == 4 else (0, 0))


def test_logprobs_are_recorded_when_asked():
    sched, _ = make()
    r = sched.add(GenerateRequest("r", tuple(A[:4]), SamplingParams(max_new_tokens=2, temperature=0.0),
                                  return_logprob=True, top_logprobs_num=2))
    first, second = torch.full((VOCAB_SIZE,), -1e9), torch.full((VOCAB_SIZE,), -1e9)
    first[7], first[9] = 1.0, 0.0
    second[7], second[9] = 0.0, 1.0
    run(sched, {"r": [first, second]})
    assert r.out.output_ids == [7, 9]
    assert r.out.output_logprobs == [pytest.approx(-0.3133, abs=1e-4)] * 2  # log(e / (e + 1))
    assert [[t for _, t in top] for top in r.out.output_top_logprobs] == [[7, 9], [9, 7]]
