"""The match engine against a brute-force reference of its rule."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentspec.frequency import FREQUENCY_CLASSES, frequency_classes
from agentspec import match as match_mod
from agentspec.match import ContextWindow, Corpus, Match, context_ids, default_levels
from conftest import run_without_numba

try:  # the numba kernels, tested even where AGENTSPEC_NO_NUMBA=1 turned them off
    from agentspec import _match_nb
except ImportError:
    _match_nb = None

# every reference test runs on both paths: a Corpus uses match._nb as it was when made
ENGINES = [
    pytest.param(None, id="numpy"),
    pytest.param(_match_nb, id="numba",
                 marks=pytest.mark.skipif(_match_nb is None, reason="numba not installed")),
]


@contextlib.contextmanager
def using(nb):
    saved, match_mod._nb = match_mod._nb, nb
    try:
        yield
    finally:
        match_mod._nb = saved


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch):
    """For tests that make their corpora themselves: runs them on both paths."""
    monkeypatch.setattr(match_mod, "_nb", request.param)
    return request.param


class Reference:
    """The rule of `Corpus.match`, written plainly (O(corpus x max_match) per lookup)."""

    def __init__(self, max_tokens=None, min_match=2, max_match=64, max_candidates=64):
        self.max_tokens, self.min_match = max_tokens, min_match
        self.max_match, self.max_candidates = max_match, max_candidates
        self.stream: list[int | None] = []  # None = document boundary
        self.dropped = 0

    def extend(self, tokens):
        self.stream.extend(int(t) for t in tokens)
        held = sum(t is not None for t in self.stream)
        mt = self.max_tokens
        if mt is not None and held > mt + mt // 4:
            drop = held - mt
            self.dropped += drop
            while drop:  # drop through the `drop`-th real token (and boundaries before it)
                if self.stream.pop(0) is not None:
                    drop -= 1

    def end_document(self):
        self.stream.append(None)

    def _cont(self, e, limit):
        out, s = [], self.stream
        while e < len(s) and s[e] is not None and len(out) < limit:
            out.append(s[e])
            e += 1
        return out

    def match(self, context, k) -> Match:
        s = self.stream
        ctx = [int(t) for t in context][-self.max_match :]
        occ, m = [], 0
        for m in range(len(ctx), self.min_match - 1, -1):
            pat = ctx[len(ctx) - m :]
            occ = [e for e in range(m, len(s)) if s[e] is not None and s[e - m : e] == pat]
            if occ:
                break
        if not occ:
            return Match(0, [], 0, 0, 0, -1)
        occ = occ[-self.max_candidates :]
        groups: dict[tuple, list[int]] = {}
        for e in occ:
            groups.setdefault(tuple(self._cont(e, 3)), []).append(e)
        best = max(groups.values(), key=lambda g: (len(g), max(g)))
        chosen = max(best)
        tokens = self._cont(chosen, max(k, 0))
        agreed = len(tokens)
        for e in best:
            c = self._cont(e, max(k, 0))
            n = 0
            while n < min(len(c), agreed) and c[n] == tokens[n]:
                n += 1
            agreed = n
        position = self.dropped + sum(t is not None for t in s[:chosen])
        return Match(m, tokens, len(occ), len(best), agreed, position)


# ---------------------------------------------------------------- property tests

def _ops(alphabet: int):
    tok = st.integers(0, alphabet - 1)
    return st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.lists(tok, min_size=0, max_size=40)),
            st.tuples(st.just("end"), st.none()),
            st.tuples(st.just("match"), st.lists(tok, min_size=0, max_size=14)),
            # a context copied from the corpus (plus a random tail), so long matches happen
            st.tuples(st.just("echo"), st.tuples(st.integers(0, 10**6), st.integers(1, 16),
                                                 st.lists(tok, max_size=2))),
        ),
        min_size=1, max_size=30,
    )


@st.composite
def configs(draw):
    min_match = draw(st.integers(1, 3))
    max_match = draw(st.integers(min_match, 12))
    inner = list(range(min_match + 1, max_match))
    if inner:
        levels = (min_match, *sorted(draw(st.sets(st.sampled_from(inner)))), max_match)
    else:
        levels = tuple(sorted({min_match, max_match}))
    # shorter contexts indexed for frequency drafts never change what copies match
    min_context = draw(st.integers(1, min_match))
    levels = tuple(range(min_context, min_match)) + levels
    return dict(
        max_tokens=draw(st.one_of(st.none(), st.integers(1, 80))),
        min_match=min_match, max_match=max_match, min_context=min_context,
        max_candidates=draw(st.integers(1, 6)),
        levels=draw(st.sampled_from([None, levels])),
        tail_max=draw(st.one_of(st.integers(1, 24), st.integers(65, 300))),  # (>64: blocks)
    )


KNOBS = st.fixed_dictionaries({
    # small values so that chunked scans, chunked indexing and merges all happen
    "SCAN_CHUNK": st.sampled_from([1, 2, 3, 256]),
    "CHUNK": st.sampled_from([1, 5, 1 << 18]),
    "FLUSH_MIN": st.sampled_from([1, 7, 2048]),
    "MERGE_FACTOR": st.sampled_from([1, 2, 4]),
    "_CHAIN_FROM": st.sampled_from([1, 5, 1024]),
    "_TAIL_START": st.sampled_from([1, 2, 256]),
})


def run_ops(cfg, ops, k=5, dir_min=None, knobs=None):
    saved = {name: getattr(match_mod, name) for name in (knobs or {})}
    try:
        for name, value in (knobs or {}).items():
            setattr(match_mod, name, value)
        _run_ops(cfg, ops, k, dir_min)
    finally:
        for name, value in saved.items():
            setattr(match_mod, name, value)


def _run_ops(cfg, ops, k, dir_min):
    corpus = Corpus(cfg["max_tokens"], cfg["min_match"], cfg["max_match"], cfg["max_candidates"],
                    min_context=cfg["min_context"], levels=cfg["levels"],
                    tail_max=cfg["tail_max"])
    if dir_min is not None:
        corpus._dir_min = dir_min
    ref = Reference(cfg["max_tokens"], cfg["min_match"], cfg["max_match"], cfg["max_candidates"])
    for op, arg in ops:
        if op == "extend":
            corpus.extend(arg)
            ref.extend(arg)
        elif op == "end":
            corpus.end_document()
            ref.end_document()
        else:
            if op == "echo":
                start, n, extra = arg
                real = [t for t in ref.stream if t is not None]
                ctx = (real[start % len(real):][:n] if real else []) + extra
            else:
                ctx = arg
            got, want = corpus.match(ctx, k), ref.match(ctx, k)
            assert got == want, (ctx, ref.stream)
            assert corpus.match(np.array(ctx, dtype=np.int64), k) == want
        assert len(corpus) == sum(t is not None for t in ref.stream)
        if corpus._nb is not None:  # the kernels' tuple, kept from the op before, is today's
            now = (*corpus._packed, corpus._tail_keys, corpus._tail_pos, corpus._tail_len,
                   *corpus._chains(), corpus._buf)
            kept = corpus._nb_state()
            assert len(kept) == len(now) and all(a is b or a == b for a, b in zip(kept, now))


SETTINGS = settings(max_examples=250, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("nb", ENGINES)
@SETTINGS
@given(configs(), _ops(3), KNOBS)
def test_matches_reference_tiny_alphabet(nb, cfg, ops, knobs):
    run_ops(cfg, ops, knobs=dict(knobs, _nb=nb))


@pytest.mark.parametrize("nb", ENGINES)
@SETTINGS
@given(configs(), _ops(6), st.integers(0, 8), KNOBS)
def test_matches_reference_compressed_runs(nb, cfg, ops, k, knobs):
    # every run keeps its keys as directory + 16-bit halves
    run_ops(cfg, ops, k=k, dir_min=0, knobs=dict(knobs, _nb=nb))


@pytest.mark.parametrize("nb", ENGINES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), _ops(4), KNOBS, st.booleans(), st.sampled_from([1, 2, 4]))
def test_hash_collisions_never_change_answers(nb, cfg, ops, knobs, compressed, values):
    # a hash with 1-4 values: every bucket is full of impostors that verification must drop
    knobs = dict(knobs, _nb=nb, _KEY_MASK=values - 1)
    run_ops(cfg, ops, dir_min=0 if compressed else None, knobs=knobs)


@pytest.mark.parametrize("nb", ENGINES)
@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 1, 259_999, 2**31 - 1]), max_size=30),
                min_size=1, max_size=8),
       st.integers(1, 3))
def test_large_token_ids(nb, chunks, min_match):
    with using(nb):
        corpus = Corpus(min_match=min_match, max_match=8, max_candidates=4, tail_max=7)
    ref = Reference(min_match=min_match, max_match=8, max_candidates=4)
    for c in chunks:
        corpus.extend(c)
        ref.extend(c)
        for ctx in (c, c[: len(c) // 2], [1, 2**31 - 1]):
            assert corpus.match(ctx, 4) == ref.match(ctx, 4)


def test_long_random_stream_against_reference(engine):
    """A longer stream (many runs and merges) with a default-shaped configuration."""
    rng = np.random.default_rng(7)
    corpus = Corpus(max_tokens=3000, min_match=2, max_match=24, max_candidates=8, tail_max=97)
    ref = Reference(max_tokens=3000, min_match=2, max_match=24, max_candidates=8)
    base = rng.integers(0, 5, 400)
    for step in range(40):
        if step % 3 == 0:
            chunk = base[rng.integers(0, 300) :][: rng.integers(20, 100)]  # repeats
        else:
            chunk = rng.integers(0, 5, rng.integers(1, 120))
        corpus.extend(chunk)
        ref.extend(chunk)
        if step % 7 == 6:
            corpus.end_document()
            ref.end_document()
        real = np.array([t for t in ref.stream if t is not None])
        for _ in range(5):
            at = rng.integers(0, len(real))
            ctx = list(real[max(0, at - 30) : at]) + list(rng.integers(0, 5, rng.integers(0, 3)))
            assert corpus.match(ctx, 6) == ref.match(ctx, 6)


# ---------------------------------------------------------------- unit tests

def test_majority_vote_beats_recency(engine):
    c = Corpus(min_match=2, max_match=8)
    for cont in ([7, 8, 9], [7, 8, 9], [5, 5, 5]):  # most recent disagrees
        c.extend([1, 2] + cont)
        c.end_document()
    m = c.match([0, 1, 2], 3)
    assert (m.length, m.tokens, m.candidates, m.agree, m.agreed) == (2, [7, 8, 9], 3, 2, 3)
    assert m.position == 7  # the later of the two agreeing occurrences


def test_tie_goes_to_most_recent(engine):
    c = Corpus(min_match=2, max_match=8)
    for cont in ([7, 8, 9], [5, 5, 5], [7, 8, 9], [5, 5, 6]):
        c.extend([1, 2] + cont)
        c.end_document()
    m = c.match([1, 2], 5)  # (7,8,9) x2 beats (5,5,5) and (5,5,6)
    assert (m.tokens, m.agree) == ([7, 8, 9], 2)
    c.extend([1, 2, 5, 5, 6])
    m = c.match([1, 2], 5)  # now (7,8,9) x2 vs (5,5,6) x2: the latter holds the newest
    assert (m.tokens, m.agree, m.agreed, m.candidates) == ([5, 5, 6], 2, 3, 5)


def test_agreed_is_common_prefix_within_group(engine):
    c = Corpus(min_match=2, max_match=8)
    c.extend([1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 9])
    m = c.match([1, 2], 10)
    assert m.tokens == [3, 4, 5, 9] and m.agree == 2 and m.agreed == 3


def test_longest_match_wins_over_count_and_boundaries_stop(engine):
    c = Corpus(min_match=2, max_match=8)
    c.extend([4, 1, 2, 3] * 5)
    c.extend([9, 1, 2, 7])
    c.end_document()
    c.extend([8, 8])
    m = c.match([9, 1, 2], 4)
    assert (m.length, m.tokens, m.candidates) == (3, [7], 1)
    assert c.match([7, 8], 2).length == 0  # would cross the boundary
    assert c.match([8, 8], 2).length == 0  # nothing follows the last occurrence


def test_max_candidates_keeps_most_recent(engine):
    c = Corpus(min_match=2, max_match=8, max_candidates=2)
    c.extend([1, 2, 5, 1, 2, 5, 1, 2, 6, 1, 2, 7])
    m = c.match([1, 2], 1)
    assert (m.candidates, m.agree, m.tokens, m.position) == (2, 1, [7], 11)


def test_eviction_drops_oldest_and_positions_stay_global(engine):
    c = Corpus(max_tokens=8, min_match=2, max_match=4)
    c.extend([1, 2, 3])
    c.extend([5, 6, 7, 8, 9, 4])
    assert len(c) == 9  # within the 25% slack
    c.extend([0, 0])  # 11 > 10: drop to 8
    assert len(c) == 8
    assert c.match([1, 2], 2).length == 0  # dropped
    m = c.match([5, 6], 2)
    assert (m.tokens, m.position) == ([7, 8], 5)
    assert c.match([3, 5], 1).length == 0  # window starts in dropped data


def test_no_match_and_edge_inputs(engine):
    c = Corpus()
    assert c.match([1, 2, 3], 4) == Match(0, [], 0, 0, 0, -1)
    c.extend([1, 2, 3, 4])
    assert c.match([], 4).length == 0
    assert c.match([2], 4).length == 0  # shorter than min_match
    assert c.match([-5, 1, 2], 4).length == 2  # negative ids never match
    assert c.match([1, 2], 0) == Match(2, [], 1, 1, 0, 2)
    assert c.match(np.array([2, 3], dtype=np.int32), 9).tokens == [4]
    with pytest.raises(ValueError):
        c.extend([1, -1])
    with pytest.raises(ValueError):
        c.extend([2**31])
    for bad in ([1, 2.0], [3, "4"], [None]):  # a step's few tokens are checked one by one
        with pytest.raises(ValueError, match="integers"):
            c.extend(bad)
    assert len(c) == 4  # a refused step added nothing
    c.extend([np.int64(5), 6])  # numpy's integers are integers too
    assert len(c) == 6 and c.match([4, 5], 4).tokens == [6]


def test_nbytes_and_len(engine):
    c = Corpus(tail_max=64)
    rng = np.random.default_rng(0)
    c.extend(rng.integers(0, 100, 10_000))
    c.match([1, 2], 4)
    assert len(c) == 10_000
    assert 4 * 10_000 < c.nbytes < 100 * 10_000


@pytest.mark.parametrize("size", [1, 3, 8, 64])
def test_a_context_window_reads_as_the_last_tokens_converted(size):
    """A step's few tokens at a time, through the buffer's moves to its front, ids that
    cannot be tokens, a list grown by more than the window and one cut back, the window
    reads as the list's last `size` tokens converted."""
    rng = np.random.default_rng(size)
    tokens = rng.integers(0, 1000, int(rng.integers(0, 2 * size))).tolist()
    window = ContextWindow(size)
    for _ in range(400):
        roll = rng.random()
        if roll < 0.05:
            del tokens[int(rng.integers(0, len(tokens) + 1)):]
        else:
            step = rng.integers(0, 1000, int(rng.choice([0, 1, 2, 3, size, 2 * size + 1])))
            tokens += step.tolist()
            if roll < 0.1 and len(step):
                tokens[-1] = int(rng.choice([-1, 2**31, 2**40]))
        ids = window.ids(tokens)
        assert ids.dtype == np.int32 and ids.flags.c_contiguous
        expected = context_ids(tokens[-size:]) if tokens else np.zeros(0, dtype=np.int32)
        # (an id no token can have is "none" to every lookup, whichever negative it reads)
        assert ids.shape == expected.shape
        assert (np.maximum(ids, -1) == np.maximum(expected, -1)).all()


