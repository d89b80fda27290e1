"""Reuse-aware variants (theory.md section 10): formulas, optima, reductions and fits."""

import math
import os
import re

import numpy as np
import pytest
from scipy import optimize, stats

from replaytheory.model import design
from replaytheory.model import reuse as ru
from replaytheory.fit.calibrate import calibrate
from replaytheory.fit.reuse_fit import choose_variant, fit_contribution, fit_reuse
from replaytheory.model.noise import ConstantNoise, PowerLawNoise, TabulatedNoise
from replaytheory.fit.probes import ProbeSet

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "theory.md")
X = np.exp(np.linspace(-3, 9, 61))[:, None]
Y = np.exp(np.linspace(-3, 5, 41))[None, :]


def _brute_min(fun, x_range=(1e-2, 1e4), y_range=(1e-2, 1e3)):
    """argmin of fun(x, y) by scipy's brute grid in log space, polished by Powell
    (an optimiser ``reuse`` does not use)."""
    def f(p):
        return math.log(float(fun(math.exp(p[0]), math.exp(p[1]))))
    box = ((math.log(x_range[0]), math.log(x_range[1])),
           (math.log(y_range[0]), math.log(y_range[1])))
    p0 = optimize.brute(f, box, Ns=120, finish=None)
    res = optimize.minimize(f, p0, method="Powell", bounds=box,
                            options={"xtol": 1e-12, "ftol": 1e-14, "maxiter": 20000})
    return math.exp(res.x[0]), math.exp(res.x[1])


# ---- reductions to section 5 -------------------------------------------------------------

@pytest.mark.parametrize("noise", [PowerLawNoise(alpha=0.2), ConstantNoise(),
                                   TabulatedNoise([0, 1, 2, 5], [1.0, 0.8, 0.9, 0.7])])
def test_zero_constants_give_section5_objective_bitwise(noise):
    want = design.objective(X, Y, mu=5.28, rho=0.1, noise=noise)
    for reuse, contribution in ((None, None), (ru.ConstantReuse(0.0), None),
                                (None, ru.ExpContribution(0.0, 0.0)),
                                (ru.TabulatedReuse((1, 4), (0.0, 0.0)),
                                 ru.ExpContribution(0.0, 0.0))):
        got = ru.objective(X, Y, mu=5.28, rho=0.1, noise=noise, reuse=reuse,
                           contribution=contribution)
        assert np.array_equal(got, want)


@pytest.mark.parametrize("mu,rho,alpha", [(5.28, 0.1, 0.2), (6.84, 1.0, 0.1), (2, 0.1, 0.1)])
def test_zero_constants_give_section5_optimum(mu, rho, alpha):
    noise = PowerLawNoise(alpha=alpha)
    want = design.optimal_design(mu, rho, noise)
    for kw in ({}, {"reuse": ru.ConstantReuse(0.0)}):
        got = ru.optimal_design(mu, rho, noise, **kw)
        assert got.horizon == pytest.approx(want.horizon, rel=1e-12)
        assert got.replay_ratio == pytest.approx(want.replay_ratio, rel=1e-12)
        assert got.regime == want.regime


# ---- the pair sum S(x) and the contribution mean f_bar -----------------------------------

@pytest.mark.parametrize("x", [0.5, 1.0, 1.5, 2.0, 3.7, 10.0, 57.3])
def test_pair_sum_is_the_survival_weighted_sum(x):
    g = np.arange(1, 200)
    weights = 2 / x * np.clip(1 - g / x, 0, None)
    c = ru.ConstantReuse(0.7)
    assert c.pair_sum(x) == pytest.approx(np.sum(weights * 0.7), rel=1e-13, abs=1e-15)
    t = ru.TabulatedReuse((1, 4, 16), (0.96, 0.79, 0.71))
    assert t.pair_sum(x) == pytest.approx(np.sum(weights * t.corr(g)), rel=1e-13, abs=1e-15)


def test_pair_sum_tail_and_continuous_forms():
    t = ru.TabulatedReuse((1, 4, 16), (0.96, 0.79, 0.71))
    g = np.arange(1, 400_000, dtype=float)
    x = 2.5e5
    brute = 2 / x * np.sum(np.clip(1 - g / x, 0, None) * t.corr(g))
    assert t.pair_sum(x) == pytest.approx(brute, rel=1e-10)
    # continuous: (2/x) int_0^x (1 - g/x) c dg - c(0)/x, by a fine quadrature
    for xx in (3.0, 20.0, 100.0):
        gg = np.linspace(0, xx, 400_001)
        integral = np.trapezoid((1 - gg / xx) * t.corr(gg), gg)
        want = 2 / xx * integral - t.corr(0.0) / xx
        assert t.pair_sum(xx, "continuous") == pytest.approx(want, rel=1e-8)
    assert ru.ConstantReuse(0.4).pair_sum(5.0, "continuous") == pytest.approx(0.4 * 0.8)


