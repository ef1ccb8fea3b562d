"""The records of a run's requests: built from what each request came to, and written as answers arrive.

Candidate records go to their pool's journal, references to the reference journal, warmup requests to their
own (not gated); the console's progress counts each one written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.pools import Pool
from harness.progress import Progress
from harness.sender import Sent
from harness.sweep import Point
from records.jsonl import RecordFiles
from records.rundir import REFERENCE_FILE, candidate_file, input_hash
from records.schema import WARMUP_FILE, build_record


class Recorder:
    """Builds and writes the request records of one run."""

    def __init__(self, *, run_id: str, files: RecordFiles, progress: Progress, tokenizers: dict[str, str],
                 decode: Callable[[list[int]], str] | None) -> None:
        self.run_id, self.files, self.progress = run_id, files, progress
        self.tokenizers = tokenizers  # pool -> the tokenizer its records name
        self.decode = decode  # the target's tokenizer: the text of answers that come without it

    def record(self, pool: Pool, point: Point | None, session, turn: int, ids: list[int], max_new: int, key: str,
               t_start: float, sent: Sent, h: str | None = None, t_planned: float | None = None) -> dict:
        """The record of one request of `session`'s turn (`point`: None for a reference), from what it came to."""
        gen = sent.gen
        if gen is not None and not gen.output_text and gen.output_ids and self.decode is not None:
            try:
                gen = dataclasses.replace(gen, output_text=self.decode(gen.output_ids))
            except ValueError:  # an id outside the tokenizer's vocabulary: the record keeps no text
                pass
        replica = sent.replica
        return build_record(
            run_id=self.run_id, key=key, role=pool.role, pool=pool.name, engine=pool.engine_record(replica),
            concurrency=point.concurrency if point else None, replica_id=replica.replica_id if replica else "",
            node_id=replica.node_id if replica else None, session=session, turn=turn, input_ids=ids,
            input_hash=h or input_hash(ids), max_new_tokens=max_new, gen=gen, t_start=t_start,
            retries=sent.retries, error=sent.error, tokenizer=self.tokenizers.get(pool.name, "byte"),
            t_planned=t_planned, request_rate=point.rate if point else None,
            arrival=point.arrival if point else None)

    def candidate(self, pool: Pool, rec: dict) -> None:
        """Write a candidate record to its pool's journal."""
        self.files.write(candidate_file(pool.name), rec)
        self.progress.candidate(rec)

    def reference(self, rec: dict) -> None:
        """Write a reference record."""
        self.files.write(REFERENCE_FILE, rec)
        self.progress.reference(rec)

    def warmup(self, rec: dict) -> None:
        """Write a warmup request's record (role "warmup": no reference, no verdict)."""
        rec["role"] = "warmup"
        self.files.write(WARMUP_FILE, rec)
