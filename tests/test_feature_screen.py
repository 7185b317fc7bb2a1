"""scripts/feature_screen.py: what features the acceptance model does not read would add."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from conftest import load_script, replay_run, replayed_alike


@pytest.fixture(scope="module")
def fs():
    return load_script("feature_screen")


def test_the_screen_sees_every_candidate_and_changes_no_draft(fs, trace, tiny_model_dir):
    run = replay_run(trace, tiny_model_dir)
    screen, _ = replayed_alike(run, lambda full: fs.Screen(full, run.setup.token_bytes))
    assert screen.rows and any(right for _, right, _ in screen.rows)
    for p, _, values in screen.rows:
        assert 0.0 <= p <= 1.0
        assert set(values) == {"source", *fs.FEATURES}
        assert values["source"] in ("copy", "path")


def test_a_feature_that_decides_the_outcome_lowers_the_loss_and_noise_does_not(fs):
    rng = random.Random(0)
    rows = []  # all predicted 0.5; the outcome follows "matched" alone
    for _ in range(4000):
        values = {name: rng.randrange(2) for name in ("source", *fs.FEATURES)}
        rows.append((0.5, rng.random() < (0.9 if values["matched"] else 0.1), values))
    report = fs.screen(rows)
    base = report["recalibrated_per_source"]
    assert report["acceptance_model"] == pytest.approx(np.log(2))
    assert report["with_feature"]["matched"] < 0.8 * base
    for name in fs.FEATURES:
        if name != "matched":
            assert report["with_feature"][name] > 0.97 * base
    assert report["with_all"] < 0.85 * base
    # all predicted 0.5, above the price: only the feature tells the 0.1 ones to be left out
    net = report["net_over_price"]
    assert net["acceptance_model"] == pytest.approx(sum(r for _, r, _ in rows) - 4000 * fs.PRICE)
    assert net["matched"] > 1.2 * net["recalibrated_per_source"]


def test_main_reports_every_feature(fs, trace, tiny_model_dir, tmp_path, capsys):
    report = fs.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                      "--json", str(tmp_path / "screen.json")])
    assert set(report["with_feature"]) == set(fs.FEATURES)
    assert set(report["net_over_price"]) == {"acceptance_model", "recalibrated_per_source",
                                             "all", *fs.FEATURES}
    assert report["first_tokens"] > 0
    assert json.loads((tmp_path / "screen.json").read_text()) == report
    assert "recalibrated per source" in capsys.readouterr().out
