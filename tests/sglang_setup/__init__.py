"""What `make sglang` needs beyond the registry: the CPU requirement list, the stand-ins, the venv check."""