def test_default_levels():
    assert default_levels(2, 64) == (2, 3, 4, 8, 64)
    assert default_levels(1, 4) == (1, 2, 3, 4)
    assert default_levels(3, 3) == (3,)
    assert Corpus(min_context=1).levels == (1, 2, 3, 4, 8, 64)
    for bad in (dict(levels=(3, 8)), dict(levels=(1, 3, 8), min_context=1),
                dict(min_context=3)):
        with pytest.raises(ValueError):
            Corpus(min_match=2, max_match=8, **bad)


def test_module_threshold_is_read_at_construction(monkeypatch):
    monkeypatch.setattr(match_mod, "TAIL_MAX", 3)
    assert Corpus().tail_max == 3


@pytest.mark.parametrize("scan_chunk", [1, 3, 256])
def test_scan_keeps_the_most_recent_of_the_longest(monkeypatch, engine, scan_chunk):
    # levels (2, 16): every length from 3 to 15 is found by extending level-2 occurrences
    monkeypatch.setattr(match_mod, "SCAN_CHUNK", scan_chunk)
    c = Corpus(min_match=2, max_match=16, max_candidates=2, levels=(2, 16))
    ref = Reference(min_match=2, max_match=16, max_candidates=2)
    for j in range(6):
        for x in (c, ref):
            x.extend([9, 1, 2, 3, 4, 100 + j, 7, 1, 2, 3, 4, 50 + j])
            x.end_document()
    for ctx in ([9, 1, 2, 3, 4], [7, 1, 2, 3, 4], [5, 1, 2, 3, 4], [3, 4]):
        assert c.match(ctx, 3) == ref.match(ctx, 3)
    m = c.match([9, 1, 2, 3, 4], 3)
    assert (m.length, m.tokens, m.candidates) == (5, [105, 7, 1], 2)


