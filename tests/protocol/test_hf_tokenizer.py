"""The tokenizer layer: the exported byte tokenizer.json, load_tokenizer, and exact-length cuts in a trained BPE."""

from __future__ import annotations

import json
import random
import shutil
import sys
import types

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from protocol import byte_export
from protocol.hf_tokenizer import HFTokenizer, load_tokenizer
from protocol.tokenizer import (
    BYTE_TOKENIZER,
    BYTE_TOKENIZER_JSON,
    EOS_ID,
    NUM_BYTES,
    SPECIAL_NAMES,
    VOCAB_SIZE,
    TokenizerError,
    check_ids,
    cut_ids,
    cut_text,
)
from protocol.tokenizer import (
    Tokenizer as TokenizerProtocol,
)
from workloads.corpus import HELDOUT_PATH

HELDOUT = HELDOUT_PATH.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def hf_byte():
    return load_tokenizer("byte")


def test_committed_byte_tokenizer_matches_the_generator(tmp_path):
    assert byte_export.differences() == []
    assert byte_export.main(["--check"]) == 0
    byte_export.write(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert byte_export.differences(tmp_path) == ["tokenizer.json"]
    assert byte_export.main(["--check", str(tmp_path)]) == 1


def test_byte_tokenizer_json_identity(hf_byte, tmp_path):
    assert isinstance(hf_byte, TokenizerProtocol)
    assert (hf_byte.name, hf_byte.vocab_size, hf_byte.eos_id) == ("byte", VOCAB_SIZE, EOS_ID)
    assert load_tokenizer(BYTE_TOKENIZER_JSON).name == "byte"
    assert load_tokenizer(BYTE_TOKENIZER_JSON.parent).name == "byte"
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copy(BYTE_TOKENIZER_JSON, copy)
    assert load_tokenizer(copy).name == "byte"  # a copy of the exported file is still the byte tokenizer
    doc = json.loads(BYTE_TOKENIZER_JSON.read_text())
    doc["added_tokens"][0]["content"] = "<s>"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    changed = load_tokenizer(other)
    assert changed.name == str(other) and changed.eos_id is None  # no tokenizer_config.json beside it


def test_every_single_id_decodes_like_the_byte_tokenizer(hf_byte):
    for t in range(VOCAB_SIZE):
        for keep in (False, True):
            assert hf_byte.decode([t], keep_special=keep) == BYTE_TOKENIZER.decode([t], keep_special=keep), t


def test_random_id_sequences_decode_like_the_byte_tokenizer(hf_byte):
    rng = random.Random(0)
    pool = list(range(NUM_BYTES)) + list(SPECIAL_NAMES) * 8 + [0xE2, 0x9C, 0x93, 0xF0, 0x9F, 0x9A, 0x80] * 8
    for _ in range(2000):
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 24))]
        for keep in (False, True):
            assert hf_byte.decode(ids, keep_special=keep) == BYTE_TOKENIZER.decode(ids, keep_special=keep), ids


@pytest.mark.parametrize("text", ["", "hello, world", "def f(x):\n    return x\n", "héllo wörld ✓ 日本語 🚀",
                                  "<eos><bos> literal specials stay text <mask>", " \t\r\n ", "\x00\x7f"])
def test_encode_is_utf8_bytes(hf_byte, text):
    assert hf_byte.encode(text) == BYTE_TOKENIZER.encode(text) == list(text.encode("utf-8"))


def test_encode_agrees_on_the_heldout_text(hf_byte):
    chunk = HELDOUT[:20000]
    assert hf_byte.encode(chunk) == BYTE_TOKENIZER.encode(chunk)


def test_ids_are_checked_against_the_vocabulary(hf_byte):
    check_ids(hf_byte, [0, 259])
    with pytest.raises(TokenizerError, match=r"input_ids\[1\]: token id 260 is outside the vocabulary of "
                                             r"tokenizer byte \(0\.\.259\)"):
        check_ids(hf_byte, [1, 260])
    with pytest.raises(TokenizerError, match=r"prompt\[0\]: token id -1"):
        check_ids(BYTE_TOKENIZER, [-1], "prompt")
    with pytest.raises(TokenizerError, match=r"ids\[0\]: token id 151644 is outside"):
        hf_byte.decode([151644])


