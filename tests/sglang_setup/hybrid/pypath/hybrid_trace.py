"""What each DFlash verify step committed and tracked, logged by the patched SGLang (SPECGATE_HYBRID_TRACE=1).

The patch sets call `verify` at the end of `_update_target_mamba_state_after_verify`, once SGLang has computed
the step it tracks into each request's checkpoint buffer (-1: none). One line per request per verify step:

    [specgate-verify] {"input": "3f2a9c01d4e5a6b7", "prompt_len": 200, "pre": 255, "commit": 3, "tracked": 0}

`input` is the request's prompt ids hashed as the harness hashes them (records/rundir.py input_hash: sha256 of
the JSON list, 16 hex digits), so a harness record's verify steps are found by its `input_hash` (the harness
sends no request id). A step with pre >= prompt_len + max_new - 1 produced no output: the overlap scheduler
launched it before the request's end was known. This is ground truth from inside the server, next to the
harness's own inference from positions. Test setup only; standard library and torch tensors only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

PREFIX = "[specgate-verify] "


def input_digest(ids) -> str:
    """The harness's input_hash of a prompt's token ids."""
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:16]


def verify(batch, seq_lens_pre_verify, commit_lens, steps_to_track) -> None:
    """Log each request's verify step (nothing unless SPECGATE_HYBRID_TRACE=1). Never raises into SGLang's verify:
    a failure is logged as `[specgate-verify-error]`, which a reader of the trace can look for."""
    if os.environ.get("SPECGATE_HYBRID_TRACE") != "1":
        return
    try:
        pre = [int(x) for x in seq_lens_pre_verify.tolist()]
        commit = [int(x) for x in commit_lens.tolist()]
        tracked = [-1] * len(commit) if steps_to_track is None else [int(x) for x in steps_to_track.tolist()]
        lines = []
        # commit_lens covers the batch's first len(commit) requests (SGLang slices req_pool_indices the same way)
        for req, p, c, t in zip(batch.reqs, pre, commit, tracked, strict=False):
            ids = req.origin_input_ids
            lines.append(PREFIX + json.dumps({"input": input_digest(ids), "rid": str(req.rid), "prompt_len": len(ids),
                                              "max_new": req.sampling_params.max_new_tokens, "pre": p, "commit": c,
                                              "tracked": t}))
        print("\n".join(lines), file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - observation must not change what it observes
        print(f"[specgate-verify-error] {e!r}", file=sys.stderr, flush=True)
