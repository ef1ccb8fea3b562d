"""Installs the hybrid patch set (hybrid_hook.py) in every Python process started with this directory on
PYTHONPATH and SPECGATE_HYBRID_PATCH=1: SGLang's scheduler and detokenizer are spawned children. Test setup only."""

import os

if os.environ.get("SPECGATE_HYBRID_PATCH") == "1":
    import hybrid_hook

    hybrid_hook.install()
