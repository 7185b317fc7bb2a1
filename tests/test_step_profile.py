"""scripts/step_profile.py: a drafter's step split into its kernels' calls and the rest."""

from __future__ import annotations

import json

import pytest

from agentspec import allocator, match, policy
from conftest import load_script


@pytest.fixture(scope="module")
def step_profile():
    return load_script("step_profile")


def test_the_kernels_of_propose_and_observe_are_part_of_the_step(step_profile, trace,
                                                                 tiny_model_dir, tmp_path):
    modules = [m._nb for m in (policy, allocator, match)]
    if policy._nb is None:
        pytest.fail("numba is a dependency: the kernels should import here")
    report = step_profile.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                                "--json", str(tmp_path / "p.json")])
    assert [m._nb for m in (policy, allocator, match)] == modules  # (put back)
    assert report["compiled"] and report["request_steps"] > 0
    # every step plans, and learns what the step before showed, in one kernel call; a
    # request's last step is learned as it finishes
    assert report["kernels"]["plan_request"]["calls"] == pytest.approx(1.0)
    assert report["kernels_between_steps"]["observe"]["calls"] > 0
    # what numba's dispatch of their arguments alone cost a call, for every kernel in steps
    assert all(k["dispatch_us"] > 0 for k in report["kernels"].values())
    assert report["kernels_us_per_step"] == pytest.approx(
        sum(k["us"] for k in report["kernels"].values()))
    assert 0 < report["kernel_share"] < 1
    assert report["interpreter_us_per_step"] == pytest.approx(
        report["overhead_us_per_step"] - report["kernels_us_per_step"])
    # planning happens in steps only; what runs between them is kept apart
    assert "plan_request" not in report["kernels_between_steps"]
    assert json.loads((tmp_path / "p.json").read_text()) == report


def test_a_method_without_kernels_has_none_in_its_step(step_profile, trace, tiny_model_dir):
    report = step_profile.main(["--traces", str(trace), "--model", str(tiny_model_dir),
                                "--method", "ngram"])
    assert report["kernels"] == {} and report["kernels_us_per_step"] == 0
    assert report["interpreter_us_per_step"] == report["overhead_us_per_step"]
