"""SGLang's test setup: what `make sglang` needs beyond the registry (the CPU requirement list, the stand-ins, the
venv check, the check of the release's hybrid patch set), the hybrid path on CPU (hybrid/: the patch sets, the
torch CPU ops, serve.py), the trained model and drafter it serves (model/), and the test servers (server.py)."""
