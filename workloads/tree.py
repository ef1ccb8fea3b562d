"""The frozen suite's `tree` group: sessions whose turns fan out from shared prefixes, so that later requests
match into the radix-tree shapes a prefix cache builds (docs/reports.md, "Tree shapes").

Per interval I, two sessions whose shapes hold at every concurrency, because each shape is made by the
session's own earlier turns (turns of a session run one after another) or by a prefill checkpoint its
sibling inserts at once:

* `fan`: turn 0, a prompt of I - 8 tokens, decodes past I (a verify step crosses it); turn 1 continues the
  history with 48 tokens of text and restores that checkpoint (`checkpoint`); turn 2 branches off turn 1's
  history at I + 37, mid-page and on no checkpoint position, so its match goes past checkpoint I into the
  edge turn 1 inserted and falls back to I (`deeper`), and its insertion splits that edge at the page
  below I + 37; turn 3 branches there again, so its match ends at the node that split created, which has
  no checkpoint of its own, and falls back to I (`split`).
* `sib`: turn 0 shares `fan`'s first 40 tokens (it splits `fan`'s first edge); turn 1 branches off it at
  40 and continues with `fan`'s prompt up to `fan`'s prefill checkpoint (the 64-token grid below I - 8),
  then diverges: it restores the checkpoint its sibling's prefill inserted (`checkpoint` + `sibling`).

Branch suffixes start with a token that differs from every other branch's at the branch point, so each
divergence is exactly where it says. The designed shapes are in `meta["tree_shapes"]` (one list per turn);
the report derives the shapes a run reached from its records and shows both.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.boundaries import FLA_CHUNK_SIZE, boundaries_upto, next_boundary
from protocol.tokenizer import Tokenizer
from workloads.schema import Session, Turn

GROUP = "tree"
FAN_SHORT = 8  # fan's prompt ends this far below I: its turn 0 crosses I in a verify step
FAN_MARGIN = 16  # ... and decodes this many tokens past it
FAN_CONTINUE = 48  # turn 1's text after turn 0's history: its prefill extend is 64 tokens long
FAN_BRANCH = 37  # turns 2 and 3 branch at I + 37: 5 tokens into a 16-token page, 37 past checkpoint I
FAN_BRANCH_SUFFIX = 27  # a branch's own text: its prompt is as long as turn 1's (I + 64)
FAN_NEW = 16  # new tokens of turns 1-3
SIB_SHARED = 40  # sib's turn 0 shares fan's first 40 tokens, mid-page below the first checkpoint
SIB_OWN, SIB_TAIL = 60, 24  # sib's own text after them; turn 1's text after fan's prefill checkpoint
SIB_NEW = (24, 16)


def _distinct(take: Callable[[int], list[int]], n: int, avoid: set[int]) -> list[int]:
    """`n` fresh tokens whose first is none of `avoid` (a branch must diverge exactly at its first token)."""
    ids = take(n)
    while ids[0] in avoid:
        ids = take(n)
    return ids


def _meta(interval: int, block_size: int, prompt_len: int, max_new: int, **extra) -> dict:
    return {**extra, "turn0_len": prompt_len, "prompt_boundaries": boundaries_upto(prompt_len, interval),
            "boundaries_spanned": boundaries_upto(prompt_len + max_new, interval), "block_size": block_size,
            "next_boundary": next_boundary(prompt_len, interval)}


def tree_sessions(take: Callable[[int], list[int]], tokenizer: Tokenizer, interval: int,
                  block_size: int) -> list[Session]:
    """The `fan` and `sib` sessions for one interval (module doc), cutting their text with `take(n)`."""
    I = interval  # the name every formula of the module doc uses
    prompt = take(I - FAN_SHORT)
    t0_new = I - len(prompt) + FAN_MARGIN
    branch = I + FAN_BRANCH
    cont = take(FAN_CONTINUE)
    at_branch = cont[branch - (len(prompt) + t0_new)]  # turn 1's token at the branch point
    x2 = _distinct(take, FAN_BRANCH_SUFFIX, {at_branch})
    x3 = _distinct(take, FAN_BRANCH_SUFFIX, {at_branch, x2[0]})

    def turn(max_new: int, suffix: list[int], branch_at: int | None = None) -> Turn:
        return Turn(max_new, suffix_ids=tuple(suffix), suffix_text=tokenizer.decode(suffix), branch_at=branch_at)

    fan_id = f"frozen-i{I}-tree-fan"
    fan = Session(
        fan_id, "frozen", I, GROUP,
        f"Fan-out: turn 0 ({len(prompt)} tokens) crosses {I} in a verify step; turn 1 continues and restores it; "
        f"turns 2 and 3 branch off the history at {branch} (no checkpoint there): turn 2's match goes past "
        f"checkpoint {I}, turn 3's ends at the node turn 2's insertion split off, without a checkpoint of its own.",
        _meta(I, block_size, len(prompt), t0_new, branch_at=branch,
              tree_shapes=[[], ["checkpoint"], ["deeper"], ["split"]]),
        (Turn(t0_new, tuple(prompt), tokenizer.decode(prompt)), turn(FAN_NEW, cont),
         turn(FAN_NEW, x2, branch), turn(FAN_NEW, x3, branch)))
    ckpt = (len(prompt) // FLA_CHUNK_SIZE) * FLA_CHUNK_SIZE  # fan's prefill checkpoint (one extend)
    if ckpt <= SIB_SHARED:  # an interval this short leaves no checkpoint for the sibling to share
        return [fan]
    own = _distinct(take, SIB_OWN, {prompt[SIB_SHARED]})
    tail = _distinct(take, SIB_TAIL, {prompt[ckpt]})
    sib_prompt = prompt[:SIB_SHARED] + own
    sib = Session(
        f"frozen-i{I}-tree-sib", "frozen", I, GROUP,
        f"Sibling: turn 0 shares {fan_id}'s first {SIB_SHARED} tokens; turn 1 branches off at {SIB_SHARED}, "
        f"goes on with {fan_id}'s prompt to {ckpt} and restores the checkpoint that session's prefill inserted.",
        _meta(I, block_size, len(sib_prompt), SIB_NEW[0], branch_at=SIB_SHARED, sibling=fan_id,
              sibling_checkpoint=ckpt, tree_shapes=[[], ["checkpoint", "sibling"]]),
        (Turn(SIB_NEW[0], tuple(sib_prompt), tokenizer.decode(sib_prompt)),
         turn(SIB_NEW[1], prompt[SIB_SHARED:ckpt] + tail, SIB_SHARED)))
    return [fan, sib]


def turn_lengths(session: Session) -> list[int]:
    """Each turn's input length when every turn generates its max_new_tokens (as the frozen suite's do)."""
    lengths, prev = [], 0
    for n, t in enumerate(session.turns):
        if n == 0:
            length = session.prompt_len
        else:
            history = prev + session.turns[n - 1].max_new_tokens
            length = min(history, t.branch_at if t.branch_at is not None else history) + len(t.suffix_ids or ())
        lengths.append(length)
        prev = length
    return lengths


def describe_tree(sessions: list[Session]) -> list[str]:
    """The `--describe` lines of the tree group: each turn, its input, what it keeps and the designed shape."""
    lines = [f"  tree: {len(sessions)} sessions whose turns branch off their history (in run order)",
             f"    {'turn':<8}  {'input':>5}  {'max_new':>7}  {'history kept':<13}  designed shape"]
    for s in sessions:
        shapes = s.meta.get("tree_shapes") or [[]] * len(s.turns)
        for n, (t, length) in enumerate(zip(s.turns, turn_lengths(s), strict=True)):
            kept = "-" if n == 0 else ("all" if t.branch_at is None else f"first {t.branch_at}")
            name = f"{s.session_id.rsplit('-', 1)[1]}/{n}"
            lines.append(f"    {name:<8}  {length:>5}  {t.max_new_tokens:>7}  {kept:<13}  "
                         f"{'+'.join(shapes[n]) or 'restores nothing'}")
    return lines