@pytest.mark.skipif(_match_nb is None, reason="numba not installed")
def test_kernels_build_the_same_index():
    """The numba path indexes exactly like the numpy one (same keys, runs and tail)."""
    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 2**31 - 1 if j % 5 == 0 else 40, rng.integers(1, 3000))
              for j in range(12)]
    built = []
    for nb in (None, _match_nb):
        with using(nb):
            c = Corpus(max_tokens=20_000, tail_max=1000)
        c._dir_min = 3000
        for j, chunk in enumerate(chunks):
            c.extend(chunk)
            if j % 4 == 3:
                c.end_document()
        c.flush()
        built.append(c)
    a, b = built
    assert a.nbytes == b.nbytes and len(a._runs) == len(b._runs) >= 1
    for ra, rb in zip(a._runs, b._runs):
        for ka, kb, pa, pb in zip(ra.keys, rb.keys, ra.pos, rb.pos):
            assert np.array_equal(ka.full(), kb.full()) and np.array_equal(pa, pb)
    n = a._tail_len
    assert np.array_equal(a._tail_keys[:, :n], b._tail_keys[:, :n])
    assert np.array_equal(a._tail_pos[:n], b._tail_pos[:n])


@pytest.mark.parametrize("how", ["no numba", "env"])
def test_numpy_path_is_the_fallback(how):
    """Without numba (or with AGENTSPEC_NO_NUMBA=1) the numpy path answers."""
    run_without_numba(how, "from agentspec import match\n"
                           "assert match._nb is None\n"
                           "c = match.Corpus()\n"
                           "c.extend([1, 2, 3, 1, 2])\n"
                           "assert c.match([1, 2], 2).tokens == [3, 1]\n")


