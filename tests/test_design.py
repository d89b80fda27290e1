import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings, strategies as st

from replaytheory import (ConstantNoise, PowerLawNoise, TabulatedNoise, finite_lr_design,
                          optimal_horizon,
                          k_function, objective, objective_rbn, optimal_design,
                          optimal_replay_ratio, power_law_optimum, profile_objective)

CHECK_VALUES = [  # theory.md section 5: (mu, rho, alpha, x*, y*), printed to ~3 digits
    (5.28, 0.1, 0.2, 4.27, 3.97),
    (6.84, 0.1, 0.1, 15.7, 6.47),
    (5.28, 1.0, 0.2, 0.92, 1.59),
    (20.0, 0.1, 0.2, 7.16, 9.14),
]


@pytest.mark.parametrize("mu, rho, alpha, x, y", CHECK_VALUES)
def test_check_values(mu, rho, alpha, x, y):
    closed = optimal_design(mu, rho, PowerLawNoise(alpha), method="closed_form")
    numeric = optimal_design(mu, rho, PowerLawNoise(alpha), method="numeric")
    assert closed.horizon == pytest.approx(x, abs=0.006 * x)
    assert closed.replay_ratio == pytest.approx(y, abs=0.006 * y)
    assert numeric.horizon == pytest.approx(closed.horizon, rel=1e-6)
    assert numeric.replay_ratio == pytest.approx(closed.replay_ratio, rel=1e-6)


def test_check_value_regimes():
    assert optimal_design(5.28, 1.0, PowerLawNoise(0.2)).regime == "on-policy"  # x* = 0.92
    assert optimal_design(5.28, 0.1, PowerLawNoise(0.2)).regime == "replay"


@settings(max_examples=150, deadline=None)
@given(mu=st.floats(0.05, 500.0), rho=st.floats(0.0, 1.0), alpha=st.floats(0.01, 0.49))
def test_closed_form_equals_numeric(mu, rho, alpha):
    closed = optimal_design(mu, rho, PowerLawNoise(alpha), method="closed_form")
    numeric = optimal_design(mu, rho, PowerLawNoise(alpha), method="numeric")
    assert numeric.horizon == pytest.approx(closed.horizon, rel=1e-6)
    assert numeric.replay_ratio == pytest.approx(closed.replay_ratio, rel=1e-6)
    assert numeric.regime == closed.regime


@settings(max_examples=80, deadline=None)
@given(mu=st.floats(0.05, 200.0), rho=st.floats(0.001, 1.0), alpha=st.floats(0.01, 0.49),
       x=st.floats(1e-3, 1e4), y=st.floats(1e-3, 1e4))
def test_closed_form_is_a_minimum(mu, rho, alpha, x, y):
    noise = PowerLawNoise(alpha)
    xs, ys = power_law_optimum(mu, rho, alpha)
    best = objective(xs, ys, mu=mu, rho=rho, noise=noise)
    assert best <= objective(x, y, mu=mu, rho=rho, noise=noise) * (1 + 1e-9)


def test_y_star_first_order_condition_and_profile():
    noise = PowerLawNoise(0.15)
    for x in (0.5, 3.0, 40.0):
        ys = optimal_replay_ratio(x, mu=6.0, rho=0.2)
        ys_grid = np.geomspace(ys / 3, ys * 3, 2001)
        j = objective(x, ys_grid, mu=6.0, rho=0.2, noise=noise)
        assert ys_grid[np.argmin(j)] == pytest.approx(ys, rel=2e-3)
        assert profile_objective(x, mu=6.0, rho=0.2, noise=noise) == pytest.approx(
            objective(x, ys, mu=6.0, rho=0.2, noise=noise))


def test_k_function_is_the_profile_up_to_a_constant():
    x = np.geomspace(0.1, 100, 7)
    k = k_function(x, mu=5.0, rho=0.3, alpha=0.25)
    prof = profile_objective(x, mu=5.0, rho=0.3, noise=PowerLawNoise(0.25))
    assert np.allclose(prof / k**2, prof[0] / k[0] ** 2)


@settings(max_examples=60, deadline=None)
@given(mu=st.floats(0.1, 100), rho=st.floats(0.001, 1), alpha=st.floats(0.01, 0.45),
       f=st.floats(1.01, 5))
