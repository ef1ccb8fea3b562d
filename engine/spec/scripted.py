"""Scripted drafter: a TEST AID, not a production drafter.

It proposes the target's own greedy continuation for the first `n` draft
positions and a guaranteed-wrong token after that, so tests can force any
commit length 1..B with random weights (whose real drafter accepts almost
nothing). It finds the greedy tokens by running the target in verify mode
(linear states untouched; the KV it writes past the committed length is
overwritten by the real verify), so it costs up to n+1 extra forwards per step.
`scripted_accept = -1` cycles n through 0..B-1 with the verify count.
"""

from __future__ import annotations

from engine.req import Req


def scripted_drafts(runner, r: Req, block_size: int, n_accept: int) -> list[int]:
    """B-1 draft tokens for request r: n_accept correct ones, then wrong ones."""
    if n_accept < 0:
        n_accept = r.verify_steps % block_size
    n_accept = min(n_accept, block_size - 1)
    block = [r.pending]
    for _ in range(n_accept + 1):
        if len(block) == block_size:
            break
        logits = runner.verify([block], [r.seq_len], [r.pages], [r.working_slot])
        greedy = int(logits[0, -1].argmax())
        block.append(greedy if len(block) <= n_accept else (greedy + 1) % 256)
    while len(block) < block_size:
        block.append((block[-1] + 1) % 256)
    return block[1:]
