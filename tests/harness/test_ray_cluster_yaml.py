"""The cluster files pass Ray's own cluster-config validation, with their variants in comments (ray_cluster.yaml:
on-prem CPU nodes, AWS in comments; ray_cluster_gpu.yaml: AWS GPU nodes, your own GPU hosts in comments), and every
setup and start command they run exists: each `make` target in the Makefile, each program on a node either a
standard one or what `make venv` puts in the project venv; none hides a failure behind `|| true`."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from tests.harness.helpers import REPO

ray_util = pytest.importorskip("ray.autoscaler._private.util")

CPU_TEXT = (REPO / "ray_cluster.yaml").read_text()
GPU_TEXT = (REPO / "ray_cluster_gpu.yaml").read_text()
COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands")
SHARED_KEYS = ("file_mounts", "cluster_synced_files", "rsync_exclude", "rsync_filter", *COMMAND_KEYS)
STANDARD = {"cd", "test", "grep", "echo", "ulimit", "mkdir"}  # shell builtins and coreutils every node has
VENV_PROGRAMS = {"ray", "python", "pip"}  # in ~/specgate/.venv/bin once `make venv` / `make venv-gpu` ran


def validated(config: dict) -> dict:
    """What `ray up` does before contacting any node: fill defaults, then schema + consistency checks."""
    prepared = ray_util.prepare_config(config)
    ray_util.validate_config(prepared)
    return prepared


def variant(text: str, name: str) -> dict:
    """The commented-out `# BEGIN name` block with the file's shared keys (sync, setup, start commands)."""
    block = re.search(rf"# BEGIN {name}\n(.*)# END {name}", text, re.S).group(1)
    config = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))
    shared = yaml.safe_load(text)
    return {**config, **{k: shared[k] for k in SHARED_KEYS}}


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))


def simple_commands(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at &&, ||, ;), as words."""
    return [shlex.split(part) for part in re.split(r"&&|\|\||;", command) if part.strip()]


def check_commands(config: dict) -> None:
    targets = makefile_targets()
    for key in COMMAND_KEYS:
        for command in config.get(key) or []:
            assert not re.search(r"\|\|\s*true", command), f"{key}: {command!r} hides a failure"
            for words in simple_commands(command):
                program = words[0]
                if program == "make":
                    named = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
                    assert named and set(named) <= targets, f"{key}: make {named}: not all in the Makefile"
                    for assignment in (w for w in words[1:] if w.startswith("GPU_ENGINES=")):
                        assert set(assignment.split("=", 1)[1].split()) <= targets, assignment
                elif program.startswith("~/specgate/"):
                    path = program.removeprefix("~/specgate/")
                    assert (REPO / path).exists() or path.startswith(".venv/bin/") and \
                        path.rsplit("/", 1)[1] in VENV_PROGRAMS, f"{key}: {program} is not made on a node"
                else:
                    assert program in STANDARD, f"{key}: {program} is not a program every node has"


def test_cpu_cluster_config_is_valid_and_runs_what_exists():
    config = yaml.safe_load(CPU_TEXT)
    prepared = validated(config)
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    node_type = prepared["available_node_types"][prepared["head_node_type"]]
    assert node_type["min_workers"] == node_type["max_workers"] == len(config["provider"]["worker_ips"])
    assert config["file_mounts"] == {"~/specgate": "."}  # the tree `ray up` runs from, not a clone to pull
    assert any("make venv" in c for c in config["setup_commands"])
    assert any("ray start --head" in c for c in config["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP:6379" in c for c in config["worker_start_ray_commands"])
    check_commands(config)


def test_cpu_aws_variant_is_valid_with_the_shared_commands():
    prepared = validated(variant(CPU_TEXT, "AWS"))
    assert prepared["provider"]["type"] == "aws" and prepared["head_node_type"] == "head"


def test_gpu_cluster_config_is_valid_and_builds_the_gpu_venvs():
    config = yaml.safe_load(GPU_TEXT)
    prepared = validated(config)
    assert prepared["provider"]["type"] == "aws"
    workers = prepared["available_node_types"]["gpu_worker"]
    assert workers["min_workers"] == workers["max_workers"] == 2
    assert config["file_mounts"] == {"~/specgate": "."} and "**/.venv*" in config["rsync_exclude"]
    setup = " ".join(config["setup_commands"])
    assert "make venv-gpu gpu-engines" in setup and 'GPU_ENGINES="sglang-gpu vllm-gpu"' in setup
    check_commands(config)


def test_gpu_local_variant_is_valid_with_the_shared_commands():
    config = variant(GPU_TEXT, "LOCAL")
    prepared = validated(config)
    assert prepared["provider"]["type"] == "local" and len(config["provider"]["worker_ips"]) == 2
    check_commands(config)


def test_a_broken_config_is_rejected_and_a_hidden_failure_is_caught():
    config = yaml.safe_load(CPU_TEXT)
    config["head_start_ray_commands"] = "ray start --head"  # must be a list
    with pytest.raises(Exception, match="is not of type 'array'"):
        validated(config)
    for bad in ("cd ~/specgate && git pull --ff-only || true", "cd ~/specgate && make venv-cuda"):
        with pytest.raises(AssertionError):
            check_commands({"setup_commands": [bad]})
