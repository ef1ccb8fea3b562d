"""Synthesized run directories for benchmarks/scale.py: N candidates built from real runs' records.

Every candidate keeps its own reference (the inputs of copy k differ from copy j's in their first
tokens, so every input hash is distinct), classes and restore links are kept (outputs, log-probs,
`cached_tokens` and the verify trace of each source turn are copied; turn n+1 is built from turn n's
candidate output as the driver builds it), and `--tokens T` extends each output to T tokens with
positions (token, log-prob, top-k) drawn at random from the sources' references, the same draw in
the candidate and its reference, so the extension adds no drift and no divergence. The extended
verify trace follows the boundary rule (or tracks nothing where the source ran `stale-seq-lens`).

So that copies are as varied as a real run's requests (a compressor must not find copy k in copy j),
each copy maps byte token ids through its own permutation (in prompts, outputs and top-k alike: which
tokens are equal is kept) and scales every log-prob by a factor within 1e-3 of 1 drawn per position and
top-k slot (the same factor in the candidate and its reference), rounded to float32 as an engine's are.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protocol.boundaries import step_to_track
from records.jsonl import RecordFiles, load_run
from records.rundir import REFERENCE_FILE, candidate_file, input_hash, load_config, write_json
from records.schema import STATS_FILE, Generation, build_record, candidate_key, reference_key

CONCURRENCY = (1, 4, 8, 16)  # the synthesized run's sweep points (copies are split evenly between them)
STAMP_TOKENS = 4  # turn 0's first tokens carry the copy's number: every input of every copy is distinct


@dataclass(frozen=True)
class Template:
    """One source session: each turn's candidate and reference record, turn 0 first."""

    source: int
    pool: str
    turns: tuple[tuple[dict, dict], ...]


@dataclass(frozen=True)
class SynthTurn:
    max_new_tokens: int
    suffix_ids: tuple[int, ...]


def load_templates(sources: list[Path]) -> tuple[list[Template], list[tuple], dict]:
    """The sources' sessions (complete and linear ones only), the reference positions extensions draw from, and the
    first source's config.json."""
    templates, positions = [], []
    for s, src in enumerate(sources):
        run = load_run(src)
        sessions: dict[tuple, dict[int, tuple[dict, dict]]] = {}
        for cand in run.candidates:
            ref = run.references.get(cand["input_hash"])
            if ref is None or cand["error"] is not None or ref["error"] is not None:
                continue
            sessions.setdefault((cand["pool"], cand["concurrency"], cand["session_id"]), {})[cand["turn"]] = (cand,
                                                                                                           ref)
        for (pool, _, _), turns in sorted(sessions.items()):
            if sorted(turns) == list(range(len(turns))) and _linear([turns[n][0] for n in range(len(turns))]):
                templates.append(Template(s, pool, tuple(turns[n] for n in range(len(turns)))))
        for ref in run.references.values():
            positions += zip(ref["output_ids"], ref["output_logprobs"], ref["output_top_logprobs"], strict=True)
    if not templates:
        raise SystemExit(f"no complete sessions in {', '.join(map(str, sources))}")
    return templates, positions, load_config(sources[0])


def _linear(turns: list[dict]) -> bool:
    """Each turn's input continues the previous turn's input and output (tree-group sessions branch: skipped)."""
    return all(cur["input_ids"][:len(prev["input_ids"]) + len(prev["output_ids"])] == prev["input_ids"]
               + prev["output_ids"] for prev, cur in zip(turns, turns[1:], strict=False))


