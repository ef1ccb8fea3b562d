import pytest

from protocol.tokenizer import BOS_ID, BYTE_TOKENIZER, EOS_ID, MASK_ID, VOCAB_SIZE


@pytest.mark.parametrize("text", ["", "hello, world", "def f(x):\n    return x\n", "héllo wörld ✓ 日本語 🚀"])
def test_round_trip(text):
    ids = BYTE_TOKENIZER.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert BYTE_TOKENIZER.decode(ids) == text
    assert BYTE_TOKENIZER.decode(BYTE_TOKENIZER.encode(text, add_bos=True)) == text


def test_specials():
    assert VOCAB_SIZE == 260 and {BOS_ID, EOS_ID, MASK_ID} <= set(range(256, 260))
    assert BYTE_TOKENIZER.decode([104, EOS_ID, 105], keep_special=True) == "h<eos>i"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        BYTE_TOKENIZER.decode([999])
    # a multi-byte character cut in half decodes with a replacement character, not an error
    assert BYTE_TOKENIZER.decode(BYTE_TOKENIZER.encode("✓")[:2]) == "\ufffd"
