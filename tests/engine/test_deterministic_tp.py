"""Deterministic mode under tensor parallelism (TP=2 on CPU, gloo), in fp32 and bf16: the three invariances of
tests/engine/test_deterministic.py hold with the model's linears sharded over two ranks and their partial sums
all-reduced (each all-reduce reduces one token's row, so its order is fixed too).

Per dtype two TP=2 engines over one seeded random model: `plain` (no speculation, no radix cache) and `spec`
(DFlash with scripted drafts, the radix cache on). (a) a request alone and batched with others, prompts chunked by
a small prefill budget: the same bits; (b) the same requests through `spec` (verify steps committing several
tokens) and `plain`: the same bits; (c) follow-up turns that restore checkpoints in `spec` and the same prompts
prefilled cold in `plain`: the same bits.
"""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.tp.local import start_local
from tests.engine.sessions import SUFFIX, req
from tests.engine.test_deterministic import bits, random_request

pytestmark = pytest.mark.slow
BASE = dict(model_path="random", model_preset="tiny", page_size=16, max_running_requests=16, tp_size=2,
            enable_deterministic_inference=True, chunked_prefill_size=64, mamba_track_interval=64)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engines(request):
    seed = {"float32": 11, "bfloat16": 12}[request.param]
    plain, *_ = start_local(EngineConfig(**BASE, dtype=request.param, seed=seed, disable_radix_cache=True))
    spec, *_ = start_local(EngineConfig(**BASE, dtype=request.param, seed=seed, speculative_algorithm="DFLASH",
                                        drafter_mode="scripted", scripted_accept=-1))
    yield plain, spec
    for e in (plain, spec):
        e.runner.shutdown()


def test_batch_invariance(engines):
    plain, _ = engines
    rng = random.Random(30)
    main = random_request(rng, "main")
    batch = [main] + [random_request(rng, f"o{i}") for i in range(5)]
    rng.shuffle(batch)
    alone = plain.generate([main])[0]
    together = next(o for o in plain.generate(batch) if o.rid == "main")
    assert bits(together) == bits(alone)


def test_speculation_invariance(engines):
    plain, spec = engines
    rng = random.Random(31)
    reqs = [req(f"r{i}", random_request(rng, f"r{i}", sampled=False).input_ids, 16, top=2) for i in range(3)]
    drafted = spec.generate(reqs)
    assert [bits(o) for o in drafted] == [bits(o) for o in plain.generate(reqs)]
    assert max(c for o in drafted for _, c, _ in o.spec_trace) >= 4  # verify steps committed several tokens


def test_restore_invariance(engines):
    plain, spec = engines
    rng = random.Random(32)
    firsts = [[rng.randrange(256) for _ in range(rng.randrange(50, 140))] for _ in range(2)]
    o1 = spec.generate([req(f"s{i}-1", ids, 24) for i, ids in enumerate(firsts)])
    seconds = [list(a) + list(o.output_ids) + list(SUFFIX) for a, o in zip(firsts, o1, strict=True)]
    o2 = spec.generate([req(f"s{i}-2", ids, 10) for i, ids in enumerate(seconds)])
    assert all(o.cached_tokens > 0 for o in o2)  # every follow-up resumed from a checkpoint
    assert [bits(o) for o in o2] == [bits(plain.generate([req(f"c{i}", ids, 10)])[0])
                                     for i, ids in enumerate(seconds)]
