import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.baselines import NgramDrafter, SuffixDrafter, ngram_propose
from agentspec.drafter import Request


def reference_ngram(tokens, min_n, max_n, k):
    """Plain loops: longest n first, earliest occurrence ending before the last token."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        for s in range(total - n):
            if tokens[s : s + n] == suffix:
                return tokens[s + n : s + n + k]
    return []


def ngram(tokens, min_n=2, max_n=4, k=5):
    return ngram_propose(np.array(tokens, dtype=np.int32), min_n, max_n, k).tolist()


def req(tokens, num_prompt, rid="r", session="s"):
    return Request(id=rid, session=session, tokens=list(tokens), num_prompt=num_prompt)


# ---------------------------------------------------------------- ngram


def test_ngram_longest_n_wins():
    # "2 3" occurs first (followed by 8) but "1 2 3" occurs later (followed by 4).
    seq = [2, 3, 8, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    assert ngram(seq) == [4, 5, 0, 1, 2]


def test_ngram_takes_earliest_occurrence():
    assert ngram([1, 2, 10, 1, 2, 20, 1, 2]) == [10, 1, 2, 20, 1]


def test_ngram_n_capped_at_max_n_then_earliest():
    # Suffix "1 2 3 4 5": a 5-long match exists later, but n is capped at 4, so the
    # earliest 4-long match ("2 3 4 5" followed by 77) wins.
    seq = [0, 2, 3, 4, 5, 77, 1, 2, 3, 4, 5, 88, 1, 2, 3, 4, 5]
    assert ngram(seq) == [77, 1, 2, 3, 4]
    assert ngram(seq, max_n=5) == [88, 1, 2, 3, 4]


def test_ngram_no_match():
    assert ngram([1, 2, 3, 4]) == []
    assert ngram([7, 1, 9, 1]) == []  # a single-token match is below min_n=2
    assert ngram([7, 1, 9, 1], min_n=1) == [9, 1]
    assert ngram([]) == [] and ngram([5]) == []


def test_ngram_k_cap_and_end_truncation():
    seq = [1, 2] + list(range(10, 30)) + [1, 2]
    assert ngram(seq) == [10, 11, 12, 13, 14]
    assert ngram(seq, k=3) == [10, 11, 12]
    assert ngram([1, 2, 3, 1, 2]) == [3, 1, 2]
    assert ngram([5, 5, 5, 5]) == [5]  # overlapping occurrence; one token left


@settings(max_examples=400, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=60),
    min_n=st.integers(1, 4),
    extra=st.integers(0, 3),
    k=st.integers(1, 8),
)
def test_ngram_matches_reference(tokens, min_n, extra, k):
    assert ngram(tokens, min_n, min_n + extra, k) == reference_ngram(tokens, min_n, min_n + extra, k)


@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=3000), prompt=st.integers(1, 50))
def test_ngram_drafter_incremental(tokens, prompt):
    prompt = min(prompt, len(tokens))
    d = NgramDrafter()
    r = req(tokens[:prompt], prompt)
    d.start(r)
    for i in range(prompt, len(tokens), 97):  # grows past the 1024 buffer
        r.tokens.extend(tokens[len(r.tokens) : i + 1])
        (draft,) = d.propose([r])
        assert draft == reference_ngram(r.tokens, 2, 4, 5)
        assert all(type(t) is int for t in draft)
    d.finish(r)


def test_ngram_only_searches_own_request():
    d = NgramDrafter()
    a = req([1, 2, 3, 4, 5, 6, 1, 2], 8, rid="a")
    b = req([9, 8, 1, 2], 4, rid="b")
    d.start(a), d.start(b)
    assert d.propose([a, b]) == [[3, 4, 5, 6, 1], []]


def test_ngram_max_model_len():
    d = NgramDrafter(max_model_len=10)
    r = req([1, 2, 3, 4, 5, 6, 7, 1, 2], 9)
    assert d.propose([r]) == [[3]]


# ---------------------------------------------------------------- suffix


def test_suffix_drafts_repeated_prompt_pattern():
    d = SuffixDrafter()
    cycle = list(range(100, 120))
    r = req(cycle * 2, 40)
    d.start(r)
    r.tokens += [100, 101, 102, 103]
    (draft,) = d.propose([r])
    assert draft[:3] == [104, 105, 106]
    assert all(type(t) is int for t in draft)


def test_suffix_global_tree_serves_later_request():
    d = SuffixDrafter()
    answer = list(range(200, 240))
    a = req([1, 2, 3], 3, rid="a", session="s1")
    d.start(a)
    a.tokens += answer[:5]
    d.propose([a])
    a.tokens += answer[5:]  # never proposed again: finish must add the rest
    d.finish(a)

    b = req([9, 9, 9], 3, rid="b", session="s2")  # another session: tree is global
    d.start(b)
    b.tokens += [220, 221, 222, 223]
    (draft,) = d.propose([b])
    assert draft[:3] == [224, 225, 226]


def test_suffix_draft_length_capped():
    cycle = list(range(300, 350))
    for depth in (24, 64):
        d = SuffixDrafter(max_tree_depth=depth)
        r = req(cycle * 4, 200)
        d.start(r)
        lengths = []
        for t in cycle * 2:
            r.tokens.append(t)
            (draft,) = d.propose([r])
            lengths.append(len(draft))
        assert max(lengths) <= min(32, depth)
        if depth == 64:
            assert max(lengths) == 32
        d.finish(r)


def test_suffix_unique_arctic_ids():
    d = SuffixDrafter()
    x = req([1, 2, 3], 3, rid="same", session="s1")
    y = req([4, 5, 6], 3, rid="same", session="s2")
    d.start(x), d.start(y)
    assert len(d.cache.active_requests) == 2
    x.tokens.append(7)
    y.tokens.append(8)
    d.propose([x, y])
    d.finish(x), d.finish(y)
    z = req([1, 2, 3], 3, rid="same", session="s1")  # id reused after finish
    d.start(z)
    assert len(d.cache.cached_requests) == 3  # earlier responses not evicted
    d.finish(z)
    assert len(d.cache.active_requests) == 0


def test_suffix_lazy_start_and_eviction():
    d = SuffixDrafter(max_cached_requests=1)
    for i in range(3):
        r = req([1, 2], 2, rid=str(i))
        r.tokens += [10 + i]
        d.propose([r])  # never started: propose starts it, like vLLM
        d.finish(r)
    assert len(d.cache.cached_requests) == 1


if __name__ == "__main__":
    pytest.main([__file__, "-q"])


def test_suffix_starts_with_the_outputs_every_method_is_given():
    seed = [list(range(300, 340))]
    warm, cold = SuffixDrafter(global_seed=seed), SuffixDrafter(name="suffix-cold")
    assert (warm.global_seed_outputs, cold.global_seed_outputs) == (1, 0)
    drafts = []
    for d in (warm, cold):
        r = req([9, 9, 9, 320, 321, 322, 323], 3)
        d.start(r)
        drafts.append(d.propose([r])[0])
    assert drafts[0][:3] == [324, 325, 326] and drafts[1] == []
