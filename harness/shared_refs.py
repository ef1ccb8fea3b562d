"""One reference per distinct input across driver actors: a registry actor that decides who serves each input.

With one driver the reference service (harness/references.py) sends one reference request per distinct input
for the whole run. With several driver actors (harness/driver_actors.py) the same input can come up on two
actors (two pools' sessions, or two sessions that share a turn), so each actor asks `ReferenceRegistry` first:
the first to claim an input serves it and reports its summary; any other waits for that summary. So a run
writes exactly the reference records one driver would, each by exactly one actor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from harness.references import References
from records.resume import RefDone

BATCH_S = 0.002  # claims and reports made within this long go to the registry in one call


class ReferenceRegistry:
    """Input hash -> its reference's summary, or the event its serving actor sets (run as a Ray async actor).
    Claims and reports come in batches: a Ray call per request cost a driver actor more CPU than the request."""

    def __init__(self, answered: Mapping[str, RefDone] | None = None) -> None:
        self.done: dict[str, RefDone] = dict(answered or {})
        self.pending: dict[str, asyncio.Event] = {}

    def claim(self, hashes: list[str]) -> dict[str, RefDone | bool | None]:
        """Per input hash: its summary (answered), None (the caller is the first: it serves the input and reports
        it), or True (another actor serves it: `wait` for it)."""
        out: dict[str, RefDone | bool | None] = {}
        for h in hashes:
            if h in self.done:
                out[h] = self.done[h]
            elif h in self.pending:
                out[h] = True
            else:
                self.pending[h] = asyncio.Event()
                out[h] = None
        return out

    async def wait(self, h: str) -> RefDone:
        """Input `h`'s summary, once the actor that claimed it has reported it."""
        event = self.pending.get(h)
        if event is not None:
            await event.wait()
        return self.done[h]

    def report(self, answers: dict[str, RefDone]) -> None:
        """These inputs' references are written: wake every actor waiting for them."""
        for h, done in answers.items():
            self.done[h] = done
            event = self.pending.pop(h, None)
            if event is not None:
                event.set()

    def size(self) -> int:
        """How many inputs have an answered reference."""
        return len(self.done)


class SharedReferences(References):
    """The reference service of one driver actor: an input not answered here is claimed from the registry
    (a Ray actor handle), served here if the claim is this actor's, else awaited from the actor that serves it."""

    def __init__(self, pool, *, registry, **kwargs) -> None:
        super().__init__(pool, **kwargs)
        self.registry = registry
        self._claims: dict[str, asyncio.Future] = {}  # waiting for the next batch
        self._reports: dict[str, RefDone] = {}
        self._batch: asyncio.Task | None = None

    def answer(self, ids: list[int], h: str, max_new: int, session, turn: int) -> asyncio.Future:
        """The reference answer (a RefDone) for `ids`: from this actor, the registry, or served now."""
        done = self.done.get(h)
        if done is not None:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(done)
            return fut
        fut = self.pending.get(h)
        if fut is None:
            fut = asyncio.ensure_future(self._claimed(ids, h, max_new, session, turn))
            self.pending[h] = fut
            fut.add_done_callback(lambda f, h=h: self._settled(h, f))
        return fut

    async def wait(self) -> None:
        """Every pending reference answered, and every one served here reported to the registry."""
        await super().wait()
        while self._batch is not None and not self._batch.done():
            await self._batch

    async def _claimed(self, ids: list[int], h: str, max_new: int, session, turn: int) -> RefDone:
        claim = self._claims[h] = asyncio.get_running_loop().create_future()
        self._send_soon()
        got = await claim
        if got is True:
            got = await self.registry.wait.remote(h)
        if got is not None:
            return got
        done = await self._serve(ids, h, max_new, session, turn)
        self._reports[h] = done
        self._send_soon()
        return done

    def _send_soon(self) -> None:
        if self._batch is None or self._batch.done():
            self._batch = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        """Send what gathered in BATCH_S, and again until nothing is left: reports, then claims."""
        await asyncio.sleep(BATCH_S)
        while self._claims or self._reports:
            claims, self._claims = self._claims, {}
            reports, self._reports = self._reports, {}
            try:
                if reports:
                    await self.registry.report.remote(reports)
                got = await self.registry.claim.remote(list(claims)) if claims else {}
            except Exception as e:  # noqa: BLE001 - the registry is gone: every claim waiting on it fails
                for fut in claims.values():
                    if not fut.done():
                        fut.set_exception(e)
                raise
            for h, fut in claims.items():
                if not fut.done():  # a claim whose run was cancelled meanwhile
                    fut.set_result(got[h])
