"""Tensor parallelism: the per-replica group (group.py), rank workers and rank 0's runner proxy
(ranks.py), and local rank processes for `python -m engine.serve --tp-size N` (local.py)."""