# ---------------------------------------------------------------- frequency drafts

def reference_frequent(session: Reference, outputs: Reference | None, context, k: int,
                       levels, max_context: int, occurrences: int, min_prob: float = 0.1,
                       worth=None):
    """The rule of `frequent_drafts`, written plainly (every level and length read, longest
    first, a later path winning only with a higher score): (tokens, probs, m, evidence, score)
    from the session's text, then from every output (the other outputs and the session's
    open document). A path's score: its probabilities summed or, given worth[d], the sum
    over its tokens of the product of worth[d][class, m + j] up to each."""
    ctx = [int(t) for t in context][-session.max_match :]
    L, s = len(ctx), session.stream
    open_start = max((i + 1 for i, t in enumerate(s) if t is None), default=0)
    open_len = len(s) - open_start
    streams = [s] + ([outputs.stream] if outputs is not None else [])

    def recent(stream, q):  # the most recent occurrences of the last q context tokens
        found = [e for e in range(q, len(stream))
                 if stream[e] is not None and stream[e - q : e] == ctx[L - q :]]
        return found[::-1][:occurrences]

    def length(stream, e, top):
        j = 0
        while j < top and e - 1 - j >= 0 and stream[e - 1 - j] == ctx[L - 1 - j]:
            j += 1
        return j

    def cont(stream, e, cap):
        out = []
        while e < len(stream) and stream[e] is not None and len(out) < cap:
            out.append(stream[e])
            e += 1
        return out

    best = [([], [], 0, 0.0, []), ([], [], 0, 0.0, [])]
    for i in range(len(levels) - 1, -1, -1):
        q = levels[i]
        if q > min(L, max_context):
            continue
        top = min(L, max_context, levels[i + 1] - 1 if i + 1 < len(levels) else L)
        found = [(stream, e) for stream in streams for e in recent(stream, q)]
        for m in range(top, q - 1, -1):
            for d in range(2):  # every length is tried: the kernels' pruning must lose nothing
                rows = [cont(stream, e, min(m, k)) for stream, e in found
                        if length(stream, e, top) >= m
                        and (stream is not s or d == 0 or e >= open_start)
                        and (stream is s or d == 1)]
                if not rows:
                    continue
                tokens, probs, evidence, p = [], [], [], 1.0
                for j in range(min(m, k)):
                    column = [r[j] if j < len(r) else None for r in rows]
                    counts = {t: column.count(t) for t in column if t is not None}
                    if not counts:
                        break
                    token = next(t for t in column if counts.get(t) == max(counts.values()))
                    total = len(column) + (j == 0 and m <= open_len)
                    if p * counts[token] / total < min_prob:
                        break
                    p = p * counts[token] / total
                    tokens.append(token)
                    probs.append(p)
                    evidence.append(counts[token])
                    rows = [r for r in rows if j < len(r) and r[j] == token]
                score, reached = 0.0, 1.0
                for j, c in enumerate(frequency_classes(probs, evidence)):
                    reached *= 1.0 if worth is None else worth[d][c][min(m + j, len(worth[d][c]) - 1)]
                    score += probs[j] if worth is None else reached
                if score > best[d][3]:
                    best[d] = (tokens, probs, m, score, evidence)
    return [(tokens, probs, m, evidence, score) for tokens, probs, m, score, evidence in best]


