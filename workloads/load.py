"""The seeded load profile: N requests in single- and multi-turn sessions.

Turn-0 prompts sit at offsets -B-4..+4 around boundaries k*I (k = 1..4) of both
intervals; many start with one of a few shared prefixes, so the radix cache is
exercised across sessions; outputs are 16-256 tokens. Follow-up turns add a short
suffix and a short output. Same seed, same sessions.

    python -m workloads.load --describe [--num-requests N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from statistics import mean

from protocol.boundaries import boundaries_upto
from protocol.tokenizer import BYTE_TOKENIZER, Tokenizer
from workloads.corpus import TextSampler, heldout_documents
from workloads.schema import DEFAULT_BLOCK_SIZE, DEFAULT_INTERVALS, MAX_TURN0_TOKENS, Session, Turn

SUITE = "load"
DEFAULT_NUM_REQUESTS = 1024
TURN_WEIGHTS = {1: 40, 2: 25, 3: 20, 4: 15}  # turns per session -> relative weight
MAX_K = 4  # prompts around boundaries 1..4
OFFSET_MARGIN = 4  # offsets -B-4 .. +4
OFFSET_ABOVE = OFFSET_MARGIN
PREFIX_TARGET_LENS = (90, 150, 220, 300)  # shared prefixes, each cut at a line end within
PREFIX_SHARE = 0.6  # chance that a session starts with a shared prefix
MIN_BODY_TOKENS = 16  # a prompt has at least this much of its own text after a prefix
TURN0_MAX_NEW = (16, 256)
SUFFIX_TOKENS = (8, 32)
FOLLOWUP_MAX_NEW = (16, 64)


def shared_prefixes() -> list[str]:
    """The fixed system prefixes: heads of held-out files (from the middle of the corpus on), each
    cut at a line end within its target length and no shorter than 80% of it."""
    docs = heldout_documents()
    out = []
    j = len(docs) // 2
    for target in PREFIX_TARGET_LENS:
        for _ in range(len(docs)):
            text = docs[j % len(docs)].text
            j += 1
            head = text[: text.rfind("\n", 0, target) + 1]
            if len(head) >= 0.8 * target:
                out.append(head)
                break
        else:
            raise ValueError(f"no held-out file has a head of about {target} characters")
    return out


class _LoadBuilder:
    """Draws sessions from one seeded random stream."""

    def __init__(self, seed: int, intervals: tuple[int, ...], block_size: int, tokenizer: Tokenizer) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.intervals = intervals
        self.offset_below = block_size + OFFSET_MARGIN
        self.tokenizer = tokenizer
        self.sampler = TextSampler(heldout_documents())
        self.prefixes = [tuple(tokenizer.encode(p)) for p in shared_prefixes()]
        self.newline = tuple(tokenizer.encode("\n"))

    def _prompt(self, length: int) -> tuple[tuple[int, ...], int | None]:
        """Prompt ids, exactly `length` tokens, maybe after a shared prefix (its index)."""
        rng = self.rng
        prefix_index = None
        if rng.random() < PREFIX_SHARE:
            fits = [i for i, p in enumerate(self.prefixes) if len(p) + MIN_BODY_TOKENS <= length]
            if fits:
                prefix_index = fits[rng.randrange(len(fits))]
        prefix = () if prefix_index is None else self.prefixes[prefix_index]
        return prefix + tuple(self.sampler.sample_tokens(rng, self.tokenizer, length - len(prefix))), prefix_index

    def session(self, index: int, num_turns: int) -> Session:
        rng = self.rng
        interval = self.intervals[rng.randrange(len(self.intervals))]
        max_k = min(MAX_K, (MAX_TURN0_TOKENS - OFFSET_ABOVE) // interval)
        k = rng.randint(1, max_k)
        offset = rng.randint(-self.offset_below, OFFSET_ABOVE)
        prompt_len = k * interval + offset
        ids, prefix_index = self._prompt(prompt_len)
        assert len(ids) == prompt_len
        max_new = rng.randint(*TURN0_MAX_NEW)
        decode = self.tokenizer.decode
        turns = [Turn(max_new_tokens=max_new, input_ids=ids, text=decode(ids))]
        for _ in range(num_turns - 1):
            n = rng.randint(*SUFFIX_TOKENS) - len(self.newline)
            suffix = self.newline + tuple(self.sampler.sample_tokens(rng, self.tokenizer, n))
            turns.append(Turn(max_new_tokens=rng.randint(*FOLLOWUP_MAX_NEW), suffix_ids=suffix,
                              suffix_text=decode(suffix)))
        prefix_name = None if prefix_index is None else f"prefix{prefix_index}"
        targets = (f"{num_turns}-turn session; prompt of {prompt_len} tokens, {offset:+d} from boundary "
                   f"{k * interval} (I={interval})"
                   + (f", starting with shared {prefix_name}." if prefix_name else "."))
        meta = {
            "boundary_offset": offset,
            "k": k,
            "boundary": k * interval,
            "turn0_len": prompt_len,
            "prompt_boundaries": boundaries_upto(prompt_len, interval),
            "boundaries_spanned": boundaries_upto(prompt_len + max_new, interval),
            "prefix": prefix_name,
            "prefix_len": len(self.prefixes[prefix_index]) if prefix_index is not None else 0,
            "num_turns": num_turns,
            "seed": self.seed,
        }
        return Session(f"load-s{self.seed}-{index:04d}", SUITE, interval, "load", targets, meta, tuple(turns))


def generate_load(num_requests: int = DEFAULT_NUM_REQUESTS, seed: int = 0,
                  intervals: tuple[int, ...] = DEFAULT_INTERVALS, block_size: int = DEFAULT_BLOCK_SIZE,
                  tokenizer: Tokenizer = BYTE_TOKENIZER) -> list[Session]:
    """Sessions whose turns add up to exactly `num_requests` requests; same seed, same sessions.

    Prompts sit at offsets -B-4..+4 around multiples of `intervals` (B = `block_size`), exact token lengths in
    `tokenizer`."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    intervals = tuple(intervals)
    if not intervals or any(i <= 0 or i + OFFSET_ABOVE > MAX_TURN0_TOKENS for i in intervals):
        top = MAX_TURN0_TOKENS - OFFSET_ABOVE
        raise ValueError(f"intervals must be positive and at most {top}: {intervals}")
    builder = _LoadBuilder(seed, intervals, block_size, tokenizer)
    counts, weights = list(TURN_WEIGHTS), list(TURN_WEIGHTS.values())
    sessions: list[Session] = []
    remaining = num_requests
    while remaining:
        num_turns = min(builder.rng.choices(counts, weights)[0], remaining)
        sessions.append(builder.session(len(sessions), num_turns))
        remaining -= num_turns
    return sessions


