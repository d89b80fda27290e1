import math

import pytest

from replaytheory import (BoundConditionError, PowerLawNoise, TabulatedNoise, convergence_bound,
                          step_size_limit, variance_terms)

NOISE = PowerLawNoise(0.2, 2.0)
BASE = dict(buffer_size=240, batch_size=60, rollouts_per_step=20, lr=1e-3, smoothness=10.0,
            kappa=2.0, f0=3.0, steps=5000, rho=0.1, noise=NOISE)


def test_terms_by_hand():
    res = convergence_bound(**BASE)
    sb2 = (12 / 2.0) ** 0.4 / 1.4  # continuous sigma_bar^2 at H = N/R = 12
    v = sb2 * (1 / 60 + 1 / 240 + 0.1 / 20)
    assert res.variance.sigma_bar2 == pytest.approx(sb2)
    assert res.variance.minibatch == pytest.approx(sb2 / 60)
    assert res.variance.local == pytest.approx(sb2 / 240)
    assert res.variance.coupling == pytest.approx(sb2 * 0.1 / 20)
    assert res.variance.total == pytest.approx(v)
    assert res.descent == pytest.approx(12 * 3.0 / (1e-3 * 5000))
    assert res.bias_driven == pytest.approx(8e-3 * 4 * 240**2 * 4.0 * 1e-3 / 20**2 * v)
    assert res.smoothness_driven == pytest.approx(8e-3 * 10.0 * v)
    assert res.value == pytest.approx(res.descent + res.bias_driven + res.smoothness_driven)
    assert res.notes == ()


def test_step_size_limit_is_the_min_of_both_conditions():
    assert step_size_limit(240, 20, 10.0, 2.0) == pytest.approx(
        min(20 / (2 * math.sqrt(2) * 2.0 * 240), 1 / 20))
    assert step_size_limit(240, 20, 10.0, 0.0) == pytest.approx(1 / 20)


def test_corrected_smoothness_condition():
    # eta < 1/(2L) (the paper's "L/2" would allow eta = 4 with L = 10; the proof does not)
    args = dict(BASE, kappa=0.0)
    convergence_bound(**dict(args, lr=0.0499))
    with pytest.raises(BoundConditionError, match=r"1/\(2L\)"):
        convergence_bound(**dict(args, lr=0.05))
    with pytest.raises(BoundConditionError):
        convergence_bound(**dict(args, lr=4.0))


def test_kappa_condition():
    limit = 20 / (2 * math.sqrt(2) * 2.0 * 240)
    convergence_bound(**dict(BASE, lr=limit))
    with pytest.raises(BoundConditionError, match="kappa"):
        convergence_bound(**dict(BASE, lr=limit * 1.01))


def test_steps_condition():
    with pytest.raises(BoundConditionError, match="steps"):
        convergence_bound(**dict(BASE, steps=1))


def test_a3_note_for_decreasing_noise():
    res = convergence_bound(**dict(BASE, noise=TabulatedNoise([0, 5, 20], [2.0, 1.0, 1.5])))
    assert any("A3 does not hold" in n for n in res.notes)


def test_variance_terms_shrink_with_bigger_sizes():
    small = variance_terms(60, 60, 60, 0.1, NOISE)
    big = variance_terms(600, 600, 600, 0.1, NOISE)
    assert big.total == pytest.approx(small.total / 10)


@pytest.mark.parametrize("change, name", [
    (dict(batch_size=300), "batch_size"),
    (dict(rollouts_per_step=300), "rollouts_per_step"),
    (dict(rho=1.5), "rho"),
    (dict(rho=-0.1), "rho"),
    (dict(lr=0.0), "lr"),
    (dict(smoothness=-1.0), "smoothness"),
    (dict(kappa=-1.0), "kappa"),
    (dict(f0=float("nan")), "f0"),
    (dict(buffer_size=float("inf")), "buffer_size"),
])
def test_bad_input(change, name):
    with pytest.raises(ValueError, match=name):
        convergence_bound(**dict(BASE, **change))
