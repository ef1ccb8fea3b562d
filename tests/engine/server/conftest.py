"""One real server subprocess per configuration, shared by the whole session."""

from __future__ import annotations

import pytest

from tests.engine.server.client import API_KEY, Server

# DFlash with a small checkpoint interval: turn 2 of a session hits the radix cache at 128 tokens
MAIN_ARGS = ["--speculative-algorithm", "DFLASH", "--mamba-track-interval", "64", "--page-size", "16",
             "--max-body-bytes", "65536"]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = Server(MAIN_ARGS, tmp_path_factory.mktemp("server") / "main.log", api_key=API_KEY)
    yield srv
    srv.stop()
