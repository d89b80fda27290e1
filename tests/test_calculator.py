import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import replaytheory
from replaytheory import (PowerLawNoise, ReplayRecommendation, TabulatedNoise, compute_ratio,
                          design_grid, optimal_config, optimal_design)
from replaytheory.model import reuse as ru
from replaytheory.calculator import (DEFAULT_REUSE, MEASURED_HORIZON,
                                     optimal_config as _optimal_config)


def model_config(**kwargs):
    """``optimal_config`` with the model's own horizon (what the tests of the model check)."""
    return _optimal_config(horizon_source="model", **kwargs)

# The tracker's example: noise measured at staleness 1-8, still growing slowly at the end.
MEASURED_1_TO_8 = TabulatedNoise(np.arange(1, 9), [1.0, 1.1, 1.2, 1.25, 1.3, 1.35, 1.4, 1.42])


# The reuse terms the brute-force checks run under: section 5's model, the calculator's
# default c, and a c(g) table falling with the gap.
REUSES = [None, DEFAULT_REUSE, ru.TabulatedReuse((1, 2, 4, 8), (0.8, 0.6, 0.4, 0.3))]


def objective(x, y, *, mu, rho, noise, reuse=None, contribution=None):
    return ru.objective(x, y, mu=mu, rho=rho, noise=noise, reuse=reuse,
                        contribution=contribution)


def j_of(cfg, noise, reuse=None, contribution=None):
    return float(objective(cfg.horizon, cfg.replay_ratio, mu=cfg.mu, rho=cfg.rho, noise=noise,
                           reuse=reuse, contribution=contribution))


def test_api_example():
    cfg = model_config(mu=6.84, rho=0.1, noise=PowerLawNoise(alpha=0.1), gpus=8,
                       batch_size=60)
    assert isinstance(cfg, ReplayRecommendation) and not hasattr(replaytheory, "Config")
    assert cfg.horizon_limit == 1000.0 and cfg.measured_horizon is None
    assert cfg.workers + cfg.trainers == 8
    assert cfg.batch_size == 60 and cfg.batch_size % cfg.trainers == 0
    assert cfg.buffer_size >= cfg.batch_size and cfg.buffer_size % cfg.trainers == 0
    assert cfg.replay_ratio == pytest.approx(6.84 * cfg.trainers / cfg.workers)
    assert cfg.rollouts_per_step == pytest.approx(60 / cfg.replay_ratio)
    assert cfg.horizon == pytest.approx(cfg.buffer_size / cfg.rollouts_per_step)
    assert cfg.compute_ratio == pytest.approx(compute_ratio(cfg.workers, cfg.trainers, 6.84))
    assert cfg.predicted_saving == pytest.approx(1 - cfg.compute_ratio * cfg.variance_ratio)
    assert 0 < cfg.predicted_saving < 1 and cfg.regime == "replay"
    d = cfg.to_dict()
    json.dumps(d)
    for key in ("buffer_size", "batch_size", "rollouts_per_step", "workers", "trainers",
                "compute_ratio", "predicted_saving", "explanation", "at_nb_edge",
                "horizon_capped", "extrapolated", "design_feasible", "horizon_source",
                "horizon_validated", "model_horizon"):
        assert key in d
    assert cfg.horizon_source == "model" and cfg.horizon_validated is False
    assert "The horizon is the model's and is not validated" in cfg.explanation


@pytest.mark.parametrize("reuse", REUSES, ids=["standard", "default_c", "table_c"])
@settings(max_examples=25, deadline=None)
@given(mu=st.floats(0.5, 30), rho=st.floats(0.01, 1), alpha=st.floats(0.01, 0.45),
       gpus=st.integers(2, 16), batch=st.sampled_from([16, 32, 60, 64, 128]))
