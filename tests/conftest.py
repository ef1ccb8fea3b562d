"""The suite's order: the end-to-end files first. `make test` runs the suite in several pytest-xdist processes, a
file per process at a time, in this order; the longest files starting first leaves the short ones to fill in
behind them, instead of one process running a long file alone at the end."""

from __future__ import annotations

SLOW_FIRST = ("tests/e2e/", "tests/harness/test_sglang_contract.py", "tests/harness/test_vllm_engine.py",
              "tests/harness/test_broken_engine.py", "tests/harness/test_real_engine.py")  # a minute or more each


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(SLOW_FIRST))  # stable: the order within each part
