"""The tokenizer interface every stage uses, and the built-in engine's byte tokenizer.

Workloads build prompts with the target's tokenizer, the server decodes its
outputs with it and the report shows text through it. The built-in engine's
tokenizer is byte-level: 256 byte tokens plus BOS, EOS, PAD and MASK, so a
prompt of an exact token length is a slice of bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

NUM_BYTES = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
MASK_ID = 259  # the DFlash drafter's placeholder for not-yet-drafted positions
VOCAB_SIZE = 260

SPECIAL_NAMES = {BOS_ID: "<bos>", EOS_ID: "<eos>", PAD_ID: "<pad>", MASK_ID: "<mask>"}


@runtime_checkable
class Tokenizer(Protocol):
    """What specgate needs of a target's tokenizer."""

    name: str  # "byte", or where it was loaded from
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""
        ...

    def decode(self, ids: Iterable[int], keep_special: bool = False) -> str:
        """Text of `ids`; special tokens dropped unless `keep_special`."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens; special ids sit above 255."""

    name = "byte"
    vocab_size = VOCAB_SIZE
    bos_id = BOS_ID
    eos_id = EOS_ID
    pad_id = PAD_ID
    mask_id = MASK_ID

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of `text` (its UTF-8 bytes), optionally after a BOS."""
        ids = list(text.encode("utf-8"))
        return [BOS_ID] + ids if add_bos else ids

    def decode(self, ids: Iterable[int], keep_special: bool = False) -> str:
        """Text of `ids`; special tokens are dropped unless `keep_special`.

        Invalid UTF-8 (a multi-byte character cut by a length limit) decodes with
        U+FFFD replacement characters instead of failing.
        """
        out: list[str] = []
        buf = bytearray()
        for t in ids:
            t = int(t)
            if 0 <= t < NUM_BYTES:
                buf.append(t)
                continue
            if t not in SPECIAL_NAMES:
                raise ValueError(f"token id {t} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
            if keep_special:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                out.append(SPECIAL_NAMES[t])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


BYTE_TOKENIZER = ByteTokenizer()
