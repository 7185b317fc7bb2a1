"""The frequency candidate of `full`: the output tree, the acceptance model's per-token rows and
numba kernels, and the policy choosing between copies and frequencies."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agentspec import allocator
from agentspec.allocator import (BIAS_BITS, KIND_SHIFT, MODIFIERS, NO_IDS, TOKEN_CLASSES,
                                 AcceptanceModel, draft_ids, token_classes, token_keys)
from agentspec.costs import linear_costs
from agentspec.drafter import PROMPT, Request
from agentspec.frequency import FREQUENCY_CLASSES, frequency_classes
from agentspec.policy import CostAware, Fixed, MostExpected, Policy, PolicyConfig, ladder

try:  # the numba kernels, tested even where AGENTSPEC_NO_NUMBA=1 turned them off
    from agentspec import _accept_nb
except ImportError:
    _accept_nb = None


def request(rid, session, tokens, role="code"):
    return Request(id=rid, session=session, tokens=list(tokens), num_prompt=len(tokens),
                   role=role)


# --- the frequency source ---------------------------------------------------------------------
def test_full_drafts_by_frequency_without_arctic_inference(monkeypatch):
    # the frequency drafts come from full's own corpora: no suffix tree library is needed
    monkeypatch.setitem(sys.modules, "arctic_inference", None)
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding._C", None)
    p = Policy(replace(ladder()["full"], global_=False))
    p.register("A", PROMPT, [5, 6, 7, 1, 5, 6, 7, 2])
    r = request("r", "A", [4, 4, 5, 6])
    p.start(r)
    p.propose([r])
    assert [c.tokens[:1] for c in p.running["r"].step()[0]] == [[7], [7]] and not p.warnings


def test_a_frequent_path_reports_how_sure_it_was_of_each_token_and_on_what_evidence():
    classes = frequency_classes([1.0, 2 / 3, 2 / 3], [1, 2, 4])
    # a share of 1 from one occurrence; 2/3 from two (the band below 0.8); then 1 from four
    assert [FREQUENCY_CLASSES[c] for c in classes] == ["F1x1", "F<.8x2", "F1x4"]


# --- per-token rows -------------------------------------------------------------------------
def test_token_classes():
    classes = token_classes([b"ab", b" word", b"\n", b"  \n", b"(", b"", b"7"]).tolist()
    assert classes == [0, 1, 2, 2, 3, 0, 0]


def test_each_row_learns_apart_from_the_others():
    model = AcceptanceModel(max_k=8)
    base = model.kind("F1")
    mid_word, new_word = np.full(4, base), np.full(4, base + 1)
    for _ in range(300):
        model.observe("code", 3, known=4, matched=0, source=mid_word)
        model.observe("code", 3, known=4, matched=4, source=new_word)
    assert model.accept_probs("code", 3, mid_word)[0] < 0.2
    assert model.accept_probs("code", 3, new_word)[0] > 0.8
    assert model.kind("S1") == MODIFIERS  # kinds take MODIFIERS rows each


@pytest.mark.parametrize("kernels", [None, _accept_nb])
def test_a_row_never_seen_starts_from_its_kind_not_from_the_role(monkeypatch, kernels):
    # past outputs the served model never takes (G), beside copies it always takes (S): a G
    # row of a token class never drafted before is predicted from G's other rows
    monkeypatch.setattr(allocator, "_nb", kernels)
    model = AcceptanceModel(max_k=8)
    s, g = model.kind("S1"), model.kind("G1")
    for _ in range(40):
        model.observe("code", 4, known=4, matched=4, source=np.full(4, s))
        for token_class in range(1, TOKEN_CLASSES):
            model.observe("code", 4, known=4, matched=0, source=np.full(4, g + token_class))
    unseen = np.full(4, g)  # G's tokens of class 0: not one observed
    assert model.accept_probs("code", 4, unseen)[0] < 0.15
    assert model.accept_probs("code", 4, np.full(4, s))[0] > 0.8


@pytest.mark.parametrize("kernels", [None, _accept_nb])
def test_token_offsets_learn_what_the_rows_cannot_tell_apart(monkeypatch, kernels):
    # one row, two words: the served model always writes "7" after "6" and never "9": the
    # offsets of those tokens (and pairs) part what the row's hazard pools
    monkeypatch.setattr(allocator, "_nb", kernels)
    model = AcceptanceModel(max_k=8)
    row = np.full(2, model.kind("F1"))
    taken, refused = draft_ids(6, [7, 8]), draft_ids(6, [9, 8])
    for _ in range(200):
        model.observe("code", 3, known=2, matched=2, source=row, ids=taken)
        model.observe("code", 3, known=2, matched=0, source=row, ids=refused)
    pooled = model.accept_probs("code", 3, row)[0]
    assert 0.3 < pooled < 0.7  # the row alone: a coin
    assert model.accept_probs("code", 3, row, ids=taken)[0] > 0.9
    assert model.accept_probs("code", 3, row, ids=refused)[0] < 0.1
    assert model.plan("code", 3, row, 2, linear_costs(0.2, 8), ids=refused)[0] == 0
    assert model.plan("code", 3, row, 2, linear_costs(0.2, 8), ids=taken)[0] == 2


def test_token_keys_put_each_offset_in_its_own_table():
    copy, path = 1 << KIND_SHIFT, 2 << KIND_SHIFT  # (rows of two kinds)
    keys = token_keys(draft_ids(5, [7, 7]), np.array([copy, copy + 1]))
    size = 1 << BIAS_BITS
    assert keys[0].tolist() == [7, 7] and keys[1].tolist() == [size + 5, size + 7]
    assert all(2 * size <= k < 3 * size for k in keys[2]) and keys[2][0] != keys[2][1]
    # the id within its kind: one key for a kind's rows, another for another kind's
    assert all(3 * size <= k < 4 * size for k in keys[3]) and keys[3][0] == keys[3][1]
    assert token_keys(draft_ids(5, [7]), np.array([path]))[3][0] != keys[3][0]


# --- the numba kernels give the numpy path's answers ------------------------------------------
@pytest.mark.skipif(_accept_nb is None, reason="numba not installed")
@pytest.mark.parametrize("costs", [
    linear_costs(0.2, 64),
    # a GPU's: the first 8 draft tokens nearly free, then dear (the kernel stops reading a
    # draft early only where no longer length could gain more: not inside the flat part)
    np.concatenate(([0.0], np.full(8, 0.02), 0.02 + 0.3 * np.arange(1, 57))),
    0.3 * np.sqrt(np.arange(65)),  # each token cheaper than the one before
], ids=["linear", "flat-then-steep", "concave"])
def test_kernels_equal_the_numpy_reference(monkeypatch, costs):
    models = []
    for kernels in (None, _accept_nb):
        monkeypatch.setattr(allocator, "_nb", kernels)
        rng = np.random.default_rng(0)
        model, answers = AcceptanceModel(max_k=64), []
        for step in range(400):
            kind = model.kind(["S1", "G=", "F1", "F<.4"][step % 4])
            n = int(rng.integers(1, 40))
            rows = kind + rng.integers(0, MODIFIERS, n)
            m = int(rng.integers(1, 300))
            # every other draft with its tokens (few ids: their offsets are shared and move)
            ids = draft_ids(int(rng.integers(0, 6)), rng.integers(0, 6, n)) if step % 2 \
                else NO_IDS
            answers.append((model.plan("code", m, rows, n, costs, ids=ids),
                            model.expected("code", m, rows, n, ids)))
            known = int(rng.integers(0, n + 1))
            model.observe("code", m, known, int(rng.integers(0, known + 1)), rows, ids)
        models.append((model, answers))
    (a, answers_a), (b, answers_b) = models
    assert answers_a == answers_b
    assert np.array_equal(a.bias, b.bias) and a.bias.any()
    assert np.array_equal(a.by_row["code"][0], b.by_row["code"][0])
    assert np.array_equal(a.by_kind["code"][1], b.by_kind["code"][1])
    assert np.array_equal(a.pool["code"][1], b.pool["code"][1])


@pytest.mark.parametrize("kernels", [None, _accept_nb])
def test_a_plan_reads_past_a_dear_token_when_free_ones_follow(monkeypatch, kernels):
    # the kernel stops reading a draft once no longer length can gain: here the second
    # token costs more than it is likely to add, and the thirty after it cost nothing
    monkeypatch.setattr(allocator, "_nb", kernels)
    model = AcceptanceModel(max_k=32)
    for _ in range(50):
        model.observe("code", 4, known=32, matched=32, source="S1")
    dear_then_free = np.concatenate(([0.0, 0.05], np.full(31, 2.0)))
    assert model.plan("code", 4, "S1", 32, dear_then_free)[0] == 32


def test_numpy_path_is_the_fallback():
    code = ("from agentspec import allocator\n"
            "assert allocator._nb is None\n"
            "m = allocator.AcceptanceModel()\n"
            "m.observe('code', 4, 3, 3, 'S1')\n"
            "assert m.length('code', 4, 8, allocator.np.zeros(9)) == 8\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env=dict(os.environ, AGENTSPEC_NO_NUMBA="1"),
                   cwd=Path(__file__).resolve().parent.parent)


# --- the policy --------------------------------------------------------------------------------
def test_full_drafts_what_past_outputs_say_when_nothing_can_be_copied():
    seed = [[5, 6, 7, 8, 9, 10, 11, 12]] * 3  # past outputs: 5 6 7 is always followed so
    p = Policy(ladder()["full-no-extension"], global_seed=seed)
    r = request("r", "A", [1, 2, 3, 5, 6, 7])  # and S has no earlier 6 7
    p.start(r)
    draft = p.propose([r])[0]
    # G feeds the frequency draft alone (no copy of it beside), no further than it matched
    [frequent] = p.running["r"].step()[0]
    assert frequent.frequency and frequent.tokens == [8, 9, 10]
    assert draft == [8, 9, 10][:len(draft)]
    assert p.global_seed_outputs == 3
    r.tokens += draft + [99]
    p.observe(r, len(draft), len(draft))
    # the candidate was scored against what the target wrote, once the next step plans
    assert p.acceptance.by_row["code"][0].sum() == 0
    p.propose([r])
    assert p.acceptance.by_row["code"][0].sum() > 0
    # without the frequency draft, G is copied from as the other corpora are
    p = Policy(ladder()["full-no-frequency"], global_seed=seed)
    r = request("r", "A", [1, 2, 3, 5, 6, 7])
    p.start(r)
    p.propose([r])
    [copy] = p.running["r"].step()[0]
    assert p.running["r"].source.startswith("G") and copy.tokens[:5] == [8, 9, 10, 11, 12]


def test_a_frequency_path_drafted_to_its_end_is_continued_by_the_path_after_it():
    seed = [[5, 6, 7, 8, 9, 10, 11, 12]] * 3  # as above: after 5 6 7, the path is 8 9 10
    p = Policy(ladder()["full"], global_seed=seed)
    r = request("r", "A", [1, 2, 3, 5, 6, 7])
    p.start(r)
    draft = p.propose([r])[0]
    # all of it pays (a fresh model expects most of it taken): after 5 6 7 8 9 10, 11 12
    [frequent] = p.running["r"].step()[0]
    assert frequent.frequency and frequent.tokens == [8, 9, 10, 11, 12]
    assert draft == frequent.tokens and p.running["r"].step()[2] == "code/frequency/1+"
    # the continuation's tokens have kinds of their own, which learn what the target takes
    kinds = {v: k for k, v in p.acceptance.kinds.items()}
    names = [kinds[int(row) // MODIFIERS] for row in frequent.rows]
    assert not names[0].startswith("+") and all(n.startswith("+F") for n in names[3:])
    r.tokens += [8, 9, 10, 11, 12, 99]
    p.observe(r, len(draft), len(draft))
    p.finish(r)  # (it learns what the request's last step showed)
    continued = p.acceptance.kinds[names[3]] * MODIFIERS
    t, h = p.acceptance.by_row["code"]
    width = len(t) // (len(p.acceptance.kinds) * MODIFIERS)
    assert h[continued * width:(continued + MODIFIERS) * width].sum() > 0
    # where the path is not drafted to its end, nothing is looked up after it
    p = Policy(replace(ladder()["full"], lam=5.0), global_seed=seed)
    r = request("r", "A", [1, 2, 3, 5, 6, 7])
    p.start(r)
    p.propose([r])
    assert [c.tokens for c in p.running["r"].step()[0]] == [[8, 9, 10]]


def test_a_frequency_source_the_model_never_follows_stops_drafting():
    cfg = replace(ladder()["full"], lam=0.2)
    p = Policy(cfg, global_seed=[[5, 6, 7, 8, 9, 10, 11, 12]] * 3)
    drafted = []
    for i in range(60):  # the served model writes something else every time
        r = request(f"r{i}", "A", [1, 2, 3, 5, 6, 7])
        p.start(r)
        draft = p.propose([r])[0]
        drafted.append(len(draft))
        r.tokens += [100 + i]
        p.observe(r, len(draft), 0)
        p.finish(r)
    assert drafted[0] > 0 and drafted[-1] == 0


def test_frequency_is_a_rung_switch_and_copies_alone_stay_as_they_were():
    assert ladder()["full"].length.frequency and isinstance(ladder()["global"].length, Fixed)
    p = Policy(PolicyConfig("x", global_=True, choose=MostExpected(), length=CostAware()))
    p.register("A", PROMPT, [5, 6, 7, 1, 5, 6, 7, 2])
    r = request("r", "A", [4, 4, 5, 6])
    p.start(r)
    p.propose([r])
    assert len(p.running["r"].step()[0]) == 1  # the copy: no frequency candidate
    assert p.g.levels[0] == p.sessions["A"].s.levels[0] == 2  # nor their shorter contexts


def test_full_drafts_by_frequency_from_the_sessions_own_text():
    # in this session's prompt, `5 6` is followed by 7 twice and by 9 once
    p = Policy(replace(ladder()["full"], global_=False))
    p.register("A", PROMPT, [5, 6, 7, 1, 5, 6, 9, 2, 5, 6, 7, 3])
    kinds = {}

    def frequency_candidates(rid: str, session: str) -> dict[str, list[int]]:
        r = request(rid, session, [4, 4, 5, 6])
        p.start(r)
        p.propose([r])
        kinds.update({v: k for k, v in p.acceptance.kinds.items()})
        found = {kinds[int(c.rows[0]) // MODIFIERS]: c.tokens for c in p.running[rid].step()[0]}
        return {k: v for k, v in found.items() if "F" in k}

    # no output was seen yet: the session's text drafts 7, at 2 in 4 (on two): the output's
    # document opens with the prompt's end, so `5 6` is also where the output starts, its
    # next token unwritten
    assert {k: v[:1] for k, v in frequency_candidates("r", "A").items()} == {"SF<.6x2": [7]}
    # a session never drafts from another one's text
    assert frequency_candidates("q", "B") == {}


def test_the_frequency_candidate_is_the_source_the_served_model_takes_more_of():
    # after `5 6` the session's text has 7 twice and the outputs 8 once and 9 once: which of
    # the two drafts is the candidate follows what the served model was seen to take
    def frequency_candidate(never_taken: str) -> tuple[str, list[int]]:
        p = Policy(ladder()["full"], global_seed=[[5, 6, 8, 0], [5, 6, 9, 0]])
        p.register("A", PROMPT, [5, 6, 7, 1, 5, 6, 7, 2])
        for kind in getattr(p, never_taken):
            for _ in range(100):
                p.acceptance.observe("code", 2, known=2, matched=0, source=np.full(2, kind))
        r = request("r", "A", [4, 4, 5, 6])
        p.start(r)
        p.propose([r])
        kinds = {v: k for k, v in p.acceptance.kinds.items()}
        found = [(kinds[int(c.rows[0]) // MODIFIERS], c.tokens[:1])
                 for c in p.running["r"].step()[0]]
        return next((kind, tokens) for kind, tokens in found if "F" in kind)

    kind, tokens = frequency_candidate("frequency_kinds")  # the outputs' drafts never taken
    assert kind.startswith("SF") and tokens == [7]
    kind, tokens = frequency_candidate("session_frequency_kinds")
    assert kind.startswith("F") and tokens in ([8], [9])


def test_the_session_text_is_a_rung_switch():
    p = Policy(replace(ladder()["full-no-session-text"], global_=False))
    p.register("A", PROMPT, [5, 6, 7, 1, 5, 6, 9, 2])
    r = request("r", "A", [4, 4, 5, 6])
    p.start(r)
    p.propose([r])
    kinds = {v: k for k, v in p.acceptance.kinds.items()}
    assert not [c for c in p.running["r"].step()[0]
                if kinds[int(c.rows[0]) // MODIFIERS].startswith("SF")]


def test_the_path_drafted_is_the_one_the_served_model_is_seen_to_take():
    # past outputs: the context 1 2 3 once, then 7 7 7; its last token 3 five times, then 9
    seed = [[1, 2, 3, 7, 7, 7]] + [[5, 3, 9, 9]] * 5

    def frequency_path(rung: str) -> list[int]:
        cfg = ladder()[rung]  # the path alone, not continued
        p = Policy(replace(cfg, length=replace(cfg.length, extend=False)), global_seed=seed)
        for c, kind in zip(FREQUENCY_CLASSES, p.frequency_kinds):  # what one output says
            for _ in range(100):  # is never what this model writes
                p.acceptance.observe("code", 1, known=3, matched=0 if "x1" in c else 3,
                                     source=np.full(3, kind))
        r = request("r", "A", [4, 1, 2, 3])
        p.start(r)
        p.propose([r])
        kinds = {v: k for k, v in p.acceptance.kinds.items()}
        return next(c.tokens for c in p.running["r"].step()[0]
                    if kinds[int(c.rows[0]) // MODIFIERS].startswith("F"))

    assert frequency_path("full") == [9]
    assert frequency_path("full-no-learned-paths") == [7, 7, 7]  # SuffixDecoding's pick
