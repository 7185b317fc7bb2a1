import numpy as np
import pytest

from agentspec.costs import linear_costs
from agentspec.learned_costs import MIN_STEPS, REFIT_EVERY, LearnedCosts


def _steps(costs: LearnedCosts, n: int, rng, rows=(1, 5), per_draft=0.002, per_drafting=0.0,
           noise=0.002):
    """Steps of 1-4 rows, each row drafting 0-7 tokens; seconds as a linear engine's."""
    for _ in range(n):
        verified = [int(x) for x in rng.integers(0, 8, int(rng.integers(*rows)))]
        seconds = (0.06 + 0.004 * len(verified) + per_drafting * sum(1 for v in verified if v)
                   + per_draft * sum(verified) + rng.normal(0, noise))
        costs.observe(verified, seconds)


def test_the_prior_stands_until_enough_varied_steps():
    costs = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    for _ in range(4 * MIN_STEPS):
        costs.observe([1, 2], 0.07)  # drafts never vary: nothing to learn their price from
    assert costs.coef is None and costs.draft_costs(2, 4)[4] == pytest.approx(1.2)
    few = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    _steps(few, MIN_STEPS - 1, np.random.default_rng(0))
    assert few.coef is None


def test_a_draft_token_is_priced_by_the_engines_own_steps():
    costs = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    _steps(costs, 20 * REFIT_EVERY, np.random.default_rng(1))
    plain_step = 0.06 + 0.004 * 4
    # 4 rows drafting n tokens each add 4n draft tokens to a step of 4 rows
    assert costs.draft_costs(4, 8) == pytest.approx(np.arange(9) * 4 * 0.002 / plain_step,
                                                    rel=0.1, abs=0.01)
    # one batch size only (rows repeat the intercept): still priced per plain step
    one = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    _steps(one, 20 * REFIT_EVERY, np.random.default_rng(2), rows=(1, 2))
    assert one.draft_costs(1, 4)[4] == pytest.approx(4 * 0.002 / 0.064, rel=0.1)


def test_a_row_that_drafts_at_all_pays_its_fixed_part():
    costs = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    _steps(costs, 20 * REFIT_EVERY, np.random.default_rng(5), per_drafting=0.004,
           noise=0.001)
    plain_step = 0.06 + 0.004 * 4
    expected = 4 * (0.004 + 0.002 * np.arange(9)) / plain_step
    expected[0] = 0.0
    assert costs.draft_costs(4, 8) == pytest.approx(expected, rel=0.1)
    # every row always drafting: the fixed part cannot be told from the intercept
    always = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    rng = np.random.default_rng(6)
    for _ in range(20 * REFIT_EVERY):
        verified = [int(x) for x in rng.integers(1, 8, 2)]
        always.observe(verified, 0.07 + 0.002 * sum(verified) + rng.normal(0, 0.001))
    assert always.draft_costs(2, 4)[4] == pytest.approx(2 * 4 * 0.002 / 0.07, rel=0.1)
    # nor from a row's own cost when batches of every size draft in every row
    sizes = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    for _ in range(20 * REFIT_EVERY):
        verified = [int(x) for x in rng.integers(1, 8, int(rng.integers(1, 5)))]
        sizes.observe(verified, 0.06 + 0.004 * len(verified) + 0.002 * sum(verified)
                      + rng.normal(0, 0.001))
    assert sizes.coef[2] == 0.0
    assert sizes.draft_costs(4, 4)[4] == pytest.approx(4 * 4 * 0.002 / 0.076, rel=0.1)


def test_pauses_outside_a_step_do_not_move_the_fit():
    costs = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    rng = np.random.default_rng(3)
    _steps(costs, 10 * REFIT_EVERY, rng)
    before = costs.draft_costs(4, 8)
    for _ in range(REFIT_EVERY):
        costs.observe([0, 0, 0, 0], 2.0)  # a collection or another process: 30x a step
    _steps(costs, REFIT_EVERY, rng)
    assert costs.draft_costs(4, 8) == pytest.approx(before, rel=0.1, abs=0.01)


def test_the_policy_plans_with_learned_prices():
    from agentspec.policy import Policy, ladder

    policy = Policy(ladder(0.5)["full"])
    assert policy.costs_at(1)[4] == pytest.approx(2.0)  # the prior: lambda 0.5
    rng = np.random.default_rng(4)
    for _ in range(4 * MIN_STEPS):
        d = int(rng.integers(0, 24))
        policy.observe_step([d], 0.065 + 0.002 * d + rng.normal(0, 0.001))
    assert policy.costs_at(1)[4] == pytest.approx(4 * 0.002 / 0.065, rel=0.1)
