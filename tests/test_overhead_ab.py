"""scripts/overhead_ab.py: two revisions' drafters, timed on the same calls of one replay."""

from __future__ import annotations

import json

import pytest

from conftest import load_script, replay_run


@pytest.fixture(scope="module")
def ab():
    return load_script("overhead_ab")


@pytest.mark.slow  # the base revision's kernels compile anew
def test_head_against_itself_times_both_on_every_call(ab, trace, tiny_model_dir, tmp_path):
    report = ab.main(["--traces", str(trace), "--model", str(tiny_model_dir), "--base", "HEAD",
                      "--json", str(tmp_path / "ab.json")])
    assert report["request_steps"] > 0
    for side in ("base", "tree"):
        assert {"register", "start", "propose", "observe", "finish"} <= set(report["by_call"][side])
        assert report["us_per_request_step"][side] > 0
    assert report["tree_over_base"] == pytest.approx(
        report["us_per_request_step"]["tree"] / report["us_per_request_step"]["base"])
    assert json.loads((tmp_path / "ab.json").read_text()) == report


def test_drafters_that_draft_differently_are_stopped_at_the_call(ab, trace, tiny_model_dir):
    from agentspec.bench import make_drafter
    from agentspec.replay import replay

    run = replay_run(trace, tiny_model_dir)
    same = ab.Tee({"a": make_drafter("full", run.setup), "b": make_drafter("full", run.setup)})
    assert replay(run.tokenized, same).total.accepted > 0  # (the sessions repeat a patch)
    differ = ab.Tee({"a": make_drafter("full", run.setup), "b": make_drafter("plain", run.setup)})
    with pytest.raises(SystemExit, match="the drafters differ in propose"):
        replay(run.tokenized, differ)


def test_a_revision_git_does_not_know_is_named(ab, trace, tiny_model_dir):
    with pytest.raises(SystemExit, match="--base no-such-rev: not a revision git knows"):
        ab.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                 "--base", "no-such-rev"])
