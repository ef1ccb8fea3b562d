"""What each DFlash verify step committed and tracked, logged by the patched SGLang (SPECGATE_HYBRID_TRACE=1).

The patch sets call `verify` at the end of `_update_target_mamba_state_after_verify`, once SGLang has computed
the step it tracks into each request's checkpoint buffer (-1: none). One line per request per verify step:

    [specgate-verify] {"input": "3f2a9c01d4e5", "prompt_len": 200, "pre": 255, "commit": 3, "tracked": 0}

`input` is `input_digest` of the request's prompt ids, so a test can find a harness record's verify steps without
a request id (the harness sends none). This is ground truth from inside the server, next to the harness's own
inference from positions. Test setup only; standard library and torch tensors only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

PREFIX = "[specgate-verify] "


def input_digest(ids) -> str:
    """12 hex digits naming a prompt's token ids."""
    return hashlib.sha1(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:12]


def verify(batch, seq_lens_pre_verify, commit_lens, steps_to_track) -> None:
    """Log each request's verify step (nothing unless SPECGATE_HYBRID_TRACE=1)."""
    if os.environ.get("SPECGATE_HYBRID_TRACE") != "1":
        return
    pre = [int(x) for x in seq_lens_pre_verify.tolist()]
    commit = [int(x) for x in commit_lens.tolist()]
    tracked = [-1] * len(pre) if steps_to_track is None else [int(x) for x in steps_to_track.tolist()]
    lines = []
    for req, p, c, t in zip(batch.reqs, pre, commit, tracked, strict=True):
        ids = req.origin_input_ids
        lines.append(PREFIX + json.dumps({"input": input_digest(ids), "prompt_len": len(ids), "pre": p,
                                          "commit": c, "tracked": t}))
    print("\n".join(lines), file=sys.stderr, flush=True)


def read(log_text: str) -> list[dict]:
    """The verify lines of a server log, in order."""
    return [json.loads(line[line.index(PREFIX) + len(PREFIX):]) for line in log_text.splitlines()
            if PREFIX in line]
