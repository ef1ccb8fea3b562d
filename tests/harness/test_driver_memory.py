"""What the driver holds while references lag behind candidates (issue 29): summaries, never whole records."""

from __future__ import annotations

import asyncio
import gc

from harness.backends import Backend
from harness.driver import Driver
from harness.pools import Pool, Replica
from harness.progress import Progress
from harness.targets import run_config
from harness.targets.builtin import candidate_engine, reference_engine
from records.jsonl import RecordFiles, load_run
from records.schema import Generation
from tests.harness.helpers import make_sessions

INTERVAL = 16
RUN_ID = "driver-memory-test"  # other tests' records may still be alive in the same process


class _LaggingReferences(Backend):
    """Answers candidates at once; holds every reference until all candidates are answered, then counts the
    candidate records still alive in the process."""

    name = "lagging"

    def __init__(self, n_candidates: int) -> None:
        super().__init__()
        self.left = n_candidates
        self.all_answered = asyncio.Event()
        self.alive_then: int | None = None

    async def server_info(self, http, url):
        return {}

    async def probe(self, http, url, role, generate=True):
        return {}

    def payload(self, input_ids, max_new_tokens, stream):
        return {"input_ids": input_ids, "max_new_tokens": max_new_tokens}

    async def generate(self, http, url, payload, timeout, incremental=False):
        if payload["rid"].split(":", 1)[1].startswith("ref/"):
            await self.all_answered.wait()
            if self.alive_then is None:
                for _ in range(50):  # let the sessions that sent the last candidates finish and drop them
                    await asyncio.sleep(0)
                gc.collect()
                self.alive_then = sum(1 for o in gc.get_objects()  # this test's records only (RUN_ID)
                                      if type(o) is dict and o.get("run_id") == RUN_ID
                                      and o.get("role") == "candidate" and "output_ids" in o)
        else:
            self.left -= 1
            if self.left == 0:
                asyncio.get_running_loop().call_soon(self.all_answered.set)
        n = payload["max_new_tokens"]
        return Generation(output_ids=[7] * n, output_text="", output_logprobs=[-0.5] * n,
                          output_top_logprobs=[[[-0.5, 7], [-1.5, 8]]] * n, cached_tokens=0, completion_tokens=n,
                          finish_reason="length", spec_verify_ct=None, spec_accept_length=None, spec_trace=None,
                          ttft=0.0, itl=0.0, e2e=0.0)

    async def flush(self, http, url, wait=60.0):
        return None

    async def counters(self, http, url):
        return {}


def test_no_candidate_record_is_held_while_its_reference_is_pending(tmp_path):
    sessions = make_sessions(12, turns=2)
    backend = _LaggingReferences(n_candidates=12 * 2 * 2)  # two sweep points

    async def go() -> None:
        cfg = run_config(intervals=(INTERVAL,), block_size=4)
        cand = Pool(f"i{INTERVAL}", "candidate", candidate_engine(cfg, INTERVAL), [Replica("c-r0", "mem")], True,
                    5.0, backend=backend)
        ref = Pool("reference", "reference", reference_engine(cfg), [Replica("r-r0", "mem")], True, 5.0,
                   backend=backend)
        files = RecordFiles(tmp_path, set())
        driver = Driver(run_id=RUN_ID, concurrency=(1, 4), candidates=[cand], reference=ref, files=files, http=None,
                        progress=Progress(0, 0, enabled=False), reference_concurrency=2)
        await driver.run({cand.name: tuple(sessions)})
        files.close()

    asyncio.run(go())
    run = load_run(tmp_path)
    assert len(run.candidates) == 48 and len(run.references) == 24  # every turn's input once
    assert backend.alive_then == 0
