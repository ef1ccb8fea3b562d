"""The restore window: the prompt tokens a restored turn prefilled on top of its checkpoint, scored on both sides.

A turn that resumed from a prefix-cache checkpoint at b (`cached_tokens`) prefills its prompt from b on with the
restored linear state. A wrong state shows there first and most: measured on the built-in engine in bf16 (I =
128, `track-off-by-one`), the log-probs of the prompt tokens just past b move by 0.4 to 6 where clean restores
move them by at most 0.06, while the turn's output tokens come after the whole suffix is prefilled, where the
error has partly decayed, and through verify steps whose numerics move them by 0.17 on a clean path. So after a
restored turn the driver sends a probe (`WindowProbe`): the same input to the same replica with SGLang's
`logprob_start_len = b` (the prompt tokens' log-probs from b on; SGLang and the built-in engine then match no
deeper than b, so the probe restores the same checkpoint, and a request asking for the same thing re-inserts
nothing new), and the same to the cold reference, once per input and checkpoint for the run (the
pools and sweep points of an interval restore the same checkpoints, so one reference probe serves them all; sent
per turn, the reference probes prefilled 3.6 times what the references themselves did on the default sweep). The
turn's session goes on as soon as its candidate probe has answered; its record, which keeps both sides' log-probs
of the prompt tokens b+1 .. len-1 (token b itself has none, as in SGLang: entry 0 is always null), is written
once the reference probe has answered (waiting for it in the reference's queue held every later turn of the
session back: a concurrency-1 run took 2.4 times as long), and a sweep point ends once all of its records are
written. The analyzer compares them (reports/window.py). Protocols that cannot score a prompt without changing
what the server caches (vLLM serves a request that asks for prompt log-probs uncached) send no probe, and the
report says so.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from harness.errors import HarnessError
from harness.pools import Pool
from harness.references import References
from harness.sender import Sender
from records.schema import Generation

# record fields the probe adds to a restored candidate turn (docs/records.md)
WINDOW_FIELDS = ("window_start", "window_cached_tokens", "window_logprobs", "window_ref_logprobs", "window_error",
                 "window_retries", "window_fault_hit")

Where = tuple[str, str]  # (pool, sweep point label)


def wants_window(gen: Generation | None, error: str | None, input_len: int) -> bool:
    """A turn whose prompt tokens past its restored checkpoint can be scored: it answered, restored a
    checkpoint, and has at least one prompt token after the first one past it."""
    return gen is not None and error is None and 0 < gen.cached_tokens and input_len - gen.cached_tokens >= 2


def scored(gen: Generation, input_len: int, start: int) -> list[float | None] | str:
    """The log-probs of prompt tokens start+1 .. input_len-1 from a probe's answer, or why there are none."""
    got = gen.input_logprobs
    if got is None:
        return "the server returned no input_token_logprobs"
    if len(got) != input_len - start:
        return f"the server returned {len(got)} prompt log-probs for the {input_len - start} tokens from {start}"
    return list(got[1:])


