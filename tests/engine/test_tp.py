"""Tensor parallelism on CPU (gloo): TP=2 matches TP=1; a dead rank fails requests fast and clearly and ends the
server; the rank group authenticates its members and exchanges no pickles."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.tp.local import start_local
from tests.engine.sessions import SUFFIX, first_divergence, prompt, req

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
CFG = dict(model_path="random", model_preset="tiny", page_size=16, mamba_track_interval=64)


@pytest.fixture(scope="module")
def pair():
    """A TP=1 and a TP=2 engine per configuration (speculative + radix)."""
    made = []

    def build(**kw):
        one = Engine(EngineConfig(**CFG, **kw))
        two, procs, _ = start_local(EngineConfig(**CFG, tp_size=2, **kw))
        made.append(two)
        return one, two

    yield build
    for e in made:
        e.runner.shutdown()


def test_tp2_logits_match_tp1(pair):
    one, two = pair(disable_radix_cache=True)
    for s in range(3):
        ids = list(prompt(90 + 31 * s, seed=s))
        pages = list(range(s * 12, s * 12 + 12))
        a = one.runner.extend(ids, 0, pages, s)
        b = two.runner.extend(ids, 0, pages, s)
        diff = (a - b).abs().max().item()
        print(f"prompt {len(ids)}: max |logit TP1 - TP2| = {diff:.2e}")
        assert diff <= 1e-4


def test_tp2_greedy_tokens_match_tp1(pair):
    one, two = pair(disable_radix_cache=True)
    reqs = [req(f"p{i}", prompt(40 + 9 * i, seed=50 + i), 16) for i in range(20)]
    for a, b in zip(one.generate(reqs), two.generate(reqs), strict=True):
        d = first_divergence(a.output_ids, b.output_ids)
        if d is not None:
            m = a.output_top_logprobs[d][0][0] - a.output_top_logprobs[d][1][0]
            print(f"{a.rid}: differs at {d}, margin {m:.2e}")
            assert m < 1e-3


def test_tp2_speculative_radix_sessions_match_tp1(pair):
    one, two = pair(speculative_algorithm="DFLASH")
    for s, n in enumerate((60, 63, 64, 127)):
        ids = prompt(n, seed=900 + s)
        outs = []
        for e in (one, two):
            o1 = e.generate([req(f"t{s}-1", ids, 20)])[0]
            o2 = e.generate([req(f"t{s}-2", tuple(ids) + tuple(o1.output_ids) + SUFFIX, 12)])[0]
            outs.append((o1.output_ids, o2.output_ids, o2.cached_tokens, o1.spec_trace))
        assert outs[0] == outs[1]
        assert outs[0][2] > 0


def test_tp2_scores_a_restored_prompt_as_tp1(pair):
    """logprob_start_len under TP: the ranks replay the extend that returns every scored position's logits."""
    from engine.io_struct import GenerateRequest, SamplingParams

    one, two = pair(speculative_algorithm="DFLASH")
    ids = prompt(60, seed=77)
    scored = []
    for e in (one, two):
        o1 = e.generate([req("w1", ids, 20)])[0]
        turn = tuple(ids) + tuple(o1.output_ids) + SUFFIX
        probe = GenerateRequest("w2", turn, SamplingParams(max_new_tokens=1), return_logprob=True, logprob_start_len=64)
        scored.append(e.generate([probe])[0])
    assert scored[0].cached_tokens == scored[1].cached_tokens == 64
    assert scored[0].input_logprobs[0] is None and scored[1].input_logprobs[0] is None
    assert scored[1].input_logprobs[1:] == pytest.approx(scored[0].input_logprobs[1:], abs=1e-4)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_killed_rank_fails_requests_and_ends_the_server(tmp_path):
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    srv = subprocess.Popen([sys.executable, "-m", "engine.serve", "--tp-size", "2", "--model-path", "random",
                            "--model-preset", "tiny", "--port", str(port)], cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if _get(base + "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("server did not come up: " + (tmp_path / "server.log").read_text()[-2000:])
        body = json.dumps({"input_ids": list(range(30, 60)), "sampling_params": {"max_new_tokens": 4,
                                                                                 "temperature": 0}}).encode()
        post = urllib.request.Request(base + "/generate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(post, timeout=30) as r:
            assert r.status == 200
        children = subprocess.run(["pgrep", "-P", str(srv.pid)], capture_output=True, text=True).stdout.split()
        ranks = [int(p) for p in children]  # the rank process (and multiprocessing's resource tracker)
        assert ranks, "no rank process found"
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        try:
            with urllib.request.urlopen(post, timeout=60) as r:
                status, answer = r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            status, answer = e.code, json.loads(e.read())
        elapsed = time.time() - t0
        print(f"request after the kill: {status} in {elapsed:.1f}s: {answer}")
        assert status >= 500 and elapsed < 45
        assert "rank 1" in json.dumps(answer)
        # the engine is dead: the server exits (status 3) so that a supervisor restarts it
        assert srv.wait(30) == 3
        log_text = (tmp_path / "server.log").read_text()
        assert "engine died" in log_text and "rank 1" in log_text
    finally:
        srv.send_signal(signal.SIGKILL)
        srv.wait(10)
        log.close()
