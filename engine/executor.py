"""Executor: runs a ScheduleBatch on the runner (the device side of a step).

It runs the prefill chunks (each extend writing its prefill checkpoint, if it
has one, from the chunked kernel's intermediate state), then the decode batch:
plain decode (checkpoint = a copy of the working state when the new length is a
multiple of the track interval) or a DFlash draft + verify + commit. It
advances each request's device view (`seq_len`, `pending`, `generated`) and
returns a BatchResult for the host to process; it makes no bookkeeping
decisions (the scheduler does, from the real lengths, when it processes the
result).
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.io_struct import GenerateRequest
from engine.sampling import logprob_info, sample
from engine.schedule_batch import BatchResult, PrefillChunk, ReqResult, ScheduleBatch
from engine.spec.dflash import DFlashWorker
from engine.stopping import take_until_finished
from protocol.boundaries import decode_tracks


class Executor:
    def __init__(self, cfg: EngineConfig, runner):
        self.cfg, self.runner = cfg, runner
        self.worker = DFlashWorker(cfg, runner) if cfg.speculative else None

    def run(self, batch: ScheduleBatch) -> BatchResult:
        """Run every forward of the step; the requests' device views advance."""
        result = BatchResult(prefill=[(chunk, self._extend(chunk)) for chunk in batch.prefill])
        if batch.decode:
            if self.worker is not None:
                result.decode = self.worker.run(batch.decode, batch.track_slots)
            else:
                result.decode = self._decode(batch.decode, batch.track_slots)
        return result

    def _extend(self, chunk: PrefillChunk) -> ReqResult:
        r = chunk.req
        first = scored_from(r.req, chunk.start, chunk.end)
        scoring = {} if first is None else {"logits_from": first}
        logits = self.runner.extend(list(r.prompt[chunk.start : chunk.end]), chunk.start, r.pages, r.working_slot,
                                    chunk.track_slot, chunk.track_offset, **scoring)
        prompt_scores = []
        if first is not None:  # rows [first, end): row p scores prompt token p + 1 (the last row: the output)
            k = r.req.top_logprobs_num
            for p in range(first, min(chunk.end, len(r.prompt) - 1)):
                prompt_scores.append((p + 1, *logprob_info(logits[p - first], r.prompt[p + 1], k)))
            logits = logits[-1]
        r.seq_len = chunk.end
        if not chunk.last:
            return ReqResult(r, chunk.start, [], None, prompt_scores=prompt_scores)
        sp = r.req.sampling
        if sp.max_new_tokens == 0:
            r.device_finished = True
            return ReqResult(r, chunk.start, [], None, {"type": "length", "length": 0}, prompt_scores=prompt_scores)
        res = self._sampled(r, chunk.start, logits[None])
        res.prompt_scores = prompt_scores
        return res

    def _decode(self, reqs, track_slots: list[int] | None) -> list[ReqResult]:
        logits = self.runner.decode([r.pending for r in reqs], [r.seq_len for r in reqs], [r.pages for r in reqs],
                                    [r.working_slot for r in reqs])  # [B, V]
        results = []
        tracking = self.cfg.tracking and track_slots is not None
        for b, r in enumerate(reqs):
            pre = r.seq_len
            r.seq_len = pre + 1
            if tracking and decode_tracks(r.seq_len, self.cfg.mamba_track_interval):
                self.runner.copy_state(r.working_slot, track_slots[b])
            results.append(self._sampled(r, pre, logits[b : b + 1]))
        return results

    def _sampled(self, r, pre: int, logits) -> ReqResult:
        """Sample the next token from logits [1, V]; discarded if r had already finished (an overlapped step)."""
        token = sample(logits[0], r.req.sampling, r.generator, r.generated)
        r.pending = token
        if r.device_finished:
            return ReqResult(r, pre, [token], logits, discarded=True)
        _, finish = take_until_finished(r.generated, [token], r.req.sampling)
        r.generated.append(token)
        r.device_finished = finish is not None
        return ReqResult(r, pre, [token], logits, finish)


def scored_from(req: GenerateRequest, start: int, end: int) -> int | None:
    """The first position of the extend [start, end) whose logits score a prompt token the request asks about
    (prompt token p + 1 from position p, for p from its logprob_start_len L on: as in SGLang, token L itself is
    never scored, its position before L being outside what it asked for); None if none does."""
    if not req.scores_prompt:
        return None
    first = max(start, req.logprob_start_len)
    return first if first < min(end, len(req.input_ids) - 1) else None
