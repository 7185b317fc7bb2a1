"""scripts/al_gap.py: full's steps beside a baseline's, and what full passed over."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import load_script, replay_run, replayed_alike


@pytest.fixture(scope="module")
def gap():
    return load_script("al_gap")


def test_the_recorder_sees_every_step_and_changes_none(gap, trace, tiny_model_dir):
    rec, alone = replayed_alike(replay_run(trace, tiny_model_dir), gap.Recorder)
    assert len(rec.steps) == alone.steps
    assert sum(a for _, a in rec.steps.values()) == alone.accepted
    assert alone.accepted > 0  # the second patch of each session repeats the first


def test_the_aligned_steps_add_up(gap, trace, tiny_model_dir, tmp_path, capsys):
    report = gap.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                       "--json", str(tmp_path / "gap.json")])
    drafts, silent = report["full_drafts"], report["full_sends_nothing"]
    assert report["aligned_positions"] == drafts["steps"] + silent["steps"] > 0
    assert sum(silent["base_took"].values()) == silent["steps"]
    assert silent["base_sent"] >= silent["base_accepted"] >= silent["base_took"]["1"] \
        + 2 * silent["base_took"]["2+"]
    assert silent["full_candidates_at_base_length"] <= silent["base_sent"]
    for band in report["passed_over_calibration"]:
        lo, hi = band["band"]
        assert lo <= band["predicted"] <= hi and 0.0 <= band["first_token_right"] <= 1.0
    assert set(report["hindsight"]) == {"accepted", "sent_ran_on", "rival_went_further",
                                        "sending_nothing"}
    for bands in report["sent_reach"].values():
        for band in bands:
            lo, hi = band["band"]
            assert lo <= band["predicted"] <= hi and 0.0 <= band["reached"] <= 1.0
    assert report["scored_calibration"]
    for name, bands in report["scored_calibration"].items():
        kind, agreement, where = name.split("/")
        assert kind in ("copy", "frequency") and agreement in gap.AGREEMENTS.values()
        assert where in ("first", "2nd-3rd", "later")
        for band in bands:
            lo, hi = band["band"]
            assert lo <= band["predicted"] <= hi and 0.0 <= band["accepted"] <= 1.0
    assert [r["price"] for r in report["silent_sends"]] == list(gap.SILENT_PRICES)
    for r in report["silent_sends"]:
        assert 0 <= r["steps_saved"] <= r["accepted"] and r["al_ratio"] >= 1.0
    assert json.loads((tmp_path / "gap.json").read_text()) == report
    out = capsys.readouterr().out
    assert "output positions where both methods start a step" in out
    assert "set against the rest of each output" in out


def test_hindsight_accounts_for_every_token_the_candidates_held(gap, trace, tiny_model_dir):
    from agentspec.bench import make_drafter
    from agentspec.replay import replay
    from agentspec.speculation import accepted_prefix

    run = replay_run(trace, tiny_model_dir)

    class Best(gap.Recorder):
        """Also keeps, per step, the most any candidate held (the hindsight's total)."""

        held = 0

        def finish(self, request):
            for at, _, _, candidates in self._open.get(request.id, []):
                self.held += max((accepted_prefix(c[0], request.output[at:])
                                  for c in candidates), default=0)
            super().finish(request)

    rec = Best(make_drafter("full", run.setup))
    total = replay(run.tokenized, rec).total
    h = rec.hindsight
    assert h["accepted"] == total.accepted > 0
    assert min(h.values()) >= 0
    assert sum(h.values()) == rec.held  # accepted + ran on + rival + where nothing was sent
    assert not rec._open  # every request's steps were set against its output
    reached = [pairs for (_, where), pairs in rec.reach.items() if where == "sent"]
    # a sent token is reached exactly when it was accepted
    assert sum(hit for pairs in reached for _, hit in pairs) == total.accepted
    for pairs in rec.reach.values():
        assert all(0.0 <= p <= 1.0 for p, _ in pairs)


def test_every_candidate_is_scored_at_the_positions_the_target_wrote(gap, trace,
                                                                    tiny_model_dir):
    from agentspec.bench import make_drafter
    from agentspec.replay import replay
    from agentspec.speculation import accepted_prefix

    run = replay_run(trace, tiny_model_dir)

    class Counting(gap.Recorder):
        """Also counts, over the steps, the candidates and the tokens they got right."""

        candidates = right = 0

        def observe(self, request, drafted, accepted):
            written = request.output[self.at[request.id]:]
            for c in self.inner.running[request.id].step()[0]:
                self.candidates += bool(c.tokens)
                self.right += accepted_prefix(c.tokens, written)
            super().observe(request, drafted, accepted)

    rec = Counting(make_drafter("full", run.setup))
    replay(run.tokenized, rec)
    scored = [pair for pairs in rec.scored.values() for pair in pairs]
    # one first position per candidate (a step writes at least one token), and each
    # candidate's positions run to its first wrong token
    assert sum(len(pairs) for (_, _, where), pairs in rec.scored.items()
               if where == "first") == rec.candidates > 0
    assert sum(right for _, right in scored) == rec.right > 0
    assert all(0.0 <= p <= 1.0 for p, _ in scored)


def test_where_no_draft_pays_every_candidate_is_passed_over(gap, trace, tiny_model_dir):
    # a draft token priced at 5 steps never pays: full sends nothing, and what it would have
    # sent is what the calibration reads
    report = gap.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                       "--lambda", "5"])
    assert report["full_drafts"]["steps"] == 0
    assert sum(b["candidates"] for b in report["passed_over_calibration"]) > 0


