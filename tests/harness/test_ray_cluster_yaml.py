"""ray_cluster.yaml (and its AWS variant in comments) passes Ray's own cluster-config validation."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.harness.helpers import REPO

ray_util = pytest.importorskip("ray.autoscaler._private.util")

TEXT = (REPO / "ray_cluster.yaml").read_text()


def validated(config: dict) -> dict:
    """What `ray up` does before contacting any node: fill defaults, then schema + consistency checks."""
    prepared = ray_util.prepare_config(config)
    ray_util.validate_config(prepared)
    return prepared


def test_local_cluster_config_is_valid():
    config = yaml.safe_load(TEXT)
    prepared = validated(config)
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    node_type = prepared["available_node_types"][prepared["head_node_type"]]
    assert node_type["min_workers"] == node_type["max_workers"] == len(config["provider"]["worker_ips"])
    assert any("make venv" in c for c in config["setup_commands"])
    assert any("ray start --head" in c for c in config["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP:6379" in c for c in config["worker_start_ray_commands"])


def test_aws_variant_is_valid_with_the_shared_commands():
    block = re.search(r"# BEGIN AWS\n(.*)# END AWS", TEXT, re.S).group(1)
    aws = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))
    shared = yaml.safe_load(TEXT)
    for key in ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands", "file_mounts"):
        aws[key] = shared[key]
    prepared = validated(aws)
    assert prepared["provider"]["type"] == "aws" and prepared["head_node_type"] == "head"


def test_a_broken_config_is_rejected():
    config = yaml.safe_load(TEXT)
    config["head_start_ray_commands"] = "ray start --head"  # must be a list
    with pytest.raises(Exception, match="is not of type 'array'"):
        validated(config)
