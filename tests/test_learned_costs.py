import numpy as np
import pytest

from agentspec.costs import linear_costs
from agentspec.learned_costs import MIN_STEPS, REFIT_EVERY, LearnedCosts


def _steps(costs: LearnedCosts, n: int, rng, rows=(1, 5), per_draft=0.002, noise=0.002):
    for _ in range(n):
        r, d = int(rng.integers(*rows)), int(rng.integers(0, 24))
        costs.observe(r, d, 0.06 + 0.004 * r + per_draft * d + rng.normal(0, noise))


def test_the_prior_stands_until_enough_varied_steps():
    costs = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    for _ in range(4 * MIN_STEPS):
        costs.observe(2, 3, 0.07)  # drafts never vary: nothing to learn their price from
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
                                                    rel=0.1)
    # one batch size only (rows repeat the intercept): still priced per plain step
    one = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    _steps(one, 20 * REFIT_EVERY, np.random.default_rng(2), rows=(1, 2))
    assert one.draft_costs(1, 4)[4] == pytest.approx(4 * 0.002 / 0.064, rel=0.1)


def test_pauses_outside_a_step_do_not_move_the_fit():
    costs = LearnedCosts(lambda b, k: linear_costs(0.3, k))
    rng = np.random.default_rng(3)
    _steps(costs, 10 * REFIT_EVERY, rng)
    before = costs.draft_costs(4, 8)
    for _ in range(REFIT_EVERY):
        costs.observe(4, 0, 2.0)  # a collection or another process: 30x a step
    _steps(costs, REFIT_EVERY, rng)
    assert costs.draft_costs(4, 8) == pytest.approx(before, rel=0.1)


def test_the_policy_plans_with_learned_prices():
    from agentspec.policy import Policy, ladder

    policy = Policy(ladder(0.5)["full"])
    assert policy.costs_at(1)[4] == pytest.approx(2.0)  # the prior: lambda 0.5
    rng = np.random.default_rng(4)
    for _ in range(4 * MIN_STEPS):
        d = int(rng.integers(0, 24))
        policy.observe_step(1, d, 0.065 + 0.002 * d + rng.normal(0, 0.001))
    assert policy.costs_at(1)[4] == pytest.approx(4 * 0.002 / 0.065, rel=0.1)
