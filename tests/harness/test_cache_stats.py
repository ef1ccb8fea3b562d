"""Cache counters from Prometheus text, and their per-sweep-point differences."""

from __future__ import annotations

from harness.backends.metrics import counters, parse_prometheus
from harness.cache_stats import cache_counters, stats_records
from records.schema import counter_deltas

TEXT = """# HELP specgate_cached_tokens_total Prompt tokens served from the radix cache.
# TYPE specgate_cached_tokens_total counter
specgate_cached_tokens_total 512.0
specgate_checkpoint_evictions_total 3.0
sglang:cached_tokens_total{model_name="m",cache_source="device"} 10
sglang:cached_tokens_total{model_name="m",cache_source="host"} 5
not a metric line
"""


def test_parse_sums_label_sets_and_skips_comments_and_junk():
    m = counters(parse_prometheus(TEXT))
    assert m == {"specgate_cached_tokens_total": 512.0, "specgate_checkpoint_evictions_total": 3.0,
                 "sglang:cached_tokens_total": 15.0}


def test_counters_map_metric_names_and_say_none_when_unexposed():
    assert cache_counters(counters(parse_prometheus(TEXT))) == {"cache_hit_tokens": 512.0, "checkpoint_evictions": 3.0,
                                                      "kv_evicted_pages": None}
    sglang = counters(parse_prometheus('sglang:cached_tokens_total{cache_source="device"} 7\n'))
    assert cache_counters(sglang) == {"cache_hit_tokens": 7.0, "checkpoint_evictions": None,
                                      "kv_evicted_pages": None}
    assert cache_counters(None) == dict.fromkeys(("cache_hit_tokens", "checkpoint_evictions", "kv_evicted_pages"))


def test_deltas_are_unknown_when_a_counter_is_missing_or_went_back():
    before = {"cache_hit_tokens": 100.0, "checkpoint_evictions": 5.0, "kv_evicted_pages": None}
    after = {"cache_hit_tokens": 356.0, "checkpoint_evictions": 2.0, "kv_evicted_pages": 4.0}
    assert counter_deltas(before, after) == {"cache_hit_tokens": 256, "checkpoint_evictions": None,
                                             "kv_evicted_pages": None}


def test_one_stats_record_per_replica_seen_before():
    c = {"cache_hit_tokens": 1.0, "checkpoint_evictions": 0.0, "kv_evicted_pages": 0.0}
    recs = stats_records(run_id="r", pool="i128", concurrency=4, before={"i128-r1": c, "i128-r0": c},
                         after={"i128-r0": {**c, "cache_hit_tokens": 9.0}}, t_start=1.0, t_end=2.0, partial=True)
    assert [r["key"] for r in recs] == ["stats/i128-c4/i128-r0", "stats/i128-c4/i128-r1"]
    assert recs[0]["counters"] == {"cache_hit_tokens": 8, "checkpoint_evictions": 0, "kv_evicted_pages": 0}
    assert recs[1]["counters"] == dict.fromkeys(c)  # the replica was gone by the end of the point
    assert recs[0]["role"] == "stats" and recs[0]["partial"] is True
