"""The restore window: the prompt tokens a restored turn prefilled on top of its checkpoint, scored on both sides.

A turn that resumed from a prefix-cache checkpoint at b (`cached_tokens`) prefills its prompt from b on with the
restored linear state. A wrong state shows there first and most: measured on the built-in engine in bf16 (I =
128, `track-off-by-one`), the log-probs of the prompt tokens just past b move by 0.4 to 6 where clean restores
move them by at most 0.06, while the turn's output tokens come after the whole suffix is prefilled, where the
error has partly decayed, and through verify steps whose numerics move them by 0.17 on a clean path. So after a
restored turn the driver sends a probe (`window_fields`): the same input to the same replica with SGLang's
`logprob_start_len = b` (the prompt tokens' log-probs from b on; SGLang and the built-in engine then match no
deeper than b, so the probe restores the same checkpoint, and a request asking for the same thing re-inserts
nothing new), and the same to the cold reference, once per input and checkpoint for the run (`RefWindows`: the
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
from typing import TYPE_CHECKING

from harness.pools import HarnessError, Pool
from records.schema import Generation

if TYPE_CHECKING:
    from harness.driver import Driver

# record fields the probe adds to a restored candidate turn (docs/records.md)
WINDOW_FIELDS = ("window_start", "window_cached_tokens", "window_logprobs", "window_ref_logprobs", "window_error",
                 "window_retries", "window_fault_hit")


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


async def window_fields(driver: Driver, pool: Pool, point: str, index: int, ids: list[int], h: str, start: int,
                        key: str) -> dict:
    """The probe of a turn restored at `start` (module doc): the fields to add to its record ({} where a side's
    protocol cannot probe). Both halves of `candidate_probe`, in turn."""
    out, rest = await candidate_probe(driver, pool, point, index, ids, h, start, key)
    return out if rest is None else {**out, **await rest()}


async def candidate_probe(driver: Driver, pool: Pool, point: str, index: int, ids: list[int], h: str, start: int,
                          key: str) -> tuple[dict, Callable[[], Awaitable[dict]] | None]:
    """The candidate half of a turn's probe: its fields so far, and the reference half still to await (None when
    there is none to wait for). The driver lets the session go on while the reference half waits its turn in the
    reference's queue (RefWindows.finish_later). The prefix-cache hits the probe adds to its replica's counters
    are kept in `driver.probe_hits` (pool, sweep point label, replica id), which the sweep point's stats leave
    out."""
    payload = pool.backend.window_payload(ids, start)
    ref_payload = driver.reference.backend.window_payload(ids, start)
    if payload is None or ref_payload is None:
        return {}, None
    out: dict = {"window_start": start, "window_retries": 0}
    replica, gen, retries, error = await driver.send(pool, index, payload, f"{key}/window")
    out["window_retries"] += retries
    if gen is None or error is not None:
        return {**out, "window_error": f"candidate probe: {error}"}, None
    out["window_cached_tokens"] = gen.cached_tokens
    if gen.injected_fault_hit is not None:  # the built-in engine with a fault injected: did it reach the probe?
        out["window_fault_hit"] = gen.injected_fault_hit
    where = (pool.name, point, replica.replica_id)
    driver.probe_hits[where] = driver.probe_hits.get(where, 0) + gen.cached_tokens
    cand = scored(gen, len(ids), start)
    if isinstance(cand, str):
        return {**out, "window_error": f"candidate probe: {cand}"}, None
    task, mine = driver.ref_windows.task(h, start, lambda: _reference_probe(driver, ref_payload, ids, h, start, key))

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


async def _reference_probe(driver: Driver, payload: dict, ids: list[int], h: str, start: int, key: str
                           ) -> tuple[list[float | None] | str, int]:
    """The reference's log-probs of the prompt tokens past `start` (or why there are none), and its re-sends."""
    async with driver.ref_sem:
        _, ref, retries, error = await driver.send(driver.reference, int(h[:8], 16), payload, f"{key}/window-ref")
    if ref is None or error is not None:
        return str(error), retries
    return scored(ref, len(ids), start), retries


class RefWindows:
    """The reference probes of a run by (input hash, checkpoint): one request serves every restored turn of that
    input and checkpoint, in any pool or sweep point. A probe that failed is dropped, so a later turn sends its
    own; `keep` bounds what is held (a dropped answer is asked again, never lost)."""

    def __init__(self, keep: int = 1024) -> None:  # ~10 MB of windows of a few hundred tokens
        self.keep = keep
        self.tasks: OrderedDict[tuple[str, int], asyncio.Task] = OrderedDict()
        self.tails: dict[tuple[str, str], set[asyncio.Task]] = {}  # (pool, point label) -> records awaiting a probe

    def task(self, h: str, start: int, probe) -> tuple[asyncio.Task, bool]:
        """The probe of (h, start), and whether this call started it (`probe()` makes its coroutine)."""
        key = (h, start)
        got = self.tasks.get(key)
        if got is not None and not (got.done() and (got.cancelled() or got.exception() is not None
                                                     or isinstance(got.result()[0], str))):
            self.tasks.move_to_end(key)
            return got, False
        got = self.tasks[key] = asyncio.ensure_future(probe())
        while len(self.tasks) > self.keep:
            self.tasks.popitem(last=False)
        return got, True

    def finish_later(self, where: tuple[str, str], rest: Callable[[], Awaitable[dict]],
                     done: Callable[[dict], None]) -> None:
        """Await a turn's reference half (`rest`) apart from its session, then `done(fields)` (the driver writes
        the record): the session's next turn need not wait for the reference's queue. `where`: (pool, sweep point
        label), whose end waits for its own (`drain`)."""
        async def finish() -> None:
            done(await rest())

        tails = self.tails.setdefault(where, set())
        task = asyncio.ensure_future(finish())
        tails.add(task)
        task.add_done_callback(tails.discard)

    async def drain(self, where: tuple[str, str]) -> None:
        """Wait until every record the sweep point `where` deferred is written (its point record comes after)."""
        tails = self.tails.pop(where, set())
        if tails:
            await asyncio.gather(*tails)

    def cancel(self, where: tuple[str, str] | None = None) -> None:
        """Stop the probes still in flight and the records waiting on them: the run is stopping, or (`where`) that
        sweep point did. A record not written is sent again by a resume."""
        for task in [*self.tasks.values()] if where is None else []:
            task.cancel()
        for w, tails in self.tails.items():
            if where is None or w == where:
                for task in list(tails):
                    task.cancel()


def without_probes(stats: dict, probe_hits: int) -> None:
    """A sweep point's stats record (records/schema.py build_stats_record) with its replica's prefix-cache hits
    less the ones its restore-window probes made (`probe_hits` tokens, kept as `window_probe_cached_tokens`): the
    point's figure counts the workload's restores once."""
    counters = stats.get("counters") or {}
    if probe_hits and counters.get("cache_hit_tokens") is not None:
        counters["cache_hit_tokens"] -= probe_hits
    stats["window_probe_cached_tokens"] = probe_hits
