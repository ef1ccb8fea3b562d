"""The driver's one request: POST to the preferred healthy replica of a pool, re-sending after replica failures.

A replica failure (the server died, a broken stream) marks the replica failed and sends again, to the same
replica once it recovers or to another, up to the driver's `max_retries`; a request error (the server refused
the request) is the record's error at once. A reference pool with no healthy replica left stops the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.backends import ReplicaFailure, RequestError
from harness.pools import HarnessError, Pool, Replica
from records.schema import Generation

if TYPE_CHECKING:
    from harness.driver import Driver


async def send(driver: Driver, pool: Pool, preferred: int, payload: dict, key: str
               ) -> tuple[Replica | None, Generation | None, int, str | None]:
    """Returns (replica, answer or None, retries, error or None)."""
    retries = 0
    last = ""
    while True:
        replica = await pool.acquire(preferred)
        if replica is None:
            if pool.role == "reference":  # no oracle: nothing can be judged, the harness failed
                raise HarnessError(f"the reference pool cannot be served: {pool.dead_message()}")
            return None, None, retries, pool.dead_message() + (f" (last failure: {last})" if last else "")
        payload["rid"] = f"{driver.run_id}:{key}" + (f"#retry{retries}" if retries else "")
        url = replica.url
        try:
            gen = await pool.backend.generate(driver.http, url, payload, driver.request_timeout,
                                              incremental=pool.incremental_streams)
        except ReplicaFailure as e:
            last = f"{replica.replica_id}: {e}"
            pool.mark_failed(replica, url, driver.http, str(e))
            if retries >= driver.max_retries:
                return replica, None, retries, f"replica failure after {retries} retries: {last}"
            retries += 1
            driver.progress.retry()
            continue
        except RequestError as e:
            return replica, None, retries, str(e)
        return replica, gen, retries, f"abort: {gen.abort_message}" if gen.abort_message else None