def test_monotonicity(mu, rho, alpha, f):
    x0, y0 = power_law_optimum(mu, rho, alpha)
    xm, ym = power_law_optimum(mu * f, rho, alpha)
    assert xm >= x0 * (1 - 1e-12) and ym >= y0 * (1 - 1e-12)
    xr, yr = power_law_optimum(mu, min(rho * f, 1.0), alpha)
    assert xr <= x0 * (1 + 1e-12) and yr <= y0 * (1 + 1e-12)
    xa, ya = power_law_optimum(mu, rho, min(alpha * f, 0.49))
    assert xa <= x0 * (1 + 1e-12) and ya <= y0 * (1 + 1e-12)


@given(mu=st.floats(0.1, 100), alpha=st.floats(0.01, 0.49))
def test_rho_to_zero_limit(mu, alpha):
    _, y = power_law_optimum(mu, 1e-12, alpha)
    assert y == pytest.approx(mu * (1 - 2 * alpha) / (2 * alpha), rel=1e-6)
    _, y0 = power_law_optimum(mu, 0.0, alpha)
    assert y0 == pytest.approx(mu * (1 - 2 * alpha) / (2 * alpha), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 2.0])
@pytest.mark.parametrize("method", ["closed_form", "numeric"])
def test_alpha_at_least_half_is_on_policy(alpha, method):
    d = optimal_design(7.0, 0.1, PowerLawNoise(alpha), method=method)
    assert d.regime == "on-policy" and d.horizon < 1
    assert d.predicted_saving == 0.0


def test_alpha_zero_is_unbounded():
    for method in ("closed_form", "numeric"):
        d = optimal_design(7.0, 0.25, PowerLawNoise(0.0), method=method)
        assert math.isinf(d.horizon)
        assert d.replay_ratio == pytest.approx(math.sqrt(7.0 / 0.25))
        assert any("as large as" in n for n in d.notes)


@given(mu=st.floats(0.1, 50), rho=st.floats(0, 1), c=st.floats(0.01, 100),
       r=st.floats(1, 100), b=st.floats(1, 500), n=st.floats(1, 5000))
def test_j_homogeneous_degree_zero(mu, rho, c, r, b, n):
    assume(n >= r)
    noise = PowerLawNoise(0.2)
    j = objective_rbn(r, b, n, mu=mu, rho=rho, noise=noise)
    assert objective_rbn(c * r, c * b, c * n, mu=mu, rho=rho, noise=noise) == pytest.approx(j)
    assert j == pytest.approx(mu * objective(n / r, b / r, mu=mu, rho=rho, noise=noise))


def test_numeric_design_for_tabulated_model_beats_a_brute_force_grid():
    noise = TabulatedNoise([0, 1, 2, 4, 8, 16, 32], [1, 1.5, 2, 2.5, 3, 4, 6])
    d = optimal_design(6.84, 0.1, noise)
    assert d.method == "numeric" and d.average == "discrete"
    xs = np.linspace(0.05, noise.max_horizon, 20000)
    prof = profile_objective(xs, mu=6.84, rho=0.1, noise=noise)
    assert d.objective <= prof.min() * (1 + 1e-9)
    assert d.replay_ratio == pytest.approx(float(optimal_replay_ratio(d.horizon, mu=6.84, rho=0.1)))


def test_decreasing_table_says_a3_fails_and_table_edge():
    noise = TabulatedNoise([0, 1, 2, 4, 8], [2.0, 1.0, 1.0, 1.1, 1.2])
    d = optimal_design(6.84, 0.1, noise)
    assert any("A3 does not hold" in n for n in d.notes)
    assert d.horizon == pytest.approx(noise.max_horizon)
    assert any("longest measured horizon" in n for n in d.notes)


def test_constant_noise_and_discrete_power_law():
    d = optimal_design(6.84, 0.1, ConstantNoise())
    assert math.isinf(d.horizon) and d.predicted_saving > 0
    assert d.replay_ratio == pytest.approx(math.sqrt(6.84 / 0.1))
    disc = optimal_design(5.28, 0.1, PowerLawNoise(0.2), average="discrete")
    assert any("degenerate" in n for n in disc.notes)


def test_saving_is_one_minus_j_ratio_and_positive_in_replay_regime():
    d = optimal_design(6.84, 0.1, PowerLawNoise(0.1))
    assert d.regime == "replay"
    assert d.j_ratio == pytest.approx(d.objective / d.on_policy_objective)
    assert 0 < d.predicted_saving == pytest.approx(1 - d.j_ratio)


