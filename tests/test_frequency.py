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
from agentspec.allocator import AGREED, MODIFIERS, SPLIT, TOKEN_CLASSES, AcceptanceModel, token_classes
from agentspec.costs import linear_costs
from agentspec.drafter import PROMPT, Request
from agentspec.frequency import FREQUENCY_CLASSES, FrequencyTree
from agentspec.policy import (Candidate, CostAware, Fixed, MostExpected, Policy, PolicyConfig,
                              ladder, mark_agreement)

try:  # the numba kernels, tested even where AGENTSPEC_NO_NUMBA=1 turned them off
    from agentspec import _accept_nb
except ImportError:
    _accept_nb = None


def request(rid, session, tokens, role="code"):
    return Request(id=rid, session=session, tokens=list(tokens), num_prompt=len(tokens),
                   role=role)


# --- the output tree ----------------------------------------------------------------------
def test_tree_drafts_the_most_frequent_continuation_with_its_frequency():
    tree = FrequencyTree()
    for tail in ([7, 8], [7, 8], [7, 9]):
        tree.add([1, 2, 3, *tail])
    d = tree.draft([5, 2, 3], 8)
    assert d.tokens[0] == 7 and d.match_len == 2  # drafts no further than it matched
    assert d.probs[0] == pytest.approx(1.0)
    if len(d.tokens) > 1:
        assert d.tokens[1] == 8 and d.probs[1] == pytest.approx(2 / 3)
    # 1 -> the class of certainty; 2/3 -> the band below 0.8
    assert [FREQUENCY_CLASSES[c] for c in d.classes] == ["F1", "F<.8"][:len(d.tokens)]
    assert tree.draft([42, 43], 8).tokens == []


def test_a_running_output_is_visible_at_once_and_the_oldest_texts_go_first():
    tree = FrequencyTree(max_texts=2)
    tree.start("r")
    tree.extend("r", [4, 5, 6, 4, 5])
    assert tree.draft([9, 4, 5], 4).tokens[:1] == [6]
    tree.add([1, 2, 3])
    tree.add([1, 2, 8])  # evicts the running request's text: its later tokens are dropped
    tree.extend("r", [6])
    tree.finish("r")
    assert tree.draft([9, 4, 5], 4).tokens == []
    assert tree.draft([0, 1, 2], 4).tokens[:1] in ([3], [8])


def test_full_runs_without_the_tree_with_one_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding._C", None)
    p = Policy(ladder()["full"], global_seed=[[1, 2, 3, 4]])
    assert p.tree is None and "arctic-inference" in p.warnings[0]
    p.register("A", PROMPT, [1, 2, 3, 4, 5, 6, 7, 8])
    r = request("r", "A", [0, 1, 2, 3])
    p.start(r)
    assert p.propose([r])[0][:2] == [4, 5]  # copies still draft


def test_a_tree_that_fails_is_dropped_with_a_warning_and_copies_go_on():
    p = Policy(ladder()["full"])

    class Refusing:
        def extend(self, seq, tokens):
            raise RuntimeError("Int32Map is full")

    p.tree.tree = Refusing()
    p.register("A", PROMPT, [1, 2, 3, 4, 5, 6, 7, 8])
    r = request("r", "A", [0, 1, 2, 3])
    p.start(r)
    r.tokens += [4]  # the output's first token goes to the tree, which refuses it
    assert p.propose([r])[0][:2] == [5, 6]
    assert p.tree is None and "frequency tree stopped: Int32Map is full" in p.warnings[0]


# --- per-token rows -------------------------------------------------------------------------
def test_token_classes():
    classes = token_classes([b"ab", b" word", b"\n", b"  \n", b"(", b"", b"7"]).tolist()
    assert classes == [0, 1, 2, 2, 3, 0, 0]