class SynthSession:
    """Copy `copy` of a template session; duck-types workloads.schema.Session for the driver and build_record."""

    def __init__(self, template: Template, copy: int, tokens: int, positions: list[tuple], commits: list[int]):
        self.t, self.copy, self.tokens = template, copy, tokens
        self.positions, self.commits = positions, commits
        first = template.turns[0][0]
        case = dict(first["case"])
        self.session_id = f"{first['session_id']}~{template.source}.{copy}"
        self.suite, self.group, self.targets = first["suite"], case.pop("group", ""), case.pop("targets", "")
        self.interval = case.pop("interval", None)
        self.meta = {**case, "case_id": first["case_id"]}
        perm = list(range(256))
        random.Random(copy).shuffle(perm)
        self.perm = np.array(perm, dtype=np.int64)
        self.turns = tuple(SynthTurn(max(c["max_new_tokens"], tokens), self._map(self._suffix(n)))
                           for n, (c, _) in enumerate(template.turns))

    def sigma(self, ids) -> np.ndarray:
        """This copy's ids for byte token ids (< 256); other ids (specials) are kept."""
        ids = np.asarray(ids, dtype=np.int64)
        return np.where((ids >= 0) & (ids < 256), self.perm[np.clip(ids, 0, 255)], ids)

    def _map(self, ids) -> tuple[int, ...]:
        return tuple(self.sigma(ids).tolist()) if len(ids) else ()

    def _suffix(self, n: int) -> tuple[int, ...]:
        if n == 0:
            return ()
        prev, cur = self.t.turns[n - 1][0], self.t.turns[n][0]
        head = len(prev["input_ids"]) + len(prev["output_ids"])
        assert cur["input_ids"][:head] == prev["input_ids"] + prev["output_ids"], "source turn not built on its prev"
        return tuple(cur["input_ids"][head:])

    def turn_input(self, turn: int, prev_input: list[int] | None, prev_output: list[int] | None) -> list[int]:
        """Turn 0: the source prompt stamped with the copy's number; later turns: prev input + output + suffix."""
        if turn == 0:
            ids = list(self._map(self.t.turns[0][0]["input_ids"]))
            code = self.copy * 8 + self.t.source
            for i in range(min(STAMP_TOKENS, len(ids))):
                ids[i], code = 97 + code % 26, code // 26
            return ids
        return list(prev_input) + list(prev_output) + list(self.turns[turn].suffix_ids)

    def answer(self, turn: int, role: str, input_len: int) -> Generation:
        """What the server answered the source turn, extended to `tokens` output tokens, in this copy's ids."""
        cand, ref = self.t.turns[turn]
        src = cand if role == "candidate" else ref
        rng = random.Random(f"{self.session_id}/{turn}")  # the same draws for the candidate and its reference
        longest = max(len(cand["output_ids"]), len(ref["output_ids"]))
        ext = rng.choices(self.positions, k=max(0, self.tokens - min(len(cand["output_ids"]), len(ref["output_ids"]))))
        ext = ext[:max(0, self.tokens - len(src["output_ids"]))]
        ids = src["output_ids"] + [p[0] for p in ext]
        lps = src["output_logprobs"] + [p[1] for p in ext]
        top = src["output_top_logprobs"] + [p[2] for p in ext]
        k = 1 + max((len(t) for r in (cand, ref) for t in r["output_top_logprobs"]), default=2)  # same in both
        scale = 1 + (np.random.default_rng(rng.getrandbits(64)).random((max(longest, self.tokens), k)) - 0.5) * 2e-3
        out = self._map(ids)
        new_lps = (np.asarray(lps) * scale[:len(lps), 0]).astype(np.float32).astype(float).tolist()
        flat = [(p, j, lp, tok) for p, entries in enumerate(top) for j, (lp, tok) in enumerate(entries)]
        new_top: list[list] = [[] for _ in top]
        if flat:
            pos, slot, lp, tok = (np.asarray(c) for c in zip(*flat, strict=True))
            same = (tok == np.asarray(ids)[pos]) & (lp == np.asarray(lps)[pos])  # the chosen token's entry keeps
            vals = np.where(same, np.asarray(new_lps)[pos], (lp * scale[pos, slot + 1]).astype(np.float32))  # its lp
            for p, v, t in zip(pos.tolist(), vals.astype(float).tolist(), self.sigma(tok).tolist(), strict=True):
                new_top[p].append([v, t])
        trace = self._trace(src, turn, input_len, len(out), random.Random(f"{self.session_id}/{turn}/trace")) \
            if src["spec_trace"] is not None else None
        return Generation(
            output_ids=list(out), output_text="".join(chr(t) if 32 <= t < 127 else "?" for t in out),
            output_logprobs=new_lps, output_top_logprobs=new_top,
            cached_tokens=src["cached_tokens"], completion_tokens=len(out), finish_reason=src["finish_reason"],
            spec_verify_ct=len(trace) if trace is not None else src["spec_verify_ct"],
            spec_accept_length=len(out) / len(trace) if trace else src["spec_accept_length"],
            spec_trace=trace, ttft=src["ttft"], itl=src["itl"], e2e=src["e2e"])

    def _trace(self, src: dict, turn: int, input_len: int, n_out: int, rng: random.Random) -> list[list[int]]:
        """The source's verify steps, moved to this turn's positions, then steps up to `n_out` outputs."""
        interval = src["interval"] or 1
        stale = (src["engine"] or {}).get("fault") == "stale-seq-lens"
        shift = input_len - src["input_len"]
        if shift == 0:
            trace = [list(e) for e in src["spec_trace"]]
        else:  # a later turn after an extended one: same commit lengths, tracked by the rule at the new positions
            trace = [[p + shift, c, -1 if stale else step_to_track(p + shift, p + shift + c, c, interval)]
                     for p, c, _ in src["spec_trace"]]
        pre = trace[-1][0] + trace[-1][1] if trace else input_len + 1
        while pre < input_len + n_out:
            c = min(rng.choice(self.commits), input_len + n_out - pre)
            trace.append([pre, c, -1 if stale else step_to_track(pre, pre + c, c, interval)])
            pre += c
        return trace