def test_finite_lr_design_without_bias_recovers_asymptotic_optimum():
    noise = PowerLawNoise(0.1)
    d = finite_lr_design(6.84, 0.1, noise, batch_size=60, smoothness=1.0, kappa=0.0, f0=1.0,
                         budget=1e7)
    assert d.horizon == pytest.approx(d.asymptotic.horizon, rel=1e-4)
    assert d.replay_ratio == pytest.approx(d.asymptotic.replay_ratio, rel=1e-4)
    assert d.bound.value == pytest.approx(d.bound.descent + d.bound.bias_driven
                                          + d.bound.smoothness_driven)
    assert d.bound_ratio < 1


def test_finite_lr_design_bias_shortens_the_horizon_and_respects_step_limit():
    noise = PowerLawNoise(0.1)
    common = dict(batch_size=60, smoothness=1.0, f0=1.0, budget=1e5)
    no_bias = finite_lr_design(6.84, 0.1, noise, kappa=0.0, **common)
    bias = finite_lr_design(6.84, 0.1, noise, kappa=0.5, **common)
    assert bias.horizon < no_bias.horizon
    assert bias.lr <= bias.bound.step_size_limit * (1 + 1e-9)
    fixed = finite_lr_design(6.84, 0.1, noise, kappa=0.5, lr=1e-2, **common)
    assert fixed.lr == 1e-2
    assert fixed.horizon <= 1 / (2 * math.sqrt(2) * 0.5 * 1e-2) * (1 + 1e-6)
    assert fixed.buffer_size >= fixed.batch_size * (1 - 1e-9)


def test_finite_lr_design_reports_the_optimised_lr_is_optimal():
    noise = PowerLawNoise(0.2)
    d = finite_lr_design(5.0, 0.2, noise, batch_size=32, smoothness=2.0, kappa=0.3, f0=2.0,
                         budget=2e4)
    for scale in (0.5, 0.9, 1.1, 2.0):
        lr = d.lr * scale
        if lr >= d.bound.step_size_limit:
            continue
        other = finite_lr_design(5.0, 0.2, noise, batch_size=32, smoothness=2.0, kappa=0.3,
                                 f0=2.0, budget=2e4, lr=lr)
        assert other.bound.value >= d.bound.value * (1 - 1e-6)