def test_async_config_is_best_over_a_brute_force_search(reuse, mu, rho, alpha, gpus, batch):
    noise = PowerLawNoise(alpha)
    cfg = model_config(mu=mu, rho=rho, noise=noise, gpus=gpus, batch_size=batch, reuse=reuse)
    assert cfg.workers + cfg.trainers == gpus
    if cfg.on_policy:
        assert cfg.buffer_size == cfg.batch_size and cfg.replay_ratio == 1.0
        assert cfg.predicted_saving == 0.0 and cfg.compute_ratio == 1.0
    best = math.inf
    for t in range(1, gpus):
        if batch % t:
            continue
        y = mu * t / (gpus - t)
        r = batch / y
        ns = np.arange(-(-max(batch, math.ceil(r - 1e-9)) // t) * t, int(1000 * r) + t + 1, t)
        ns = ns[ns / r <= 1000]
        if ns.size:
            best = min(best, float(objective(ns / r, y, mu=mu, rho=rho, noise=noise,
                                             reuse=reuse).min()))
    j_on = float(objective(1.0, 1.0, mu=mu, rho=rho, noise=noise, reuse=reuse))
    # On-policy answers are checked too: no split may beat them (issue 26).
    j_cfg = j_on if cfg.on_policy else j_of(cfg, noise, reuse)
    assert j_cfg <= min(best, j_on) * (1 + 1e-9)


@pytest.mark.parametrize("reuse,contribution", [
    (None, None), (DEFAULT_REUSE, None), (ru.ConstantReuse(0.3), ru.ExpContribution(0.05, 0.01))])
@pytest.mark.parametrize("mu,alpha", [(2.0, 0.05), (6.84, 0.1), (20.0, 0.02)])
def test_sync_config_is_best_over_a_brute_force_search(reuse, contribution, mu, alpha):
    noise, b = PowerLawNoise(alpha), 64
    cfg = model_config(mu=mu, rho=0.05, noise=noise, batch_size=b, max_horizon=100,
                       reuse=reuse, contribution=contribution)
    best = min(float(objective(np.arange(max(b, r), 100 * r + 1) / r, b / r, mu=mu, rho=0.05,
                               noise=noise, reuse=reuse, contribution=contribution).min())
               for r in range(1, 10 * b + 1))
    j_on = float(objective(1.0, 1.0, mu=mu, rho=0.05, noise=noise, reuse=reuse,
                           contribution=contribution))
    j_cfg = j_on if cfg.on_policy else j_of(cfg, noise, reuse, contribution)
    assert j_cfg <= min(best, j_on) * (1 + 1e-9)
    assert cfg.variant == ru.variant_name(reuse, contribution)


def test_the_default_model_is_the_self_correlated_variant_and_says_so():
    cfg = model_config(mu=6.84, rho=0.1, alpha=0.05, batch_size=64)
    assert cfg.variant == "self_correlated" and cfg.design.reuse == {"model": "constant",
                                                                    "c": 0.67}
    assert "Model: self_correlated (section 10)" in cfg.explanation
    assert "c = 0.67 (the default" in cfg.explanation
    standard = model_config(mu=6.84, rho=0.1, alpha=0.05, batch_size=64, reuse=None)
    assert standard.variant == "standard" and "Model: section 5's" in standard.explanation
    # c = 0 is section 5's model (section 10.3 reduces to it), and a ConstantReuse(0) term
    # gives the same integers.
    assert model_config(mu=6.84, rho=0.1, alpha=0.05, batch_size=64, reuse=0).to_dict() \
        == standard.to_dict()
    zero = model_config(mu=6.84, rho=0.1, alpha=0.05, batch_size=64,
                          reuse=ru.ConstantReuse(0.0))
    assert (zero.buffer_size, zero.rollouts_per_step) == (standard.buffer_size,
                                                         standard.rollouts_per_step)
    # Self-correlation charges reuse: less of it than section 5's model.
    assert cfg.replay_ratio < standard.replay_ratio


@pytest.mark.parametrize("kwargs,name", [({"reuse": 1.5}, "reuse"), ({"reuse": -0.1}, "reuse"),
                                         ({"reuse": "0.5"}, "reuse"), ({"reuse": True}, "reuse"),
                                         ({"contribution": 0.5}, "contribution")])
def test_bad_reuse_terms_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        optimal_config(mu=6.84, rho=0.1, alpha=0.1, **kwargs)


def test_sync_config_integers_near_continuous_optimum():
    cfg = model_config(mu=5.28, rho=0.1, alpha=0.2, batch_size=64, reuse=None)
    assert cfg.workers is None and cfg.trainers is None
    assert float(cfg.rollouts_per_step).is_integer()
    assert cfg.horizon == pytest.approx(cfg.design.horizon, rel=0.1)
    assert cfg.replay_ratio == pytest.approx(cfg.design.replay_ratio, rel=0.1)
    assert cfg.compute_ratio == pytest.approx((1 + 5.28 / cfg.replay_ratio) / 6.28)


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_on_policy_is_a_first_class_answer(alpha):
    cfg = model_config(mu=6.84, rho=0.1, alpha=alpha, gpus=8, batch_size=60)
    assert cfg.on_policy and cfg.regime == "on-policy"
    assert cfg.buffer_size == cfg.batch_size == 60
    assert cfg.replay_ratio == 1.0 and cfg.horizon == 1.0
    assert cfg.predicted_saving == 0.0
    # ideal split without a buffer: W/T closest to mu
    assert (cfg.workers, cfg.trainers) == (7, 1)
    assert "Stay on-policy" in cfg.explanation


def test_on_policy_regime_of_check_values():
    cfg = model_config(mu=5.28, rho=1.0, alpha=0.2, gpus=8, batch_size=60)
    assert cfg.on_policy and cfg.design.horizon == pytest.approx(0.921, abs=1e-3)


def test_batch_range_and_divisibility():
    cfg = optimal_config(mu=6.84, rho=0.1, alpha=0.1, gpus=6, batch_size=(50, 70))
    assert 50 <= cfg.batch_size <= 70 and cfg.batch_size % cfg.trainers == 0
    assert cfg.buffer_size % cfg.trainers == 0


def test_fixed_trainers_and_max_buffer():
    cfg = model_config(mu=6.84, rho=0.1, alpha=0.1, gpus=8, trainers=2, batch_size=60,
                         max_buffer_size=120, reuse=None)
    assert (cfg.workers, cfg.trainers) == (6, 2)
    assert cfg.buffer_size <= 120
    assert any("max_buffer_size" in n for n in cfg.notes)


def test_unbounded_optimum_is_capped():
    cfg = optimal_config(mu=6.84, rho=0.1, alpha=0.0, batch_size=60, max_horizon=50)
    assert cfg.horizon <= 50 and any("max_horizon" in n for n in cfg.notes)


def test_budget_and_min_steps():
    cfg = optimal_config(mu=6.84, rho=0.1, alpha=0.1, gpus=8, batch_size=60, budget=1e4,
                         min_steps=2000)
    assert cfg.steps >= 2000
    assert cfg.steps == pytest.approx(1e4 / (1 + cfg.workers / cfg.trainers))
    with pytest.raises(ValueError, match="min_steps"):
        optimal_config(mu=6.84, rho=0.1, alpha=0.1, gpus=8, batch_size=60, budget=10,
                       min_steps=2000)


def test_costs_instead_of_mu_and_tabulated_noise():
    a = optimal_config(generation_cost=13.68, train_cost=2.0, rho=0.1, alpha=0.1, gpus=8)
    b = optimal_config(mu=6.84, rho=0.1, alpha=0.1, gpus=8)
    assert a.to_dict() == b.to_dict()
    table = TabulatedNoise([0, 1, 2, 4, 8], [2.0, 1.0, 1.0, 1.1, 1.2])
    cfg = optimal_config(mu=6.84, rho=0.1, noise=table, gpus=8)
    assert any("A3 does not hold" in n for n in cfg.notes)


def test_design_grid_shape_and_regimes():
    g = design_grid(np.geomspace(1, 20, 5), np.array([0.05, 0.2, 0.6]), rho=0.1)
    assert g["horizon"].shape == (5, 3)
    assert g["on_policy"][:, 2].all()
    assert np.all(np.diff(g["replay_ratio"][:, 0]) >= 0)


@pytest.mark.parametrize("kwargs, name", [
    (dict(mu=0.0), "mu"),
    (dict(mu=-2.0), "mu"),
    (dict(mu=float("nan")), "mu"),
    (dict(rho=1.5), "rho"),
    (dict(alpha=-0.1), "alpha"),
    (dict(alpha=float("inf")), "alpha"),
    (dict(gpus=1), "gpus"),
    (dict(gpus=7.5), "gpus"),
    (dict(gpus=8, trainers=8), "trainers"),
    (dict(gpus=8, trainers=12), "trainers"),
    (dict(batch_size=60.5), "batch_size"),
    (dict(batch_size=0), "batch_size"),
    (dict(batch_size=(70, 50)), "batch_size"),
    (dict(max_buffer_size=30), "max_buffer_size"),
    (dict(min_steps=10), "budget"),
    (dict(budget=-5.0), "budget"),
    (dict(max_horizon=0.5), "max_horizon"),
    (dict(generation_cost=1.0, train_cost=1.0), "not both"),
])
def test_bad_input(kwargs, name):
    base = dict(mu=6.84, rho=0.1, alpha=0.1, batch_size=60)
    base.update(kwargs)
    if "generation_cost" in kwargs:
        pass
    elif "mu" in kwargs and kwargs["mu"] is None:
        base.pop("mu")
    with pytest.raises(ValueError, match=name):
        optimal_config(**base)


def test_missing_noise_and_mu():
    with pytest.raises(ValueError, match="noise"):
        optimal_config(mu=6.84, rho=0.1)
    with pytest.raises(ValueError, match="mu"):
        optimal_config(rho=0.1, alpha=0.1)


@settings(max_examples=40, deadline=None)
@given(staleness=st.lists(st.integers(0, 40), min_size=1, max_size=10, unique=True),
       values=st.lists(st.floats(0.1, 10.0), min_size=10, max_size=10),
       mu=st.floats(0.3, 30), rho=st.floats(0.0, 1.0),
       gpus=st.none() | st.integers(2, 12), batch=st.sampled_from([8, 16, 60, 64]))
def test_horizon_stays_within_the_noise_table(staleness, values, mu, rho, gpus, batch):
    s = sorted(staleness)
    table = TabulatedNoise(s, values[:len(s)])
    cfg = optimal_config(mu=mu, rho=rho, noise=table, gpus=gpus, batch_size=batch)
    # x = N/R <= largest staleness + 1: the oldest sample in the buffer was measured
    assert cfg.horizon <= table.measured_horizon * (1 + 1e-12)
    assert cfg.measured_horizon == table.measured_horizon == s[-1] + 1
    assert cfg.horizon_limit == min(1000.0, table.measured_horizon)
    assert f"covers staleness up to {s[-1]:g} steps" in cfg.explanation
    assert cfg.design.horizon <= table.measured_horizon


def test_config_and_design_agree_on_a_table():
    cfg = model_config(mu=6.84, rho=0.1, noise=MEASURED_1_TO_8, batch_size=60, reuse=None)
    design = optimal_design(6.84, 0.1, MEASURED_1_TO_8)
    assert design.horizon == pytest.approx(9.0)
    assert cfg.horizon == pytest.approx(design.horizon, rel=0.15) and cfg.horizon <= 9.0
    assert cfg.buffer_size < 200  # the silent extrapolation recommended N = 8000


def test_a_horizon_at_the_tables_edge_is_reported_as_a_lower_bound():
    # Noise falling with staleness (as calibrated for heldout_digits3, theory.md section 10.9):
    # the objective still falls at the table's edge, so x* = 16 is a bound, not an optimum.
    falling = TabulatedNoise(np.arange(16.0), (1.0 + np.arange(16.0)) ** -0.17)
    cfg = optimal_config(mu=2.0, rho=0.1, noise=falling, batch_size=64)
    assert cfg.horizon_at_limit and cfg.design.horizon == cfg.horizon_limit == 16.0
    assert "16 steps is a lower bound on the best horizon" in cfg.explanation
    assert cfg.to_dict()["horizon_at_limit"] is True
    # Noise that climbs steeply past staleness 2 puts the optimum inside the table.
    rising = TabulatedNoise(np.arange(16.0), np.r_[1.0, 1.0, 1.0, np.full(13, 50.0)])
    inside = optimal_config(mu=2.0, rho=0.1, noise=rising, batch_size=64)
    assert inside.design.horizon < inside.horizon_limit and not inside.horizon_at_limit
    assert "lower bound" not in inside.explanation


def test_extrapolation_is_explicit_and_says_how():
    held = TabulatedNoise(MEASURED_1_TO_8.staleness, MEASURED_1_TO_8.sigma2_values,
                          extrapolate="hold_last")
    cfg = model_config(mu=6.84, rho=0.1, noise=held, batch_size=60, max_horizon=200,
                         reuse=None)
    assert cfg.horizon > held.measured_horizon and cfg.horizon_limit == 200.0
    assert cfg.measured_horizon == 9.0
    assert "extrapolated by holding sigma^2 at its last measured value (1.42)" \
        in cfg.explanation and "beyond the measured range" in cfg.explanation
    assert cfg.design.horizon > held.measured_horizon
    assert cfg.design.noise["extrapolate"] == "hold_last"


def test_no_replay_inside_the_table_falls_back_to_on_policy():
    # One worker, one trainer: y = mu = 20, so N >= B forces x >= 20 > 3 measured steps.
    table = TabulatedNoise([0, 1, 2], [1.0, 1.0, 1.0])
    cfg = optimal_config(mu=20.0, rho=0.1, noise=table, gpus=2, batch_size=60)
    assert cfg.on_policy and cfg.horizon == 1.0
    assert any("within the measured noise table (3 steps)" in n for n in cfg.notes)
