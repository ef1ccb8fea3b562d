"""The analysis as Ray tasks on a two-node local cluster (reports/analyze_pass.py) gives what one process gives."""

from __future__ import annotations

import pandas as pd
import pytest
import ray
from ray.cluster_utils import Cluster

from records.compact import compact_run
from reports.analyze_run import analyze_run
from reports.render import render_run
from tests.reports.factory import synthetic_run

OUTPUTS = ("requests.csv", "boundaries.csv", "configs.csv", "coverage.csv", "tree_shapes.csv", "junit.xml",
           "summary.md", "report.html")


def test_the_analysis_on_a_two_node_cluster_equals_the_one_process_analysis(tmp_path):
    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=1, intervals=(64, 128, 256))
    compact_run(run_dir)
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        got, want = analyze_run(run_dir, cluster=cluster.address), analyze_run(run_dir)
        assert len(want.df) and (want.df["class"] == "hard").any() and want.df["restored_link"].notna().any()
        pd.testing.assert_frame_equal(got.df, want.df)
        pd.testing.assert_frame_equal(got.latency, want.latency)
        pd.testing.assert_frame_equal(got.shapes, want.shapes)
        assert (got.facts, got.run_id, got.cache_lost, got.stats, got.references) == \
            (want.facts, want.run_id, want.cache_lost, want.stats, want.references)

        one = render_run(run_dir)
        alone = {name: (run_dir / name).read_bytes() for name in OUTPUTS}
        on_cluster = render_run(run_dir, cluster=cluster.address)
        assert on_cluster.headline == one.headline and on_cluster.exit_code == one.exit_code == 1
        for name in OUTPUTS:
            assert (run_dir / name).read_bytes() == alone[name], name
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_records_still_in_journals_are_refused_before_any_cluster_is_joined(tmp_path):
    run_dir = synthetic_run(tmp_path / "run", fault=False)
    assert not ray.is_initialized()
    with pytest.raises(ValueError, match="compact them first"):
        analyze_run(run_dir, cluster="local")
    assert not ray.is_initialized()
