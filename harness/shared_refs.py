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


class ReferenceRegistry:
    """Input hash -> its reference's summary, or the event its serving actor sets (run as a Ray async actor)."""

    def __init__(self, answered: Mapping[str, RefDone] | None = None) -> None:
        self.done: dict[str, RefDone] = dict(answered or {})
        self.pending: dict[str, asyncio.Event] = {}

    async def claim(self, h: str) -> RefDone | None:
        """None: the caller serves input `h` and reports it (`report`); else its summary, once it is answered."""
        if h in self.done:
            return self.done[h]
        event = self.pending.get(h)
        if event is None:
            self.pending[h] = asyncio.Event()
            return None
        await event.wait()
        return self.done[h]

    def report(self, h: str, done: RefDone) -> None:
        """Input `h`'s reference is written: wake every actor waiting for it."""
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

    async def _claimed(self, ids: list[int], h: str, max_new: int, session, turn: int) -> RefDone:
        got = await self.registry.claim.remote(h)
        if got is not None:
            return got
        done = await self._serve(ids, h, max_new, session, turn)
        await self.registry.report.remote(h, done)
        return done
