import pytest

from engine.model.tokenizer import BOS_ID, EOS_ID, MASK_ID, TOKENIZER, VOCAB_SIZE


@pytest.mark.parametrize("text", ["", "hello, world", "def f(x):\n    return x\n", "héllo wörld ✓ 日本語 🚀"])
def test_round_trip(text):
    ids = TOKENIZER.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert TOKENIZER.decode(ids) == text
    assert TOKENIZER.decode(TOKENIZER.encode(text, add_bos=True)) == text


def test_specials():
    assert VOCAB_SIZE == 260 and {BOS_ID, EOS_ID, MASK_ID} <= set(range(256, 260))
    assert TOKENIZER.decode([104, EOS_ID, 105], keep_special=True) == "h<eos>i"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOKENIZER.decode([999])
    # a multi-byte character cut in half decodes with a replacement character, not an error
    assert TOKENIZER.decode(TOKENIZER.encode("✓")[:2]) == "\ufffd"
