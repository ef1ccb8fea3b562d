"""The distribution this stand-in installs as (tests/sglang_setup/venv.py reads these two names)."""

DIST = "sgl-kernel-specgate-standin"  # not `sglang-kernel`: nothing may mistake it for the real kernels
VERSION = "0.0.0"