def _texts(alphabet: int):
    tok = st.integers(0, alphabet - 1)
    return st.lists(st.tuples(st.lists(tok, min_size=1, max_size=30), st.booleans()),
                    max_size=6)


@pytest.mark.parametrize("nb", ENGINES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_texts(3), _texts(4), st.lists(st.integers(0, 3), max_size=12), st.integers(1, 6),
       st.sampled_from([1, 2, 3, 8]), st.integers(1, 5), st.booleans(), KNOBS,
       st.none() | st.integers(0, 2**32 - 1))
def test_frequent_drafts_match_the_reference(nb, session_texts, output_texts, context, k,
                                             max_context, occurrences, with_outputs, knobs,
                                             worth_seed):
    knobs = dict(knobs, _nb=nb)
    saved = {name: getattr(match_mod, name) for name in knobs}
    try:
        for name, value in knobs.items():
            setattr(match_mod, name, value)
        corpora = [Corpus(min_context=1, max_match=12, tail_max=9) for _ in range(2)]
        refs = [Reference(min_match=1, max_match=12) for _ in range(2)]
        for texts, corpus, ref in zip((session_texts, output_texts), corpora, refs):
            for tokens, ends in texts:
                corpus.extend(tokens)
                ref.extend(tokens)
                if ends:
                    corpus.end_document()
                    ref.end_document()
        outputs = corpora[1] if with_outputs else None
        # a table of what each class is worth at each matched length, or SuffixDecoding's score
        worth = None if worth_seed is None else \
            np.random.default_rng(worth_seed).random((2, len(FREQUENCY_CLASSES), 10))
        got = match_mod.frequent_drafts(corpora[0], outputs, context, k, max_context,
                                        occurrences, worth=worth)
        want = reference_frequent(refs[0], refs[1] if with_outputs else None, context, k,
                                  corpora[0].levels, max_context, occurrences,
                                  worth=None if worth is None else worth.tolist())
        assert [(d.tokens, d.match_len, d.evidence) for d in got] == \
            [(w[0], w[2], w[3]) for w in want]
        for d, w in zip(got, want):
            assert d.probs == pytest.approx(w[1]) and d.classes == frequency_classes(w[1], w[3])
            assert d.score == pytest.approx(w[4])
    finally:
        for name, value in saved.items():
            setattr(match_mod, name, value)