@pytest.mark.parametrize("call, name", [
    (lambda: optimal_design(0.0, 0.1, PowerLawNoise(0.1)), "mu"),
    (lambda: optimal_design(5.0, 1.1, PowerLawNoise(0.1)), "rho"),
    (lambda: optimal_design(5.0, float("nan"), PowerLawNoise(0.1)), "rho"),
    (lambda: optimal_design(5.0, 0.1, "power"), "noise"),
    (lambda: optimal_design(5.0, 0.1, ConstantNoise(), method="closed_form"), "closed_form"),
    (lambda: optimal_design(5.0, 0.1, PowerLawNoise(0.1), method="magic"), "method"),
    (lambda: objective(1.0, 0.0, mu=5.0, rho=0.1, noise=PowerLawNoise(0.1)), "replay_ratio"),
    (lambda: objective_rbn(1.0, -2.0, 4.0, mu=5.0, rho=0.1, noise=PowerLawNoise(0.1)),
     "batch_size"),
    (lambda: power_law_optimum(5.0, 0.1, -0.2), "alpha"),
    (lambda: finite_lr_design(5.0, 0.1, PowerLawNoise(0.1), batch_size=60.5, smoothness=1.0,
                              kappa=0.1, f0=1.0, budget=100.0), "batch_size"),
    (lambda: finite_lr_design(5.0, 0.1, PowerLawNoise(0.1), batch_size=60, smoothness=1.0,
                              kappa=0.1, f0=1.0, budget=100.0, lr=0.6), "lr"),
    (lambda: finite_lr_design(5.0, 0.1, PowerLawNoise(0.1), batch_size=60, smoothness=1.0,
                              kappa=0.1, f0=1.0, budget=-1.0), "budget"),
])
def test_bad_input(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@given(y=st.floats(0.05, 100), rho=st.floats(0, 1), alpha=st.floats(0.01, 0.49))
@settings(deadline=None)
def test_optimal_horizon_at_fixed_replay_ratio(y, rho, alpha):
    # d/dx [x^(2a) (1/y + rho + 1/x)] = 0  =>  x = (1 - 2a) / (2a (1/y + rho))
    x = optimal_horizon(y, mu=5.0, rho=rho, noise=PowerLawNoise(alpha))
    assert x == pytest.approx((1 - 2 * alpha) / (2 * alpha * (1 / y + rho)), rel=1e-6)


@given(y=st.floats(0.5, 50), rho=st.floats(0.0, 1.0), alpha=st.floats(0.005, 0.45),
       x_max=st.floats(2.0, 5000.0))
@example(y=24.857142857142858, rho=0.01, alpha=0.01, x_max=1000.0)  # x* = 975.5 lies past the last grid point below the cap
@settings(deadline=None)
def test_optimal_horizon_with_a_cap_is_the_capped_optimum(y, rho, alpha, x_max):
    # J is unimodal in x for the power law, so the capped optimum is min(x*, x_max) even
    # when x* falls between the log grid's last point and the cap.
    free = (1 - 2 * alpha) / (2 * alpha * (1 / y + rho))
    x = optimal_horizon(y, mu=5.0, rho=rho, noise=PowerLawNoise(alpha), x_max=x_max)
    assert x == pytest.approx(min(free, x_max), rel=1e-6)


def test_finite_lr_design_stays_inside_a_measured_table_unless_extrapolated():
    """A falling table pushes x* to the far end; a table says nothing past its staleness."""
    staleness, sigma2 = [0.0, 1.0, 2.0, 3.0], [4.0, 3.0, 2.0, 1.0]
    common = dict(batch_size=16, smoothness=1.0, kappa=0.0, f0=1.0, budget=1e4)
    capped = finite_lr_design(2.0, 0.1, TabulatedNoise(staleness, sigma2), **common)
    assert 1.0 <= capped.horizon <= 4.0 * (1 + 1e-9)
    assert any("longest measured horizon (4 steps)" in n for n in capped.notes)
    assert not any("horizon optimum lies on the edge" in n for n in capped.notes)
    free = finite_lr_design(2.0, 0.1, TabulatedNoise(staleness, sigma2, extrapolate="hold_last"),
                            **common)
    assert free.horizon > 4.0



@settings(max_examples=10, deadline=None)
@given(slope=st.floats(-0.003, 0.003), big_l=st.floats(0.5, 8.0), kappa=st.floats(1e-3, 0.05),
       f0=st.floats(0.05, 0.3), mu=st.sampled_from([0.6, 2.0, 6.84]), rho=st.floats(0.0, 0.3))
@example(slope=0.0, big_l=4.0, kappa=0.03, f0=0.2, mu=2.0, rho=0.1)
def test_a_table_edge_that_does_not_bind_leaves_the_finite_lr_optimum_as_it_was(
        slope, big_l, kappa, f0, mu, rho):
    """The cap at a table's longest staleness (31b0b21) must only cut off x past it: with the
    optimum well inside, capped ("none") and uncapped ("hold_last": the same sigma^2
    everywhere, theory.md 4.6) searches agree exactly. Shrinking the search grid to the
    cap instead moved heldout_*'s registered finite_eta x* (1 -> 1.064, 4.217 -> 3.910)."""
    staleness = np.array([0.0, 1, 2, 4, 8, 16, 32, 64, 128, 255])  # measured up to x = 256
    sigma2 = 1.0 + slope * staleness
    common = dict(batch_size=64, smoothness=big_l, kappa=kappa, f0=f0, budget=900.0)
    free = finite_lr_design(mu, rho, TabulatedNoise(staleness, sigma2, extrapolate="hold_last"),
                            **common)
    assume(free.horizon < 128.0)  # well inside the table: the cap does not bind
    capped = finite_lr_design(mu, rho, TabulatedNoise(staleness, sigma2), **common)
    assert (capped.horizon, capped.replay_ratio) == (free.horizon, free.replay_ratio)


@settings(max_examples=200, deadline=None)
@example(a=1.0, b=2.0, c=1e-30)
@given(a=st.floats(1e-6, 1e6), b=st.one_of(st.just(0.0), st.floats(1e-6, 1e6)),
       c=st.floats(1e-300, 1e6))
def test_the_best_step_size_solves_its_cubic_however_small_the_cubic_term(a, b, c):
    """The minimiser of a/eta + b eta + c eta^2 is the positive root of 2c eta^3 + b eta^2 = a
    (to 1e-6 of a), also where c is so small against b that the companion matrix loses the
    small roots (c = 1e-30: a crash before)."""
    from replaytheory.model.design import _best_lr
    eta = float(_best_lr(a, b, c, np.inf))
    assert 0 < eta < np.inf
    assert abs((2 * c * eta + b) * eta * eta - a) <= 1e-6 * a
