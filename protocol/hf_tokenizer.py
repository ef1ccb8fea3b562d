"""Loading a target's tokenizer: a HF tokenizer.json, a model directory, or the built-in byte tokenizer.

`load_tokenizer(path_or_name)` is the one entry point. It returns a `Tokenizer`
(protocol/tokenizer.py) backed by HF `tokenizers`; a model directory without a
tokenizer.json (a sentencepiece model, say) goes through `transformers`'
AutoTokenizer when that package is installed (it is not a dependency). Nothing
is downloaded: a hub name is looked up only in the local HF cache, through
transformers. "byte" is the built-in engine's tokenizer, loaded from its
committed tokenizer.json like any other.

Text is encoded without special-token parsing: "<eos>" typed in a prompt is five
characters, not the EOS token, so prompt text can never smuggle a control token.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from protocol.tokenizer import BYTE_TOKENIZER_JSON, TokenizerError, check_ids

BYTE = "byte"
HOW_TO = ("pass the path of a tokenizer.json or of a local model directory (holding tokenizer.json, or "
          "tokenizer files that the optional transformers package can read); nothing is downloaded")


def _token_text(value) -> str | None:
    """A special token's text from tokenizer_config.json (a string or an AddedToken-like object)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class HFTokenizer:
    """A `Tokenizer` over a HF `tokenizers.Tokenizer` (one tokenizer.json)."""

    def __init__(self, tok, name: str, eos_id: int | None) -> None:
        self._tok = tok
        self._tok.encode_special_tokens = True  # prompt text stays text, see the module doc
        self.name = name
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0  # ids may have holes; the largest one counts
        self.eos_id = eos_id

    @classmethod
    def from_file(cls, path: Path, name: str | None = None) -> HFTokenizer:
        """Load one tokenizer.json; the EOS id comes from tokenizer_config.json / config.json beside it."""
        from tokenizers import Tokenizer as RustTokenizer

        try:
            tok = RustTokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exception for a malformed file
            raise TokenizerError(f"tokenizer {path}: not a readable HF tokenizer.json ({e}); {HOW_TO}") from None
        return cls(tok, name or _name_of(path), _eos_id(tok, path.parent))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], keep_special: bool = False) -> str:
        """Text of `ids`; special tokens dropped unless `keep_special`; TokenizerError on unknown ids."""
        ids = [int(t) for t in ids]
        check_ids(self, ids, "ids")
        return self._tok.decode(ids, skip_special_tokens=not keep_special)

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (its raw piece, e.g. 'Ġthe'), or None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The raw vocabulary piece of `token_id`, or None."""
        return self._tok.id_to_token(token_id)


class TransformersTokenizer:
    """A `Tokenizer` over a transformers tokenizer (model directories without tokenizer.json)."""

    def __init__(self, tok, name: str) -> None:
        self._tok = tok
        self.name = name
        self.vocab_size = len(tok)
        self.eos_id = tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens (special-token strings stay text)."""
        return list(self._tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def decode(self, ids: Iterable[int], keep_special: bool = False) -> str:
        """Text of `ids`; special tokens dropped unless `keep_special`."""
        ids = [int(t) for t in ids]
        check_ids(self, ids, "ids")
        return self._tok.decode(ids, skip_special_tokens=not keep_special)


def _name_of(path: Path) -> str:
    """'byte' for the built-in tokenizer's file (wherever it was copied to), else the path."""
    try:
        same = path.resolve() == BYTE_TOKENIZER_JSON or path.stat().st_size == BYTE_TOKENIZER_JSON.stat().st_size \
            and _read_json(path) == _read_json(BYTE_TOKENIZER_JSON)
    except OSError:
        same = False
    return BYTE if same else str(path)


def _eos_id(tok, directory: Path) -> int | None:
    """EOS from tokenizer_config.json's eos_token, else config.json / generation_config.json's eos_token_id."""
    text = _token_text(_read_json(directory / "tokenizer_config.json").get("eos_token"))
    if text is not None and tok.token_to_id(text) is not None:
        return tok.token_to_id(text)
    for name in ("generation_config.json", "config.json"):
        eos = _read_json(directory / name).get("eos_token_id")
        if isinstance(eos, list) and eos:
            eos = eos[0]
        if isinstance(eos, int) and not isinstance(eos, bool):
            return eos
    return None


def _with_transformers(spec: str, what: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TokenizerError(f"tokenizer {spec}: {what}, and reading it needs the optional transformers package "
                             f"(pip install transformers); or {HOW_TO}") from None
    try:
        tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many types (OSError, ValueError, ...)
        raise TokenizerError(f"tokenizer {spec}: transformers could not load it from local files ({e}); "
                             f"{HOW_TO}") from None
    return TransformersTokenizer(tok, spec)


def load_tokenizer(spec: str | Path):
    """The tokenizer named by `spec`: 'byte', a tokenizer.json, a model directory, or a locally cached hub name.

    Raises TokenizerError saying what was looked for and how to pass a usable one.
    """
    text = str(spec)
    if text == BYTE:
        return HFTokenizer.from_file(BYTE_TOKENIZER_JSON, BYTE)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix != ".json":
            return _with_transformers(text, "it is not a tokenizer.json")
        return HFTokenizer.from_file(path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return HFTokenizer.from_file(path / "tokenizer.json")
        return _with_transformers(text, "the directory has no tokenizer.json")
    if path.exists():
        raise TokenizerError(f"tokenizer {text}: not a regular file or directory; {HOW_TO}")
    if text.startswith((".", "/", "~")) or text.endswith(".json") or text.count("/") > 1:
        raise TokenizerError(f"tokenizer {text}: no such file or directory; {HOW_TO}")
    return _with_transformers(text, "no such file or directory (looked for it as a hub name in the local cache)")
