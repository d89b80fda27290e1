import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replaytheory.stats.analysis import (compute_to_fraction_of_best, compute_to_target,
                                         curves_on_grid, median_iqr, pareto_frontier, regret,
                                         spearman, split_half_spearman, tail_mean)


def test_compute_to_target_first_hit_and_missing():
    c = [10, 20, 30, 40]
    m = [0.1, np.nan, 0.5, 0.7]
    assert compute_to_target(c, m, 0.5) == 30
    assert compute_to_target(c, m, 0.3, interpolate=True) == pytest.approx(10 + 20 * 0.5)
    assert compute_to_target(c, m, 0.9) == math.inf
    assert compute_to_fraction_of_best(c, m, 0.98) == 40
    assert compute_to_fraction_of_best(c, [0.1, 0.69, 0.5, 0.7]) == 20


def test_tail_mean():
    c = np.arange(1, 101)
    m = np.where(c >= 75, 1.0, 0.0)
    assert tail_mean(c, m, 0.25) == pytest.approx(1.0)
    assert tail_mean(c, np.arange(100.0), 0.25) == pytest.approx(np.arange(74, 100).mean())


def test_median_iqr_with_nan_and_inf():
    a = np.array([[1.0, 2.0, 3.0, np.nan], [np.inf, np.inf, 5.0, 1.0]])
    med, lo, hi = median_iqr(a, axis=1)
    assert med[0] == 2.0 and lo[0] == 1.5 and hi[0] == 2.5
    assert med[1] == math.inf and lo[1] == pytest.approx(4.0)
    med, _, _ = median_iqr(np.full((2, 3), np.nan), axis=1)
    assert np.all(np.isnan(med))


def test_curves_on_grid_holds_last_value():
    out = curves_on_grid([([1, 3], [0.1, 0.3]), ([2, 4], [0.2, 0.4])], [0, 1, 2, 3, 4, 5])
    assert np.allclose(out[0], [np.nan, 0.1, 0.1, 0.3, 0.3, 0.3], equal_nan=True)
    assert np.allclose(out[1], [np.nan, np.nan, 0.2, 0.2, 0.4, 0.4], equal_nan=True)


def test_pareto_frontier():
    c = [1, 2, 3, 4, 5, 2]
    m = [0.1, 0.3, 0.2, 0.6, 0.5, np.nan]
    assert pareto_frontier(c, m).tolist() == [0, 1, 3]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 1)), min_size=1, max_size=30))
def test_pareto_points_are_not_dominated(points):
    c, m = map(np.array, zip(*points))
    front = pareto_frontier(c, m)
    for i in front:
        assert not np.any((c <= c[i]) & (m > m[i]))
    for j in set(range(len(c))) - set(front.tolist()):
        assert np.any((c <= c[j]) & (m >= m[j]))


def test_spearman_ranks_inf_last():
    assert spearman([1, 2, 3, np.inf], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert math.isnan(spearman([1, 2], [2, 1]))


def test_split_half_spearman_detects_signal_and_noise():
    rng = np.random.default_rng(0)
    truth = np.linspace(0, 1, 20)[:, None]
    clean = truth + 0.01 * rng.standard_normal((20, 6))
    noisy = truth + 3.0 * rng.standard_normal((20, 6))
    assert split_half_spearman(clean) > 0.95
    assert split_half_spearman(noisy) < 0.6
    with pytest.raises(ValueError, match="seeds"):
        split_half_spearman(np.zeros((5, 1)))


def test_regret():
    assert regret(150.0, 100.0) == pytest.approx(0.5)
    assert regret(math.inf, 100.0) == math.inf
    with pytest.raises(ValueError, match="compute_best"):
        regret(1.0, 0.0)


def test_best_option_and_gate_with_learning_rates():
    from replaytheory.stats.analysis import best_option
    s = np.array([[[1, 2, 3], [5, 6, 7]], [[9, 9, 9], [0, 1, np.nan]]], dtype=float)
    best, idx = best_option(s, "max")
    assert best.tolist() == [6.0, 9.0] and idx.tolist() == [1, 0]
    best, idx = best_option(s, "min")
    assert best.tolist() == [2.0, 0.5] and idx.tolist() == [0, 1]
    rng = np.random.default_rng(1)
    truth = np.linspace(0, 1, 12)[:, None, None]
    scores = truth + np.array([0.0, -0.3])[None, :, None] + 0.01 * rng.standard_normal((12, 2, 6))
    assert split_half_spearman(scores, "max") > 0.95
