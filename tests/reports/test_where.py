"""The report's first answer (reports/html_where.py): restore kinds read differentially, the cell grids, the links."""

from __future__ import annotations

import pandas as pd

from reports.html_where import cell_grids, kind_table, reading, restore_kind, where_section


def frame(rows: list[tuple]) -> pd.DataFrame:
    """(cached_tokens, restored_link, block_size, class, step, commit) rows of a gated pool at interval 128."""
    df = pd.DataFrame(rows, columns=["cached_tokens", "restored_link", "block_size", "class",
                                     "restored_crossing_step", "restored_crossing_commit_len"])
    df["restored_verify_crossed"] = df["restored_link"].eq("verify")
    df["interval"] = 128
    return df


STALE = frame([(128, "verify", 8, "hard", 0, 1), (128, "verify", 8, "drift", 1, 3), (128, "verify", 8, "drift", 0, 1),
               (64, "prefill", 8, "exact", None, None), (0, None, 8, "exact", None, None),
               (0, None, 8, "soft", None, None), (128, "none", 8, "exact", None, None)])


def test_each_request_has_one_restore_kind():
    assert [restore_kind(r) for r in [
        {"cached_tokens": 0}, {"cached_tokens": float("nan")}, {"cached_tokens": 128, "restored_link": "verify"},
        {"cached_tokens": 128, "restored_link": "position", "block_size": 8},
        {"cached_tokens": 128, "restored_link": "position", "block_size": float("nan")},
        {"cached_tokens": 64, "restored_link": "prefill"}, {"cached_tokens": 128, "restored_link": "none"},
        {"cached_tokens": 128, "restored_link": None}]] == \
        ["nothing", "nothing", "verify", "generated", "decode", "prefill", "other", "other"]


def test_the_reading_sets_the_kinds_that_flagged_beside_those_that_stayed_exact():
    kinds = kind_table(STALE)
    assert kinds[["kind", "n", "flagged", "soft", "exact"]].values.tolist() == [
        ["verify", 3, 3, 0, 0], ["prefill", 1, 0, 0, 1], ["other", 1, 0, 0, 1], ["nothing", 2, 0, 1, 1]]
    text = reading(kinds)
    assert text.startswith("Every flagged request (3) restored a checkpoint that their previous turn crossed inside "
                           "a verify step (all 3 that did); the 1 that restored a checkpoint that their previous "
                           "turn's prefill took were exact")
    assert "of the 2 that restored nothing, none was flagged" in text  # one soft flip among them


def test_flags_in_two_kinds_are_both_named_and_none_flagged_says_so():
    mixed = frame([(128, "verify", 8, "hard", 0, 1), (0, None, 8, "drift", None, None), (0, None, 8, "exact", None,
                                                                                         None)])
    assert reading(kind_table(mixed)) == ("2 flagged requests: 1 of 1 that restored a checkpoint that their previous "
                                          "turn crossed inside a verify step, 1 of 2 that restored nothing.")
    clean = frame([(0, None, 8, "exact", None, None)])
    assert reading(kind_table(clean)) == "No request was flagged: 1 restored nothing."


def test_the_cell_grid_marks_flagged_exact_unreached_and_impossible_cells():
    html = cell_grids(STALE)
    assert '<td class="cell bad">2/2</td>' in html  # step 0, commit 1: both flagged
    assert '<td class="cell bad">1/1</td>' in html  # step 1, commit 3
    assert html.count('class="cell na"') == 8 * 7 // 2  # step >= commit length: the boundary cannot lie there
    assert "interval 128" in html and "not reached" in html
    assert cell_grids(frame([(0, None, 8, "exact", None, None)])) == ""  # nothing verify-crossed: no grid


def test_the_section_links_the_worst_cases_and_names_the_subsystem():
    html = where_section(STALE, "The evidence points at the restored checkpoints", [("case-1", "HARD a/1: x")])
    assert '<a href="#case-1">HARD a/1: x</a>' in html and "Most likely:</b> The evidence points" in html
    assert html.index("Every flagged request") < html.index("Most likely") < html.index("case-1")


def test_the_placement_section_lists_each_replica_and_rank_with_its_devices():
    from reports.html_sections import placement_section

    seat = {"node_ip": "10.0.0.2", "node_id": "abcdef123456", "gpu_ids": ["0"], "cuda_visible_devices": "0",
            "device": "NVIDIA H100"}
    config = {"pools": {"i128": {"replicas": [{"replica_id": "i128-r0", "placement": {
        **seat, "ranks": [{**seat, "gpu_ids": ["1"], "cuda_visible_devices": "1"}]}}]},
        "reference": {"replicas": [{"replica_id": "reference-r0"}]}}}  # a run from before placements were kept
    html = placement_section(config)
    assert html.count("<tr") == 3 and "10.0.0.2 (abcdef12)" in html and "&#x27;1&#x27;" in html
    assert placement_section({"pools": {}}) == ""
