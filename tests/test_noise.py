import numpy as np
import pytest
from hypothesis import given, strategies as st

from replaytheory import ConstantNoise, PowerLawNoise, TabulatedNoise, noise_from_dict


def brute_discrete(model, h):
    n = int(np.floor(h))
    s = np.arange(n)
    return (model.sigma2(s).sum() + (h - n) * model.sigma2(n)) / h


@given(alpha=st.floats(0.0, 2.0), tau=st.floats(0.1, 10.0),
       h=st.floats(0.1, 3000.0))
def test_power_law_discrete_average_matches_sum(alpha, tau, h):
    m = PowerLawNoise(alpha, tau)
    assert m.sigma_bar2(h, "discrete") == pytest.approx(brute_discrete(m, h), rel=1e-9, abs=1e-300)


def test_power_law_discrete_average_large_horizon_uses_asymptotics():
    m = PowerLawNoise(0.3, 2.0)
    h = 1e6
    exact = (np.arange(int(h)) / 2.0) ** 0.6
    assert m.sigma_bar2(h, "discrete") == pytest.approx(exact.sum() / h, rel=1e-10)


@given(alpha=st.floats(0.0, 2.0), tau=st.floats(0.1, 10.0), h=st.floats(1e-3, 1e6))
def test_power_law_continuous_closed_form(alpha, tau, h):
    m = PowerLawNoise(alpha, tau)
    assert m.sigma_bar2(h) == pytest.approx((h / tau) ** (2 * alpha) / (2 * alpha + 1), rel=1e-12)


def test_continuous_approaches_discrete_for_long_horizons():
    m = PowerLawNoise(0.2)
    ratio = m.sigma_bar2(1e5, "discrete") / m.sigma_bar2(1e5, "continuous")
    assert ratio == pytest.approx(1.0, rel=1e-3)


def test_constant_noise():
    m = ConstantNoise(2.5)
    assert np.allclose(m.sigma_bar2([0.3, 1, 10, 1e6]), 2.5)
    assert np.allclose(PowerLawNoise(0.0).sigma_bar2([0.5, 7.5, 1e7], "discrete"), 1.0)


def test_tabulated_interpolation_and_averages():
    m = TabulatedNoise([0, 1, 3], [2.0, 1.0, 1.5])
    assert m.sigma2(2) == pytest.approx(1.25)
    assert m.sigma2(10) == pytest.approx(1.5)  # flat beyond the table
    assert m.max_horizon == 4.0
    # discrete: sigma2 at 0,1,2 = 2, 1, 1.25, plus half of sigma2(3) = 1.5
    assert m.sigma_bar2(3.5) == pytest.approx((2 + 1 + 1.25 + 0.5 * 1.5) / 3.5)
    # continuous: integral of the piecewise-linear interpolant
    assert m.sigma_bar2(2.0, "continuous") == pytest.approx((1.5 + 1.125) / 2)
    assert m.sigma_bar2(0.5, "discrete") == pytest.approx(2.0)


def test_tabulated_decreasing_is_accepted_but_flagged():
    m = TabulatedNoise([0, 1, 2], [3.0, 1.0, 1.5])
    assert not m.satisfies_a3
    assert m.largest_drop == pytest.approx(2 / 3)
    env = m.monotone_envelope()
    assert env.satisfies_a3 and np.allclose(env.sigma2_values, [3, 3, 3])
    assert TabulatedNoise([0, 1], [1.0, 1.0]).satisfies_a3


@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12), st.floats(0.1, 40.0))
def test_tabulated_discrete_matches_brute_force(vals, h):
    if max(vals) <= 0:
        return
    m = TabulatedNoise(np.arange(len(vals)), vals)
    assert m.sigma_bar2(h) == pytest.approx(brute_discrete(m, h), rel=1e-9, abs=1e-12)


def test_round_trip_dict():
    for m in (PowerLawNoise(0.2, 3.0), ConstantNoise(2.0), TabulatedNoise([0, 2], [1.0, 2.0])):
        back = noise_from_dict(m.to_dict())
        assert np.allclose(back.sigma_bar2([0.5, 3.0, 40.0]), m.sigma_bar2([0.5, 3.0, 40.0]))


@pytest.mark.parametrize("make, name", [
    (lambda: PowerLawNoise(-0.1), "alpha"),
    (lambda: PowerLawNoise(float("nan")), "alpha"),
    (lambda: PowerLawNoise(0.1, 0.0), "tau"),
    (lambda: ConstantNoise(0.0), "sigma2"),
    (lambda: TabulatedNoise([], []), "staleness"),
    (lambda: TabulatedNoise([0, 1], [1.0, -1.0]), "sigma2"),
    (lambda: TabulatedNoise([0, 1], [1.0, float("nan")]), "sigma2"),
    (lambda: TabulatedNoise([0, 1], [0.0, 0.0]), "sigma2"),
    (lambda: TabulatedNoise([1, 0], [1.0, 1.0]), "staleness"),
    (lambda: TabulatedNoise([-1, 0], [1.0, 1.0]), "staleness"),
    (lambda: TabulatedNoise([0, 1, 2], [1.0, 1.0]), "same length"),
    (lambda: PowerLawNoise(0.1).sigma_bar2(0.0), "horizon"),
    (lambda: PowerLawNoise(0.1).sigma_bar2(1.0, "exact"), "average"),
])
def test_bad_input(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_tabulated_range_and_explicit_extrapolation():
    m = TabulatedNoise([1, 2, 8], [1.0, 1.2, 1.5])
    assert m.extrapolate == "none" and m.measured_horizon == m.max_horizon == 9.0
    assert "extrapolate" not in m.to_dict()  # saved tables keep their form
    held = TabulatedNoise([1, 2, 8], [1.0, 1.2, 1.5], extrapolate="hold_last")
    assert held.measured_horizon == 9.0 and held.max_horizon == np.inf
    assert held.sigma2(50) == pytest.approx(1.5)
    back = noise_from_dict(held.to_dict())
    assert back.extrapolate == "hold_last" and back.max_horizon == np.inf
    assert held.monotone_envelope().extrapolate == "hold_last"
    with pytest.raises(ValueError, match="extrapolate must be one of"):
        TabulatedNoise([0, 1], [1.0, 1.0], extrapolate="linear")
