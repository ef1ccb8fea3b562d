"""The restore-window probe (harness/window.py): what it sends, and what a restored turn's record gets."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import pytest

from harness.errors import HarnessError
from harness.references import References
from harness.sender import Sent
from harness.window import WindowProbe, scored, wants_window, without_probes
from records.schema import Generation

GEN = Generation(output_ids=[1], output_text="", output_logprobs=[-0.1], output_top_logprobs=[], cached_tokens=4,
                 completion_tokens=1, finish_reason="length", spec_verify_ct=None, spec_accept_length=None,
                 spec_trace=None, ttft=None, itl=None, e2e=0.1, input_logprobs=[None, -1.0, -2.0, -3.0])


@dataclass
class Backend:
    probes: bool = True

    def window_payload(self, ids, start):
        return {"input_ids": ids, "logprob_start_len": start} if self.probes else None


@dataclass
class Pool:
    name: str
    backend: Backend = field(default_factory=Backend)


@dataclass
class Replica:
    replica_id: str


class Sender:
    """Answers each pool's requests with `answers[pool name]` (an answer, or an exception to raise) and keeps what
    was sent: (pool, preferred replica, logprob_start_len, key)."""

    def __init__(self, answers: dict):
        self.answers, self.sent = answers, []

    async def send(self, pool, preferred, payload, key):
        self.sent.append((pool.name, preferred, payload["logprob_start_len"], key))
        answer = self.answers[pool.name]
        if isinstance(answer, Exception):
            raise answer
        return Sent(*answer)


def make_probe(answers: dict, reference_probes: bool = True, keep: int = 1024) -> WindowProbe:
    """A probe over a Sender of `answers` and the reference service of its pool "reference" (which serves no
    reference here: no recorder, no progress)."""
    sender = Sender(answers)
    refs = References(Pool("reference", Backend(reference_probes)), sender=sender, recorder=None, progress=None,
                      concurrency=1)
    return WindowProbe(sender, refs, keep=keep)


def probe(windows, ids=(10, 11, 12, 13, 14, 15, 16, 17), start=4, pool="i128", key="i128-c4/s/1"):
    return asyncio.run(windows.fields(Pool(pool), "c4", 3, list(ids), "abcdef0123", start, key))


def test_a_restored_turn_is_probed_on_its_replica_and_on_the_reference_from_its_checkpoint():
    ref = replace(GEN, cached_tokens=0, input_logprobs=[-0.5, -1.5, -2.5, -3.5])
    windows = make_probe({"i128": (Replica("i128-r1"), GEN, 0, None), "reference": (Replica("ref-r0"), ref, 0, None)})
    assert probe(windows) == {"window_start": 4, "window_retries": 0, "window_cached_tokens": 4,
                             "window_logprobs": [-1.0, -2.0, -3.0], "window_ref_logprobs": [-1.5, -2.5, -3.5]}
    assert windows.sender.sent == [("i128", 3, 4, "i128-c4/s/1/window"),
                           ("reference", 0xABCDEF01, 4, "i128-c4/s/1/window-ref")]
    probe(windows)
    assert windows.hits == {("i128", "c4", "i128-r1"): 8}  # what the sweep point's stats leave out


def test_a_probe_says_whether_an_injected_fault_reached_it():
    ref = replace(GEN, cached_tokens=0, input_logprobs=[-0.5, -1.5, -2.5, -3.5])
    for hit in (True, False):
        windows = make_probe({"i128": (Replica("i128-r1"), replace(GEN, injected_fault_hit=hit), 0, None),
                         "reference": (Replica("ref-r0"), ref, 0, None)})
        assert probe(windows)["window_fault_hit"] is hit


def test_one_reference_probe_serves_every_turn_of_an_input_and_checkpoint():
    ref = replace(GEN, cached_tokens=0, input_logprobs=[-0.5, -1.5, -2.5, -3.5])
    answers = {"i128": (Replica("i128-r1"), GEN, 0, None), "ctl-i128-cache": (Replica("ctl-r0"), GEN, 0, None),
               "reference": (Replica("ref-r0"), ref, 2, None)}
    windows = make_probe(answers)
    first = probe(windows)
    again = probe(windows, pool="ctl-i128-cache", key="ctl-i128-cache-c4/s/1")
    assert first["window_retries"] == 2 and again["window_retries"] == 0  # re-sends belong to the one that sent
    assert again["window_ref_logprobs"] == first["window_ref_logprobs"] == [-1.5, -2.5, -3.5]
    assert [s[0] for s in windows.sender.sent] == ["i128", "reference", "ctl-i128-cache"]
    answers["reference"] = (Replica("ref-r0"), replace(ref, input_logprobs=[-0.7, -1.7, -2.7, -3.7, -4.7]), 0, None)
    five = (Replica("r"), replace(GEN, input_logprobs=[None, -1.0, -2.0, -3.0, -4.0]), 0, None)
    answers["i128"] = five
    probe(windows, start=3)  # another checkpoint of the same input: its own probe
    answers["i128"] = (Replica("i128-r1"), GEN, 0, None)
    assert windows.sender.sent[-1] == ("reference", 0xABCDEF01, 3, "i128-c4/s/1/window-ref")
    together = make_probe({"i128": five, "ctl-i128-cache": five, "reference": answers["reference"]})

    async def both():
        return await asyncio.gather(*(together.fields(Pool(p), "c4", 3, list(range(10, 18)), "abcdef0123",
                                                   3, f"{p}-c4/s/1") for p in ("i128", "ctl-i128-cache")))
    assert [got["window_ref_logprobs"] for got in asyncio.run(both())] == [[-1.7, -2.7, -3.7, -4.7]] * 2
    assert [s[0] for s in together.sender.sent].count("reference") == 1  # one in flight is shared too
    failing = make_probe({"i128": answers["i128"], "reference": (Replica("r"), None, 0, "HTTP 503")})
    assert probe(failing)["window_error"] == "reference probe: HTTP 503"
    failing.sender.answers["reference"] = (Replica("ref-r0"), ref, 0, None)
    assert probe(failing)["window_ref_logprobs"] == [-1.5, -2.5, -3.5]  # a failed probe is not kept: sent again
    assert [s[0] for s in failing.sender.sent] == ["i128", "reference", "i128", "reference"]


def test_no_reference_probe_for_a_candidate_window_that_cannot_be_compared():
    short = replace(GEN, input_logprobs=[None, -1.0])  # 2 log-probs for the 4 prompt tokens from 4
    windows = make_probe({"i128": (Replica("i128-r1"), short, 0, None), "reference": (Replica("ref-r0"), GEN, 0, None)})
    assert probe(windows)["window_error"] == ("candidate probe: the server returned 2 prompt log-probs for the 4 "
                                             "tokens from 4")
    assert [s[0] for s in windows.sender.sent] == ["i128"]


def test_a_probe_that_fails_says_where():
    ok = (Replica("r"), GEN, 0, None)
    cases = [
        ({"i128": (Replica("r"), None, 0, "HTTP 400: bad"), "reference": ok}, "candidate probe: HTTP 400: bad"),
        ({"i128": (Replica("r"), GEN, 2, None), "reference": (Replica("r"), None, 1, "timeout after 9s")},
         "reference probe: timeout after 9s"),
        ({"i128": ok, "reference": HarnessError("the reference pool cannot be served")},
         "reference probe: the reference pool cannot be served"),
        ({"i128": (Replica("r"), replace(GEN, input_logprobs=None), 0, None), "reference": ok},
         "candidate probe: the server returned no input_token_logprobs"),
        ({"i128": ok, "reference": (Replica("r"), replace(GEN, input_logprobs=[None, -1.0]), 0, None)},
         "reference probe: the server returned 2 prompt log-probs for the 4 tokens from 4"),
    ]
    for answers, error in cases:
        got = probe(make_probe(answers))
        assert got["window_error"] == error and got["window_start"] == 4 and "window_logprobs" not in got
    assert probe(make_probe(dict(cases[1][0])))["window_retries"] == 3  # a re-sent probe says so, both sides summed


def test_no_probe_where_a_side_cannot_score_a_prompt_uncached():
    windows = make_probe({}, reference_probes=False)
    assert probe(windows) == {} and windows.sender.sent == []


def test_which_turns_are_probed():
    assert wants_window(GEN, None, 8)
    assert not wants_window(GEN, "HTTP 500", 8) and not wants_window(None, None, 8)
    assert not wants_window(replace(GEN, cached_tokens=0), None, 8)
    assert not wants_window(GEN, None, 5) and wants_window(GEN, None, 6)  # a token past the first one past it
    assert scored(GEN, 8, 4) == [-1.0, -2.0, -3.0]


def test_the_stats_of_a_sweep_point_leave_the_probes_hits_out():
    stats = {"counters": {"cache_hit_tokens": 300, "checkpoint_evictions": 2}}
    without_probes(stats, 128)
    assert stats == {"counters": {"cache_hit_tokens": 172, "checkpoint_evictions": 2},
                     "window_probe_cached_tokens": 128}
    unknown = {"counters": {"cache_hit_tokens": None}}
    without_probes(unknown, 64)
    assert unknown["counters"]["cache_hit_tokens"] is None and unknown["window_probe_cached_tokens"] == 64


def test_the_reference_probes_held_are_bounded_and_a_dropped_one_is_asked_again():
    ref = replace(GEN, cached_tokens=0, input_logprobs=[-0.5, -1.5, -2.5, -3.5])
    windows = make_probe({"i128": (Replica("r"), GEN, 0, None), "reference": (Replica("ref-r0"), ref, 0, None)},
                        keep=2)
    for h in ("aaaa0000", "bbbb0000", "cccc0000", "bbbb0000", "aaaa0000"):
        asyncio.run(windows.fields(Pool("i128"), "c4", 3, list(range(10, 18)), h, 4, f"k-{h}"))
    assert [(s[1], s[3]) for s in windows.sender.sent if s[0] == "reference"] == [
        (0xAAAA0000, "k-aaaa0000/window-ref"), (0xBBBB0000, "k-bbbb0000/window-ref"),
        (0xCCCC0000, "k-cccc0000/window-ref"), (0xAAAA0000, "k-aaaa0000/window-ref")]  # b kept, a dropped
    assert list(windows.ref_probes) == [("bbbb0000", 4), ("aaaa0000", 4)]  # c dropped: least recently used


def test_a_record_waiting_on_its_reference_probe_is_written_apart_and_a_point_waits_for_its_own():
    async def go():
        windows, written, gate = make_probe({}), [], asyncio.Event()

        async def slow():
            await gate.wait()
            return {"window_ref_logprobs": [-1.0]}

        async def quick():
            return {"window_ref_logprobs": [-2.0]}

        windows.finish_later(("i128", "c1"), slow, lambda f: written.append(("slow", f)))
        windows.finish_later(("i128", "c4"), quick, lambda f: written.append(("quick", f)))
        await asyncio.sleep(0)
        await windows.drain(("i128", "c4"))
        assert written == [("quick", {"window_ref_logprobs": [-2.0]})]  # the other point's record still waits
        drained = asyncio.ensure_future(windows.drain(("i128", "c1")))
        await asyncio.sleep(0)
        assert not drained.done()
        gate.set()
        await drained
        assert written[-1] == ("slow", {"window_ref_logprobs": [-1.0]})
        windows.finish_later(("i128", "c8"), slow, written.append)
        gate.clear()
        stuck = asyncio.Event()

        async def never():
            await stuck.wait()
            return {}

        windows.finish_later(("i128", "c8"), never, written.append)
        await asyncio.sleep(0)
        windows.cancel(("i128", "c8"))  # the point stopped: its waiting records are not written
        with pytest.raises(asyncio.CancelledError):
            await windows.drain(("i128", "c8"))
        return written

    assert len(asyncio.run(go())) == 2
