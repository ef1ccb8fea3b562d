"""The tokenizer interface every stage uses, and the built-in engine's byte tokenizer.

Workloads build prompts with the target's tokenizer, the server decodes its
outputs with it and the report shows text through it. The built-in engine's
tokenizer is byte-level: 256 byte tokens plus BOS, EOS, PAD and MASK, so a
prompt of an exact token length is a slice of bytes. The same tokenizer is
committed as a HF tokenizer.json (`BYTE_TOKENIZER_JSON`, written by
`protocol/byte_export.py`), so harness, workloads and reports load every target's
tokenizer the same way (`protocol.hf_tokenizer.load_tokenizer`); the engine keeps
this pure-Python copy for its hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

NUM_BYTES = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
MASK_ID = 259  # the DFlash drafter's placeholder for not-yet-drafted positions
VOCAB_SIZE = 260

SPECIAL_NAMES = {BOS_ID: "<bos>", EOS_ID: "<eos>", PAD_ID: "<pad>", MASK_ID: "<mask>"}

BYTE_TOKENIZER_DIR = Path(__file__).resolve().parent / "data" / "byte_tokenizer"
BYTE_TOKENIZER_JSON = BYTE_TOKENIZER_DIR / "tokenizer.json"  # what /server_info reports as tokenizer_path


class TokenizerError(ValueError):
    """A tokenizer cannot be loaded, or ids / text do not fit it; the message says what to do."""


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


def check_ids(tokenizer: Tokenizer, ids: Sequence[int], where: str = "input_ids") -> None:
    """Raise TokenizerError naming the first id outside `tokenizer`'s vocabulary (0..vocab_size-1)."""
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < tokenizer.vocab_size:
            raise TokenizerError(f"{where}[{i}]: token id {t!r} is outside the vocabulary of tokenizer "
                                 f"{tokenizer.name} (0..{tokenizer.vocab_size - 1})")


def cut_ids(tokenizer: Tokenizer, text: str, length: int) -> list[int]:
    """The first `length` token ids of `text` in `tokenizer` (exactly that many, or TokenizerError)."""
    ids = tokenizer.encode(text)
    if len(ids) < length:
        raise TokenizerError(f"the text has {len(ids)} tokens in tokenizer {tokenizer.name}, fewer than the "
                             f"{length} asked for; give a longer text")
    return ids[:length]


def cut_text(tokenizer: Tokenizer, text: str, length: int, slack: int = 64) -> str:
    """The longest prefix of `text` that encodes to exactly `length` tokens in `tokenizer`.

    Unlike decode(cut_ids(...)), the result round-trips: encode(result) has `length`
    tokens, so it can be sent as text. A prefix's token count is not monotone in
    its character count under BPE (a merge can break), so after a bisection the
    last `slack` candidates are checked one by one; TokenizerError if none fits.
    """
    def n_tokens(k: int) -> int:
        return len(tokenizer.encode(text[:k]))

    if n_tokens(len(text)) < length:
        raise TokenizerError(f"the text has {n_tokens(len(text))} tokens in tokenizer {tokenizer.name}, fewer "
                             f"than the {length} asked for; give a longer text")
    lo, hi = 0, len(text)  # invariant: n_tokens(lo) <= length (n_tokens(0) == 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n_tokens(mid) <= length:
            lo = mid
        else:
            hi = mid - 1
    for k in range(lo, max(lo - slack, 0) - 1, -1):
        if n_tokens(k) == length:
            return text[:k]
    raise TokenizerError(f"no prefix of the text encodes to exactly {length} tokens in tokenizer "
                         f"{tokenizer.name}; use cut_ids (token ids) instead")
