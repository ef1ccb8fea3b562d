"""The trained default weights (engine/weights/default): what they are, a golden continuation, acceptance.

Nothing here skips: missing weights fail the golden tests.
"""

from __future__ import annotations

import json
from dataclasses import replace

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateRequest, SamplingParams
from engine.model.config import HybridConfig, preset
from engine.runner import DEFAULT_WEIGHTS
from protocol.tokenizer import BYTE_TOKENIZER
from workloads.corpus import TextCursor, heldout_documents

GOLDEN_PROMPT = "def _splitext(p, sep, altsep, extsep):\n    "
# recorded from the committed weights: '    """Return the string the string the string t'
# (smallest top-1/top-2 margin along the way: 0.023, far above numeric noise)
GOLDEN_IDS = [32, 32, 32, 32, 34, 34, 34, 82, 101, 116, 117, 114, 110, 32, 116, 104, 101, 32, 115, 116, 114, 105, 110,
              103, 32, 116, 104, 101, 32, 115, 116, 114, 105, 110, 103, 32, 116, 104, 101, 32, 115, 116, 114, 105, 110,
              103, 32, 116]
ACCEPT_FLOOR = 2.8  # ~80% of the 3.51 measured (mean commit length) on the prompts of the test below


# --- the committed weights -------------------------------------------------------


def test_committed_weights_are_the_default_and_small():
    files = {p.name: p.stat().st_size for p in DEFAULT_WEIGHTS.iterdir()}
    assert {"config.json", "model.safetensors", "drafter.safetensors"} <= set(files)
    assert sum(files.values()) <= 25 * 2**20
    cfg = HybridConfig.load(DEFAULT_WEIGHTS / "config.json")
    small = preset("small")
    assert replace(cfg, drafter_num_layers=small.drafter_num_layers) == small
    report = json.loads((DEFAULT_WEIGHTS / "training.json").read_text())
    assert report["target"]["validation_bpb"] > 0


def _engine(**kw) -> Engine:
    return Engine(EngineConfig(model_path="default", disable_radix_cache=True, **kw))


def test_committed_weights_golden_greedy_continuation():
    e = _engine()
    out = e.generate([GenerateRequest("g", tuple(GOLDEN_PROMPT.encode()), SamplingParams(max_new_tokens=len(GOLDEN_IDS),
                                                                                         ignore_eos=True))])[0]
    assert out.output_ids == GOLDEN_IDS, BYTE_TOKENIZER.decode(out.output_ids, keep_special=True)


def test_drafter_acceptance_stays_above_the_floor():
    cursor = TextCursor(heldout_documents())
    prompts = [tuple(cursor.take(160).encode("ascii")) for _ in range(4)]
    e = _engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=8)
    outs = e.generate([GenerateRequest(f"a{i}", p, SamplingParams(max_new_tokens=64, ignore_eos=True))
                       for i, p in enumerate(prompts)])
    ref = _engine().generate([GenerateRequest(f"r{i}", p, SamplingParams(max_new_tokens=64, ignore_eos=True))
                              for i, p in enumerate(prompts)])
    assert [o.output_ids for o in outs] == [r.output_ids for r in ref]
    mean = sum(len(o.output_ids) for o in outs) / sum(o.spec_verify_ct for o in outs)
    assert mean >= ACCEPT_FLOOR, f"mean commit length {mean:.2f} < floor {ACCEPT_FLOOR}"