@pytest.mark.parametrize("x,y", [(1.0, 1.0), (3.5, 2.0), (16.0, 4.0), (7.2, 0.5)])
def test_contribution_mean_is_the_poisson_average(x, y):
    f = ru.ExpContribution(per_use=0.3, per_step=0.05)
    u = np.arange(0, 200)
    s = np.arange(int(math.floor(x)) + 1)
    per_s = np.array([np.sum(stats.poisson.pmf(u, si * y / x) * f.value(u, si)) for si in s])
    widths = np.clip(x - s, 0, 1)  # the step function s -> f(floor s) over [0, x]
    assert f.mean(x, y, "discrete") == pytest.approx(np.sum(widths * per_s) / x, rel=1e-10)
    ss = np.linspace(0, x, 200_001)
    k = 0.05 + y / x * (1 - math.exp(-0.3))
    want = np.trapezoid(np.exp(-k * ss), ss) / x
    assert f.mean(x, y, "continuous") == pytest.approx(want, rel=1e-8)


# ---- optima against independent minimisations --------------------------------------------

def _doc_table():
    with open(DOC) as fh:
        text = fh.read()
    block = text.split("### 10.3", 1)[1].split("### 10.4", 1)[0]
    rows = re.findall(r"^\| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                      r"([\d.]+) \|$", block, re.M)
    assert len(rows) >= 4
    return [tuple(float(v) for v in r) for r in rows]


@pytest.mark.parametrize("row", _doc_table())
def test_closed_form_check_values(row):
    mu, rho, alpha, c, x_star, y_star = row
    x, y = ru.power_law_reuse_optimum(mu, rho, alpha, c)
    assert x == pytest.approx(x_star, rel=1e-3)
    assert y == pytest.approx(y_star, rel=1e-3)
    noise = PowerLawNoise(alpha=alpha)
    xb, yb = _brute_min(lambda a, b: ru.objective(a, b, mu=mu, rho=rho, noise=noise,
                                                  reuse=ru.ConstantReuse(c)))
    assert xb == pytest.approx(x, rel=1e-4)
    assert yb == pytest.approx(y, rel=1e-4)


def test_numeric_optimum_tabulated_reuse_matches_brute_force():
    noise = PowerLawNoise(alpha=0.1)
    t = ru.TabulatedReuse((1, 4, 16), (0.6, 0.3, 0.1))
    d = ru.optimal_design(6.84, 0.05, noise, reuse=t)
    xb, yb = _brute_min(lambda a, b: ru.objective(a, b, mu=6.84, rho=0.05, noise=noise,
                                                  reuse=t))
    assert d.method == "numeric"
    assert d.horizon == pytest.approx(xb, rel=1e-3)
    assert d.replay_ratio == pytest.approx(yb, rel=1e-3)


@pytest.mark.parametrize("reuse", [None, ru.ConstantReuse(0.4)])
def test_numeric_optimum_with_contribution_matches_brute_force(reuse):
    noise = PowerLawNoise(alpha=0.1)
    f = ru.ExpContribution(per_use=0.2, per_step=0.01)
    d = ru.optimal_design(6.84, 0.05, noise, reuse=reuse, contribution=f)
    xb, yb = _brute_min(lambda a, b: ru.objective(a, b, mu=6.84, rho=0.05, noise=noise,
                                                  reuse=reuse, contribution=f))
    assert d.horizon == pytest.approx(xb, rel=1e-3)
    assert d.replay_ratio == pytest.approx(yb, rel=1e-3)
    assert d.variant == ("clipping" if reuse is None else "reuse_clipping")


def test_self_correlation_lowers_the_replay_ratio():
    noise = PowerLawNoise(alpha=0.1)
    y = [ru.optimal_design(6.84, 0.05, noise, reuse=ru.ConstantReuse(c)).replay_ratio
         for c in (0.0, 0.2, 0.5, 0.9)]
    assert all(a > b for a, b in zip(y, y[1:]))


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="c"):
        ru.ConstantReuse(1.5)
    with pytest.raises(ValueError, match="per_use"):
        ru.ExpContribution(-0.1, 0.0)
    with pytest.raises(ValueError, match="gaps"):
        ru.TabulatedReuse((4, 1), (0.5, 0.5))
    with pytest.raises(ValueError, match="reuse"):
        ru.objective(1.0, 1.0, mu=2, rho=0.1, noise=ConstantNoise(), reuse=0.3)


