import json
import math
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from agentspec.allocator import (AGREES, ALONE, COPY_BINS, DIFFERS, KIND_SHIFT, MODIFIERS,
                                 QUIET, TOKEN_CLASSES,
                                 AcceptanceModel, agentspec_lengths, agreement, copy_bin,
                                 hazard_counts, logit, redundancy, scored)
from agentspec.controller import Controller, KmaxError, KmaxTable, load_kmax
from agentspec.costs import BatchCost, CostProfile, linear_costs
from agentspec.drafter import FILE, PROMPT, TOOL, Request
from agentspec.match import Match
from agentspec.policy import (Algorithm2, CostAware, Fixed, Longest, MostExpected, Policy,
                              PolicyConfig, draft_kind, emission_forms, ladder,
                              numbered_listings)
from agentspec.structure import token_bytes
from agentspec.tokens import CHATML, ChatTokenizer
from conftest import run_without_numba, tiny_tokenizer

try:  # the compiled plan, tested beside its reference where numba imports
    from agentspec import _policy_nb
except ImportError:
    _policy_nb = None


# --- controller -------------------------------------------------------------------------
def test_controller_length_and_update():
    c = Controller(lam=0.05, kmax={"code": 20})
    assert c.length("code", 0) == 0
    assert c.length("code", 7) == 7 and c.length("code", 100) == 20
    assert c.length("review", 100) == 32  # unknown role: default cap
    c.update("code", drafted=5, accepted=5)
    assert c.alpha["code"] == pytest.approx(1.475)
    c.update("code", drafted=5, accepted=2)
    assert c.alpha["code"] == pytest.approx(1.45)
    c.update("code", drafted=20, accepted=20)  # cut by the cap: no update
    assert c.alpha["code"] == pytest.approx(1.45)
    for _ in range(100):
        c.update("code", drafted=3, accepted=3)
    assert c.alpha["code"] == 12.0
    for _ in range(1000):
        c.update("code", drafted=3, accepted=0)
    assert c.alpha["code"] == 0.05
    assert c.length("code", 3) == 1  # clip at 1


def runs(rs, m=8):
    return [(m, r) for r in rs]


def test_kmax_from_runs_matches_the_article_example():
    # Pr(R >= 11) = 0.12, Pr(R >= 12) = 0.09 at lambda 0.1 -> Kmax 11
    t = KmaxTable.from_runs(0.1, {"code": runs([0] * 88 + [11] * 3 + [12] * 9)}, max_k=64)
    assert t.survival["code"][10] == pytest.approx(0.12)
    assert t.survival["code"][11] == pytest.approx(0.09)
    assert t.kmax["code"] == 11
    assert KmaxTable.from_runs(0.5, {"x": runs([0, 0, 1])}, 8).kmax["x"] == 1


def test_copy_bins_and_hazard_counts():
    bins = [copy_bin(n) for n in range(1, 8000)]
    assert bins[:32] == list(range(32)) and bins == sorted(bins) and bins[-1] == COPY_BINS - 1
    # a 4-token draft after a 3-token match that matched 2: copies of 3 and 4 continued,
    # the copy of 5 did not
    trials, hits = hazard_counts([(3, 2)], max_k=4)
    assert trials[[copy_bin(3), copy_bin(4), copy_bin(5)]].tolist() == [1, 1, 1]
    assert hits[[copy_bin(3), copy_bin(4), copy_bin(5)]].tolist() == [1, 1, 0]
    assert trials.sum() == 3
    # R = max_k: every drafted position was reached and accepted, none past it counted
    trials, hits = hazard_counts([(1, 4)], max_k=4)
    assert trials.sum() == hits.sum() == 4


def test_kmax_hazard_by_copy_length():
    t = KmaxTable.from_runs(0.2, {"code": runs([0, 0], m=2) + runs([30, 30], m=20)}, 32)
    trials, hits = t.hazard["code"]
    assert trials[copy_bin(2)] == 2 and hits[copy_bin(2)] == 0
    assert trials[copy_bin(25)] == hits[copy_bin(25)] == 2
    # the prior makes the allocator draft long copies long and short matches not at all
    model = AcceptanceModel(max_k=32, prior=t.hazard)
    assert model.length("code", 20, cap=32, costs=linear_costs(0.3, 32)) >= 28
    assert model.length("code", 2, cap=32, costs=linear_costs(0.3, 32)) == 0
    # a copy followed past what the profile saw keeps the last hazard it knew
    assert model.length("code", 1000, cap=32, costs=linear_costs(0.3, 32)) > 0


