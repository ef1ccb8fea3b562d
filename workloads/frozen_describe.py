"""The frozen suite's coverage table (`python -m workloads.frozen --describe`)."""

from __future__ import annotations

from collections import Counter

from protocol.boundaries import FLA_CHUNK_SIZE, prefill_track_position
from workloads.schema import Session
from workloads.tree import GROUP as TREE_GROUP
from workloads.tree import describe_tree

GROUPS = ("offset", "multi", "control", "shared", TREE_GROUP)  # in the order the table lists them


def _fmt_counts(counter: Counter) -> str:
    return " ".join(f"{key}:{counter[key]}" for key in sorted(counter))


def describe(sessions: list[Session]) -> str:
    """The coverage table: per interval, offsets, boundaries spanned, controls; then totals."""
    lines = []
    for interval in sorted({s.interval for s in sessions if s.interval is not None}):
        mine = [s for s in sessions if s.interval == interval]
        groups = Counter(s.group for s in mine)
        lines.append(f"interval {interval}: {len(mine)} sessions ("
                     + ", ".join(f"{g} {groups[g]}" for g in GROUPS if groups[g]) + ")")
        lines.append(f"  {'offset':>6}  {'count':>5}  {'turn-0 lengths':<16}  max_new_tokens")
        offsets = [s for s in mine if s.group == "offset"]
        for off in sorted({s.meta["boundary_offset"] for s in offsets}):
            at = [s for s in offsets if s.meta["boundary_offset"] == off]
            lens = ", ".join(str(s.prompt_len) for s in at)
            news = ", ".join(str(s.turns[0].max_new_tokens) for s in at)
            lines.append(f"  {off:>+6}  {len(at):>5}  {lens:<16}  {news}")
        for group in ("offset", "multi"):
            spans = Counter(s.meta["boundaries_spanned"] for s in mine if s.group == group)
            lines.append(f"  boundaries spanned by turn 0 ({group}): {_fmt_counts(spans)}")
        # where a cold turn 0 (one extend) is checkpointed on the built-in engine / SGLang: the 64-token grid
        ckpt = Counter(prefill_track_position(0, s.prompt_len, FLA_CHUNK_SIZE) for s in mine)
        off_grid = sum(v for k, v in ckpt.items() if k and k % interval)
        at = _fmt_counts(Counter({k: v for k, v in ckpt.items() if k}))
        lines.append(f"  turn-0 prefill checkpoints (deepest 64-aligned position): {at}; {off_grid} not a multiple "
                     f"of I; none (prompt < 64): {ckpt[None]}")
        multi = [s for s in mine if s.group == "multi"]
        lines.append("  multi: " + ", ".join(f"{s.session_id.rsplit('-', 1)[1]} len {s.prompt_len} "
                                             f"spans {s.meta['boundaries_spanned']}" for s in multi))
        controls = [s for s in mine if s.group == "control"]
        if controls:
            ends = max(s.max_total_tokens() for s in controls)
            lines.append(f"  control: {len(controls)} sessions, prompts "
                         f"{', '.join(str(s.prompt_len) for s in controls)}; longest session ends at {ends}, "
                         f"more than a block below boundary {interval}")
        shared = [s for s in mine if s.group == "shared"]
        if shared:
            lines.append(f"  shared: {len(shared)} sessions sharing prefixes of the stem (in run order)")
            lines.append(f"    {'session':<8}  {'shared':>6}  {'prompt':>6}  {'max_new':>7}  prefix ends at")
            for s in shared:
                lines.append(f"    {s.session_id.rsplit('-', 1)[1]:<8}  {s.meta['shared_prefix_len']:>6}  "
                             f"{s.prompt_len:>6}  {s.turns[0].max_new_tokens:>7}  {s.meta['prefix_ends']}")
        tree = [s for s in mine if s.group == TREE_GROUP]
        if tree:
            lines += describe_tree(tree)
    requests = sum(len(s.turns) for s in sessions)
    per = ", ".join(f"{c} at I={i}" for i, c in sorted(Counter(s.interval for s in sessions).items()))
    lines.append(f"total: {len(sessions)} sessions ({per}), {requests} requests, "
                 f"longest turn-0 prompt {max(s.prompt_len for s in sessions)} tokens, "
                 f"longest session {max(s.max_total_tokens() for s in sessions)} tokens")
    return "\n".join(lines)
