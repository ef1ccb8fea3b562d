"""Choosing the target by key, the backend a started target implies, the venv lookup any engine with a venv of its
own uses, and the environments replica actors give their servers."""

from __future__ import annotations

import pytest

from harness.cli import from_argv
from harness.config import ConfigError
from harness.replica import ServerSite, project_environment
from harness.targets import TARGETS, run_config, target_key
from harness.targets import vllm as vllm_target
from harness.targets.venv import InterpreterNotFound, Venv, find_python
from tests.harness.fake_vllm import make_interpreter

OTHER = Venv("OtherEngine", "--other-python", "SPECGATE_OTHER_PYTHON", (".venv-other/bin/python",),
             "`make other`")
SITE = ServerSite("vllm-r0", "127.0.0.1", "/logs", "/repo", "key")


@pytest.mark.parametrize("argv, key", [
    ([], "builtin"),
    (["--endpoint", "http://h:1", "--reference-endpoint", "http://h:2"], "endpoints"),
    (["--engine", "builtin", "--endpoint", "http://h:1", "--reference-endpoint", "http://h:2"], "endpoints"),
])
def test_the_target_is_the_engine_or_the_endpoints(argv, key):
    assert target_key(from_argv(argv, {})[0]) == key


def test_a_started_target_given_endpoints_refuses_them_itself(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="^--engine vllm starts vLLM replicas under Ray; for already-running"):
        from_argv(["--engine", "vllm", "--model", str(tmp_path), "--endpoint", "http://h:1"], {})


def test_each_started_target_implies_its_backend_and_an_unknown_engine_is_refused():
    assert [TARGETS[k].settings_class.default_backend for k in ("builtin", "vllm", "endpoints")] == \
        ["sglang", "openai", "sglang"]
    with pytest.raises(ConfigError, match=r"^--engine must be one of builtin, vllm, sglang, got 'x'"):
        run_config(engine="x")  # a TOML file can give any string
    with pytest.raises(ConfigError, match=r"^--engine must be one of builtin, vllm, sglang, got 'endpoints'"):
        run_config(engine="endpoints")  # chosen by --endpoint, not by name


def test_find_python_for_any_engine_says_its_own_flag_and_build(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InterpreterNotFound, match=r"^no OtherEngine interpreter at .*\.venv-other/bin/python: build "
                       r"one with `make other`, or pass --other-python /path/to/venv/bin/python"):
        find_python(OTHER, None, {})
    fake = make_interpreter(tmp_path / "bin")
    assert find_python(OTHER, None, {"SPECGATE_OTHER_PYTHON": fake}) == fake
    make_interpreter(tmp_path / ".venv-other" / "bin")  # the conventional venv in the working directory
    assert find_python(OTHER, None, {}) == str(tmp_path / ".venv-other" / "bin" / "python")
    assert find_python(OTHER, fake, {"SPECGATE_OTHER_PYTHON": "/nope"}) == fake  # the flag wins


def test_the_project_environment_puts_the_tree_first_and_vllm_s_keeps_it_out():
    assert project_environment({"PYTHONPATH": "/x"}, SITE)["PYTHONPATH"] == "/repo:/x"
    assert project_environment({}, ServerSite("r", "h", "/l", None, None)) == {}
    env = vllm_target.environment({"PYTHONPATH": "/repo", "HOME": "/h"}, SITE)
    assert "PYTHONPATH" not in env and env["HOME"] == "/h" and env["VLLM_API_KEY"] == "key"
    assert env["VLLM_CACHE_ROOT"] == "/logs/vllm-r0-cache" and env["VLLM_HOST_IP"] == "127.0.0.1"
