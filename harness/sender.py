"""One request to a pool: POST to the preferred healthy replica, re-sending after replica failures.

A replica failure (the server died, a broken stream) marks the replica failed and sends again, to the same
replica once it recovers or to another, up to `max_retries`; a request error (the server refused the request)
is the request's error at once. A reference pool with no healthy replica left stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from harness.backends import ReplicaFailure, RequestError
from harness.errors import HarnessError
from harness.pools import Pool, Replica
from harness.progress import Progress
from records.schema import Generation


@dataclass(frozen=True)
class Sent:
    """What one request came to."""

    replica: Replica | None  # the replica that answered (or failed) last; None: no healthy replica was left
    gen: Generation | None  # the answer; None when there is none
    retries: int  # re-sends after replica failures
    error: str | None  # the request's error (a refusal, a replica failure past the retries, an abort), or None


class Sender:
    """Sends a run's requests, each named to the servers by the run id and its record key (`rid`)."""

    def __init__(self, *, run_id: str, http: aiohttp.ClientSession, progress: Progress, request_timeout: float,
                 max_retries: int) -> None:
        self.run_id, self.http, self.progress = run_id, http, progress
        self.request_timeout, self.max_retries = request_timeout, max_retries

    async def send(self, pool: Pool, preferred: int, payload: dict, key: str) -> Sent:
        """POST `payload` to `pool`'s replica `preferred` (or the next healthy one), re-sent after replica
        failures (module doc); a reference pool with no healthy replica left raises HarnessError."""
        retries = 0
        last = ""
        while True:
            replica = await pool.acquire(preferred)
            if replica is None:
                if pool.role == "reference":  # no oracle: nothing can be judged, the harness failed
                    raise HarnessError(f"the reference pool cannot be served: {pool.dead_message()}")
                return Sent(None, None, retries, pool.dead_message() + (f" (last failure: {last})" if last else ""))
            payload["rid"] = f"{self.run_id}:{key}" + (f"#retry{retries}" if retries else "")
            url = replica.url
            try:
                gen = await pool.backend.generate(self.http, url, payload, self.request_timeout,
                                                  incremental=pool.incremental_streams)
            except ReplicaFailure as e:
                last = f"{replica.replica_id}: {e}"
                pool.mark_failed(replica, url, self.http, str(e))
                if retries >= self.max_retries:
                    return Sent(replica, None, retries, f"replica failure after {retries} retries: {last}")
                retries += 1
                self.progress.retry()
                continue
            except RequestError as e:
                return Sent(replica, None, retries, str(e))
            return Sent(replica, gen, retries, f"abort: {gen.abort_message}" if gen.abort_message else None)
