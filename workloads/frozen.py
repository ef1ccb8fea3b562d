"""The frozen boundary suite: 72 sessions, 36 per track interval (128, 256).

Per interval: turn-0 prompts at every offset -B..+1 around boundaries k*I
(k = 1 and 2, different text), four prompts whose turn 0 spans 2-4 boundaries,
four controls that never reach a boundary, and a shared-prefix group (a stem and
five sessions whose prompts share a prefix of it ending at a checkpoint boundary,
a page boundary, mid-page and below the first boundary), so the radix tree splits
edges and matches stop at nodes with and without checkpoints. Turn 0 decodes past
the next boundary (plus a margin); turn 1 appends a fixed suffix to turn 0's input
and output, so it hits the radix entry that turn 0's tracked checkpoint created.
Those 68 sessions have two turns; the `tree` group (workloads/tree.py) adds two
sessions per interval whose later turns branch off their own history, so requests
match into split nodes and siblings' checkpoints at every concurrency.

    python -m workloads.frozen --write      # regenerate workloads/data/frozen.jsonl
    python -m workloads.frozen --check      # exit 1 if the committed file and the generator differ
    python -m workloads.frozen --describe   # coverage table

Another target's suite, cut in its tokenizer (`--tokenizer`: a tokenizer.json or a model directory), for its
intervals and block size: `--write --file F --tokenizer MODEL [--intervals 128,256 --block-size 8]`; `--check`
and `--describe` of that file take the same flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from protocol.boundaries import boundaries_upto, next_boundary
from protocol.tokenizer import BYTE_TOKENIZER, Tokenizer
from workloads.corpus import DATA_DIR, TextCursor, heldout_documents
from workloads.frozen_describe import describe
from workloads.schema import DEFAULT_BLOCK_SIZE, DEFAULT_INTERVALS, Session, Turn, dumps_jsonl
from workloads.tree import tree_sessions
from workloads.validate import validate_file

FROZEN_PATH = DATA_DIR / "frozen.jsonl"
SUITE = "frozen"
OFFSET_KS = (1, 2)  # each offset is placed at these boundary indices, with different text
DECODE_MARGIN = 16  # turn 0 decodes this many tokens past the next boundary
TURN1_SUFFIX = "\n\n# continued\n"
TURN1_MAX_NEW_TOKENS = 32
# (k, offset): turn-0 prompt k*I + offset; with decoding, turn 0 spans 2, 3, 4 and 3 boundaries
MULTI_CASES = ((2, -3), (3, -5), (4, -2), (2, 3))
NUM_CONTROLS = 4
PAGE = 16  # the built-in engine's default KV page size: radix edges split at multiples of it
STEM_SHORT = 8  # the stem prompt ends this far below boundary 2I, so its turn 0 crosses 2I in a verify step
# Shared-prefix group, in run order (at concurrency 1 each session sees the tree its predecessors left):
# (name, shared prefix length(I), where the prefix ends, prompt length(I), turn-0 max_new_tokens(I) or None for
# "decode past the next boundary")
SHARED_CASES = (
    ("ckpt", lambda i: i, "a checkpoint boundary (I)", lambda i: i + 40, lambda i: 24),
    ("page", lambda i: i + PAGE, "a page boundary past I, no checkpoint", lambda i: i + 56, None),
    ("mid", lambda i: i + 2 * PAGE + 5, "mid-page, mid-edge", lambda i: i + 60, None),
    ("low", lambda i: i - PAGE - 8, "mid-page below the first boundary", lambda i: i + 8, lambda i: 24),
    ("deep", lambda i: 2 * i - STEM_SHORT, "the stem's whole prompt", lambda i: 2 * i + 20, lambda i: 24),
)


def _offset_id(offset: int) -> str:
    return f"m{-offset}" if offset < 0 else f"p{offset}"


def _turn0_max_new(prompt_len: int, interval: int) -> int:
    """New tokens that carry decoding past the next boundary above the prompt, plus the margin."""
    max_new = next_boundary(prompt_len, interval) - prompt_len + DECODE_MARGIN
    assert max_new <= interval + DECODE_MARGIN, (prompt_len, interval, max_new)
    return max_new


def _where(offset: int, boundary: int) -> str:
    if offset < 0:
        return f"ends {-offset} tokens before boundary {boundary}"
    if offset == 0:
        return f"ends exactly on boundary {boundary}"
    return f"ends {offset} token{'s' if offset > 1 else ''} past boundary {boundary}"


class _Builder:
    """Turns (interval, prompt length, max_new) into sessions, cutting fresh text for each prompt to exactly
    that many tokens of the target's tokenizer (the seed picks the document the text starts in)."""

    def __init__(self, block_size: int, tokenizer: Tokenizer, seed: int = 0) -> None:
        self.cursor = TextCursor(heldout_documents(), first_doc=seed)
        self.block_size = block_size
        self.tokenizer = tokenizer
        self.suffix_ids = tuple(tokenizer.encode(TURN1_SUFFIX))

    def take(self, n: int) -> list[int]:
        return self.cursor.take_tokens(self.tokenizer, n)

    def session(self, session_id: str, interval: int, group: str, targets: str, prompt_len: int,
                max_new: int, meta: dict, ids: list[int] | None = None) -> Session:
        ids = tuple(self.take(prompt_len) if ids is None else ids)
        assert len(ids) == prompt_len
        turns = (
            Turn(max_new_tokens=max_new, input_ids=ids, text=self.tokenizer.decode(ids)),
            Turn(max_new_tokens=TURN1_MAX_NEW_TOKENS, suffix_ids=self.suffix_ids, suffix_text=TURN1_SUFFIX),
        )
        meta = {
            **meta,
            "turn0_len": prompt_len,
            "prompt_boundaries": boundaries_upto(prompt_len, interval),
            "boundaries_spanned": boundaries_upto(prompt_len + max_new, interval),
            "block_size": self.block_size,
        }
        return Session(session_id, SUITE, interval, group, targets, meta, turns)