# ---- fits on synthetic probes with a known truth -----------------------------------------

def _reuse_table(c_of_gap, rng, probes=30, per=400, dim=8):
    rows = {k: [] for k in ("probe_step", "gap", "staleness", "uses", "inner", "sq_now",
                            "sq_then", "unit")}
    for p in range(probes):
        for g, c in c_of_gap.items():
            a = rng.standard_normal((per, dim))
            # the later use has twice the scale: the estimator must normalise by both norms
            b = 2 * (c * a + math.sqrt(1 - c * c) * rng.standard_normal((per, dim)))
            for key, val in (("inner", np.sum(a * b, 1)), ("sq_now", np.sum(a * a, 1)),
                             ("sq_then", np.sum(b * b, 1))):
                rows[key].append(val)
            rows["probe_step"].append(np.full(per, p))
            rows["gap"].append(np.full(per, g))
            rows["staleness"].append(np.full(per, g + 1))
            rows["uses"].append(np.full(per, 1))
            rows["unit"].append(np.zeros(per))
    return {k: np.concatenate(v) for k, v in rows.items()}


def _contribution_table(a, b, rng, probes=30, per=600):
    uses = rng.integers(0, 6, (probes, per))
    stal = rng.integers(0, 20, (probes, per))
    kept = (rng.random((probes, per)) < np.exp(-a * uses - b * stal)).astype(float)
    return {"probe_step": np.repeat(np.arange(probes), per), "staleness": stal.ravel(),
            "uses": uses.ravel(), "clip_fraction": 1 - kept.ravel(),
            "contribution": kept.ravel(), "is_weight": np.ones(probes * per),
            "unit": np.zeros(probes * per)}


def test_fit_reuse_recovers_a_constant_correlation():
    rng = np.random.default_rng(0)
    fit = fit_reuse(ProbeSet({"reuse": _reuse_table({4: 0.6, 8: 0.6, 16: 0.6}, rng)}))
    assert fit.constant_ok and fit.supported
    assert fit.c_interval[0] <= 0.6 <= fit.c_interval[1]
    assert isinstance(fit.model, ru.ConstantReuse)


def test_fit_reuse_tabulates_a_decaying_correlation():
    rng = np.random.default_rng(1)
    fit = fit_reuse(ProbeSet({"reuse": _reuse_table({4: 0.9, 8: 0.6, 16: 0.2}, rng)}))
    assert not fit.constant_ok
    assert isinstance(fit.model, ru.TabulatedReuse)
    assert np.allclose(fit.model.corr_values, (0.9, 0.6, 0.2), atol=0.03)


def test_fit_contribution_recovers_the_rates():
    rng = np.random.default_rng(2)
    fit = fit_contribution(ProbeSet({"contribution": _contribution_table(0.3, 0.02, rng)}))
    assert fit.per_use_interval[0] <= 0.3 <= fit.per_use_interval[1]
    assert fit.per_step_interval[0] <= 0.02 <= fit.per_step_interval[1]
    assert fit.supported and fit.fits


@pytest.mark.parametrize("c,a,want", [(0.0, 0.0, "standard"), (0.6, 0.0, "self_correlated"),
                                      (0.0, 0.3, "clipping"), (0.6, 0.3, "reuse_clipping")])
def test_choose_variant_names_the_true_one(c, a, want):
    rng = np.random.default_rng(3)
    probes = ProbeSet({"reuse": _reuse_table({4: c, 8: c, 16: c}, rng),
                       "contribution": _contribution_table(a, 0.0, rng)})
    assert choose_variant(fit_reuse(probes), fit_contribution(probes)).variant == want


