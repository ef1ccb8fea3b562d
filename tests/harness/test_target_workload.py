"""The workload follows the target: the probed interval and block size, the target's tokenizer, decoded text.

Stub servers (tests/harness/fake_server.py) report a recorded SGLang /server_info at
I = 512, B = 16, or a BPE tokenizer trained in the test as their `tokenizer_path`,
and answer without text; the built-in engine is driven through --endpoint with and
without --tokenizer pointing at its exported byte tokenizer.json.
"""

from __future__ import annotations

import json
import shutil

import pytest

from harness.run import main
from protocol.tokenizer import BYTE_TOKENIZER_JSON
from tests.harness import server_infos
from tests.harness.helpers import candidate_args, engine_pair, read_lines, reference_args
from tests.harness.test_external import servers
from tests.workloads.bpe import train_bpe
from workloads.frozen import FROZEN_PATH

pytestmark = pytest.mark.slow


def test_a_server_at_512_with_block_16_gets_a_generated_boundary_suite(tmp_path, capsys):
    payload = server_infos.write(tmp_path / "info.json", server_infos.current(512, 16))
    cand = candidate_args(512, "--server-info-json", payload)
    with servers(cand, reference_args()) as (c, r):
        common = ["--endpoint", c, "--reference-endpoint", r, "--runs-dir", str(tmp_path / "runs"), "--dry-run"]
        assert main(common) == 2  # its tokenizer_path is a hub name: the frozen suite cannot be built
        err = capsys.readouterr().err
        assert "reports tokenizer_path 'Qwen/Qwen3.5-35B-A3B', which is not a readable local path: pass " \
               "--tokenizer" in err
        assert main([*common, "--tokenizer", "byte", "--seed", "4"]) == 0
        out = capsys.readouterr().out
        assert main([*common, "--tokenizer", "byte", "--suite", "load", "--num-requests", "40"]) == 0
        load_out = capsys.readouterr().out
    assert ("workload: generated for intervals 512 and B=16 (offsets -16..+1 around multiples of each interval), "
            "seed 4; tokenizer byte (from --tokenizer)") in out
    # offsets -16..+1 at 512 and 1024 (36), 4 multi, 4 controls, a stem and 5 shared, the tree group's fan (4 turns)
    # and sib (2 turns): 52 sessions, no context cap
    assert "pool i512: 52 sessions, 106 requests per sweep point" in out
    assert "DFLASH B=16, radix extra_buffer, interval 512" in out
    assert "workload: seed 0, prompts at offsets -20..+4 around multiples of 512" in load_out
    assert "pool i512: " in load_out and "40 requests per sweep point" in load_out


def test_a_bpe_target_gets_exact_prompt_lengths_and_decoded_text(tmp_path, capsys):
    bpe = train_bpe(tmp_path / "bpe")
    cand = candidate_args(128, "--no-text", "--tokenizer-path", bpe.name)
    with servers(cand, reference_args("--no-text")) as (c, r):
        rc = main(["--endpoint", c, "--reference-endpoint", r, "--runs-dir", str(tmp_path / "runs"), "--run-id",
                   "bpe", "--concurrency", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    config = json.loads((tmp_path / "runs" / "bpe" / "config.json").read_text())
    assert config["plan"]["tokenizer"] == bpe.name
    assert config["plan"]["workload"].startswith("workload: generated for intervals 128 and B=4")
    recs = [r for r in read_lines(tmp_path / "runs" / "bpe") if r["role"] == "candidate"]
    # two turns of every generated session at B = 4, and the tree group's 4 + 2 turns
    assert len(recs) == 2 * (2 * (4 + 2) + 4 + 4 + 6) + 6
    for r in recs:
        assert r["tokenizer"] == bpe.name and r["output_ids"]
        assert r["output_text"] == bpe.decode(r["output_ids"])  # the server sent no text
        if r["turn"] == 0:
            assert r["input_len"] == r["case"]["turn0_len"]
        if r["case"]["group"] == "offset" and r["turn"] == 0:
            assert r["input_len"] == r["case"]["boundary"] + r["case"]["boundary_offset"]
    offsets = {(r["case"]["boundary"], r["case"]["boundary_offset"]) for r in recs if r["case"]["group"] == "offset"}
    assert offsets == {(b, o) for b in (128, 256) for o in range(-4, 2)}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    yield from engine_pair(tmp_path_factory.mktemp("engines"))


def test_the_exported_byte_tokenizer_gives_the_builtin_records(engines, tmp_path, capsys):
    cand, ref = engines
    exported = tmp_path / "tok" / "tokenizer.json"
    exported.parent.mkdir()
    shutil.copy(BYTE_TOKENIZER_JSON, exported)  # elsewhere: recognised by content, not by path
    common = ["--endpoint", cand, "--reference-endpoint", ref, "--concurrency", "4", "--runs-dir",
              str(tmp_path / "runs"), "--no-progress", "--request-timeout", "120", "--max-soft-rate", "1",
              "--min-coverage", "0"]  # the random tiny drafter crosses 1 of the 36 cells: not what this checks
    assert main([*common, "--tokenizer", str(exported), "--run-id", "exported"]) == 0
    assert main([*common, "--run-id", "default"]) == 0
    capsys.readouterr()
    runs = {name: {r["key"]: r for r in read_lines(tmp_path / "runs" / name) if r["role"] == "candidate"}
            for name in ("exported", "default")}
    assert set(runs["exported"]) == set(runs["default"]) and len(runs["exported"]) == 74
    committed = {json.loads(x)["session_id"]: json.loads(x) for x in FROZEN_PATH.read_text().splitlines()}
    for key, rec in runs["exported"].items():
        other = runs["default"][key]
        assert rec["tokenizer"] == other["tokenizer"] == "byte"
        assert (rec["input_ids"], rec["output_ids"], rec["output_text"]) == \
            (other["input_ids"], other["output_ids"], other["output_text"]), key
        assert rec["output_text"] and rec["error"] is None
        if rec["turn"] == 0:  # the committed suite is what both sent
            assert rec["input_ids"] == committed[rec["session_id"]]["turns"][0]["input_ids"]
    for name in ("exported", "default"):
        plan = json.loads((tmp_path / "runs" / name / "config.json").read_text())["plan"]
        assert plan["workload"].startswith("workload: the committed workloads/data/frozen.jsonl; tokenizer byte")
