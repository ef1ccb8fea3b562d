"""The cover suite: one two-turn session per (verify step holding the boundary, commit length) cell.

Meant for the built-in engine's scripted drafter with `--scripted-accept -1` (what
`harness.run --cover` sets): verify step v of a request then commits (v mod B) + 1
tokens, so the step v = c - 1 that commits c tokens starts at pre = P + c(c-1)/2
(prefill leaves the sequence at the prompt length P). Choosing P = I - 1 - s - c(c-1)/2
puts boundary I at step s of that verify block (DESIGN.md section 1), and no earlier
step reaches it. Turn 0 decodes past the boundary; turn 1 appends a suffix and
restores the checkpoint that verify step saved (or should have saved). B(B+1)/2
cells per interval: 36 at B = 8.

    python -m workloads.cover --describe [--intervals 128,256] [--block-size 8]
"""

from __future__ import annotations

import argparse

from protocol.boundaries import boundary_step
from protocol.tokenizer import BYTE_TOKENIZER
from workloads.corpus import TextCursor, heldout_documents
from workloads.schema import DEFAULT_BLOCK_SIZE, DEFAULT_INTERVALS, Session, Turn, WorkloadError

SUITE = "cover"
DECODE_MARGIN = 16  # turn 0 decodes this many tokens past the boundary
TURN1_SUFFIX = "\n\n# covered\n"
TURN1_MAX_NEW_TOKENS = 16


def cover_cells(block_size: int) -> list[tuple[int, int]]:
    """(step, commit_len) with 0 <= step < commit_len <= block_size, by commit length then step."""
    return [(s, c) for c in range(1, block_size + 1) for s in range(c)]


def cover_prompt_len(interval: int, step: int, commit_len: int) -> int:
    """The turn-0 prompt length whose verify step `commit_len - 1` holds boundary `interval` at `step`."""
    pre = interval - 1 - step  # boundary_step(pre, interval) == step
    return pre - commit_len * (commit_len - 1) // 2


def generate_cover(intervals: tuple[int, ...] = DEFAULT_INTERVALS,
                   block_size: int = DEFAULT_BLOCK_SIZE) -> list[Session]:
    """Every cell at every interval, deterministically (held-out text, fresh for each prompt)."""
    smallest = block_size * (block_size + 1) // 2 + 1
    for interval in intervals:
        if interval < smallest:
            raise WorkloadError(f"interval {interval} is too small for the cover suite at block size {block_size}: "
                                f"the prompts of the longest commits need an interval >= {smallest}")
    cursor = TextCursor(heldout_documents())
    suffix = tuple(BYTE_TOKENIZER.encode(TURN1_SUFFIX))
    sessions = []
    for interval in intervals:
        for step, commit in cover_cells(block_size):
            prompt_len = cover_prompt_len(interval, step, commit)
            pre = prompt_len + commit * (commit - 1) // 2
            assert boundary_step(pre, interval) == step and step < commit
            text = cursor.take(prompt_len)
            ids = tuple(BYTE_TOKENIZER.encode(text))
            turns = (Turn(max_new_tokens=interval - prompt_len + DECODE_MARGIN, input_ids=ids, text=text),
                     Turn(max_new_tokens=TURN1_MAX_NEW_TOKENS, suffix_ids=suffix, suffix_text=TURN1_SUFFIX))
            targets = (f"Prompt of {prompt_len} tokens: with the scripted drafter cycling commit lengths, verify "
                       f"step {commit - 1} (commit {commit}, from {pre}) holds boundary {interval} at step {step}; "
                       "turn 1 restores its checkpoint.")
            meta = {"step": step, "commit_len": commit, "boundary": interval, "verify_pre_len": pre,
                    "turn0_len": prompt_len, "block_size": block_size}
            sessions.append(Session(f"cover-i{interval}-s{step}-c{commit}", SUITE, interval, "cover", targets, meta,
                                    turns))
    return sessions


def describe(sessions: list[Session]) -> str:
    """Per interval: cells, prompt lengths, max_new_tokens."""
    lines = []
    for interval in sorted({s.interval for s in sessions}):
        mine = [s for s in sessions if s.interval == interval]
        lens = [s.prompt_len for s in mine]
        lines.append(f"interval {interval}: {len(mine)} cells (step, commit length), turn-0 prompts "
                     f"{min(lens)}..{max(lens)} tokens, turn 0 decodes to {interval + DECODE_MARGIN}, "
                     f"turn 1 +{TURN1_MAX_NEW_TOKENS}")
    lines.append(f"total: {len(sessions)} sessions, {sum(len(s.turns) for s in sessions)} requests per sweep point")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: --describe."""
    ap = argparse.ArgumentParser(prog="python -m workloads.cover", description=__doc__.splitlines()[0])
    ap.add_argument("--describe", action="store_true", required=True, help="print the cells and prompt lengths")
    ap.add_argument("--intervals", default=",".join(map(str, DEFAULT_INTERVALS)), help="comma-separated")
    ap.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    args = ap.parse_args(argv)
    intervals = tuple(int(i) for i in args.intervals.split(","))
    try:
        print(describe(generate_cover(intervals, args.block_size)))
    except WorkloadError as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