def _offset_sessions(b: _Builder, interval: int) -> list[Session]:
    out = []
    for k in OFFSET_KS:
        for offset in range(-b.block_size, 2):
            boundary = k * interval
            prompt_len = boundary + offset
            max_new = _turn0_max_new(prompt_len, interval)
            nb = next_boundary(prompt_len, interval)
            targets = (f"Prompt of {prompt_len} tokens {_where(offset, boundary)} (I={interval}); decoding "
                       f"crosses boundary {nb} in a verify step and turn 1 restores its checkpoint.")
            meta = {"boundary_offset": offset, "k": k, "boundary": boundary, "next_boundary": nb}
            sid = f"frozen-i{interval}-k{k}-{_offset_id(offset)}"
            out.append(b.session(sid, interval, "offset", targets, prompt_len, max_new, meta))
    return out


def _multi_sessions(b: _Builder, interval: int) -> list[Session]:
    out = []
    for n, (k, offset) in enumerate(MULTI_CASES, start=1):
        prompt_len = k * interval + offset
        max_new = _turn0_max_new(prompt_len, interval)
        nb = next_boundary(prompt_len, interval)
        spanned = boundaries_upto(prompt_len + max_new, interval)
        targets = (f"Prompt of {prompt_len} tokens {_where(offset, k * interval)} (I={interval}); turn 0 "
                   f"spans {spanned} boundaries up to {nb} and turn 1 restores the deepest checkpoint.")
        meta = {"boundary_offset": offset, "k": k, "boundary": k * interval, "next_boundary": nb}
        out.append(b.session(f"frozen-i{interval}-multi{n}", interval, "multi", targets, prompt_len, max_new,
                             meta))
    return out


def _control_sessions(b: _Builder, interval: int) -> list[Session]:
    # The whole session (prompt, turn-0 output, suffix, turn-1 output) ends below the first boundary,
    # with a block to spare so not even a full verify block past the last token reaches it.
    room = interval - 1 - b.block_size - len(b.suffix_ids) - TURN1_MAX_NEW_TOKENS
    max_new = room // 4
    longest = room - max_new
    if longest < NUM_CONTROLS:
        raise ValueError(f"interval {interval} leaves no room for a control session")
    out = []
    for n in range(1, NUM_CONTROLS + 1):
        prompt_len = longest * n // NUM_CONTROLS
        end = prompt_len + max_new + len(b.suffix_ids) + TURN1_MAX_NEW_TOKENS
        targets = (f"Control: prompt of {prompt_len} tokens, both turns end by token {end}, below the "
                   f"first boundary {interval}; no checkpoint is tracked, so a hard mismatch is a "
                   "false alarm.")
        meta = {"boundary_offset": None, "k": 0, "boundary": None, "next_boundary": interval}
        out.append(b.session(f"frozen-i{interval}-ctrl{n}", interval, "control", targets, prompt_len, max_new,
                             meta))
    return out


