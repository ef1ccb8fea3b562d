"""Shared helpers for engine tests: prompts around boundaries and two-turn sessions."""

from __future__ import annotations

import random

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateRequest, SamplingParams

SUFFIX = tuple(b"\n# next question:")


def make_engine(**kw) -> Engine:
    base = dict(model_path="random", model_preset="tiny", page_size=16, max_running_requests=16)
    base.update(kw)
    return Engine(EngineConfig(**base))


def prompt(n: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(256) for _ in range(n))


def req(rid: str, ids, max_new: int, top: int = 2, **sp) -> GenerateRequest:
    return GenerateRequest(rid, tuple(ids), SamplingParams(max_new_tokens=max_new, ignore_eos=True, **sp),
                           return_logprob=True, top_logprobs_num=top)


def two_turn(engine: Engine, ids, max_new1: int, max_new2: int, tag: str):
    """Run turn 1, then turn 2 = turn-1 prompt + output + suffix, on the same engine."""
    o1 = engine.generate([req(f"{tag}-t1", ids, max_new1)])[0]
    ids2 = tuple(ids) + tuple(o1.output_ids) + SUFFIX
    o2 = engine.generate([req(f"{tag}-t2", ids2, max_new2)])[0]
    return o1, ids2, o2


def margin(o, i: int) -> float:
    top = o.output_top_logprobs[i]
    return top[0][0] - top[1][0]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
