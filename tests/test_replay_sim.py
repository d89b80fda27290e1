"""Checks of the synchronous replay simulator (theory.md section 4) and its probes."""

import numpy as np
import pytest
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from replaytheory import QuadraticProblem, TabularProblem, simulate_replay
from replaytheory.buffer import ReplayIndex, sync_fifo_slots
from replaytheory.fit.probe_measure import measure_probe
from replaytheory.sim.replay_sim import interpolate_curves
from replaytheory.sim.sim_tabular import LOSSES

SLOW = dict(deadline=None, phases=(Phase.explicit, Phase.generate))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), r=st.integers(1, 40), steps=st.integers(1, 25))
def test_ring_slots_hold_what_replay_index_holds(n, r, steps):
    assume(r <= n)
    ring = np.full(n, -1)
    buf = ReplayIndex(n)
    for t in range(steps):
        ring[sync_fifo_slots(t, r, [n])[0]] = t
        buf.add(np.arange(t * r, (t + 1) * r), t, t)
    held = buf.metadata(buf.items())["insert_step"]
    assert sorted(ring[ring >= 0].tolist()) == sorted(held.tolist())


def _exact_minibatch_v(prob: QuadraticProblem, n: int, b: int, r: int) -> float:
    """E||mean of the B drawn noises||^2 for a full buffer, from the problem's definition."""
    stal = np.arange(n) // r
    sig = np.sqrt(prob.sigma2(stal))
    k = prob.rho * np.abs(stal[:, None] - stal[None, :]) / n
    np.fill_diagonal(k, 1.0)
    pair_mean = np.sum(sig[:, None] * sig[None, :] * k) / n**2
    return float(np.mean(sig**2) / b + (1 - 1 / b) * pair_mean)