def _span(values: list[int]) -> str:
    return f"{min(values)}..{max(values)} (mean {mean(values):.0f})" if values else "-"


def describe(sessions: list[Session]) -> str:
    """A summary table of a load profile."""
    requests = sum(len(s.turns) for s in sessions)
    seeds = sorted({s.meta.get("seed") for s in sessions}, key=str)
    lines = [f"load profile: seed {', '.join(map(str, seeds))}, {requests} requests "
             f"in {len(sessions)} sessions"]
    turns = Counter(len(s.turns) for s in sessions)
    lines.append("  turns per session: " + ", ".join(f"{t}: {turns[t]}" for t in sorted(turns)))
    for interval in sorted({s.interval for s in sessions}):
        mine = [s for s in sessions if s.interval == interval]
        ks = Counter(s.meta["k"] for s in mine)
        offs = Counter(s.meta["boundary_offset"] for s in mine)
        spans = Counter(s.meta["boundaries_spanned"] for s in mine)
        lines.append(f"  interval {interval}: {len(mine)} sessions")
        lines.append("    boundary k: " + ", ".join(f"{k}: {ks[k]}" for k in sorted(ks)))
        lines.append("    offsets: " + ", ".join(f"{o:+d}: {offs[o]}" for o in sorted(offs)))
        lines.append("    boundaries spanned by turn 0: "
                     + ", ".join(f"{b}: {spans[b]}" for b in sorted(spans)))
    prefixes = Counter(s.meta["prefix"] for s in sessions)
    lens = {s.meta["prefix"]: s.meta["prefix_len"] for s in sessions if s.meta["prefix"]}
    lines.append("  shared prefixes: " + ", ".join(f"{p} ({lens[p]} tokens): {prefixes[p]} sessions"
                                                   for p in sorted(lens)) + f"; none: {prefixes[None]}")
    follow = [t for s in sessions for t in s.turns[1:]]
    lines.append(f"  turn-0 prompt tokens: {_span([s.prompt_len for s in sessions])}")
    lines.append(f"  turn-0 max_new_tokens: {_span([s.turns[0].max_new_tokens for s in sessions])}")
    lines.append(f"  follow-up suffix tokens: {_span([len(t.suffix_ids or ()) for t in follow])}")
    lines.append(f"  follow-up max_new_tokens: {_span([t.max_new_tokens for t in follow])}")
    lines.append(f"  session tokens at most: {_span([s.max_total_tokens() for s in sessions])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: --describe prints the summary of a generated profile."""
    ap = argparse.ArgumentParser(prog="python -m workloads.load", description=__doc__.splitlines()[0])
    ap.add_argument("--describe", action="store_true", required=True, help="print a summary table")
    ap.add_argument("--num-requests", type=int, default=DEFAULT_NUM_REQUESTS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(describe(generate_load(args.num_requests, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