def _shared_sessions(b: _Builder, interval: int) -> list[Session]:
    # The stem's turn 0 inserts [0, 2I) with a checkpoint at 2I; each later session shares a prefix of the
    # stem's prompt, so its match (or its insertion) stops inside that edge, where no checkpoint is.
    stem_len = 2 * interval - STEM_SHORT
    stem = b.take(stem_len)
    stem_id = f"frozen-i{interval}-shared-stem"
    out = [b.session(stem_id, interval, "shared",
                     f"Shared-prefix stem: prompt of {stem_len} tokens; turn 0 crosses {2 * interval} in a verify "
                     "step and inserts the edge the other sessions of the group share a prefix of.",
                     stem_len, _turn0_max_new(stem_len, interval),
                     {"shared_prefix_len": stem_len, "prefix_ends": "stem", "stem": stem_id,
                      "next_boundary": 2 * interval}, ids=stem)]
    for name, shared, where, prompt, max_new in SHARED_CASES:
        length, prompt_len = shared(interval), prompt(interval)
        new = max_new(interval) if max_new else _turn0_max_new(prompt_len, interval)
        rest = b.take(prompt_len - length)
        while length < stem_len and rest[0] == stem[length]:  # the shared prefix must end exactly there
            rest = b.take(prompt_len - length)
        targets = (f"Prompt of {prompt_len} tokens sharing the stem's first {length} tokens (ending at {where}); "
                   "its match stops inside the stem's edge and its insertion splits it there.")
        meta = {"shared_prefix_len": length, "prefix_ends": where, "stem": stem_id,
                "next_boundary": next_boundary(prompt_len, interval)}
        out.append(b.session(f"frozen-i{interval}-shared-{name}", interval, "shared", targets, prompt_len, new,
                             meta, ids=stem[:length] + rest))
    return out


def generate_frozen(intervals: tuple[int, ...] = DEFAULT_INTERVALS, block_size: int = DEFAULT_BLOCK_SIZE,
                    tokenizer: Tokenizer = BYTE_TOKENIZER, seed: int = 0,
                    max_context: int | None = None) -> list[Session]:
    """The frozen suite, deterministically: offset cases (-B..+1), multi-boundary cases, controls per interval,
    then the shared-prefix group of every interval, then the tree group of every interval (each group after
    the others, so the cases before it keep their text).

    Prompts are exact token lengths in `tokenizer`; `seed` picks where the text starts (0: the committed
    suite's text); sessions that could outgrow `max_context` tokens are left out.
    """
    b = _Builder(block_size, tokenizer, seed)
    sessions: list[Session] = []
    for interval in intervals:
        sessions += _offset_sessions(b, interval)
        sessions += _multi_sessions(b, interval)
        sessions += _control_sessions(b, interval)
    for interval in intervals:
        sessions += _shared_sessions(b, interval)
    for interval in intervals:
        sessions += tree_sessions(b.take, tokenizer, interval, block_size)
    return [s for s in sessions if max_context is None or s.max_total_tokens() <= max_context]


def check_file(path: Path, **target) -> str | None:
    """None when `path` holds exactly what the generator writes (for `target`: generate_frozen's keywords), else
    what differs."""
    sessions = generate_frozen(**target)
    expected = dumps_jsonl(sessions)
    try:
        actual = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"{path}: cannot read: {e}"
    if actual == expected:
        return None
    exp_lines, act_lines = expected.splitlines(), actual.splitlines()
    for i, (e, a) in enumerate(zip(exp_lines, act_lines, strict=False), start=1):
        if e != a:
            return f"{path}:{i}: differs from the generator (session {sessions[i - 1].session_id})"
    return f"{path}: {len(act_lines)} lines, the generator writes {len(exp_lines)}"


def _target(args: argparse.Namespace) -> dict:
    """generate_frozen's keywords from the CLI (the committed suite's own when no flag is given)."""
    from protocol.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else BYTE_TOKENIZER
    intervals = tuple(int(i) for i in args.intervals.split(","))
    return {"intervals": intervals, "block_size": args.block_size, "tokenizer": tokenizer,
            "max_context": args.max_context}


def main(argv: list[str] | None = None) -> int:
    """CLI: --write, --check, --describe (on --file, default the committed suite; --tokenizer for another
    target's)."""
    ap = argparse.ArgumentParser(prog="python -m workloads.frozen", description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=FROZEN_PATH, help="the JSONL file (default: %(default)s)")
    ap.add_argument("--tokenizer", help="the target's tokenizer: a tokenizer.json or a model directory (default: "
                    "the built-in byte tokenizer)")
    ap.add_argument("--intervals", default=",".join(map(str, DEFAULT_INTERVALS)), help="track intervals")
    ap.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="DFlash block size B")
    ap.add_argument("--max-context", type=int, default=None, help="leave out sessions that could outgrow it")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the file")
    mode.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generator")
    mode.add_argument("--describe", action="store_true", help="print the coverage table")
    args = ap.parse_args(argv)
    target = _target(args)
    if args.write:
        sessions = generate_frozen(**target)
        args.file.write_text(dumps_jsonl(sessions), encoding="utf-8")
        print(f"wrote {len(sessions)} sessions to {args.file}")
        return 0
    if args.check:
        problem = check_file(args.file, **target)
        if problem:
            print(f"{problem}; run `python -m workloads.frozen --write` (with the same flags) if the generator "
                  "change is intended", file=sys.stderr)
            return 1
        print(f"{args.file}: matches the generator")
        return 0
    print(describe(validate_file(args.file, tokenizer=target["tokenizer"], max_context=args.max_context)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