def test_kmax_file_round_trip_and_errors(tmp_path):
    t = KmaxTable.from_runs(0.2, {"code": runs([1, 2, 3, 40]), "review": runs([0, 1], 3)}, 8)
    t.save(tmp_path / "k.json")
    again = load_kmax(tmp_path / "k.json")
    assert again.kmax == t.kmax and again.survival == t.survival and again.lam == 0.2
    assert again.hazard == t.hazard
    broken = t.to_json()
    broken["hazard_by_copy_length"]["code"]["hits"][0] = 99.0
    (tmp_path / "hz.json").write_text(json.dumps(broken))
    with pytest.raises(KmaxError, match="hazard_by_copy_length"):
        load_kmax(tmp_path / "hz.json")
    for field, value, says in (("kmax", "x", "'kmax' must be an object of role: integer"),
                               ("lambda", None, "no 'lambda'"),
                               ("hazard_by_copy_length", {"code": {"trials": [1]}},
                                "'hazard_by_copy_length' must be")):
        broken = t.to_json()
        if value is None:
            del broken[field]
        else:
            broken[field] = value
        (tmp_path / "field.json").write_text(json.dumps(broken))
        with pytest.raises(KmaxError, match=f"field.json: bad Kmax table: {says}"):
            load_kmax(tmp_path / "field.json")
    (tmp_path / "bad.json").write_text("{broken")
    with pytest.raises(KmaxError, match="bad.json"):
        load_kmax(tmp_path / "bad.json")
    (tmp_path / "wrong.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(KmaxError, match="format"):
        load_kmax(tmp_path / "wrong.json")
    with pytest.raises(KmaxError, match="no such"):
        load_kmax(tmp_path / "missing.json")


# --- allocators -------------------------------------------------------------------------
def test_redundancy_and_algorithm2():
    assert redundancy(0, 0, 0.3) == 0.0
    assert redundancy(1, 1, 0.3) == pytest.approx(0.3)  # p(1) = g_min
    assert redundancy(3, 4, 0.3) == pytest.approx(0.75 * (0.3 + 0.7 * (1 - math.exp(-3))))
    # budget floor(32 / 2) = 16 split by g; each gets at least |CT*|
    lengths = agentspec_lengths([(4, 4, 2), (4, 1, 9)], alpha=32, g_min=0.3)
    g1, g2 = redundancy(4, 4, 0.3), redundancy(1, 4, 0.3)
    assert lengths == [max(2, int(16 * g1 / (g1 + g2))), max(9, int(16 * g2 / (g1 + g2)))]
    assert agentspec_lengths([None, (1, 1, 3)], alpha=32, g_min=0.3) == [0, 16]


def test_cost_aware_learns_acceptance():
    model = AcceptanceModel(max_k=16)
    costs = linear_costs(0.2, 16)
    assert model.rate == 1.0  # no history
    model.charge(0.2 * 4, accepted=4)
    assert model.rate > 1.0  # faster than plain: the bar rises with R
    slow = AcceptanceModel(max_k=16)
    for _ in range(50):
        slow.charge(0.2 * 16, accepted=0)  # long drafts all rejected
    assert slow.rate == 1.0  # never below plain's rate: waste does not make drafts cheaper
    before = model.length("code", 8, cap=16, costs=costs)
    for _ in range(300):
        model.observe("code", 8, known=16, matched=16)
    assert model.length("code", 8, cap=16, costs=costs) == 16 > before
    for _ in range(300):
        model.observe("review", 8, known=8, matched=0)
    assert model.length("review", 8, cap=16, costs=costs) == 0
    assert model.length("code", 0, cap=16, costs=0 * costs) == 0
    # a higher lambda never drafts more
    assert model.length("code", 3, 16, linear_costs(0.9, 16)) <= model.length("code", 3, 16,
                                                                               costs)


def test_drafts_that_take_less_than_predicted_make_the_next_plans_shorter():
    def trained(calibrate_sent: bool) -> AcceptanceModel:
        model = AcceptanceModel(max_k=16, calibrate_sent=calibrate_sent)
        for _ in range(300):  # half the drafts are taken whole, half not at all
            model.observe("code", 8, known=16, matched=16)
            model.observe("code", 8, known=16, matched=0)
        return model

    costs = linear_costs(0.3, 16)  # every token's p ~0.5 pays at R = 1; not at twice that
    model, plain = trained(True), trained(False)
    assert model.sent_ratio("code") == 1.0 and model.length("code", 8, 16, costs) > 0
    before = model.length("code", 8, 16, costs)
    for _ in range(3000):  # the drafts sent take half the tokens the model predicted
        model.observe_sent("code", predicted=2.0, accepted=1)
        plain.observe_sent("code", predicted=2.0, accepted=1)
    assert model.sent_ratio("code") == pytest.approx(2.0, abs=0.05)
    assert model.length("code", 8, 16, costs) < before == plain.length("code", 8, 16, costs)
    assert model.sent_ratio("review") == plain.sent_ratio("code") == 1.0  # per key; or off
    # a plan is priced by the ratio of the decision it makes (the policy's `sent_key`)
    assert model.plan("code", 8, "", 16, costs, sent="code/copy/2")[0] == before
    for _ in range(3000):  # a stretch where nothing sent is taken still lets plans draft
        model.observe_sent("code", predicted=2.0, accepted=0)
    assert model.sent_ratio("code") == 2.0


def test_where_nothing_pays_at_r_a_quiet_step_prices_at_one_token_a_step():
    model = AcceptanceModel(max_k=16, calibrate_sent=True)
    for i in range(400):  # a quarter of first tokens after 8 matched tokens are taken
        model.observe("code", 8, known=1, matched=int(i % 4 == 0))
    for _ in range(100):
        model.charge(0.2 * 4, accepted=4)  # a fast stretch: R well above 1
    p = model.accept_probs("code", 8, n=1)[0]
    costs = linear_costs(0.2, 16)
    assert 0.2 < p < 0.2 * model.rate  # worth a token's price at 1 token a step, not at R
    assert model.plan("code", 8, "", 16, costs, sent="code/copy/1")[0] == 0
    quiet = "code" + QUIET
    assert model.planning_rate(quiet) == model.sent_ratio(quiet) == 1.0
    assert model.plan("code", 8, "", 16, costs, sent=quiet)[0] == 1
    for _ in range(3000):  # the drafts so sent take half what was predicted: their own ratio
        model.observe_sent(quiet, predicted=0.5, accepted=0)
        model.observe_sent(quiet, predicted=0.5, accepted=1)
    assert model.planning_rate(quiet) == pytest.approx(1.0, abs=0.05)
    for _ in range(3000):
        model.observe_sent(quiet, predicted=0.5, accepted=0)
    assert model.planning_rate(quiet) == 2.0 and model.plan("code", 8, "", 16, costs,
                                                            sent=quiet)[0] == 0


def test_a_rarely_seen_source_borrows_what_the_model_does_elsewhere():
    prior = {"code": ([16.0] * COPY_BINS, [15.0] * COPY_BINS)}  # the traces: copies hold
    model = AcceptanceModel(max_k=8, prior=prior)
    assert model.accept_probs("code", 5, "G1", 1)[0] == pytest.approx(15 / 16)
    for _ in range(300):  # the model being served breaks copies of S at length 5
        model.observe("code", 5, known=1, matched=0, source="S1")
    # G1 never drafted: it starts from the role's pooled curve, not the traces' prior
    assert model.accept_probs("code", 5, "G1", 1)[0] < 0.2
    for _ in range(300):  # until its own counts say otherwise
        model.observe("code", 5, known=1, matched=1, source="G1")
    assert model.accept_probs("code", 5, "G1", 1)[0] > 0.9
    assert model.accept_probs("code", 5, "S1", 1)[0] < 0.2
    # another role keeps its own prior
    assert model.accept_probs("review", 5, "G1", 1)[0] == pytest.approx(0.8)


def test_copies_of_neighbouring_lengths_learn_together():
    model = AcceptanceModel(max_k=8)
    far = model.accept_probs("code", 30, n=1)[0]
    for _ in range(200):  # copies of length 10 break
        model.observe("code", 10, known=1, matched=0)
    assert model.accept_probs("code", 11, n=1)[0] < 0.5  # so do those of length 11
    assert model.accept_probs("code", 30, n=1)[0] == far  # not those much longer


def test_cost_aware_drafts_where_the_measured_cost_curve_pays():
    model = AcceptanceModel(max_k=16)
    for _ in range(300):  # every token accepted with probability 0.9
        model.observe("code", 8, known=16, matched=16)
    p = model.accept_probs("code", 8, n=16)
    gains = np.cumsum(p)
    # linear costs: token k while p_k >= lambda * R
    assert model.length("code", 8, 16, linear_costs(0.5, 16)) == int(np.sum(p >= 0.5))
    # a step that costs a lot more past 4 tokens per row: stop at 4
    steep = np.array([0.0, 0.05, 0.1, 0.15, 0.2] + [5.0 + n for n in range(12)])
    assert model.length("code", 8, 16, steep) == 4
    # a fixed price for any draft: all or nothing, whatever the per-token slope
    flat = np.array([0.0] + [gains[-1] - 0.5] * 16)
    assert model.length("code", 8, 16, flat) == 16


def test_draft_costs_follow_the_measured_curve():
    prof = CostProfile(backend="mlx", model="m", batches={
        1: BatchCost([1, 2, 3, 5, 9], [0.10, 0.12, 0.11, 0.16, 0.20], 0.12),
        4: BatchCost([1, 2, 3, 5, 9], [0.20, 0.30, 0.40, 0.60, 1.00], 0.5)})
    c1 = prof.draft_costs(1, 12)
    assert c1[0] == 0.0 and c1[1] == pytest.approx(0.2)
    assert c1[2] == pytest.approx(0.2)  # a faster measurement never makes more tokens cheaper
    assert all(np.diff(c1) >= 0)
    assert c1[12] == pytest.approx((0.20 + 0.01 * 4 - 0.10) / 0.10)  # last slope onwards
    assert prof.draft_costs(4, 4)[4] == pytest.approx(2.0)
    assert prof.draft_costs(2, 4)[4] == pytest.approx(c1[4] + (2.0 - c1[4]) / 3)


def test_every_rung_plans_with_lambda_of_the_batch_size_it_runs_at():
    from agentspec.bench import BenchSetup, make_drafter

    prof = CostProfile(backend="mlx", model="m", batches={
        1: BatchCost([1, 2, 3], [0.10, 0.11, 0.12], 0.1),
        4: BatchCost([1, 2, 3], [0.20, 0.30, 0.40], 0.5)})
    setup = BenchSetup(profile=prof)
    assert (setup.lam_at(1), setup.lam_at(4)) == (0.1, 0.5)
    assert BenchSetup(profile=prof, lam=0.3).lam_at(4) == 0.3  # --lambda wins
    assert BenchSetup().lam_at(16) == 0.2
    agspec = make_drafter("agspec", setup)
    batch = [request(f"r{i}", "A", [1, 2, 3]) for i in range(4)]
    for r in batch:
        agspec.start(r)
    agspec.propose(batch)
    assert agspec.controller.lam == 0.5 and agspec.controller.tau == 0.5
    agspec.propose(batch[:1])
    assert agspec.controller.lam == 0.1


def test_the_token_after_a_fully_accepted_draft_teaches_the_next_position():
    model = AcceptanceModel(max_k=8, prior_weight=4)
    before = model.accept_probs("code", 40)[2]
    for _ in range(50):
        model.observe("code", 40, known=3, matched=3)
    assert model.accept_probs("code", 40)[2] > max(before, 0.9)
    for _ in range(50):
        model.observe("code", 40, known=3, matched=2)
    assert model.accept_probs("code", 40)[2] < 0.6


def test_drafts_grow_while_the_output_keeps_copying():
    """A model repeating itself: the cost-aware length grows with every confirmed token."""
    p = Policy(ladder(0.2)["full"])
    loop = list(range(100, 140))
    r = request("r", "A", [1, 2, 3] + loop)
    p.start(r)
    lengths = []
    while len(r.output) < 40 * 8:
        draft = p.propose([r])[0]
        n = len(r.output)
        truth = [loop[(n + i) % 40] for i in range(len(draft) + 1)]
        a = next((i for i, (d, t) in enumerate(zip(draft, truth)) if d != t), len(draft))
        r.tokens += truth[:a + 1]
        p.observe(r, len(draft), a)
        lengths.append(len(draft))
    assert max(lengths[-5:]) > 8


def test_an_output_repeating_itself_is_drafted_past_its_period():
    loop = [7, 8, 9]
    for follow, draft in ((False, loop), (True, (loop * 4)[:10])):
        p = Policy(PolicyConfig("x", length=Fixed(10), follow=follow))
        r = request("r", "A", [1, 2, 3, 4], output=loop * 3)
        p.start(r)
        assert p.propose([r])[0] == draft
    # a continuation that stops at a document's end is not a loop
    p = Policy(PolicyConfig("x", length=Fixed(10), follow=True))
    p.register("A", PROMPT, [5, 6, 7, 8, 9])
    r = request("r", "A", [5, 6])
    p.start(r)
    assert p.propose([r])[0] == [7, 8, 9]


# --- corpora ----------------------------------------------------------------------------
def request(rid, session, tokens, role="code", output=()):
    return Request(id=rid, session=session, tokens=list(tokens) + list(output),
                   num_prompt=len(tokens), role=role)


def test_session_corpus_drafts_from_earlier_prompts_and_outputs():
    p = Policy(PolicyConfig("session", length=Fixed(4)))
    p.register("A", PROMPT, [1, 2, 3, 4, 5, 6, 7, 8])
    r = request("r1", "A", [9, 1, 2, 3])
    p.start(r)
    assert p.propose([r]) == [[4, 5, 6, 7]]
    r.tokens += [4, 5]
    p.observe(r, 4, 2)
    p.finish(r)
    # another session never sees A's text
    other = request("r2", "B", [1, 2, 3])
    p.start(other)
    assert p.propose([other]) == [[]]
    # A's finished output is in A's S for the next call
    p.register("A", TOOL, [50, 51])
    nxt = request("r3", "A", [60, 9, 1, 2])
    p.start(nxt)
    assert p.propose([nxt])[0][:2] == [3, 4]


def test_global_needs_a_match_longer_by_more_than_delta():
    cfg = PolicyConfig("global", global_=True, length=Fixed(3), choose=Longest(5))
    seed = [[10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]]
    p = Policy(cfg, global_seed=seed)
    p.register("A", PROMPT, [16, 17, 90, 91, 92])  # S matches 2 tokens
    short = request("r1", "A", [15, 16, 17])  # G matches 3 = 2 + 1: S wins
    p.start(short)
    assert p.propose([short]) == [[90, 91, 92]]
    long = request("r2", "A", [10, 11, 12, 13, 14, 15, 16, 17])  # G: 8 > 2 + 5
    p.start(long)
    assert p.propose([long]) == [[18, 19, 20]]


def test_an_output_starts_as_earlier_outputs_did_after_the_same_prompt_end():
    header = [90, 91, 92]  # what every prompt ends with (a chat template's assistant header)

    def first_draft(lead: bool) -> list[int]:
        p = Policy(PolicyConfig("s", lead=lead, length=Fixed(4)))
        earlier = request("r1", "A", [1, 2, 3] + header, output=[5, 6, 7, 8, 9])
        p.start(earlier)
        p.finish(earlier)
        r = request("r2", "A", [4, 4, 4] + header)
        p.start(r)
        return p.propose([r])[0]

    assert first_draft(lead=True) == [5, 6, 7, 8] and first_draft(lead=False) == []


def test_an_output_lead_joins_g_so_other_sessions_start_from_it():
    p = Policy(replace(ladder()["full"], listings=False))
    for i in range(3):  # three sessions' outputs start alike after the header
        earlier = request(f"a{i}", f"A{i}", [i, 90, 91, 92], output=[5, 6, 7, 8, 9, 10 + i])
        p.start(earlier)
        p.finish(earlier)
    r = request("b", "B", [40, 90, 91, 92])  # a new session: nothing in its own S
    p.start(r)
    p.propose([r])
    paths = [c.tokens for c in p.running["b"].step()[0] if c.frequency]
    assert paths and paths[0][:5] == [5, 6, 7, 8, 9]


def test_workspace_and_emission_forms():
    tok = ChatTokenizer(tiny_tokenizer(), CHATML)
    text = "def add(a, b):\n    return a - b\n"
    assert emission_forms(text) == (" def add(a, b):\n     return a - b\n",
                                    "-def add(a, b):\n-    return a - b\n")
    written = tok.encode("--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-")
    target = tok.encode("    return a - b\n")

    def draft(cfg, output):
        p = Policy(cfg, encode=tok.encode, token_bytes=token_bytes(tok.tokenizer))
        p.register("A", FILE, tok.encode(text), "src/calc.py")
        r = request("r", "A", [0], output=output)  # the model wrote the diff so far
        p.start(r)
        return p.propose([r])[0], len(p.sessions["A"].w)

    workspace = PolicyConfig("workspace", session=False, workspace=True, length=Fixed(len(target)))
    emission = replace(workspace, name="emission", emission=True)
    (raw, _), (diff, held) = draft(workspace, written), draft(emission, written)
    assert diff == target and raw != target
    # the forms are encoded once an output writes a hunk header, not before
    no_hunk = tok.encode("--- a/src/calc.py\n+++ b/src/calc.py\n")
    assert draft(emission, no_hunk)[1] == len(tok.encode(text)) < held


def test_numbered_listings_are_the_runs_of_consecutively_numbered_lines():
    swe = "[File: calc.py (4 lines total)]\n1:def add(a, b):\n2:\n3:    return a - b\n(Open file)\n"
    cat_n = "     7\tx = 1\n     8\t    y = 2\n     9\tz = 3\n"
    assert numbered_listings(swe) == ["def add(a, b):\n\n    return a - b\n"]
    assert numbered_listings(cat_n) == ["x = 1\n    y = 2\nz = 3\n"]
    # grep hits, times and short runs are not listings
    assert numbered_listings("12:30 lunch\n4:a\n9:b\n11:c\n1:x\n2:y\n") == []


def test_a_line_copied_from_a_numbered_listing_drafts_past_the_line_start():
    tok = ChatTokenizer(tiny_tokenizer(), CHATML)
    shown = "[File: calc.py]\n1:def add(a, b):\n2:    total = a - b\n3:    return total\n"
    written = tok.encode("edit 1:3\ndef add(a, b):\n    total = a - b\n    return total\n")
    cut = len(tok.encode("edit 1:3\ndef add(a, b):"))
    ctx, target = written[:cut], written[cut:]  # the draft starts at the line break

    def draft(listings):
        cfg = PolicyConfig("s", listings=listings, length=Fixed(len(target)))
        p = Policy(cfg, encode=tok.encode, token_bytes=token_bytes(tok.tokenizer))
        p.register("A", TOOL, tok.encode(shown))
        r = request("r", "A", [0] + ctx)
        p.start(r)
        return p.propose([r])[0]

    assert draft(True) == target and draft(False) != target


def test_a_listing_shown_again_is_not_added_again():
    tok = ChatTokenizer(tiny_tokenizer(), CHATML)
    shown = tok.encode("[File: calc.py]\n1:def add(a, b):\n2:    total = a - b\n3:    return total\n")
    p = Policy(PolicyConfig("s", listings=True), encode=tok.encode,
               token_bytes=token_bytes(tok.tokenizer))
    p.register("A", TOOL, shown)
    once = len(p.sessions["A"].s)  # (real tokens held)
    assert once > len(shown)  # the tool output, and its lines unnumbered
    p.register("A", TOOL, shown)  # the viewer shows the same window again
    assert len(p.sessions["A"].s) - once == len(shown)  # the output only


def test_structure_isolation_drafts_only_from_the_same_block():
    tok = ChatTokenizer(tiny_tokenizer(), CHATML)
    from agentspec.structure import token_bytes

    cfg = ladder()["agentspec-s"]
    p = Policy(cfg, token_bytes=token_bytes(tok.tokenizer))
    structure = (("```diff", "```"),)
    first = tok.encode("Old: return a - b\n```diff\n return a + b\n```\n")
    r = Request(id="r1", session="A", tokens=[0], num_prompt=1, structure=structure)
    p.start(r)
    r.tokens += first
    p.finish(r)
    # the same context drafts from the history of the block it is in
    outside = tok.encode("Now: return a")
    r2 = Request(id="r2", session="A", tokens=[0] + outside, num_prompt=1 + len(outside),
                 structure=structure)
    p.start(r2)
    (d_out,) = p.propose([r2])
    assert tok.decode(d_out).startswith(" - b\n")
    inside = tok.encode("```diff\n return a")
    r3 = Request(id="r3", session="A", tokens=[0], num_prompt=1, structure=structure)
    p.start(r3)
    r3.tokens += inside
    (d_in,) = p.propose([r3])
    assert tok.decode(d_in).startswith(" + b\n")


def test_bad_structure_affects_only_that_request():
    tok = ChatTokenizer(tiny_tokenizer(), CHATML)
    from agentspec.structure import token_bytes

    p = Policy(ladder()["full"], token_bytes=token_bytes(tok.tokenizer))
    r = Request(id="bad", session="A", tokens=[1, 2], num_prompt=2, structure=(("", "x"),))
    p.start(r)
    assert p.propose([r]) == [[]]
    assert "structure ignored" in p.warnings[0]


def test_expected_chooser_prefers_the_corpus_that_gets_accepted():
    cfg = PolicyConfig("x", global_=True, choose=MostExpected(), length=CostAware(), lam=0.1)
    p = Policy(cfg, global_seed=[[1, 2, 3, 7, 7, 7, 7, 7]])
    p.register("A", PROMPT, [1, 2, 3, 4, 5, 6])  # S and G both match [1, 2, 3]
    for _ in range(200):  # history: S's drafts fail, G's hold
        p.acceptance.observe("code", 3, known=4, matched=0, source="S1")
        p.acceptance.observe("code", 3, known=4, matched=4, source="G1")
    r = request("r", "A", [9, 1, 2, 3])
    p.start(r)
    assert p.propose([r])[0][:3] == [7, 7, 7]
    assert p.running["r"].source == "G1"  # one occurrence in G


def test_draft_kind_tells_agreeing_occurrences_from_a_vote():
    one = Match(length=3, tokens=[4], candidates=1, agree=1, agreed=1, position=0)
    assert draft_kind("S", one) == "S1"
    assert draft_kind("W", replace(one, candidates=3, agree=3)) == "W="
    assert draft_kind("G", replace(one, candidates=3, agree=2)) == "G~"
    # the policy learns each kind apart: a split vote in S does not discredit S's
    # unanimous continuations (copies only: no frequency candidate)
    full = ladder()["full"]
    p = Policy(replace(full, length=replace(full.length, frequency=False)))
    p.register("A", PROMPT, [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 7, 8, 9, 5])
    for _ in range(200):
        p.acceptance.observe("code", 3, known=4, matched=0, source="S~")
        p.acceptance.observe("code", 3, known=4, matched=4, source="S=")
    split = request("r", "A", [0, 7, 8, 9])  # [7, 8, 9] went on to 4 once and 5 once
    whole = request("q", "A", [0, 1, 2, 3])  # [1, 2, 3] went on to 4, 5, 6 both times
    p.start(split)
    p.start(whole)
    drafts = p.propose([split, whole])
    assert drafts[0] == [] and drafts[1][:4] == [4, 5, 6, 7]  # the most recent occurrence
    assert (p.running["r"].source, p.running["q"].source) == ("S~", "S=")


@pytest.mark.parametrize("compiled", [True, False] if _policy_nb is not None else [False])
def test_a_copy_past_its_occurrences_common_prefix_has_a_kind_of_its_own(compiled):
    # [1, 2, 3] went on with 4, 5, 6 both times, then with 7 once and 8 once: the copy's
    # first three tokens are what every occurrence said, the rest only the most recent's
    full = ladder()["full"]
    p = Policy(replace(full, length=replace(full.length, frequency=False)))
    p.compiled = p.compiled and compiled
    p.register("A", PROMPT, [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3, 4, 5, 6, 8, 9])
    r = request("r", "A", [0, 1, 2, 3])
    p.start(r)
    p.propose([r])
    (copy,), _, _ = p.running["r"].step()
    names = {row: name for name, row in p.acceptance.kinds.items()}
    assert copy.tokens == [4, 5, 6, 8, 9]
    assert [names[int(row) >> KIND_SHIFT] for row in copy.rows] == ["S="] * 3 + ["S=>"] * 2


@pytest.mark.parametrize("change, named", [
    ({"length": "costly"}, "policy 'x': length='costly' is not a length strategy (Fixed, Alpha, "
                           "Algorithm2, CostAware)"),
    ({"choose": "best"}, "policy 'x': choose='best' is not a chooser (Longest, MostExpected)"),
    ({"choose": MostExpected()}, "policy 'x': length=Fixed(k=10) must be CostAware"),
    ({"max_k": 0}, "policy 'x': max_k=0 must be at least 1"),
    ({"lam": -0.5}, "policy 'x': lam=-0.5 must be a number >= 0"),
    ({"lam": float("nan")}, "policy 'x': lam=nan"),
])
def test_a_bad_strategy_fails_at_construction_naming_it(change, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        PolicyConfig("x", **change)


@pytest.mark.parametrize("make, named", [
    (lambda: Fixed(0), "Fixed: k=0 must be at least 1"),
    (lambda: Longest(-1), "Longest: delta=-1 must be at least 0"),
    (lambda: Algorithm2(alpha=0), "Algorithm2: alpha=0 must be positive"),
    (lambda: Algorithm2(g_min=2.0), "Algorithm2: g_min=2.0 must be within [0, 1]"),
])
def test_a_bad_strategy_value_fails_naming_the_strategy(make, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        make()


def test_a_padded_batch_drafts_one_width_and_charges_every_row_for_it():
    """MLX pads a batch to its widest draft: one width is planned for all rows, and a lone
    long draft, which every row would pay for, is cut where the batch stops gaining."""
    def batch():
        p = Policy(replace(ladder(0.2)["full"], length=CostAware()))  # copies only
        p.register("A", PROMPT, list(range(100, 160)))  # a long text to copy
        p.register("B", PROMPT, [7, 8, 9, 10, 11])  # a short one: 3 tokens after [7, 8]
        rows = [request("a", "A", [100, 101, 102]), request("b", "B", [7, 8])]
        for r in rows:
            p.start(r)
        return p, rows

    p, rows = batch()
    alone = p.propose(rows)
    p, rows = batch()
    padded = p.propose(rows, padded=True)
    width = len(padded[0])
    assert len(alone[0]) > 3 and alone[1] == [9, 10, 11]
    assert 0 < width < len(alone[0]) and padded[0] == alone[0][:width]
    assert padded[1] == [9, 10, 11][:width]
    # every row is charged the price of the width it is verified at
    assert [p.running[r.id].step_costs[1] for r in rows] == [p.costs_at(2)[width]] * 2


def test_building_a_policy_compiles_the_kernels_its_steps_call():
    # in a fresh process: a bench times steps, and a server answers requests, right after
    # building its drafter; no kernel may be left to compile in them
    code = ("from agentspec.policy import Policy, ladder\n"
            "from agentspec import _accept_nb, _match_nb, _policy_nb\n"
            "kernels = [_match_nb.lookup, _match_nb.index_tail, _match_nb.link_tail,\n"
            "           _match_nb.entry_keys, _policy_nb.plan_request, _accept_nb.expected,\n"
            "           _accept_nb.observe]\n"
            "assert not any(k.signatures for k in kernels)\n"
            "Policy(ladder()['full'])\n"
            "print([k.__name__ for k in kernels if not k.signatures])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(_policy_nb is None, reason="the compiled plan needs numba")
def test_the_plans_cache_is_dropped_when_a_kernel_it_compiles_in_changes(tmp_path):
    # numba keys a cached function to its own file; the plan compiles in the corpora's and
    # the acceptance model's kernels, so their change must drop its cache too
    def cached():
        return sorted(p.name for p in tmp_path.iterdir())

    for name in ("_policy_nb.plan_request-23.py311.nbi",
                 "_policy_nb.plan_request-23.py311.1.nbc", "_match_nb.lookup-131.py311.nbi"):
        (tmp_path / name).write_text("")
    _policy_nb.drop_stale_cache(tmp_path, "_policy_nb", "one")
    assert cached() == ["_match_nb.lookup-131.py311.nbi", "_policy_nb.depends"]
    (tmp_path / "_policy_nb.keep-40.py311.nbi").write_text("")  # compiled from "one"
    _policy_nb.drop_stale_cache(tmp_path, "_policy_nb", "one")
    assert "_policy_nb.keep-40.py311.nbi" in cached()
    _policy_nb.drop_stale_cache(tmp_path, "_policy_nb", "two")
    assert cached() == ["_match_nb.lookup-131.py311.nbi", "_policy_nb.depends"]
    assert (tmp_path / "_policy_nb.depends").read_text() == "two"


def test_agreement_says_where_two_candidates_part():
    assert agreement([1, 2, 3, 4], [1, 2, 5]).tolist() == [AGREES, AGREES, DIFFERS, DIFFERS]
    assert agreement([1, 2, 3], [1, 2]).tolist() == [AGREES, AGREES, ALONE]
    assert agreement([7, 2], [1, 2, 3]).tolist() == [DIFFERS, DIFFERS]
    assert agreement([7], []).tolist() == [ALONE]


def test_agreeing_candidates_learn_rows_of_their_own():
    # a copy and a frequency path that say the same are scored on rows apart from those of
    # a lone candidate, so the model can learn that two sources agreeing are surer
    seed = [[1, 2, 3, 4, 5, 6]] * 3 + [[1, 2, 3, 9, 9, 9]]
    for name, moved in (("full", True), ("full-no-agreement", False)):
        p = Policy(ladder()[name], global_seed=seed)
        p.register("s", PROMPT, [1, 2, 3, 4, 5, 6, 0, 0])
        r = Request("r", "s", [8, 1, 2, 3], 4)
        p.start(r)
        p.propose([r])
        cands = p.running["r"].step()[0]
        assert len(cands) == 2 and cands[0].tokens[:3] == cands[1].tokens[:3]
        assert all((int(c.rows[0]) % MODIFIERS // TOKEN_CLASSES == AGREES) == moved
                   for c in cands)


def test_tokens_two_candidates_both_say_take_the_learned_blend_of_their_hazards():
    model = AcceptanceModel()
    copy = (3, np.full(4, model.kind("S1")), np.array([0, 5, 6, 7, 8]))
    path = (2, np.full(4, model.kind("F1x1")), np.array([0, 5, 6, 7, 8]))
    own = [model.accept_probs("code", m, rows, 4, ids) for m, rows, ids in (copy, path)]
    hazards = [p / np.concatenate(([1.0], p[:-1])) for p in own]
    agreed = model.agreed_hazards("code", copy, path, 2)
    # it starts at the mean of the two logits, and plans read it for the tokens both say
    mean_logit = (logit(hazards[0][0]) + logit(hazards[1][0])) / 2
    assert agreed[0] == pytest.approx(1 / (1 + np.exp(-mean_logit)))
    probs = model.accept_probs("code", *copy[:2], 4, copy[2], agreed)
    assert probs[1] == pytest.approx(agreed[0] * agreed[1])
    assert probs[2] == pytest.approx(probs[1] * hazards[0][2])
    # the target taking every token both said teaches it to trust them more
    for _ in range(50):
        model.learn_blend("code", copy, path, 2, 2)
    assert (model.agreed_hazards("code", copy, path, 2) > agreed + 0.1).all()
    assert (model.blend("code")[1] > 0).all()


@pytest.mark.skipif(_policy_nb is None, reason="numba not installed")
@pytest.mark.parametrize("name, padded", [("full", False), ("full", True),
                                          ("full-no-token-bias", False),
                                          ("full-sent-only", False),
                                          ("full-no-blend", False),
                                          ("full-no-quiet", False)])
def test_the_compiled_plan_drafts_as_the_reference(name, padded):
    # two policies in lockstep, one planning in the kernel and one in Python, on text of
    # repeated phrases (frequency paths taken whole and continued) with fenced blocks:
    # every step's drafts, candidates and keys are the same, and so is what both learn
    # from them; the kernel looks the copy up itself while S is the only source, and is
    # handed it where block history or a file (W) is another
    rng = np.random.default_rng(1)
    phrases = [rng.integers(0, 40, int(rng.integers(2, 9))).tolist() for _ in range(10)]
    token_bytes = [b"```"] + [b" w%d" % t for t in range(1, 40)]

    def text(n):
        return [t for _ in range(n) for t in phrases[int(rng.integers(0, len(phrases)))]]

    seed = [text(20) for _ in range(4)]
    policies = [Policy(ladder()[name], global_seed=seed, token_bytes=token_bytes)
                for _ in range(2)]
    policies[1].compiled = False
    assert policies[0].compiled
    continued, looked_up, sources, said, parted, blended = 0, set(), set(), set(), 0, 0
    quiet = 0
    for call in range(4):
        prompt, targets, file = text(30), [text(12), text(12)], text(10)
        rows = []
        for p in policies:
            p.register("s", PROMPT, prompt)
            if call == 2:
                p.register("s", FILE, file, path="f.py")
            rows.append([Request(f"c{call}-{i}", "s", list(prompt), len(prompt), role="code",
                                 structure=(("```", "```"),)) for i in range(2)])
            for r in rows[-1]:
                p.start(r)
        while all(len(r.tokens) - len(prompt) < len(t) for r, t in zip(rows[0], targets)):
            drafts = [p.propose(rs, padded=padded) for p, rs in zip(policies, rows)]
            assert drafts[0] == drafts[1]
            for i, draft in enumerate(drafts[0]):
                a, b = (p.running[rs[i].id] for p, rs in zip(policies, rows))
                (a_candidates, a_sent, a_key), (b_candidates, b_sent, b_key) = a.step(), b.step()
                assert [(c.tokens, c.m, c.rows.tolist(), c.ids.tolist(), c.frequency,
                         c.agreed.tolist()) for c in a_candidates] == \
                    [(c.tokens, c.m, c.rows.tolist(), c.ids.tolist(), c.frequency,
                      c.agreed.tolist()) for c in b_candidates]
                assert a_key == b_key and a.step_costs.tolist() == b.step_costs.tolist()
                assert (a_sent is None) == (b_sent is None)
                if a_sent:
                    assert (a_sent.tokens, a_sent.rows.tolist()) == \
                        (b_sent.tokens, b_sent.rows.tolist())
                continued += "+" in a_key
                quiet += a_key.endswith(QUIET)
                blended += any(len(c.agreed) for c in a_candidates)
                said.update(int(row) % MODIFIERS // TOKEN_CLASSES
                            for c in a_candidates for row in c.rows)
                parted += any(int(row) >> KIND_SHIFT == policies[0].acceptance.kinds["S=>"]
                              for c in a_candidates for row in c.rows)
                looked_up.add(a.looks_up)
                sources.add(a.source[:1])
                written = len(rows[0][i].tokens) - len(prompt)
                truth = targets[i][written : written + len(draft) + 1]
                accepted = scored(draft, truth)[1]
                for p, rs in zip(policies, rows):
                    rs[i].tokens.extend(truth[: accepted + 1])
                    p.observe(rs[i], len(draft), accepted)
        for p, rs in zip(policies, rows):
            for r in rs:
                p.finish(r)
    assert continued > 0 and looked_up == {True, False} and {"S", "B", "W"} <= sources
    assert said == {ALONE, AGREES, DIFFERS}  # (every rung here has agreement)
    assert parted  # (copies past their occurrences' common prefix, planned alike)
    assert (blended > 0) == policies[0].config.length.blend
    if not policies[0].config.length.quiet or padded:  # (a padded row always sends)
        assert quiet == 0
    assert quiet or name != "full" or padded  # (here full has steps where nothing paid at R)
    # and both learned alike: the kernel from inside the next plan, Python before it
    a, b = (p.acceptance for p in policies)
    assert a.blends.keys() == b.blends.keys() \
        and all(np.array_equal(a.blends[role], b.blends[role]) for role in a.blends)
    assert (a.blend("code")[1] > 0).all() == policies[0].config.length.blend
    assert np.array_equal(a.bias, b.bias) and np.array_equal(a.rate_sums, b.rate_sums)
    assert all(a.sent_ratio(key) == b.sent_ratio(key) for key in a._slot | b._slot)
    assert all(np.array_equal(x, y) for x, y in zip(a.by_row["code"], b.by_row["code"]))


def test_a_step_is_learned_by_the_next_plan_or_when_its_state_is_read():
    # observe keeps what the target wrote; the request's next plan learns it first (the
    # compiled plan in its own call), and so do state() and finish() where none comes
    seed = [[5, 6, 7, 8, 9, 10, 11, 12]] * 3
    for read in ("propose", "state", "finish"):
        p = Policy(ladder()["full"], global_seed=seed)
        r = request("r", "A", [1, 2, 3, 5, 6, 7])
        p.start(r)
        draft = p.propose([r])[0]
        assert draft
        sums = p.acceptance.rate_sums.copy()
        r.tokens += draft + [99]
        p.observe(r, len(draft), len(draft))
        assert np.array_equal(p.acceptance.rate_sums, sums)  # (kept, not learned yet)
        if read == "propose":
            p.propose([r])
            assert p.running["r"].pending is None
        elif read == "state":
            rate = p.state()["acceptance/rate"]
            assert not np.array_equal(rate, sums) and p.running["r"].pending is None
        else:
            p.finish(r)
        # R was charged for the row: len(draft) accepted, one more token written
        assert p.acceptance.rate_sums[0] == sums[0] * 0.999 + len(draft) + 1


@pytest.mark.parametrize("how", ["no numba", "env"])
def test_without_numba_the_policy_plans_in_python(how):
    run_without_numba(how, "from agentspec import policy\n"
                           "from agentspec.drafter import PROMPT, Request\n"
                           "assert policy._nb is None\n"
                           "p = policy.Policy(policy.ladder()['full'])\n"
                           "assert not p.compiled\n"
                           "p.register('s', PROMPT, [1, 2, 3, 4, 5, 6, 7, 8] * 4)\n"
                           "r = Request('r', 's', [9, 1, 2, 3], 4, role='code')\n"
                           "p.start(r)\n"
                           "assert p.propose([r])[0][:3] == [4, 5, 6]\n")
