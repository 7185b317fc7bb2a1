"""Semantic blocks of a generation: delimiter pairs, a token->bytes map, and the block tracker.

AgentSpec's structure-isolated drafting: with each request the agent passes the paired
delimiters of its semantic blocks, e.g. ``[["```python", "```"], ["<tool_call>", "</tool_call>"]]``.
The server keeps, per tokenizer, a cached map from token id to the exact bytes the token stands
for (`token_bytes`), and per request a small pushdown automaton (`BlockTracker`) fed with the
generated tokens, so that the drafter knows which block the next token belongs to and drafts
only from history of that same block type.

Delimiter pairs (`parse_structure`)
-----------------------------------
A JSON string, or a list (or tuple) of ``[open, close]`` pairs (lists or tuples), or the
AgentSpec paper's nested form, a list of groups each of which is a list of pairs (groups are
flattened in order; flat pairs and groups may be mixed). ``None`` means no structure, ``()``.
Both delimiters are non-empty strings of at most 64 characters; open delimiters are unique
(closers may repeat); at most 32 pairs in all. Anything else raises `StructureError`, whose
message names the element (``structure[1][0]``) and the problem.

Tracking rules (`BlockTracker`)
-------------------------------
Matching is on bytes: delimiters are UTF-8 encoded and the output is the concatenation of its
tokens' bytes, so delimiters split across tokens and multi-byte characters split across tokens
need nothing special. The automaton is defined by one left-to-right scan of the text T with a
stack of open blocks (innermost on top), at each position i:

1. if a block is open and the close delimiter of the innermost block occurs at T[i:], that block
   closes and the scan resumes after the closer;
2. else, if some open delimiters occur at T[i:] and fewer than `max_depth` (16) blocks are open,
   the longest of them opens a block and the scan resumes after it;
3. else T[i] is plain text and the scan resumes at i + 1.

Consequences: a pair with the same open and close string ('$$', '```') closes when it is the
innermost block and opens otherwise; closers of outer blocks inside an inner block are plain
text (only the innermost block's closer closes); a closer with no open block is plain text;
openers beyond the depth cap are plain text; no input raises. Of prefix-ambiguous openers
('```' and '```python'), the longest one that occurs at a position wins. Any opener nests
inside any block: with ('$', '$') among the pairs, a '$' inside a '```python' block opens a
'$' block, and that fence's closer is plain text until the '$' block closes.

Labels: a token belongs to the innermost block open when the token ENDS, where the state at
byte offset e is that of the scan above run on T[:e] alone, as if the text ended there. So the
token that completes an opener belongs to the new block, the token that completes a closer to
the outer one, and a token holding a whole block belongs to what follows it. While the bytes
after a position cannot yet decide between delimiters ('```' completed and '```python' still
possible; a '$' inside a '$$' block, either an inner '$' opener or the start of the '$$'
closer), the state is the one the text so far gives: after '```py' the block '```' is open and
tokens are labelled '```'; when 'thon' completes the longer opener the top of the stack
becomes '```python' (a re-label, not a new block). A label depends only on the text up to the
end of its token, never on how that text was split into tokens, so feeding tokens one at a
time or all at once gives identical labels, and a label, once returned, is never revised.

A label is the open delimiter string of the block, or None outside every block. Without
structure (``pairs == ()``) every label is None and `block` is None.

Cost: a decision at position i depends only on T[i:i+L], L the longest delimiter in bytes,
so decisions more than L bytes from the end are final. The tracker keeps the committed stack
plus a tail of fewer than L bytes; each token appends its bytes, commits what is now final
(one regular-expression search over the tail jumps to the next position where a whole
delimiter occurs) and evaluates the tail once more to label the token. That is O(bytes of
the token + L) per token, with no re-scan of the output.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Iterable

__all__ = [
    "MAX_DELIMITER",
    "MAX_DEPTH",
    "MAX_PAIRS",
    "BlockTracker",
    "StructureError",
    "parse_structure",
    "token_bytes",
]

MAX_PAIRS = 32
MAX_DELIMITER = 64  # characters
MAX_DEPTH = 16

Pairs = tuple[tuple[str, str], ...]


class StructureError(ValueError):
    """Delimiter pairs that cannot be used; the message names the element and the problem."""


# ---------------------------------------------------------------------------------------------
# parse_structure


def _kind(x: object) -> str:
    return type(x).__name__


def _is_group(item: object) -> bool:
    return (isinstance(item, (list, tuple)) and len(item) > 0
            and all(isinstance(p, (list, tuple)) for p in item))


def _delimiter(where: str, side: str, d: object) -> str:
    if not isinstance(d, str):
        raise StructureError(f"{where}: {side} delimiter must be a string, got {_kind(d)} {d!r}")
    if not d:
        raise StructureError(f"{where}: {side} delimiter is empty")
    if len(d) > MAX_DELIMITER:
        raise StructureError(f"{where}: {side} delimiter is {len(d)} characters long, "
                             f"longer than the {MAX_DELIMITER} allowed")
    try:
        d.encode("utf-8")
    except UnicodeEncodeError:
        raise StructureError(f"{where}: {side} delimiter {d!r} is not valid Unicode "
                             f"(lone surrogate)") from None
    return d


def parse_structure(value: object) -> Pairs:
    """Validate delimiter pairs; returns them as a tuple of (open, close) string tuples.

    Accepts a JSON string, a list or tuple of [open, close] pairs (lists or tuples), or a list
    of groups of pairs (the AgentSpec paper's nested form); None gives (). Raises
    StructureError naming the element and the problem otherwise.
    """
    if value is None:
        return ()
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise StructureError("structure is not valid UTF-8 text") from None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise StructureError(f"structure is not valid JSON: {e}") from None
    if not isinstance(value, (list, tuple)):
        raise StructureError(f"structure must be a list of [open, close] pairs, "
                             f"got {_kind(value)}")
    located: list[tuple[str, object]] = []
    for i, item in enumerate(value):
        if _is_group(item):
            located.extend((f"structure[{i}][{j}]", p) for j, p in enumerate(item))
        else:
            located.append((f"structure[{i}]", item))
    if len(located) > MAX_PAIRS:
        raise StructureError(f"structure has {len(located)} pairs, more than the "
                             f"{MAX_PAIRS} allowed")
    pairs: list[tuple[str, str]] = []
    first: dict[str, str] = {}
    for where, p in located:
        if not isinstance(p, (list, tuple)):
            raise StructureError(f"{where}: must be an [open, close] pair, "
                                 f"got {_kind(p)} {p!r}")
        if len(p) != 2:
            raise StructureError(f"{where}: a pair needs 2 delimiters [open, close], "
                                 f"got {len(p)}")
        op = _delimiter(where, "open", p[0])
        cl = _delimiter(where, "close", p[1])
        if op in first:
            raise StructureError(f"{where}: duplicate open delimiter {op!r} "
                                 f"(already in {first[op]})")
        first[op] = where
        pairs.append((op, cl))
    return tuple(pairs)


# ---------------------------------------------------------------------------------------------
# token_bytes


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _types(component: object) -> list[dict]:
    """All (nested) component dicts of a tokenizer.json decoder/pre_tokenizer/normalizer."""
    out: list[dict] = []
    stack = [component]
    while stack:
        c = stack.pop()
        if isinstance(c, dict):
            out.append(c)
            for key in ("decoders", "pretokenizers", "normalizers"):
                stack.extend(c.get(key) or ())
        elif isinstance(c, list):
            stack.extend(c)
    return out


def text_of(token_bytes: list[bytes], ids: Iterable[int]) -> str:
    """The text of token ids, from their bytes (a split UTF-8 sequence decodes as U+FFFD);
    ids outside the map count as empty tokens, as the automaton reads them."""
    n = len(token_bytes)
    return b"".join([token_bytes[t] if 0 <= t < n else b"" for t in ids]).decode("utf-8",
                                                                                  "replace")


def token_bytes(tokenizer) -> list[bytes]:
    """Map every token id of a `tokenizers.Tokenizer` to the exact bytes it stands for.

    Byte-level BPE vocabularies (GPT-2's byte-to-unicode alphabet: 'Ġ' space, 'Ċ' newline)
    are inverted byte by byte, so a token may hold part of a UTF-8 sequence. Otherwise
    (SentencePiece style) '▁' becomes a space and byte-fallback tokens '<0xNN>' become the
    byte NN; other vocabularies map tokens to their UTF-8 text. Added and special tokens map
    to their content. Ids missing from the vocabulary map to b''. Builds the whole list each
    call: callers cache it per tokenizer.
    """
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    try:
        cfg = json.loads(tokenizer.to_str())
    except Exception:  # a tokenizer that cannot serialize itself: decide from the vocabulary
        cfg = {}
    model = cfg.get("model") or {}
    decoder_parts = _types(cfg.get("decoder"))
    pre_parts = _types(cfg.get("pre_tokenizer"))
    types = {c.get("type") for c in decoder_parts}
    if cfg.get("decoder"):
        byte_level = "ByteLevel" in types
    elif cfg:
        byte_level = any(c.get("type") == "ByteLevel" for c in pre_parts)
    else:  # heuristic: GPT-2's stand-ins for space and newline
        byte_level = any("\u0120" in t or "\u010a" in t for t in vocab)
    fallback = bool(model.get("byte_fallback")) or "ByteFallback" in types

    added = {}
    try:
        added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
    except AttributeError:
        pass

    size = max(list(vocab.values()) + list(added) + [-1]) + 1
    out: list[bytes] = [b""] * size
    if byte_level:
        dec = _byte_decoder()
        for tok, i in vocab.items():
            try:
                out[i] = bytes(dec[c] for c in tok)
            except KeyError:  # a character outside the byte alphabet: keep its UTF-8
                out[i] = b"".join(bytes([dec[c]]) if c in dec else c.encode("utf-8", "replace")
                                  for c in tok)
    else:
        if not fallback:
            fallback = sum(1 for t in vocab if _BYTE_FALLBACK.fullmatch(t)) >= 256
        for tok, i in vocab.items():
            m = _BYTE_FALLBACK.fullmatch(tok) if fallback else None
            if m:
                out[i] = bytes([int(m.group(1), 16)])
            else:
                out[i] = tok.replace("\u2581", " ").encode("utf-8", "replace")
    for i, content in added.items():
        out[i] = content.encode("utf-8", "replace")
    return out


# ---------------------------------------------------------------------------------------------
# BlockTracker


class _Machine:
    """What trackers of the same pairs share: encoded delimiters and the search pattern."""

    __slots__ = ("labels", "closes", "openers", "maxlen", "search")

    def __init__(self, pairs: Pairs):
        self.labels: tuple[str, ...] = tuple(o for o, _ in pairs)
        self.closes: tuple[bytes, ...] = tuple(c.encode("utf-8") for _, c in pairs)
        opens = [o.encode("utf-8") for o, _ in pairs]
        # openers by first byte, longest first: (bytes, pair index)
        openers: dict[int, list[tuple[bytes, int]]] = {}
        for k, o in enumerate(opens):
            openers.setdefault(o[0], []).append((o, k))
        for lst in openers.values():
            lst.sort(key=lambda x: -len(x[0]))
        self.openers = openers
        delims = sorted(set(opens) | set(self.closes), key=len, reverse=True)
        self.maxlen = len(delims[0])
        # leftmost position where any whole delimiter occurs
        self.search = re.compile(b"|".join(re.escape(d) for d in delims)).search


@lru_cache(maxsize=512)
def _machine(pairs: Pairs) -> _Machine:
    return _Machine(pairs)


def _step(m: _Machine, buf: bytes, s: int, stack: list[int], cap: int) -> int:
    """Apply the rule at position s (where some delimiter occurs); returns the next position."""
    if stack:
        c = m.closes[stack[-1]]
        if buf.startswith(c, s):
            stack.pop()
            return s + len(c)
    if len(stack) < cap:
        for o, k in m.openers.get(buf[s], ()):
            if buf.startswith(o, s):
                stack.append(k)
                return s + len(o)
    return s + 1


class BlockTracker:
    """The pushdown automaton of one request's output (rules in the module docstring)."""

    __slots__ = ("pairs", "max_depth", "_m", "_tb", "_stack", "_buf", "_label", "_depth")

    def __init__(self, pairs: Pairs, token_bytes: list[bytes], max_depth: int = MAX_DEPTH):
        self.pairs: Pairs = parse_structure(pairs)
        self.max_depth = max(0, int(max_depth))
        self._m: _Machine | None = _machine(self.pairs) if self.pairs else None
        self._tb = token_bytes
        self._stack: list[int] = []  # committed: decisions before the tail are final
        self._buf = b""  # the tail: bytes whose decisions may still change (< maxlen)
        self._label: str | None = None  # innermost block of the text so far
        self._depth = 0

    @property
    def block(self) -> str | None:
        """The innermost open block now: the label the next token gets unless it changes it."""
        return self._label

    @property
    def depth(self) -> int:
        """How many blocks are open now."""
        return self._depth

    def copy(self) -> "BlockTracker":
        """An independent snapshot (O(depth + tail)): roll back by keeping the copy."""
        t = BlockTracker.__new__(BlockTracker)
        t.pairs, t.max_depth, t._m, t._tb = self.pairs, self.max_depth, self._m, self._tb
        t._stack = self._stack.copy()
        t._buf, t._label, t._depth = self._buf, self._label, self._depth
        return t

    def feed(self, ids: Iterable[int]) -> list[str | None]:
        """Advance over new token ids; returns each token's label (open delimiter or None).

        Ids outside the map count as empty tokens; no input raises.
        """
        m = self._m
        if m is None:
            return [None for _ in ids]
        tb = self._tb
        n = len(tb)
        cap = self.max_depth
        search = m.search
        maxlen = m.maxlen
        labels = m.labels
        stack = self._stack
        buf = self._buf
        label = self._label
        depth = self._depth
        out: list[str | None] = []
        for t in ids:
            data = tb[t] if 0 <= t < n else b""
            if data:
                buf += data
                limit = len(buf) - maxlen + 1  # decisions at positions < limit are final
                pos = 0
                hit = search(buf)
                while hit is not None:
                    s = hit.start()
                    if s >= limit:
                        break
                    pos = _step(m, buf, s, stack, cap)
                    hit = search(buf, pos)
                if hit is None:  # no delimiter in the tail: the committed state is the state
                    if stack:
                        label, depth = labels[stack[-1]], len(stack)
                    else:
                        label, depth = None, 0
                else:  # evaluate the undecided tail as if the text ended here
                    st = stack.copy()
                    while hit is not None:
                        p = _step(m, buf, hit.start(), st, cap)
                        hit = search(buf, p)
                    if st:
                        label, depth = labels[st[-1]], len(st)
                    else:
                        label, depth = None, 0
                if pos < limit:
                    pos = limit
                if pos:
                    buf = buf[pos:]
            out.append(label)
        self._buf, self._label, self._depth = buf, label, depth
        return out
