"""`other_server`: a replica whose server reports other identity settings than its pool started it with is another
server; settings are compared by meaning, so SGLang's spellings (no speculation as null) are not contradictions."""

from harness.targets.base import other_server

STARTED = {"speculative_algorithm": "NONE", "disable_radix_cache": True, "inject_fault": None,
           "mamba_track_interval": 128, "dtype": "float32", "tp_size": 1}


def test_the_same_settings_spelled_otherwise_are_the_same_server():
    said = {"speculative_algorithm": None, "disable_radix_cache": 1, "inject_fault": "", "mamba_track_interval": "128",
            "dtype": "float32", "tp_size": None}
    assert other_server("reference", "http://r", said, STARTED) is None
    assert other_server("reference", "http://r", {}, STARTED) is None  # what a server does not report is not compared


def test_a_neighbour_s_settings_name_the_pool_and_the_setting():
    candidate = dict(STARTED, speculative_algorithm="DFLASH", disable_radix_cache=False)
    problem = other_server("reference", "http://r", candidate, STARTED)
    assert problem == ("pool reference: the server at http://r reports speculative_algorithm 'DFLASH', where this "
                       "pool's replicas were started with 'NONE': another server answers there")
    faulty = dict(STARTED, inject_fault="stale-seq-lens")
    assert "inject_fault 'stale-seq-lens'" in other_server("i128", "http://c", faulty, STARTED)
    assert "tp_size 2" in other_server("i128", "http://c", dict(STARTED, tp_size=2), STARTED)
