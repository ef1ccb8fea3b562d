"""The built-in byte tokenizer as a HF tokenizer directory (tokenizer.json + tokenizer_config.json).

`python -m protocol.byte_export --check` exits 1 when the committed files under
protocol/data/byte_tokenizer/ differ from what this module generates;
`--write [DIR]` (re)writes them. The files are plain JSON built here, not a
`tokenizers` serialization, so they do not change with the library's version.

Encoding: byte-level BPE without merges (GPT-2's byte-to-unicode alphabet), so
each UTF-8 byte b is token id b; `<bos>` `<eos>` `<pad>` `<mask>` are the special
tokens 256..259. The chat template is the server's trivial one
(engine/server/chat.py renders the same text): one `role: content` line per
message, then `assistant: ` when a generation prompt is asked for.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from protocol.tokenizer import BOS_ID, BYTE_TOKENIZER_DIR, EOS_ID, MASK_ID, NUM_BYTES, PAD_ID, SPECIAL_NAMES

# Jinja form of engine/server/chat.py's template (HF apply_chat_template, vLLM --chat-template)
BYTE_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet of the ByteLevel pre-tokenizer."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(NUM_BYTES):
        if b not in table:
            table[b] = chr(NUM_BYTES + extra)
            extra += 1
    return table


def _byte_level() -> dict:
    # use_regex off: no word splitting, every byte is its own piece (there are no merges anyway)
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def tokenizer_doc() -> dict:
    """The tokenizer.json object of the byte tokenizer."""
    alphabet = bytes_to_unicode()
    added = [{"id": i, "content": SPECIAL_NAMES[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in sorted(SPECIAL_NAMES)]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {alphabet[b]: b for b in range(NUM_BYTES)}, "merges": []}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": _byte_level(), "post_processor": None, "decoder": _byte_level(), "model": model}


def tokenizer_config() -> dict:
    """tokenizer_config.json: the special tokens by role and the chat template (transformers reads it)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL_NAMES[BOS_ID],
            "eos_token": SPECIAL_NAMES[EOS_ID], "pad_token": SPECIAL_NAMES[PAD_ID],
            "mask_token": SPECIAL_NAMES[MASK_ID], "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "model_max_length": 2048, "chat_template": BYTE_CHAT_TEMPLATE}


def files() -> dict[str, str]:
    """File name -> exact text of each exported file."""
    return {"tokenizer.json": json.dumps(tokenizer_doc(), indent=1, ensure_ascii=False) + "\n",
            "tokenizer_config.json": json.dumps(tokenizer_config(), indent=1) + "\n"}


def differences(directory: Path = BYTE_TOKENIZER_DIR) -> list[str]:
    """Names of the files in `directory` that are missing or differ from the generated ones."""
    out = []
    for name, text in files().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def write(directory: Path = BYTE_TOKENIZER_DIR) -> None:
    """Write the byte tokenizer's files into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (directory / name).write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m protocol.byte_export", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed files differ")
    p.add_argument("--write", action="store_true", help="write the files")
    p.add_argument("dir", nargs="?", default=str(BYTE_TOKENIZER_DIR), help="target directory")
    args = p.parse_args(argv)
    directory = Path(args.dir)
    if args.write:
        write(directory)
        print(f"wrote {', '.join(files())} to {directory}")
        return 0
    diff = differences(directory)
    if diff:
        print(f"{directory}: {', '.join(diff)} differ from the generator; run python -m protocol.byte_export --write",
              file=sys.stderr)
        return 1
    print(f"{directory}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
