"""Restore links: which earlier turn's crossing (or prefill) a restored checkpoint comes from (the #37817 signature).

A state-tracking bug does not hurt the request whose verify step crossed a boundary; it hurts the next turn that
restores the checkpoint. `link_restored_checkpoints` ties each such turn to the crossing of its previous turn,
over the columns of the requests frame (reports/analyze.py) before it is built.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

from records.schema import sweep_point_of
from reports.crossing_cells import crossing_list

OnPath = Callable[[int, int, int], bool]


def seqs_on_path(seqs: list[tuple]) -> OnPath:
    """`on_path(i, j, length)`: request i's first `length` input tokens are request j's input + output tokens
    there (unknown ids: True); `seqs`: each row's (input ids, output ids)."""
    def on_path(i: int, j: int, length: int) -> bool:
        (ids, _), (prev_in, prev_out) = seqs[i], seqs[j]
        if not ids or not prev_in:
            return True
        return list(ids[:length]) == (list(prev_in) + list(prev_out or []))[:length]

    return on_path


def link_restored_checkpoints(cols: dict[str, list], on_path: OnPath) -> None:
    """Link each turn that restored `cached_tokens = b` to the previous turn's crossing of b (same session and
    sweep point): that is the #37817 signature, a checkpoint saved (or not) by the verify tracking path, then
    restored by the next turn. When the previous turn restored b itself on the same path (a later turn that
    branches off its history, workloads/README.md), the link goes to the turn before it that did not; a turn
    that branched off below b restored another path's checkpoint ("none"). `cols`: the frame's columns
    (its link columns are set here); `on_path`: whether a row's input went along another row's sequence.

    `restored_link`: "verify" when the engine reported the previous turn's verify steps (spec_trace) and one
    crossed b; "position" when it did not report them and b lies in the previous turn's generated positions
    (so some verify step crossed it, which one is unknown); "prefill" when b lies inside the previous turn's
    prompt past what that turn restored itself (a checkpoint its prefill took: on SGLang's 64-token grid, not
    a multiple of the interval); "none" otherwise (the previous turn did not take it: another session's, or one
    restored before); None without a restore or a previous turn.
    """
    index = LinkIndex()
    index.add(cols)
    cols.update(index.links(lambda j: crossing_list(cols["crossings"][j]), on_path))


class LinkIndex:
    """What the links read of each row, gathered batch by batch in compact form (a streamed run's rows,
    reports/analyze_pass.py): its session (pool, sweep point, session id) as a number, turn, restored
    tokens, input length, and whether its class is an error or its interval unknown. `links(crossings, on_path)`
    gives the link columns link_restored_checkpoints sets, as whole lists."""

    def __init__(self) -> None:
        self._sessions: dict[tuple, int] = {}
        self.session, self.turn, self.cached, self.input_len = array("q"), [], array("q"), array("q")
        self.no_prev = bytearray()  # 1: its class is an error or its interval unknown (no link from it)

    def add(self, cols: dict[str, list]) -> None:
        """Append the rows of a batch's frame columns (reports/analyze.py row_of lists)."""
        keys = cols.get("key") or [None] * len(cols["turn"])
        for key, pool, conc, session in zip(keys, cols["pool"], cols["concurrency"], cols["session_id"],
                                            strict=True):
            self.session.append(self._sessions.setdefault((pool, sweep_point_of(key, conc), session),
                                                          len(self._sessions)))
        self.turn += cols["turn"]  # as recorded (a turn that is not an integer has no previous turn)
        self.cached.extend(cols["cached_tokens"])  # integers (reports/analyze.py row_of)
        self.input_len.extend(cols["input_len"])
        self.no_prev += bytes(int(c == "error" or iv is None) for c, iv in zip(cols["class"], cols["interval"],
                                                                                strict=True))

    def extend(self, other: LinkIndex) -> None:
        """Append the rows of another index (rows that follow this one's)."""
        names = {v: k for k, v in other._sessions.items()}
        self.session.extend(self._sessions.setdefault(names[s], len(self._sessions)) for s in other.session)
        self.turn += other.turn
        self.cached.extend(other.cached)
        self.input_len.extend(other.input_len)
        self.no_prev += other.no_prev

    def links(self, crossings: Callable[[int], list[dict]], on_path: OnPath) -> dict[str, list]:
        """The link columns of every row (link_restored_checkpoints' rules: its doc); `crossings(j)`: row j's
        crossings."""
        self._sessions.clear()
        n = len(self.turn)
        out = {"restored_link": [None] * n, "restored_verify_crossed": [False] * n,
               "restored_crossing_step": [None] * n, "restored_crossing_commit_len": [None] * n,
               "restored_crossing_tracked": [None] * n}
        index: dict[tuple, int] = {}
        for i in range(n):
            index.setdefault((self.session[i], self.turn[i]), i)
        turns, cached_col = self.turn, self.cached
        for i, turn in enumerate(turns):
            cached = cached_col[i]
            if not isinstance(turn, int) or turn <= 0 or cached <= 0:
                continue
            where = self.session[i]
            prev = index.get((where, turn - 1))
            while prev is not None and cached_col[prev] == cached and turns[prev] > 0 and on_path(i, prev, cached):
                prev = index.get((where, turns[prev] - 1))
            if prev is None or self.no_prev[prev]:
                continue
            out["restored_link"][i] = "prefill" if cached_col[prev] < cached <= self.input_len[prev] else "none"
            if not on_path(i, prev, cached):
                out["restored_link"][i] = "none"
                continue
            for x in crossings(prev):
                if x["boundary"] != cached:
                    continue
                if x["source"] == "reported":
                    out["restored_link"][i] = "verify"
                    out["restored_verify_crossed"][i] = True
                    out["restored_crossing_step"][i] = x["step"]
                    out["restored_crossing_commit_len"][i] = x["commit_len"]
                    out["restored_crossing_tracked"][i] = x["tracked_agrees"]
                else:
                    out["restored_link"][i] = "position"
                break
        return out
