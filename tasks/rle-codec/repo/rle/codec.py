"""Run-length encoding.

Text format: each run is written as its length followed by the character,
and the length is omitted when it is 1, so "aaabccccccccccccd" becomes
"3ab12cd". Digits cannot be encoded in this format.

Bytes format: pairs of (count, value) bytes, with runs longer than 255 split
into several pairs.
"""

from __future__ import annotations

from itertools import groupby


def runs(data: str) -> list[tuple[str, int]]:
    """Group `data` into (character, run length) pairs."""
    return [(char, sum(1 for _ in group)) for char, group in groupby(data)]


def encode(text: str) -> str:
    if any(char.isdigit() for char in text):
        raise ValueError("digits cannot be run-length encoded in text format")
    return "".join(char if count == 1 else f"{count}{char}" for char, count in runs(text))


def decode(encoded: str) -> str:
    out = []
    count = ""
    for char in encoded:
        if char.isdigit():
            count = char
            continue
        out.append(char * int(count or "1"))
        count = ""
    if count:
        raise ValueError(f"encoded text ends with a dangling count {count!r}")
    return "".join(out)


def encode_bytes(data: bytes) -> bytes:
    out = bytearray()
    for value, group in groupby(data):
        count = sum(1 for _ in group)
        while count > 0:
            chunk = min(count, 255)
            out += bytes((chunk, value))
            count -= chunk
    return bytes(out)


def decode_bytes(encoded: bytes) -> bytes:
    if len(encoded) % 2:
        raise ValueError("encoded bytes must come in (count, value) pairs")
    out = bytearray()
    for i in range(0, len(encoded), 2):
        count, value = encoded[i], encoded[i + 1]
        if count == 0:
            raise ValueError(f"zero-length run at offset {i}")
        out += bytes((value,)) * count
    return bytes(out)
