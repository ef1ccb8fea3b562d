"""Processing a step's result on the host (SGLang's scheduler_output_processor_mixin).

Under overlap scheduling this runs one step late: the next step has already
been planned and run when these tokens are appended, the checkpoint boundaries
recorded (`_mamba_prefix_cache_update`: flip the ping-pong index, set
`last_track_seqlen`), prefixes cached (`cache_unfinished_req` after a prefill
that does not finish the request) and finished requests released.
"""

from __future__ import annotations

from engine.faults import PINGPONG_DOUBLE_FLIP, active
from engine.io_struct import GenerateOutput
from engine.req import Req
from engine.sampling import logprob_info
from engine.schedule_batch import BatchResult, ReqResult, ScheduleBatch
from protocol.boundaries import crossed_boundary


class OutputProcessorMixin:
    """Host-side result processing of the Scheduler (it provides cfg, tree, counters, reap)."""

    def process(self, batch: ScheduleBatch, result: BatchResult) -> dict[str, GenerateOutput]:
        """Apply one step's result; returns the outputs it changed, by request id."""
        touched: dict[str, GenerateOutput] = {}
        for chunk, res in result.prefill:
            self.process_batch_result_prefill(chunk.last, res)
            touched[res.req.rid] = res.req.out
        for res in result.decode:
            if self.process_batch_result_decode(res):
                touched[res.req.rid] = res.req.out
        for r in self.reap():
            touched[r.rid] = r.out
        return touched

    def process_batch_result_prefill(self, last_chunk: bool, res: ReqResult) -> None:
        r = res.req
        self._record_prompt_scores(r, res)
        if not last_chunk or r.out.finished:
            return  # an intermediate chunk is cached when its next chunk is planned
        self._emit(r, res)
        if not r.out.finished and r.aborted is None:
            self.tree.cache_unfinished_req(r)  # so others can match it while r decodes

    def process_batch_result_decode(self, res: ReqResult) -> bool:
        """Tokens and checkpoint bookkeeping of one decode/verify row; False if the row is ignored."""
        r = res.req
        if r.out.finished or res.discarded:
            return False  # the overlapped extra step of a request that had already finished
        self._emit(r, res)
        post = res.pre_len + (res.commit_len if self.cfg.speculative else 1)
        self._mamba_prefix_cache_update(r, res.pre_len, post)
        if self.cfg.speculative:
            r.out.spec_verify_ct += 1
            r.out.spec_trace.append((res.pre_len, res.commit_len, res.tracked_step))
            self.counters["verify_steps"] += 1
            self.counters["accepted_tokens"] += res.commit_len - 1  # drafts the target agreed with (no bonus)
        return True

    def _mamba_prefix_cache_update(self, r: Req, pre: int, post: int) -> None:
        """Record a decode/verify checkpoint from the real lengths, whether or not the device copied it."""
        if not self.tracking:
            return
        boundary = crossed_boundary(pre, post, self.interval)
        if boundary is None:
            return
        r.next_track_idx = 1 - r.next_track_idx
        if active(self.cfg, PINGPONG_DOUBLE_FLIP):
            r.next_track_idx = 1 - r.next_track_idx  # flipped again: the copy and the insert now name different slots
            self.state.tainted.add(r.last_track_slot)  # the slot the tree will get was not written for this boundary
        r.last_track_seqlen = boundary

    @staticmethod
    def _record_prompt_scores(r: Req, res: ReqResult) -> None:
        """The prompt tokens this chunk scored, into r's output at their offsets from logprob_start_len."""
        start = r.req.logprob_start_len
        for pos, lp, top in res.prompt_scores:
            r.out.input_logprobs[pos - start] = lp
            if r.out.input_top_logprobs:
                r.out.input_top_logprobs[pos - start] = top

    def _emit(self, r: Req, res: ReqResult) -> None:
        """Append the step's tokens (and log-probs) to r's output; mark it finished if they end it."""
        out = r.out
        want_lp = r.req.return_logprob or r.req.top_logprobs_num
        for i, token in enumerate(res.tokens):
            out.output_ids.append(token)
            if want_lp:
                lp, top = logprob_info(res.logits[i], token, r.req.top_logprobs_num)
                out.output_logprobs.append(lp)
                out.output_top_logprobs.append(top)
        self.counters["generation_tokens"] += len(res.tokens)
        if res.finish is not None:
            out.finish_reason = res.finish
            out.finished = True
