"""Delimiter pairs, the token->bytes map and the block tracker (agentspec.structure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from conftest import tiny_tokenizer

from agentspec.structure import (MAX_DEPTH, BlockTracker, StructureError, parse_structure,
                                 text_of, token_bytes)

FENCE = (("```python", "```"),)
FIXTURES = [HealthCheck.function_scoped_fixture]  # module-scoped fixtures, safe to reuse
AGENT = (("```python", "```"), ("```", "```"), ("<tool_call>", "</tool_call>"), ("$$", "$$"),
         ("$", "$"))


# ----------------------------------------------------------------------------- reference model

def reference_stack(pairs, text: bytes, max_depth: int = MAX_DEPTH) -> list[int]:
    """The rules, scanned plainly over the whole text: the stack of open pair indices."""
    opens = [o.encode() for o, _ in pairs]
    closes = [c.encode() for _, c in pairs]
    stack: list[int] = []
    i = 0
    while i < len(text):
        if stack and text.startswith(closes[stack[-1]], i):
            i += len(closes[stack[-1]])
            stack.pop()
            continue
        found = [k for k in range(len(pairs)) if text.startswith(opens[k], i)]
        if found and len(stack) < max_depth:
            k = max(found, key=lambda k: len(opens[k]))
            stack.append(k)
            i += len(opens[k])
            continue
        i += 1
    return stack


def reference_labels(pairs, chunks: list[bytes], max_depth: int = MAX_DEPTH):
    """Each token's label: the innermost block of the text up to the token's end."""
    labels, text = [], b""
    for c in chunks:
        text += c
        stack = reference_stack(pairs, text, max_depth)
        labels.append(pairs[stack[-1]][0] if stack else None)
    return labels


def tracker_for(pairs, chunks, **kw) -> BlockTracker:
    """A tracker whose vocabulary is exactly the given chunks (token id i = chunk i)."""
    return BlockTracker(pairs, [c.encode() if isinstance(c, str) else c for c in chunks], **kw)


def labels_of(pairs, chunks, **kw):
    return tracker_for(pairs, chunks, **kw).feed(range(len(chunks)))


# ----------------------------------------------------------------------------- parse_structure

def test_parse_flat_nested_and_json():
    flat = [["```python", "```"], ["<tool_call>", "</tool_call>"]]
    want = (("```python", "```"), ("<tool_call>", "</tool_call>"))
    assert parse_structure(flat) == want
    assert parse_structure(json.dumps(flat)) == want
    assert parse_structure([tuple(p) for p in flat]) == want
    assert parse_structure(want) == want  # what Session.structure returns
    # the AgentSpec paper's form: groups of pairs, flattened in order
    nested = [[["```python", "```"], ["<tool_call>", "</tool_call>"]],
              [["\\[", "\\]"], ["\\(", "\\)"], ["$$", "$$"], ["$", "$"]]]
    got = parse_structure(json.dumps(nested))
    assert got == want + (("\\[", "\\]"), ("\\(", "\\)"), ("$$", "$$"), ("$", "$"))
    assert parse_structure([["$$", "$$"], [["$", "$"]]]) == (("$$", "$$"), ("$", "$"))
    assert parse_structure([]) == () == parse_structure("[]") == parse_structure(None)
    # limits are inclusive; closers may repeat
    many = [[f"<{i}>", "</>"] for i in range(32)]
    assert len(parse_structure(many)) == 32
    assert parse_structure([["x" * 64, "y" * 64]]) == (("x" * 64, "y" * 64),)


@pytest.mark.parametrize("value, needle", [
    (42, "must be a list"),
    ({"open": "```"}, "must be a list"),
    ('{"open": "```"}', "must be a list"),
    ("[[\"```\", \"```\"]", "not valid JSON"),
    ("", "not valid JSON"),
    (["```"], "structure[0]: must be an [open, close] pair"),
    ([["```"]], "structure[0]: a pair needs 2 delimiters"),
    ([["a", "b", "c"]], "got 3"),
    ([[["a", "b"], ["c"]]], "structure[0][1]: a pair needs 2"),
    ([["", "```"]], "structure[0]: open delimiter is empty"),
    ([["```", ""]], "close delimiter is empty"),
    ([[1, "x"]], "open delimiter must be a string, got int"),
    ([["x", None]], "close delimiter must be a string, got NoneType"),
    ([[["a", "b"], "x"]], "open delimiter must be a string, got list"),
    ([["a", "b"], ["c", "d"], ["a", "e"]], "structure[2]: duplicate open delimiter 'a'"),
    ([[f"<{i}>", "</>"] for i in range(33)], "33 pairs, more than the 32"),
    ([["x" * 65, "y"]], "65 characters long, longer than the 64"),
    ([["x", "y" * 70]], "close delimiter is 70 characters long"),
    ('[["\\ud800", "x"]]', "not valid Unicode"),
])
def test_parse_errors_name_the_problem(value, needle):
    with pytest.raises(StructureError) as e:
        parse_structure(value)
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)


def test_tracker_validates_its_pairs():
    with pytest.raises(StructureError, match="duplicate"):
        BlockTracker((("a", "b"), ("a", "c")), [b"a"])


# ----------------------------------------------------------------------------- token_bytes

TRAIN = [
    "Here is the fix:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.\n",
    "<tool_call>\n{\"name\": \"edit\", \"arguments\": {\"path\": \"src/calc.py\"}}\n</tool_call>\n",
    "Café, naïve, Straße, déjà vu — 日本語のテキスト、中文文本, emoji 🙂🚀, math $$x^2$$.\n",
    "```diff\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-print('héllo')\n+print('wörld')\n```\n",
]


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return tiny_tokenizer(TRAIN * 4, vocab_size=600)


@pytest.fixture(scope="module")
def bpe_bytes(bpe) -> list[bytes]:
    return token_bytes(bpe)


def test_token_bytes_byte_level(bpe, bpe_bytes):
    vocab = bpe.get_vocab(with_added_tokens=True)
    assert len(bpe_bytes) == max(vocab.values()) + 1
    assert bpe_bytes[vocab["<|im_end|>"]] == b"<|im_end|>"
    assert bpe_bytes[vocab["\u0120"]] == b" " and bpe_bytes[vocab["\u010a"]] == b"\n"
    assert all(bpe_bytes[vocab[chr(0x100 + i)]] == bytes([i]) for i in range(33))
    partial = 0
    for i, b in enumerate(bpe_bytes):
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            partial += 1  # part of a multi-byte character
            continue
        assert bpe.decode([i], skip_special_tokens=False) == text
    assert partial > 0  # the vocabulary does split characters; the map keeps their bytes


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURES)
@given(text=st.text())
def test_token_bytes_round_trip_any_text(bpe, bpe_bytes, text):
    ids = bpe.encode(text, add_special_tokens=False).ids
    assert b"".join(bpe_bytes[i] for i in ids) == text.encode()


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURES)
@given(text=st.text())
def test_text_of_is_the_tokenizers_decode(bpe, bpe_bytes, text):
    ids = bpe.encode(text, add_special_tokens=False).ids
    assert text_of(bpe_bytes, ids) == text == bpe.decode(ids, skip_special_tokens=False)
    # a character cut between tokens decodes as U+FFFD, as the tokenizer's does
    cut = [i for i in ids if not _utf8(bpe_bytes[i])][:1]
    assert text_of(bpe_bytes, cut) == bpe.decode(cut, skip_special_tokens=False)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_text_of_reads_ids_outside_the_map_as_empty(bpe, bpe_bytes):
    ids = bpe.encode("x = 1", add_special_tokens=False).ids
    assert text_of(bpe_bytes, [len(bpe_bytes) + 5, *ids, 2**40, -1]) == "x = 1"


def test_token_bytes_sentencepiece_style():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)},
             "\u2581": 259, "\u2581def": 260, "```": 261, "x": 262}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens(["<s>", "</s>"])
    tb = token_bytes(tok)
    assert tb[260] == b" def" and tb[259] == b" " and tb[261] == b"```"
    assert tb[3 + 0x0A] == b"\n" and tb[3 + 0xC3] == b"\xc3"
    assert tb[1] == b"<s>"
    ids = tok.encode("x\n\u00e9 ```", add_special_tokens=False).ids
    assert b"".join(tb[i] for i in ids) == " x\n\u00e9 ```".encode()


# ----------------------------------------------------------------------------- BlockTracker

def test_fenced_code_with_a_real_tokenizer(bpe, bpe_bytes):
    text = ("Here is the fix:\n```python\ndef add(a, b):\n    return a + b\n```\n"
            "Done. ``` not code\n")
    ids = bpe.encode(text, add_special_tokens=False).ids
    labels = BlockTracker(FENCE, bpe_bytes).feed(ids)
    raw = text.encode()
    opened = raw.index(b"```python") + len(b"```python")
    closed = raw.index(b"```", opened) + 3
    end = 0
    for i, label in zip(ids, labels):
        end += len(bpe_bytes[i])
        assert label == ("```python" if opened <= end < closed else None)
    assert labels.count("```python") >= 5


def test_delimiter_split_across_tokens():
    chunks = ["``", "`py", "thon\n", "x = 1\n", "`", "``", "\nafter"]
    assert labels_of(FENCE, chunks) == [None, None, "```python", "```python", "```python",
                                        None, None]
    # with a shorter opener too: "```" is open until "python" completes the longer one
    both = (("```python", "```"), ("```", "```"))
    assert labels_of(both, chunks) == [None, "```", "```python", "```python", "```python",
                                       None, None]
    # and when the bytes decide for the shorter one
    assert labels_of(both, ["```", "py", "\n", "```", "x"]) == ["```", "```", "```", None, None]
    assert labels_of(both, ["```pyt", "x\n"]) == ["```", "```"]


def test_multibyte_characters_split_across_tokens():
    pairs = (("«", "»"), ("日本", "語"))
    raw = "a«b日本c語»d".encode()
    chunks = [raw[i:i + 1] for i in range(len(raw))]  # one byte per token
    labels = labels_of(pairs, chunks)
    # the label changes with the token that completes a character of a delimiter
    ends = [len(raw[:k]) for k in range(1, len(raw) + 1)]
    at = {e: lb for e, lb in zip(ends, labels)}
    spans = {"«": (len("a«".encode()), len("a«b日本c語»".encode())),
             "日本": (len("a«b日本".encode()), len("a«b日本c語".encode()))}
    for e, label in at.items():
        inner = [k for k, (lo, hi) in spans.items() if lo <= e < hi]
        want = "日本" if "日本" in inner else "«" if inner else None
        assert label == want, e


def test_nested_tool_call_with_code_fence():
    pairs = (("<tool_call>", "</tool_call>"), ("```python", "```"))
    chunks = ["Calling", " <tool", "_call>", '{"code": "', "```", "python\\n", "x</tool_call>",
              "\\n", "```", '"}', "</tool_", "call>", " done"]
    assert labels_of(pairs, chunks) == [
        None, None, "<tool_call>", "<tool_call>", "<tool_call>", "```python",
        "```python",  # the outer closer inside the inner block is plain text
        "```python", "<tool_call>", "<tool_call>", "<tool_call>", None, None]


def test_same_open_and_close():
    pairs = (("$$", "$$"), ("$", "$"))
    text = "a $x$ b $$y = $z$ + 1$$ c"
    chunks = list(text)
    labels = labels_of(pairs, chunks)
    assert labels == reference_labels(pairs, [c.encode() for c in chunks])
    got = "".join("." if lb is None else "D" if lb == "$$" else "s" for lb in labels)
    # a lone "$" is an open "$" block until the next byte makes it "$$" (at 8: opener, at 21:
    # the closer of the "$$" block; inside "$$", the "$" at 14 opens an inner "$" block)
    assert got == "..ss....sDDDDDssDDDDDs...", got
    t = tracker_for(pairs, ["$$", "x", "$$"])
    assert t.feed([0]) == ["$$"] and t.block == "$$" and t.depth == 1
    assert t.feed([1, 2]) == ["$$", None] and t.block is None and t.depth == 0


def test_unbalanced_text_never_breaks():
    pairs = (("<tool_call>", "</tool_call>"), ("```python", "```"))
    chunks = ["``` stray closer", "</tool_call>", "```python\n", "</tool_call>", "```", "\n"]
    assert labels_of(pairs, chunks) == [None, None, "```python", "```python", None, None]


def test_depth_cap():
    pairs = (("(", ")"),)
    chunks = list("((((((x))))))")
    t = tracker_for(pairs, chunks, max_depth=3)
    labels = t.feed(range(len(chunks)))
    assert t.feed([]) == []
    depths = []
    t = tracker_for(pairs, chunks, max_depth=3)
    for i in range(len(chunks)):
        t.feed([i])
        depths.append(t.depth)
    # openers past the cap are plain text, so three closers close everything
    assert depths == [1, 2, 3, 3, 3, 3, 3, 2, 1, 0, 0, 0, 0]
    assert labels == ["("] * 9 + [None] * 4
    deep = tracker_for(pairs, ["("])
    deep.feed([0] * 100)
    assert deep.depth == MAX_DEPTH


def test_no_structure_falls_back_cleanly(bpe, bpe_bytes):
    t = BlockTracker((), bpe_bytes)
    ids = bpe.encode("```python\nx\n```", add_special_tokens=False).ids
    assert t.feed(ids) == [None] * len(ids) and t.block is None and t.depth == 0
    assert BlockTracker(parse_structure("[]"), bpe_bytes).feed(iter(ids)) == [None] * len(ids)


def test_copy_is_an_independent_snapshot():
    chunks = ["<tool_call>", "```py", "thon", "```", "</tool_call>"]
    pairs = (("<tool_call>", "</tool_call>"), ("```python", "```"))
    t = tracker_for(pairs, chunks)
    t.feed([0, 1])
    snap = t.copy()
    assert t.feed([2]) == ["```python"] and t.depth == 2
    assert snap.block == "<tool_call>" and snap.depth == 1
    assert snap.feed([2, 3, 4]) == ["```python", "<tool_call>", None]
    assert t.block == "```python"  # the original did not move


def test_bad_ids_count_as_empty_tokens():
    t = tracker_for(FENCE, ["```python", "x"])
    assert t.feed([-1, 0, 99, 1, 2**40]) == [None, "```python", "```python", "```python",
                                            "```python"]


# ----------------------------------------------------------------------------- properties

ALPHABET = ["a", "b", "$", "`", "<", "/", "é", "日"]
delimiter = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4).map("".join)
pair_sets = st.lists(st.tuples(delimiter, delimiter), min_size=1, max_size=5,
                     unique_by=lambda p: p[0]).map(tuple)


@st.composite
def structured_text(draw, pairs):
    """Text built from delimiters, their prefixes and noise."""
    delims = [d for p in pairs for d in p]
    piece = st.one_of(
        st.sampled_from(delims),
        st.sampled_from(delims).flatmap(
            lambda d: st.integers(1, len(d)).map(lambda n: d[:n])),
        st.text(alphabet=ALPHABET + ["x", " ", "\n"], max_size=4))
    return "".join(draw(st.lists(piece, max_size=30)))


@st.composite
def split_bytes(draw, raw: bytes):
    """Cut bytes at random points (multi-byte characters too); some empty tokens."""
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=len(raw) + 3)))
    bounds = [0] + cuts + [len(raw)]
    return [raw[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def cases(draw):
    pairs = draw(pair_sets)
    raw = draw(structured_text(pairs)).encode()
    chunks = draw(split_bytes(raw))
    depth = draw(st.sampled_from([0, 1, 2, 3, MAX_DEPTH]))
    return pairs, chunks, depth


@settings(max_examples=400, deadline=None)
@given(case=cases(), data=st.data())
def test_tracker_matches_reference_however_fed(case, data):
    pairs, chunks, depth = case
    ids = list(range(len(chunks)))
    want = reference_labels(pairs, chunks, depth)

    at_once = tracker_for(pairs, chunks, max_depth=depth)
    assert at_once.feed(ids) == want

    one_by_one = tracker_for(pairs, chunks, max_depth=depth)
    maxlen = max(len(d.encode()) for p in pairs for d in p)
    got = []
    for i in ids:
        got += one_by_one.feed([i])
        assert len(one_by_one._buf) < maxlen  # the tail stays bounded
        stack = reference_stack(pairs, b"".join(chunks[: i + 1]), depth)
        assert one_by_one.depth == len(stack) <= depth
        assert one_by_one.block == (pairs[stack[-1]][0] if stack else None)
    assert got == want

    # random batches, with a snapshot taken somewhere along the way
    batched = tracker_for(pairs, chunks, max_depth=depth)
    got, i = [], 0
    snap, snap_at = None, data.draw(st.integers(0, len(ids)))
    while i < len(ids):
        if snap is None and i >= snap_at:
            snap, snap_at = batched.copy(), i
        n = data.draw(st.integers(1, 5))
        got += batched.feed(ids[i:i + n])
        i += n
    assert got == want
    if snap is not None:
        assert snap.feed(ids[snap_at:]) == want[snap_at:]


@settings(max_examples=200, deadline=None)
@given(pairs=pair_sets, tokens=st.lists(st.binary(max_size=6), max_size=40),
       ids=st.lists(st.integers(-3, 45), max_size=60))
def test_never_raises_on_arbitrary_bytes_and_ids(pairs, tokens, ids):
    t = BlockTracker(pairs, tokens, max_depth=3)
    labels = t.feed(ids)
    assert len(labels) == len(ids) and 0 <= t.depth <= 3
    opens = {o for o, _ in pairs}
    assert all(lb is None or lb in opens for lb in labels)
    chunks = [tokens[i] if 0 <= i < len(tokens) else b"" for i in ids]
    assert labels == reference_labels(pairs, chunks, 3)


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURES)
@given(data=st.data())
def test_real_tokenizer_matches_reference(bpe, bpe_bytes, data):
    text = data.draw(structured_text(AGENT).map(lambda s: s + " </tool_call> x"))
    ids = bpe.encode(text, add_special_tokens=False).ids
    chunks = [bpe_bytes[i] for i in ids]
    assert b"".join(chunks) == text.encode()
    t = BlockTracker(AGENT, bpe_bytes)
    assert t.feed(ids) == reference_labels(AGENT, chunks)