@pytest.mark.parametrize("nb", ENGINES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_texts(3), _texts(4), st.lists(st.integers(0, 3), max_size=12), st.integers(1, 6),
       st.booleans(), st.booleans(), st.lists(st.integers(0, 5), max_size=4), st.booleans())
def test_a_frequent_candidate_is_the_draft_a_policy_takes_as_it_reads_it(
        nb, session_texts, output_texts, context, k, with_outputs, session_text, prefix,
        with_classes):
    with using(nb):
        corpora = [Corpus(min_context=1, max_match=12, tail_max=9) for _ in range(2)]
    for texts, corpus in zip((session_texts, output_texts), corpora):
        for tokens, ends in texts:
            corpus.extend(tokens)
            if ends:
                corpus.end_document()
    outputs = corpora[1] if with_outputs else None
    kinds = np.arange(2 * len(FREQUENCY_CLASSES)).reshape(2, -1) * 4  # from S, from every output
    token_classes = np.array([0, 1, 2], dtype=np.intp) if with_classes \
        else np.zeros(0, dtype=np.intp)  # (token 3 takes the last class)
    prefix_ids = np.array([9, *prefix], dtype=np.int64)  # the token before, a path continued
    prefix_rows = np.arange(len(prefix), dtype=np.int64) + 1000
    got = match_mod.frequent_candidate(corpora[0], outputs, context, k, kinds, token_classes,
                                       prefix_ids, prefix_rows, session_text=session_text)
    local, every = match_mod.frequent_drafts(corpora[0], outputs, context, k)
    source = 0 if session_text and local.score > every.score else 1
    draft = (local, every)[source]
    if not draft.tokens:
        assert got is None
        return
    tokens, m, ids, rows = got
    assert (tokens, m) == (draft.tokens, draft.match_len)
    assert ids.tolist() == [9, *prefix, *draft.tokens]
    assert rows.tolist() == [*prefix_rows.tolist(), *(
        kinds[source, c] + (token_classes[min(t, 2)] if with_classes else 0)
        for t, c in zip(draft.tokens, draft.classes))]


