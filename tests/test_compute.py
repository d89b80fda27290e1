import math

import pytest
from hypothesis import given, strategies as st

from replaytheory import (compute_ratio, cost_per_update, estimate_mu, expected_replay_ratio,
                          gamma_table, generation_share, mu_from_costs, paper_gamma_tables)
from replaytheory.model.compute import PAPER_SPLITS


def test_api_example():
    assert compute_ratio(workers=6, trainers=2, mu=6.84) == pytest.approx(0.5096, abs=1e-3)


def test_qwen3_table_reproduced_and_typo_flagged():
    rows = paper_gamma_tables()["Qwen3-0.6B"]
    got = [round(r.gamma, 2) for r in rows]
    assert got == [1.02, 0.51, 0.34, 0.26, 0.17, 0.15]
    flagged = [(r.workers, r.trainers) for r in rows if r.matches_print is False]
    assert flagged == [(6, 2)]  # the paper prints 0.41 where the formula gives 0.51
    assert rows[1].printed == 0.41


def test_qwen25_table_formula_values():
    rows = gamma_table(5.28, PAPER_SPLITS)
    assert [round(r.gamma, 2) for r in rows] == [1.27, 0.64, 0.42, 0.32, 0.21, 0.18]
    # the printed table is within 0.02 everywhere (it matches mu ~ 5.2)
    assert all(r.matches_print for r in paper_gamma_tables()["Qwen2.5-7B"])


def test_costs_and_shares():
    assert cost_per_update(6.84) == pytest.approx(7.84)
    assert cost_per_update(6.84, workers=6, trainers=2, buffer=True) == pytest.approx(4.0)
    assert generation_share(6.84) == pytest.approx(6.84 / 7.84)
    assert 0.8 < generation_share(5.28) < 0.9
    assert expected_replay_ratio(6, 2, 6.84) == pytest.approx(2.28)
    assert mu_from_costs(13.68, 2.0) == pytest.approx(6.84)


@given(mu=st.floats(0.1, 50), w=st.integers(1, 16), t=st.integers(1, 16))
def test_estimate_mu_inverts_replay_ratio(mu, w, t):
    # A run at full speed consumes mu T / W samples per unique rollout.
    k_inf = 100_000
    k_train = round(k_inf * expected_replay_ratio(w, t, mu))
    if k_train < 1:
        return
    assert estimate_mu(k_inf, k_train, w, t) == pytest.approx(mu, rel=1e-4 + 1 / k_train)


@given(mu=st.floats(0.01, 100), w=st.integers(1, 32), t=st.integers(1, 32))
def test_gamma_is_cost_ratio(mu, w, t):
    g = compute_ratio(w, t, mu)
    assert g == pytest.approx((1 + w / t) / (1 + mu))
    # gamma < 1 exactly when the expected replay ratio exceeds one (W/T < mu)
    assert (g < 1) == (w / t < mu) or math.isclose(w / t, mu)


@pytest.mark.parametrize("call, name", [
    (lambda: compute_ratio(6, 2, 0.0), "mu"),
    (lambda: compute_ratio(6, 2, -1.0), "mu"),
    (lambda: compute_ratio(6, 2, float("nan")), "mu"),
    (lambda: compute_ratio(6, 2, float("inf")), "mu"),
    (lambda: compute_ratio(0, 2, 5.0), "workers"),
    (lambda: compute_ratio(6, 2.5, 5.0), "trainers"),
    (lambda: estimate_mu(0, 10), "unique_rollouts"),
    (lambda: estimate_mu(10, 10.5), "samples_consumed"),
    (lambda: mu_from_costs(-1.0, 1.0), "generation_cost"),
    (lambda: mu_from_costs(1.0, 0.0), "train_cost"),
    (lambda: cost_per_update(5.0, buffer=True), "workers"),
])
def test_bad_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
