"""Run-length encoding for text and bytes."""

from .codec import decode, decode_bytes, encode, encode_bytes, runs

__all__ = ["decode", "decode_bytes", "encode", "encode_bytes", "runs"]