@pytest.mark.skipif(_match_nb is None, reason="numba not installed")
def test_both_engines_round_a_path_alike():
    # after 1 2: 30 five times in 17 (then 198 four times in 5), twelve others once; the second
    # token's share is 4/5, which a product rounded another way reads as just under 0.8
    texts = [[1, 2, 30, 198]] * 4 + [[1, 2, 30, 7]] + [[1, 2, 100 + i] for i in range(12)]
    drafts = []
    for nb in (None, _match_nb):
        with using(nb):
            session, outputs = Corpus(min_context=1), Corpus(min_context=1)
        for text in texts:
            outputs.extend(text)
            outputs.end_document()
        drafts.append(match_mod.frequent_drafts(session, outputs, [1, 2], 8, occurrences=17)[1])
    numpy_path, kernels = drafts
    assert kernels.tokens == [30, 198] and kernels.evidence == [5, 4]
    assert (numpy_path.probs, numpy_path.classes, numpy_path.score) == \
        (kernels.probs, kernels.classes, kernels.score)


def test_a_frequent_path_follows_the_majority_and_counts_the_unwritten_context(engine):
    session, outputs = Corpus(min_context=1), Corpus(min_context=1)
    for tail in ([7, 8], [7, 8], [7, 9]):
        outputs.extend([1, 2, 3, *tail])
        outputs.end_document()
    local, every = match_mod.frequent_drafts(session, outputs, [5, 2, 3], 8)
    assert local.tokens == [] and every.match_len == 2  # no further than it matched:
    assert every.tokens == [7, 8] and every.probs == pytest.approx([1, 2 / 3])
    assert every.evidence == [3, 2]  # three occurrences go on with 7, two of them with 8
    # an output being written (the session's open document) is an output too, and its
    # context is an occurrence whose next token is not written yet
    session.extend([2, 3, 4, 2, 3])
    local, every = match_mod.frequent_drafts(session, outputs, [2, 3], 8)
    assert local.tokens == [4, 2] and local.probs == pytest.approx([1 / 2, 1 / 2])
    assert every.tokens == [7, 8] and every.probs == pytest.approx([3 / 5, 2 / 5])
    # once it ends, it is the session's text only
    session.end_document()
    local, every = match_mod.frequent_drafts(session, outputs, [2, 3], 8)
    assert local.probs == pytest.approx([1, 1]) and every.probs == pytest.approx([1, 2 / 3])
    assert match_mod.frequent_drafts(session, None, [9, 9], 8)[1].tokens == []
    with pytest.raises(ValueError, match="same levels"):
        match_mod.frequent_drafts(session, Corpus(), [2, 3], 8)


def test_a_path_is_chosen_by_what_it_is_worth_to_the_model_when_that_is_known(engine):
    session, outputs = Corpus(min_context=1), Corpus(min_context=1)
    outputs.extend([1, 2, 3, 7, 7, 7])  # the whole context once, then 7 7 7
    outputs.end_document()
    for _ in range(5):  # its last token often, then 9
        outputs.extend([5, 3, 9, 9])
        outputs.end_document()
    # SuffixDecoding's score: three certainties after the one long occurrence
    every = match_mod.frequent_drafts(session, outputs, [1, 2, 3], 8)[1]
    assert every.tokens == [7, 7, 7] and every.score == pytest.approx(3)
    # a model that never takes what one occurrence says, and often what five agree on
    once = [FREQUENCY_CLASSES.index(c) for c in FREQUENCY_CLASSES if c.endswith("x1")]
    worth = np.full((2, len(FREQUENCY_CLASSES), 16), 0.9)
    worth[:, once] = 0.1
    every = match_mod.frequent_drafts(session, outputs, [1, 2, 3], 8, worth=worth)[1]
    assert every.tokens == [9] and every.match_len == 1 and every.score == pytest.approx(0.9)
