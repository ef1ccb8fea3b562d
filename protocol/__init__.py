"""What every stage agrees on: the tokenizer interface and the checkpoint-boundary arithmetic.

Imported by every package, importing none of them (DESIGN.md section 2), so the
engine, the workloads and the analyzer cannot disagree about where a boundary is
or what a token id means.
"""
