"""`--engine sglang`'s parts without a real SGLang: its flags and pools, the bootstrap that hands the API key to
SGLang, its environment, the vocabulary check of the workload, what it reads from a Llama's /server_info, the
API key kept out of recorded server info, /flush_cache's answers, and the Qwen3-Next config a build writes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

import harness.targets.base as base
from harness.backends import RequestError
from harness.backends.info import candidate_problem, track_interval
from harness.backends.sglang import flush_cache
from harness.backends.sglang_probe import redacted
from harness.cli import from_argv
from harness.config import ConfigError
from harness.models.hf_build import with_interval
from harness.replica import ServerSite
from harness.run import make_plan
from harness.targets import make_target
from harness.targets.sglang_profile import BOOTSTRAP, cold_args, cpu_environment, make_pool, pools
from tests.harness import server_infos
from tests.harness.targets.case_sglang import case
from workloads.schema import Session, Turn

DFLASH = ("--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "8",
          "--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval", "64", "--dtype", "float32")


def test_pools_the_candidate_runs_its_flags_and_the_reference_the_same_cold():
    (cand, baseline), ref = pools(DFLASH, calibrate=True)
    assert (cand.name, cand.speculative, cand.radix_cache, cand.strategy, cand.block_size) == (
        "sglang", True, True, "extra_buffer", 8)
    assert ref.args == baseline.args == ("--dtype", "float32", "--disable-radix-cache")
    assert (ref.speculative, ref.radix_cache, ref.strategy, ref.block_size) == (False, False, None, None)
    assert cold_args(("--speculative-algorithm=NGRAM", "--enable-metrics", "--log-level", "info")) == (
        "--enable-metrics", "--log-level", "info", "--disable-radix-cache")
    plain = make_pool("sglang", "candidate", ())
    assert (plain.speculative, plain.radix_cache, plain.strategy) == (False, True, None)


def test_the_bootstrap_puts_the_key_from_the_environment_on_sglang_s_argv_only(tmp_path):
    """A stand-in `sglang.launch_server` writes what it was given to fd 1 (past the bootstrap's redacting
    sys.stdout): the flags with --api-key appended, the key gone from its environment, the working directory off
    sys.path; the process's own command line never holds it."""
    (tmp_path / "mods" / "sglang").mkdir(parents=True)
    (tmp_path / "mods" / "sglang" / "__init__.py").write_text("")
    (tmp_path / "mods" / "sglang" / "launch_server.py").write_text(
        "import json, os, sys\nif __name__ == '__main__':\n"
        "    os.write(1, json.dumps([sys.argv, 'SPECGATE_API_KEY' in os.environ, os.getcwd() in sys.path, '' in "
        "sys.path, open('/proc/self/cmdline').read().count('s3cret')]).encode())\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "mods"), "SPECGATE_API_KEY": "s3cret"}
    out = subprocess.run([sys.executable, "-c", BOOTSTRAP, "--model-path", "/m", "--port", "1"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    argv, *rest = json.loads(out)
    assert argv[0].endswith("sglang/launch_server.py")  # run as SGLang's own module
    assert (argv[1:], rest) == (["--model-path", "/m", "--port", "1", "--api-key", "s3cret"], [False, False, False, 0])
    env.pop("SPECGATE_API_KEY")
    out = subprocess.run([sys.executable, "-c", BOOTSTRAP, "--port", "1"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)[0][1:] == ["--port", "1"]


def test_the_bootstrap_writes_the_key_out_of_everything_sglang_logs(tmp_path):
    """SGLang logs its server_args, api_key included: through print, a logging handler, and a forked child, the
    key reaches the log file as <redacted>."""
    (tmp_path / "mods" / "sglang").mkdir(parents=True)
    (tmp_path / "mods" / "sglang" / "__init__.py").write_text("")
    (tmp_path / "mods" / "sglang" / "launch_server.py").write_text(
        "import logging, os, sys\n"
        "key = sys.argv[sys.argv.index('--api-key') + 1]\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "logging.info('server_args=%s', {'api_key': key})\n"
        "print(f'argv: {sys.argv[1:]}', flush=True)\n"
        "if os.fork() == 0:\n"
        "    print(f'child: {key}', file=sys.stderr, flush=True)\n"
        "    os._exit(0)\n"
        "os.wait()\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "mods"), "SPECGATE_API_KEY": "s3cret-key"}
    with open(tmp_path / "server.log", "wb") as log:
        subprocess.run([sys.executable, "-c", BOOTSTRAP, "--port", "1"], env=env, cwd=tmp_path, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    text = (tmp_path / "server.log").read_text()
    assert sorted(text.splitlines()) == ["argv: ['--port', '1', '--api-key', '<redacted>']",
                                         "child: <redacted>", "server_args={'api_key': '<redacted>'}"]


def test_the_environment_is_sglang_s_cpu_engine_offline_with_a_home_of_its_own(tmp_path):
    env = cpu_environment({"PYTHONPATH": "/repo", "VIRTUAL_ENV": "/repo/.venv", "HOME": "/root", "PATH": "/bin"},
                          ServerSite("sglang-r0", "127.0.0.1", str(tmp_path), "/repo", "key"))
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env and env["PATH"] == "/bin"
    assert env["HOME"] == str(tmp_path / "sglang-r0-home") and (tmp_path / "sglang-r0-home").is_dir()
    assert {k: env[k] for k in ("SGLANG_USE_CPU_ENGINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                "OMP_NUM_THREADS")} == {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1",
                                                        "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def test_a_workload_with_ids_outside_the_model_s_vocabulary_is_refused(tmp_path, monkeypatch):
    c = case(tmp_path)  # the case's model has 300 ids; its byte tokenizer's fit
    target = make_target(from_argv(c.argv, {})[0])
    assert make_plan(target)[0].candidates[0].sessions
    big = [Session("s", "mine", None, "offset", "t", {}, (Turn(4, input_ids=(1, 2, 3)),
                                                          Turn(4, suffix_ids=(299, 300))))]
    monkeypatch.setattr(base, "load_sessions", lambda cfg, workload: (big, 0))
    with pytest.raises(ConfigError, match=r"^--suite frozen: the workload sends token id 300, and the model's "
                       r"vocabulary has 300 ids \(a real SGLang scheduler dies on it\): build the workload"):
        target.sessions(target.workload({}))


def test_a_llama_reports_no_interval_and_is_no_candidate_problem():
    llama = server_infos.cpu_llama("/m")
    assert (llama["uses_mamba_radix_cache"], llama["mamba_track_interval"]) == (False, 256)
    assert track_interval(llama) is None
    assert candidate_problem({**llama, "speculative_algorithm": "NGRAM"}, "http://h:1") is None
    hybrid = server_infos.current(16, 4)
    assert track_interval(hybrid) == 16 and candidate_problem(hybrid, "http://h:1") is None
    assert "restart the server with --mamba-radix-cache-strategy extra_buffer" in candidate_problem(
        {**hybrid, "mamba_radix_cache_strategy": "no_buffer"}, "http://h:1")


def test_recorded_server_info_holds_no_key():
    info = {"api_key": "s3cret", "admin_api_key": None, "model_path": "/m",
            "launch_command": "python -m sglang.launch_server --model-path /m --api-key s3cret"}
    assert redacted(info, "s3cret") == {"api_key": "<redacted>", "admin_api_key": None, "model_path": "/m",
                                        "launch_command": "python -m sglang.launch_server --model-path /m --api-key "
                                                          "<redacted>"}
    assert redacted({"api_key": None}, None) == {"api_key": None}


def _flush(statuses: list[int], api_key: str | None = None) -> tuple[list[str], object]:
    """flush_cache against a server answering `statuses` in turn (then 200); (the keys it was sent, outcome)."""
    seen: list[str] = []

    async def handler(request):
        seen.append(request.headers.get("Authorization", ""))
        status = statuses.pop(0) if statuses else 200
        return web.Response(status=status, text="Cache flushed." if status == 200 else "no")

    async def go():
        app = web.Application()
        app.router.add_post("/flush_cache", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as http:
                try:
                    return await flush_cache(http, f"http://127.0.0.1:{port}", api_key, wait=30)
                except RequestError as e:
                    return e
        finally:
            await runner.cleanup()

    return seen, asyncio.run(go())


def test_flush_cache_retries_a_400_only_and_names_the_key_on_a_refusal():
    seen, outcome = _flush([400, 400], "k")
    assert (seen, outcome) == (["Bearer k"] * 3, None)  # requests still running: retried until flushed
    for status in (401, 403, 404):
        seen, outcome = _flush([status])
        assert len(seen) == 1 and isinstance(outcome, RequestError)
        assert str(outcome).endswith(f"/flush_cache refused (HTTP {status}: no); it was sent with no API key: pass "
                                     "the server's key with --api-key (SGLang's /flush_cache takes its --api-key "
                                     "or --admin-api-key)")
    seen, outcome = _flush([409], "k")
    assert len(seen) == 1 and str(outcome).endswith("/flush_cache refused (HTTP 409: no)")


def test_a_qwen3_next_build_writes_its_full_attention_interval(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"layer_types": ["linear_attention"] * 3 + ["full_attention"]}))
    with_interval(path)
    assert json.loads(path.read_text())["full_attention_interval"] == 4
    path.write_text(json.dumps({"layer_types": ["linear_attention"], "full_attention_interval": 2}))
    with_interval(path)  # one the config has is kept
    assert json.loads(path.read_text())["full_attention_interval"] == 2


def test_models_build_takes_either_engine_s_venv(tmp_path, monkeypatch):
    """`python -m harness.models build` needs an interpreter with transformers: --python, else vLLM's venv, else
    SGLang's (a Llama meant for SGLang needs no vLLM)."""
    import harness.targets.venv as venv
    from harness.models.__main__ import interpreter
    from harness.targets.venv import InterpreterNotFound
    from tests.harness.fake_vllm import make_interpreter

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(venv, "repo_root", lambda: tmp_path)
    for name in ("SPECGATE_VLLM_PYTHON", "SPECGATE_SGLANG_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InterpreterNotFound, match=r"^no interpreter with transformers: build one with `make vllm` "
                       r"\(\.venv-vllm\) or `make sglang` \(\.venv-sglang\), or pass --python"):
        interpreter(None)
    sglang = make_interpreter(tmp_path / ".venv-sglang" / "bin")
    assert interpreter(None) == sglang
    vllm = make_interpreter(tmp_path / ".venv-vllm" / "bin")
    assert interpreter(None) == vllm
    assert interpreter(sglang) == sglang  # --python wins
