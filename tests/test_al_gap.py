"""scripts/al_gap.py: full's steps beside a baseline's, and what full passed over."""

from __future__ import annotations

import json

import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def gap():
    return load_script("al_gap")


def test_the_recorder_sees_every_step_and_changes_none(gap, trace, tiny_model_dir):
    from agentspec.bench import make_drafter
    from agentspec.replay import replay

    run = gap.load_bench("replay", [trace], sessions=None, seed=0, methods="full",
                         batch="1", model=str(tiny_model_dir), cost_profile=None, lam=0.2,
                         kmax=None, structure=None, profile_sessions=60, split=True,
                         dtype=None, urls=(None, None), outputs=None, save_outputs=None)
    alone = replay(run.tokenized, make_drafter("full", run.setup)).total
    rec = gap.Recorder(make_drafter("full", run.setup))
    recorded = replay(run.tokenized, rec).total
    assert (recorded.steps, recorded.accepted, recorded.drafted) == \
        (alone.steps, alone.accepted, alone.drafted)
    assert len(rec.steps) == alone.steps
    assert sum(a for _, a in rec.steps.values()) == alone.accepted
    assert alone.accepted > 0  # the second patch of each session repeats the first


def test_the_aligned_steps_add_up(gap, trace, tiny_model_dir, tmp_path, capsys):
    report = gap.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                       "--json", str(tmp_path / "gap.json")])
    drafts, silent = report["full_drafts"], report["full_sends_nothing"]
    assert report["aligned_positions"] == drafts["steps"] + silent["steps"] > 0
    assert sum(silent["base_took"].values()) == silent["steps"]
    for band in report["passed_over_calibration"]:
        lo, hi = band["band"]
        assert lo <= band["predicted"] <= hi and 0.0 <= band["first_token_right"] <= 1.0
    assert json.loads((tmp_path / "gap.json").read_text()) == report
    assert "output positions where both methods start a step" in capsys.readouterr().out


def test_where_no_draft_pays_every_candidate_is_passed_over(gap, trace, tiny_model_dir):
    # a draft token priced at 5 steps never pays: full sends nothing, and what it would have
    # sent is what the calibration reads
    report = gap.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                       "--lambda", "5"])
    assert report["full_drafts"]["steps"] == 0
    assert sum(b["candidates"] for b in report["passed_over_calibration"]) > 0


def test_the_frontier_plans_full_cheaper_and_prices_it_the_same(gap, trace, tiny_model_dir,
                                                               capsys):
    # planned for a price of 0, full sends every candidate: more draft tokens, each one
    # still priced at the run's lambda
    report = gap.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                       "--frontier", "0.0"])
    base, at_lam, free = report["frontier"]
    assert (base["plan_lambda"], at_lam["plan_lambda"], free["plan_lambda"]) == (None, 0.2, 0.0)
    assert free["rejected_per_token"] >= at_lam["rejected_per_token"]
    assert free["al"] >= at_lam["al"]
    assert free["al_ratio"] == round(free["al"] / base["al"], 4)
    assert "full planned for λ0.0" in capsys.readouterr().out


def test_a_bad_frontier_is_named(gap, trace, capsys):
    with pytest.raises(SystemExit):
        gap.main(["--traces", str(trace), "--frontier", "0.1,cheap"])
    assert "--frontier '0.1,cheap': not a comma-separated list of numbers" \
        in capsys.readouterr().err