def test_reuse_rows_from_too_few_probe_steps_are_left_out_with_a_note():
    """A short run may probe its buffer rows at two steps only: the calibration stands
    without the reuse fit and says why, instead of failing."""
    from replaytheory.sim.replay_sim import simulate_replay
    from replaytheory.sim.sim_tabular import TabularProblem
    res = simulate_replay(TabularProblem(loss="grpo", group_size=8, n_prompts=16),
                          [(128, 32, 16)], steps=120, lrs=[8.0], probe_every=2, seed=1)
    t = res.probes.tables
    two = np.isin(t["reuse"]["probe_step"], np.unique(t["reuse"]["probe_step"])[:2])
    probes = ProbeSet({**t, "reuse": {k: v[two] for k, v in t["reuse"].items()}},
                      res.probes.counts)
    cal = calibrate(probes, mu=2.0, n_boot=20)
    assert cal.reuse is None and cal.contribution is not None
    assert any(n.startswith("reuse: rows from 2 probe step(s)") for n in cal.notes)
    assert calibrate(res.probes, mu=2.0, n_boot=20).reuse is not None


def test_tabular_simulator_writes_reuse_tables_and_calibrate_uses_them():
    from replaytheory.sim.replay_sim import simulate_replay
    from replaytheory.sim.sim_tabular import TabularProblem
    res = simulate_replay(TabularProblem(loss="grpo", group_size=8, n_prompts=16),
                          [(128, 32, 16)], steps=120, lrs=[8.0], probe_every=2, seed=1)
    p = res.probes
    assert p.n_rows("reuse") > 0 and p.n_rows("contribution") > 0
    assert set(np.unique(p.tables["reuse"]["gap"])) <= {2.0, 4.0, 8.0, 16.0}
    assert np.all(p.tables["reuse"]["staleness"] >= p.tables["reuse"]["gap"])
    assert set(np.unique(p.tables["contribution"]["contribution"])) <= {0.0, 1.0}
    cal = calibrate(p, mu=2.0, n_boot=50)
    assert cal.variant_choice is not None and cal.reuse is not None
    d = cal.design(2.0, variant="self_correlated")
    assert d.variant == "self_correlated" and d.replay_ratio > 0




# ---- one search, one result type (issue 29) ----------------------------------------------

def test_both_families_return_one_design_type_with_flagged_caveats():
    import json
    steep = PowerLawNoise(alpha=0.7)
    std = design.optimal_design(6.84, 0.1, steep)
    reu = ru.optimal_design(6.84, 0.1, steep, reuse=ru.ConstantReuse(0.4))
    assert type(std) is type(reu) is design.Design
    assert not hasattr(ru, "ReuseDesign")
    assert (std.variant, std.pair_sum, std.contribution_mean) == ("standard", 0.0, 1.0)
    assert reu.variant == "self_correlated"
    # the caveat is a flag in both families, and the note is derived from it
    for d in (std, reu):
        assert design.Caveat.NOISE_TOO_STEEP in d.caveats
        assert d.notes == tuple(d._note(c) for c in d.caveats)
        row = json.loads(json.dumps(d.to_dict()))
        assert "noise_too_steep" in row["caveats"] and row["notes"] == list(d.notes)
    flat = ru.optimal_design(2.0, 0.1, ConstantNoise(), reuse=ru.ConstantReuse(0.4))
    assert math.isinf(flat.horizon) and design.Caveat.UNBOUNDED in flat.caveats
    table = TabulatedNoise([0, 1, 2, 3], [1.0, 1.1, 1.2, 1.3])
    for d in (design.optimal_design(6.84, 0.1, table),
              ru.optimal_design(6.84, 0.1, table, reuse=ru.ConstantReuse(0.4))):
        assert d.horizon == table.max_horizon and d.caveats == (design.Caveat.AT_MEASURED_EDGE,)


def test_the_public_optimisers_are_search_design_on_their_objective():
    noise = TabulatedNoise([0, 1, 2, 4, 8, 16], [1.0, 1.2, 1.3, 1.5, 1.6, 1.8])
    model = design.Section5Objective(mu=6.84, rho=0.1, noise=noise, average="discrete")
    assert design.search_design(model) == design.optimal_design(6.84, 0.1, noise)
    f = ru.ExpContribution(per_use=0.2, per_step=0.01)
    reuse_model = ru.ReuseObjective(mu=6.84, rho=0.1, noise=noise, average="discrete",
                                    reuse=ru.ConstantReuse(0.4), contribution=f)
    got = design.search_design(reuse_model)
    assert got == ru.optimal_design(6.84, 0.1, noise, reuse=ru.ConstantReuse(0.4),
                                    contribution=f)
    assert got.search_box is not None and not reuse_model.profiled
    with pytest.raises(ValueError, match="closed_form"):
        design.search_design(reuse_model, "closed_form")
