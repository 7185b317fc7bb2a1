import pytest

from rle import decode, decode_bytes, encode, encode_bytes, runs


def test_runs():
    assert runs("aabccc") == [("a", 2), ("b", 1), ("c", 3)]
    assert runs("") == []


def test_encode_text():
    assert encode("aaabccccccccccccd") == "3ab12cd"
    assert encode("") == ""
    with pytest.raises(ValueError):
        encode("abc1")


def test_decode_short_runs():
    assert decode("3ab2c") == "aaabcc"
    with pytest.raises(ValueError):
        decode("ab3")


def test_decode_long_runs():
    assert decode("12ab") == "a" * 12 + "b"
    text = "x" * 10 + "y" * 105 + "z"
    assert decode(encode(text)) == text


def test_bytes_round_trip():
    data = b"\x00" * 300 + b"ab"
    encoded = encode_bytes(data)
    assert encoded == bytes((255, 0, 45, 0, 1, 97, 1, 98))
    assert decode_bytes(encoded) == data
    with pytest.raises(ValueError):
        decode_bytes(b"\x00a")