def test_agreement_marks_the_shared_path_and_where_the_two_part():
    a = Candidate([1, 2, 3, 4], 3, np.zeros(4, dtype=np.intp))
    b = Candidate([1, 2, 9], 2, np.zeros(3, dtype=np.intp))
    mark_agreement(a, b)
    assert (a.rows // TOKEN_CLASSES).tolist() == [AGREED, AGREED, SPLIT, 0]
    assert (b.rows // TOKEN_CLASSES).tolist() == [AGREED, AGREED, SPLIT]
    c = Candidate([1, 2], 3, np.zeros(2, dtype=np.intp))  # a prefix of the other: no split
    d = Candidate([1, 2, 5], 3, np.zeros(3, dtype=np.intp))
    mark_agreement(c, d)
    assert (d.rows // TOKEN_CLASSES).tolist() == [AGREED, AGREED, 0]


def test_each_row_learns_apart_from_the_others():
    model = AcceptanceModel(max_k=8)
    base = model.kind("F1")
    alone, agreed = np.full(4, base), np.full(4, base + AGREED * TOKEN_CLASSES)
    for _ in range(300):
        model.observe("code", 3, known=4, matched=0, source=alone)
        model.observe("code", 3, known=4, matched=4, source=agreed)
    assert model.accept_probs("code", 3, alone)[0] < 0.2
    assert model.accept_probs("code", 3, agreed)[0] > 0.8
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


# --- the numba kernels give the numpy path's answers ------------------------------------------
@pytest.mark.skipif(_accept_nb is None, reason="numba not installed")
def test_kernels_equal_the_numpy_reference(monkeypatch):
    costs = linear_costs(0.2, 64)
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
            answers.append((model.plan("code", m, rows, n, costs),
                            model.expected("code", m, rows, n)))
            known = int(rng.integers(0, n + 1))
            model.observe("code", m, known, int(rng.integers(0, known + 1)), rows)
        models.append((model, answers))
    (a, answers_a), (b, answers_b) = models
    assert answers_a == answers_b
    assert np.array_equal(a.by_row["code"][0], b.by_row["code"][0])
    assert np.array_equal(a.by_kind["code"][1], b.by_kind["code"][1])
    assert np.array_equal(a.pool["code"][1], b.pool["code"][1])


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
    p = Policy(replace(ladder()["full"], global_=False), global_seed=seed)  # no G copies
    r = request("r", "A", [1, 2, 3, 5, 6, 7])  # and S has no earlier 6 7
    p.start(r)
    draft = p.propose([r])[0]
    # the tree matched 5 6 7 and drafts no further than that
    assert draft and draft == [8, 9, 10][:len(draft)]
    assert p.global_seed_outputs == 3
    r.tokens += draft + [99]
    p.observe(r, len(draft), len(draft))
    # both candidates of the step were scored against what the target wrote
    assert p.acceptance.by_row["code"][0].sum() > 0


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
    assert p.tree is None and not p.warnings


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
        found = {kinds[int(c.rows[0]) // MODIFIERS]: c.tokens for c in p.running[rid].candidates}
        return {k: v for k, v in found.items() if "F" in k}

    # no output was seen yet: the session's tree drafts, sure of 7 at 2 in 3
    assert {k: v[:1] for k, v in frequency_candidates("r", "A").items()} == {"SF<.8": [7]}
    # a session never drafts from another one's text
    assert frequency_candidates("q", "B") == {}


def test_a_sessions_text_tree_keeps_its_last_two_segments(monkeypatch):
    from agentspec import policy as policy_module

    monkeypatch.setattr(policy_module, "TEXT_SEGMENT", 6)
    p = Policy(replace(ladder()["full"], global_=False))
    p.register("A", PROMPT, [5, 6, 7, 1, 1, 1])  # segment 1: 5 6 -> 7
    text = p.sessions["A"].text
    assert text.draft([5, 6], 4).tokens[:1] == [7]
    p.register("A", PROMPT, [2, 2, 2, 2, 2, 2])  # segment 2
    assert text.draft([5, 6], 4).tokens[:1] == [7]
    p.register("A", PROMPT, [3, 3, 3, 3, 3, 3])  # segment 3: segment 1 goes
    assert text.draft([5, 6], 4).tokens == [] and text.draft([2, 2], 4).tokens[:1] == [2]


def test_the_session_text_tree_is_a_rung_switch():
    p = Policy(replace(ladder()["full-no-session-text"], global_=False))
    p.register("A", PROMPT, [5, 6, 7, 1, 5, 6, 9, 2])
    assert p.sessions["A"].text is None and p.tree is not None