class WindowProbe:
    """The restore-window probes of a run (module doc). It holds the reference probes by (input hash,
    checkpoint): one request serves every restored turn of that input and checkpoint, in any pool or sweep point;
    a probe that failed is dropped, so a later turn sends its own, and at most `keep` are held (a dropped answer
    is asked again, never lost). It holds the records that wait for a reference probe, per sweep point, and the
    prefix-cache hits the probes add to each replica's counters, which the sweep point's stats leave out."""

    def __init__(self, sender: Sender, references: References, enabled: bool = True, keep: int = 1024) -> None:
        self.sender, self.references, self.enabled = sender, references, enabled
        self.keep = keep  # ~10 MB of windows of a few hundred tokens
        self.ref_probes: OrderedDict[tuple[str, int], asyncio.Task] = OrderedDict()
        self.waiting: dict[Where, set[asyncio.Task]] = {}  # records awaiting a reference probe
        self.hits: dict[tuple[str, str, str], int] = {}  # (pool, point label, replica id) -> probes' cached tokens

    def wants(self, gen: Generation | None, error: str | None, input_len: int) -> bool:
        """Whether to probe this turn: probes are on and `wants_window`."""
        return self.enabled and wants_window(gen, error, input_len)

    async def fields(self, pool: Pool, point: str, index: int, ids: list[int], h: str, start: int, key: str
                     ) -> dict:
        """The probe of a turn restored at `start`: the fields to add to its record ({} where a side's protocol
        cannot probe). Both halves of `candidate_half`, in turn."""
        out, rest = await self.candidate_half(pool, point, index, ids, h, start, key)
        return out if rest is None else {**out, **await rest()}

    async def candidate_half(self, pool: Pool, point: str, index: int, ids: list[int], h: str, start: int, key: str
                             ) -> tuple[dict, Callable[[], Awaitable[dict]] | None]:
        """The candidate half of a turn's probe, sent to replica `index` of `pool`: its fields so far, and the
        reference half still to await (None when there is none to wait for). The session goes on while the
        reference half waits its turn in the reference's queue (`finish_later`)."""
        payload = pool.backend.window_payload(ids, start)
        ref_payload = self.references.pool.backend.window_payload(ids, start)
        if payload is None or ref_payload is None:
            return {}, None
        out: dict = {"window_start": start, "window_retries": 0}
        sent = await self.sender.send(pool, index, payload, f"{key}/window")
        out["window_retries"] += sent.retries
        if sent.gen is None or sent.error is not None:
            return {**out, "window_error": f"candidate probe: {sent.error}"}, None
        gen = sent.gen
        out["window_cached_tokens"] = gen.cached_tokens
        if gen.injected_fault_hit is not None:  # the built-in engine with a fault injected: did it reach the probe?
            out["window_fault_hit"] = gen.injected_fault_hit
        where = (pool.name, point, sent.replica.replica_id)
        self.hits[where] = self.hits.get(where, 0) + gen.cached_tokens
        cand = scored(gen, len(ids), start)
        if isinstance(cand, str):
            return {**out, "window_error": f"candidate probe: {cand}"}, None
        task, mine = self._reference_probe(h, start, lambda: self._reference_logprobs(ref_payload, ids, h, start,
                                                                                        key))

        async def reference_half() -> dict:
            try:
                refs, retries = task.result() if task.done() else await asyncio.shield(task)
            except HarnessError as e:  # the reference pool is gone: its own requests stop the run
                return {"window_error": f"reference probe: {e}"}
            # the re-sends of a shared probe are the record's that sent it
            more = {"window_retries": out["window_retries"] + retries} if mine else {}
            if isinstance(refs, str):
                return {**more, "window_error": f"reference probe: {refs}"}
            return {**more, "window_logprobs": cand, "window_ref_logprobs": refs}

        return out, reference_half

    def finish_later(self, where: Where, rest: Callable[[], Awaitable[dict]], done: Callable[[dict], None]) -> None:
        """Await a turn's reference half (`rest`) apart from its session, then `done(fields)` (the record is
        written): the session's next turn need not wait for the reference's queue. The end of the sweep point
        `where` waits for its own (`drain`)."""
        async def finish() -> None:
            done(await rest())

        waiting = self.waiting.setdefault(where, set())
        task = asyncio.ensure_future(finish())
        waiting.add(task)
        task.add_done_callback(waiting.discard)

    async def drain(self, where: Where) -> None:
        """Wait until every record the sweep point `where` deferred is written (its point record comes after)."""
        waiting = self.waiting.pop(where, set())
        if waiting:
            await asyncio.gather(*waiting)

    def cancel(self, where: Where | None = None) -> None:
        """Stop the probes still in flight and the records waiting on them: the run is stopping, or (`where`) that
        sweep point did. A record not written is sent again by a resume."""
        for task in [*self.ref_probes.values()] if where is None else []:
            task.cancel()
        for w, waiting in self.waiting.items():
            if where is None or w == where:
                for task in list(waiting):
                    task.cancel()

    def hits_of(self, pool: str, point: str, replica_id: str) -> int:
        """The cached tokens the probes of sweep point `point` got from `replica_id` of `pool` (counted once)."""
        return self.hits.pop((pool, point, replica_id), 0)

    def _reference_probe(self, h: str, start: int, probe) -> tuple[asyncio.Task, bool]:
        """The reference probe of (h, start), and whether this call started it (`probe()` makes its coroutine)."""
        key = (h, start)
        got = self.ref_probes.get(key)
        if got is not None and not (got.done() and (got.cancelled() or got.exception() is not None
                                                     or isinstance(got.result()[0], str))):
            self.ref_probes.move_to_end(key)
            return got, False
        got = self.ref_probes[key] = asyncio.ensure_future(probe())
        while len(self.ref_probes) > self.keep:
            self.ref_probes.popitem(last=False)
        return got, True

    async def _reference_logprobs(self, payload: dict, ids: list[int], h: str, start: int, key: str
                                  ) -> tuple[list[float | None] | str, int]:
        """The reference's log-probs of the prompt tokens past `start` (or why there are none), and its re-sends."""
        sent = await self.references.send(payload, h, f"{key}/window-ref")
        if sent.gen is None or sent.error is not None:
            return str(sent.error), sent.retries
        return scored(sent.gen, len(ids), start), sent.retries


def without_probes(stats: dict, probe_hits: int) -> None:
    """A sweep point's stats record (records/schema.py build_stats_record) with its replica's prefix-cache hits
    less the ones its restore-window probes made (`probe_hits` tokens, kept as `window_probe_cached_tokens`): the
    point's figure counts the workload's restores once."""
    counters = stats.get("counters") or {}
    if probe_hits and counters.get("cache_hit_tokens") is not None:
        counters["cache_hit_tokens"] -= probe_hits
    stats["window_probe_cached_tokens"] = probe_hits