def plan(templates: list[Template], positions: list[tuple], n_candidates: int, tokens: int
         ) -> list[tuple[int, list[SynthSession]]]:
    """(concurrency, sessions) per sweep point: copies of the templates until there are n_candidates turns."""
    commits = [c for t in templates for cand, _ in t.turns for _, c, _ in (cand["spec_trace"] or [])] or [1]
    sessions, total, copy = [], 0, 0
    while total < n_candidates:
        for t in templates:
            if total >= n_candidates:
                break
            sessions.append(SynthSession(t, copy, tokens, positions, commits))
            total += len(t.turns)
        copy += 1
    per = -(-len(sessions) // len(CONCURRENCY))
    return [(c, sessions[i * per:(i + 1) * per]) for i, c in enumerate(CONCURRENCY)]


def record(s: SynthSession, role: str, concurrency: int | None, turn: int, ids: list[int], run_id: str) -> dict:
    """The record the driver would write for this turn's candidate or reference answer."""
    cand = s.t.turns[turn][0]
    h = input_hash(ids)
    key = candidate_key(s.t.pool, concurrency, s.session_id, turn) if role == "candidate" else reference_key(h)
    src = cand if role == "candidate" else s.t.turns[turn][1]
    return build_record(run_id=run_id, key=key, role=role, pool=src["pool"], engine=src["engine"],
                        concurrency=concurrency, replica_id=src["replica_id"], node_id=src["node_id"], session=s,
                        turn=turn, input_ids=ids, input_hash=h, max_new_tokens=s.turns[turn].max_new_tokens,
                        gen=s.answer(turn, role, len(ids)), t_start=src["t_start"], retries=0, error=None,
                        tokenizer=src["tokenizer"])


def write_run(run_dir: Path, points: list[tuple[int, list[SynthSession]]], config: dict, stats: dict | None
              ) -> tuple[int, int]:
    """Write the synthesized run through RecordFiles as a driver would (compacting at each sweep point's end
    where the writer can); returns (candidates, output tokens of candidates and references)."""
    run_dir.mkdir(parents=True)
    write_json(run_dir / "config.json", {**config, "run_id": run_dir.name})
    files = RecordFiles(run_dir, set())
    n = tokens = 0
    for concurrency, sessions in points:
        for s in sessions:
            prev_in = prev_out = None
            for turn in range(len(s.turns)):
                ids = s.turn_input(turn, prev_in, prev_out)
                cand = record(s, "candidate", concurrency, turn, ids, run_dir.name)
                ref = record(s, "reference", None, turn, ids, run_dir.name)
                files.write(candidate_file(s.t.pool), cand)
                files.write(REFERENCE_FILE, ref)
                n, tokens = n + 1, tokens + len(cand["output_ids"]) + len(ref["output_ids"])
                prev_in, prev_out = ids, cand["output_ids"]
        if stats is not None and sessions:
            files.write(STATS_FILE, {**stats, "run_id": run_dir.name, "concurrency": concurrency,
                                     "key": f"stats/{stats['pool']}-c{concurrency}/{stats['replica_id']}"})
        if hasattr(files, "compact"):
            files.compact()
    files.close()
    return n, tokens
