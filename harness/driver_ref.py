"""The driver's reference side: one reference request per distinct input for the whole run (harness/driver.py).

A mixin of Driver, which provides refs_done, ref_futures, ref_sem, reference, files, progress, fatal, send and
_record.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

from harness.pools import HarnessError
from harness.refstore import RefDone
from records.rundir import REFERENCE_FILE
from records.schema import reference_key


class ReferenceMixin:
    """Serving the references of a Driver."""

    def reference_for(self, ids: list[int], h: str, max_new: int, session, turn: int) -> asyncio.Future:
        """The reference answer for `ids`: one request per distinct input for the whole run. An answered one is
        kept as its RefDone alone (not the task that served it)."""
        done = self.refs_done.get(h)
        if done is not None:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(done)
            return fut
        fut = self.ref_futures.get(h)
        if fut is None:
            fut = asyncio.ensure_future(self._serve_reference(ids, h, max_new, session, turn))
            self.ref_futures[h] = fut
            fut.add_done_callback(partial(self._settled, h))
        return fut

    def _settled(self, h: str, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.refs_done[h] = fut.result()
            del self.ref_futures[h]

    async def _serve_reference(self, ids: list[int], h: str, max_new: int, session, turn: int) -> dict:
        key = reference_key(h)
        async with self.ref_sem:
            payload = self.reference.backend.payload(ids, max_new, stream=False)
            t_start = time.time()
            try:
                replica, gen, retries, error = await self.send(self.reference, int(h[:8], 16), payload, key)
            except HarnessError as e:
                if not self.fatal.done():
                    self.fatal.set_exception(e)
                raise
        rec = self._record(self.reference, replica, None, session, turn, ids, max_new, gen, t_start, retries,
                           error, key, h)
        self.files.write(REFERENCE_FILE, rec)
        self.progress.reference(rec)
        return RefDone.of(rec)  # what later candidates of this input need, not the record
