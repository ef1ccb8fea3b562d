"""The reference service: one reference request per distinct input for the whole run, on the cold path.

Every candidate input is also sent to the reference pool, at most `concurrency` requests at a time; identical
inputs share one request for the whole run, and an answered one is kept as its RefDone alone (not the record,
not the task that served it): what later candidates of the input need. A candidate's live mismatch (the console's
count) is decided once its reference answers. A reference pool that cannot be served stops the run (`fatal`):
nothing left could be judged. The restore-window probe sends its reference half through `send`, under the same
limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from functools import partial

from harness.errors import HarnessError
from harness.pools import Pool
from harness.progress import Progress
from harness.recorder import Recorder
from harness.sender import Sender, Sent
from records.resume import Recorded, RefDone
from records.schema import reference_key


class References:
    """The references of a run: answered (by input hash), pending, and the limit on those in flight."""

    def __init__(self, pool: Pool, *, sender: Sender, recorder: Recorder, progress: Progress,
                 concurrency: int, answered: Mapping[str, RefDone] | None = None) -> None:
        self.pool, self.sender, self.recorder, self.progress = pool, sender, recorder, progress
        self.done: dict[str, RefDone] = dict(answered or {})  # input hash -> its answered reference's summary
        self.pending: dict[str, asyncio.Future] = {}  # input hash -> its reference, while pending (or failed)
        self.sem = asyncio.Semaphore(concurrency)
        self._fatal: asyncio.Future | None = None

    @property
    def fatal(self) -> asyncio.Future:
        """Done, with the error, once the reference pool cannot be served (made on first use, in the run's loop)."""
        if self._fatal is None:
            self._fatal = asyncio.get_running_loop().create_future()
        return self._fatal

    def answer(self, ids: list[int], h: str, max_new: int, session, turn: int) -> asyncio.Future:
        """The reference answer (a RefDone) for `ids`, whose hash is `h`: one request per distinct input for the
        whole run."""
        done = self.done.get(h)
        if done is not None:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(done)
            return fut
        fut = self.pending.get(h)
        if fut is None:
            fut = asyncio.ensure_future(self._serve(ids, h, max_new, session, turn))
            self.pending[h] = fut
            fut.add_done_callback(partial(self._settled, h))
        return fut

    def compare(self, candidate: Recorded, answer: asyncio.Future) -> None:
        """Count a live mismatch once `answer`, the reference of `candidate`'s input, is in: both answered and
        their output ids differ (the analyzer classifies later)."""
        answer.add_done_callback(partial(self._compare, candidate))

    async def send(self, payload: dict, h: str, key: str) -> Sent:
        """Send a request for input `h` to the reference pool, under the service's limit, to the replica its hash
        prefers (as its reference went)."""
        async with self.sem:
            return await self.sender.send(self.pool, int(h[:8], 16), payload, key)

    async def wait(self) -> None:
        """Return once every pending reference is answered (or raise the first failure)."""
        await asyncio.gather(*self.pending.values())

    def _settled(self, h: str, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.done[h] = fut.result()
            del self.pending[h]

    def _compare(self, candidate: Recorded, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None and candidate.differs(fut.result()):
            self.progress.mismatch()

    async def _serve(self, ids: list[int], h: str, max_new: int, session, turn: int) -> RefDone:
        key = reference_key(h)
        async with self.sem:
            payload = self.pool.backend.payload(ids, max_new, stream=False)
            t_start = time.time()
            try:
                sent = await self.sender.send(self.pool, int(h[:8], 16), payload, key)
            except HarnessError as e:
                if not self.fatal.done():
                    self.fatal.set_exception(e)
                raise
        rec = self.recorder.record(self.pool, None, session, turn, ids, max_new, key, t_start, sent, h)
        self.recorder.reference(rec)
        return RefDone.of(rec)  # what later candidates of this input need, not the record