def test_quadratic_minibatch_noise_matches_its_definition():
    prob = QuadraticProblem(alpha=0.3, rho=0.2, kappa=0.0)
    n, b, r = 48, 16, 6
    res = simulate_replay(prob, [(n, b, r)], steps=3000, lrs=[0.01], minibatch_every=1,
                          probe_start=n // r)
    mb = res.probes.tables["minibatch"]["sq_error"]
    exact = _exact_minibatch_v(prob, n, b, r)
    assert abs(mb.mean() - exact) < 4 * mb.std() / np.sqrt(mb.size)
    # and the coupling term is real: without it the expectation is clearly lower
    no_coupling = _exact_minibatch_v(QuadraticProblem(alpha=0.3, rho=0.0), n, b, r)
    assert mb.mean() - no_coupling > 4 * mb.std() / np.sqrt(mb.size)


def test_quadratic_per_sample_noise_follows_sigma():
    prob = QuadraticProblem(alpha=0.25, tau=2.0, kappa=0.0)
    res = simulate_replay(prob, [(64, 16, 8)], steps=400, lrs=[0.01], probe_every=2)
    t = res.probes.tables["noise"]
    for s in range(8):
        x = t["sq_noise"][t["staleness"] == s]
        assert abs(x.mean() - prob.sigma2(s)) < 4 * x.std() / np.sqrt(x.size)


def test_quadratic_expected_loss_is_the_mean_of_sampled_runs():
    # The Rao-Blackwellised loss must equal the average of the explicit runs.
    prob = QuadraticProblem(kappa=0.5, rho=0.1, f0=2.0)
    res = simulate_replay(prob, [(64, 16, 8)], steps=150, lrs=[0.05], seeds=400,
                          record_every=50)
    sampled, expected = res.loss[0, 0], res.loss_expected[0, 0]  # seeds x records
    for k in range(1, res.record_steps.size):
        se = sampled[:, k].std() / np.sqrt(sampled.shape[0])
        assert abs(sampled[:, k].mean() - expected[:, k].mean()) < 4 * se


def test_quadratic_loss_falls_and_diverges_when_lr_too_large():
    res = simulate_replay(QuadraticProblem(), [(32, 16, 8)], steps=300, lrs=[0.05, 10.0])
    curve = res.mean_loss(expected=True)[0]
    assert curve[0, -1] < 0.01 * curve[0, 0]
    assert np.isnan(curve[1, -1])  # a step size far above 2/L diverges: reported as NaN


def test_quadratic_rejects_a_coupling_that_is_no_covariance():
    with pytest.raises(ValueError, match="rho"):
        QuadraticProblem(rho=1.0).check_cell(64 * 16, 16, 16)
    with pytest.raises(ValueError, match="rho"):
        simulate_replay(QuadraticProblem(rho=1.0), [(64 * 16, 16, 16)], steps=5, lrs=[0.1])
    QuadraticProblem(rho=0.1).check_cell(32 * 16, 16, 16)  # valid: no error


def test_tabular_losses_carry_the_harness_names():
    # the simulator and llm_experiments.rl.losses name the same objectives alike (the harness is
    # not imported here: it needs torch)
    assert LOSSES == ("grpo", "grpo_unclipped", "grpo_truncated", "asymre")
    assert TabularProblem().loss == "grpo"


@pytest.mark.parametrize("loss", LOSSES)
def test_tabular_losses_learn(loss):
    prob = TabularProblem(loss=loss, n_prompts=16)
    res = simulate_replay(prob, [(128, 64, 32)], steps=300, lrs=[8.0], seeds=2)
    curve = res.mean_loss()[0, 0]
    assert curve[0] == pytest.approx(prob.initial_loss())
    assert curve[-1] < 0.6 * curve[0]


def test_tabular_binary_rewards_and_probes():
    prob = TabularProblem(reward_model="binary", n_prompts=8, n_answers=8)
    q, _ = prob.rewards_and_init()
    assert set(np.unique(q)) == {0.0, 1.0} and np.all(q.sum(1) == 1)
    res = simulate_replay(prob, [(96, 32, 16)], steps=60, lrs=[4.0], probe_every=10)
    t = res.probes.tables
    assert t["noise"]["staleness"].max() == 5
    assert np.all(t["noise"]["drift"][t["noise"]["staleness"] == 0] == 0)
    assert np.all(t["noise"]["ref_sq_error"] > 0)  # fresh-sample reference has an error
    assert res.probes.n_rows("bias") > 0 and res.probes.n_rows("coupling") > 0


def test_budget_accounting_and_interpolation():
    res = simulate_replay(QuadraticProblem(), [(64, 32, 8), (32, 32, 16)], steps=[200, 100],
                          lrs=[0.02], record_every=10)
    assert res.cost_per_step(4.0).tolist() == [32 + 4 * 8, 32 + 4 * 16]
    assert np.isnan(res.loss[1, 0, 0, res.record_steps > 100]).all()
    budget = 150 * (32 + 4 * 8)  # 150 steps of the first cell, 75 of the second
    at = res.loss_at_budget(4.0, budget)
    assert at[0, 0] == pytest.approx(res.mean_loss()[0, 0, res.record_steps == 150][0])
    x = np.array([0.0, 10, 20])
    curves = np.exp(-np.array([[[0.0, 1.0, 2.0]]]))
    assert interpolate_curves(x, curves, [15.0])[0, 0] == pytest.approx(np.exp(-1.5))
    assert np.isnan(interpolate_curves(x, curves, [25.0])[0, 0])


def test_seeded_simulation_repeats():
    a = simulate_replay(TabularProblem(), [(128, 64, 32)], steps=50, lrs=[4.0], seed=3)
    b = simulate_replay(TabularProblem(), [(128, 64, 32)], steps=50, lrs=[4.0], seed=3)
    assert np.array_equal(a.loss, b.loss)


@pytest.mark.parametrize("cells, kw, name", [
    ([(8, 16, 4)], {}, "buffer_size"),
    ([(16, 16, 32)], {}, "rollouts_per_step"),
    ([(16, 16, 0)], {}, "rollouts_per_step"),
    ([(16, 0, 4)], {}, "batch_size"),
    ([(16, 16)], {}, "cells"),
    ([(16, 16, 4)], {"steps": 0}, "steps"),
    ([(16, 16, 4)], {"lrs": [-0.1]}, "lrs"),
    ([(16, 16, 4)], {"lrs": [np.nan]}, "lrs"),
    ([(16, 16, 4)], {"seeds": 0}, "seeds"),
    ([(16, 16, 4)], {"probe_lr": 3}, "probe_lr"),
])
def test_bad_input_names_the_parameter(cells, kw, name):
    args = {"steps": 5, "lrs": [0.1], **kw}
    with pytest.raises(ValueError, match=name):
        simulate_replay(QuadraticProblem(), cells, **args)


def test_bad_problem_parameters():
    with pytest.raises(ValueError, match="rollouts_per_step"):
        simulate_replay(TabularProblem(group_size=8), [(64, 32, 12)], steps=5, lrs=[1.0])
    with pytest.raises(ValueError, match="problem"):
        simulate_replay("quadratic", [(16, 16, 4)], steps=5, lrs=[1.0])
    for kw, name in [({"alpha": -1}, "alpha"), ({"rho": 1.5}, "rho"), ({"tau": 0}, "tau"),
                     ({"kappa": 2}, "kappa"), ({"dim": 0}, "dim")]:
        with pytest.raises(ValueError, match=name):
            QuadraticProblem(**kw)
    for kw, name in [({"loss": "ppo"}, "loss"), ({"loss": "grpo_clip"}, "loss"),
                     ({"clip": 0}, "clip"),
                     ({"reward_model": "dense"}, "reward_model"),
                     ({"reward_beta": (0, 1)}, "reward_beta"), ({"group_size": 1}, "group_size")]:
        with pytest.raises(ValueError, match=name):
            TabularProblem(**kw)


# ---- probe_measure ----------------------------------------------------------------------

@settings(max_examples=30, **SLOW)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30), h=st.integers(1, 5))
def test_measure_probe_matches_brute_force(seed, n, h):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((n, 3))
    stal = rng.integers(0, h, n)
    drift = rng.random(n)
    g = rng.standard_normal(3)
    drawn = rng.integers(0, n, 5)
    rows = measure_probe(e, stal, drift, g, 0.1, drawn, probe_step=7, buffer_size=n,
                         rollouts_per_step=2)
    sq = (e**2).sum(1)
    assert np.allclose(rows["noise"]["sq_noise"], sq)
    c = rows["coupling"]
    for gap, pairs, inner, msq in zip(c["gap"], c["n_pairs"], c["mean_inner"], c["mean_sq"]):
        i, j = np.nonzero((np.abs(stal[:, None] - stal[None, :]) == gap) & ~np.eye(n, dtype=bool))
        assert pairs == i.size / 2
        assert inner == pytest.approx(np.mean(np.sum(e[i] * e[j], 1)))
        assert msq == pytest.approx(np.mean((sq[i] + sq[j]) / 2))
    for s, count, mean_sq, noise_sq in zip(*(rows["bias"][k] for k in
                                             ("staleness", "n_samples", "mean_sq", "noise_sq"))):
        m = e[stal == s]
        assert count == len(m) and mean_sq == pytest.approx(np.sum(m.mean(0) ** 2))
        assert noise_sq == pytest.approx(np.mean((m**2).sum(1)))
    mb = rows["minibatch"]
    assert mb["sq_error"][0] == pytest.approx(np.sum(e[drawn].mean(0) ** 2))
    assert mb["sigma_bar2"][0] == pytest.approx(sq.mean())
    assert mb["horizon"][0] == n / 2 and mb["replay_ratio"][0] == 5 / 2


def test_measure_probe_bad_input():
    e = np.zeros((4, 2))
    with pytest.raises(ValueError, match="staleness"):
        measure_probe(e, [0, 1], [0] * 4, [0, 0], 0.0, [0], probe_step=0, buffer_size=4,
                      rollouts_per_step=1)
    with pytest.raises(ValueError, match="ref_sq_error"):
        measure_probe(e, [0] * 4, [0] * 4, [0, 0], -1.0, [0], probe_step=0, buffer_size=4,
                      rollouts_per_step=1)
    with pytest.raises(ValueError, match="drawn"):
        measure_probe(e, [0] * 4, [0] * 4, [0, 0], 0.0, [9], probe_step=0, buffer_size=4,
                      rollouts_per_step=1)