def test_load_errors_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as on a machine without transformers
    with pytest.raises(TokenizerError, match=r"no such file or directory; pass the path of a tokenizer\.json"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerError, match=r"bad\.json: not a readable HF tokenizer\.json"):
        load_tokenizer(bad)
    (tmp_path / "model").mkdir()
    with pytest.raises(TokenizerError, match=r"the directory has no tokenizer\.json, and reading it needs the "
                                             r"optional transformers package"):
        load_tokenizer(tmp_path / "model")
    with pytest.raises(TokenizerError, match=r"Qwen/Qwen3-8B: no such file or directory \(looked for it as a hub "
                                             r"name in the local cache\), and reading it needs"):
        load_tokenizer("Qwen/Qwen3-8B")


class FakeAutoTokenizer:
    """Stands in for transformers' AutoTokenizer: a model directory with a sentencepiece-like vocabulary."""

    loaded: list = []

    def __init__(self) -> None:
        self.eos_token_id = 2

    @classmethod
    def from_pretrained(cls, spec, local_files_only):
        cls.loaded.append((spec, local_files_only))
        return cls()

    def __len__(self):
        return 5

    def __call__(self, text, add_special_tokens, split_special_tokens):
        assert add_special_tokens is False and split_special_tokens is True
        return {"input_ids": [3 + (ord(c) % 2) for c in text]}

    def decode(self, ids, skip_special_tokens):
        return "".join("ab"[t - 3] if t >= 3 else ("" if skip_special_tokens else "<s>") for t in ids)


def test_model_directory_without_tokenizer_json_goes_through_transformers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=FakeAutoTokenizer))
    FakeAutoTokenizer.loaded.clear()
    tok = load_tokenizer(tmp_path)
    assert FakeAutoTokenizer.loaded == [(str(tmp_path), True)]  # never a download
    assert (tok.name, tok.vocab_size, tok.eos_id) == (str(tmp_path), 5, 2)
    assert tok.encode("ab") == [4, 3] and tok.decode([4, 3, 2]) == "ba" and tok.decode([2], True) == "<s>"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([5])


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE trained on the held-out text (no download), saved as a HF model directory."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([HELDOUT], trainer=trainer)
    d = tmp_path_factory.mktemp("bpe")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    return d


def test_trained_bpe_loads_and_round_trips(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    assert isinstance(tok, HFTokenizer) and tok.name == str(bpe_dir / "tokenizer.json")
    assert tok.vocab_size == 1024 and tok.eos_id == 0
    sample = HELDOUT[5000:25000]
    ids = tok.encode(sample)
    assert len(ids) < len(sample.encode()) / 2  # merges learned: far fewer tokens than bytes
    assert tok.decode(ids) == sample
    assert tok.encode("<|endoftext|>") != [0]  # special-token text stays text
    assert tok.decode([0, *tok.encode("x")]) == "x" and tok.decode([0], keep_special=True) == "<|endoftext|>"


@pytest.mark.parametrize("length", [1, 7, 127, 128, 129, 255, 256, 257, 1000])
def test_cuts_have_exact_lengths_in_the_trained_bpe(bpe_dir, length):
    tok = load_tokenizer(bpe_dir)
    start = 3 * length  # different text for each length
    text = HELDOUT[start:start + 8 * length + 64]
    ids = cut_ids(tok, text, length)
    assert len(ids) == length and ids == tok.encode(text)[:length]
    prefix = cut_text(tok, text, length)
    assert len(tok.encode(prefix)) == length and text.startswith(prefix)
    assert len(tok.encode(text[:len(prefix) + 1])) > length  # longest such prefix (next character adds a token)


def test_cuts_of_too_short_text_fail(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    with pytest.raises(TokenizerError, match=r"the text has 2 tokens in tokenizer .*fewer than the 5 asked for"):
        cut_ids(tok, "import os", 5)
    with pytest.raises(TokenizerError, match="fewer than the 5 asked for"):
        cut_text(tok, "import os", 5)
    assert cut_text(BYTE_TOKENIZER, "héllo", 3) == "hé"
    with pytest.raises(TokenizerError, match="no prefix of the text encodes to exactly 2 tokens"):
        cut_text(BYTE_TOKENIZER, "héllo", 2)  # 'é' is two byte tokens