def test_silent_candidates_are_cut_to_the_length_the_baseline_sent(gap):
    # one step where full sent nothing and the baseline sent 3 tokens, one accepted: full's
    # candidates cut to 3 tokens would have had 2 accepted (the better of the two)
    full, base = gap.Recorder(None), gap.Recorder(None)
    full.steps[("r", 4)], base.steps[("r", 4)] = (0, 0), (3, 1)
    base.drafts[("r", 4)] = [5, 9, 9]
    full.silent_candidates[("r", 4)] = [[5, 6, 7, 8], [5, 9]]
    full.outputs["r"] = [1, 2, 3, 4, 5, 6, 8, 8]
    silent = gap.compare(full, base)["full_sends_nothing"]
    assert (silent["steps"], silent["base_sent"], silent["base_accepted"]) == (1, 3, 1)
    assert silent["full_candidates_at_base_length"] == 2


def test_a_token_gained_where_nothing_was_sent_saves_only_the_steps_the_run_took(gap):
    # the run: 6 steps over 10 tokens; the step at 1 drafted 3 and had 2 accepted (emitting
    # 1-3), the one at 5 drafted 2, both accepted (5-7); the others sent nothing
    full = gap.Recorder(None)
    full.outputs["r"] = list(range(10, 20))
    full.steps = {("r", 0): (0, 0), ("r", 1): (3, 2), ("r", 4): (0, 0), ("r", 5): (2, 2),
                  ("r", 8): (0, 0), ("r", 9): (0, 0)}
    full.silent_best[("r", 0)] = ([10, 11, 12], np.array([0.5, 0.3, 0.1]))
    full.silent_best[("r", 8)] = ([99], np.array([0.9]))  # wrong from its first token
    cheap, dear = gap.silent_sends(full, lam=0.2, prices=(0.05, 0.28))
    # sent whole at 0, the candidate reaches 4, where the run's next step starts anyway:
    # the step at 1 is saved, and its 3 draft tokens pay for the 3 sent
    assert (cheap["steps_sending"], cheap["accepted"]) == (2, 3)
    assert (cheap["steps_saved"], cheap["draft_tokens_added"]) == (1, 1)
    assert cheap["al_ratio"] == 1.2  # 6 steps become 5
    assert cheap["speedup_ratio"] == round(7.0 / 6.2, 4)  # cost 6 + 0.2 * 5 drafted
    # cut at 2 tokens, the gain ends at 3, inside the step at 1: a step from 3 still ends
    # at 4, drafting the last of that step's tokens, so nothing is saved
    assert (dear["accepted"], dear["steps_saved"], dear["draft_tokens_added"]) == (2, 0, 1)
    assert dear["al_ratio"] == 1.0 and dear["speedup_ratio"] == round(7.0 / 7.2, 4)


def test_the_frontier_plans_full_cheaper_and_prices_it_the_same(gap, trace, tiny_model_dir,
                                                               capsys):
    # planned for a price of 0, full sends every candidate: more draft tokens, each one
    # still priced at the run's lambda
    report = gap.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                       "--frontier", "0.0"])
    base, at_lam, free = report["frontier"]
    assert (base["plan_lambda"], at_lam["plan_lambda"], free["plan_lambda"]) == (None, 0.2, 0.0)
    # (its AL need not be higher: sent whole, a candidate the price used to cut short can
    # also be the one that wins the step over another)
    assert free["rejected_per_token"] >= at_lam["rejected_per_token"]
    assert free["al_ratio"] == round(free["al"] / base["al"], 4)
    assert "full planned for λ0.0" in capsys.readouterr().out


def test_a_bad_frontier_is_named(gap, trace, capsys):
    with pytest.raises(SystemExit):
        gap.main(["--traces", str(trace), "--frontier", "0.1,cheap"])
    assert "--frontier '0.1,cheap': not a comma-separated list of numbers" \
        in capsys.readouterr().err
