"""Fits of sigma, rho, kappa from probes (theory.md sections 4, 5, 8)."""

import json
import math

import numpy as np
import pytest

from replaytheory import (Calibration, QuadraticProblem, TabulatedNoise, calibrate,
                          check_decomposition, fit_bias, fit_coupling, fit_noise_model,
                          optimal_config, simulate_replay)
from replaytheory.fit.probes import SCHEMA, ProbeSet

TRUTH = QuadraticProblem(alpha=0.2, tau=1.5, rho=0.15, kappa=0.5, f0=10.0,
                         reference_samples=32)
N, B, R = 16 * 16, 32, 16


@pytest.fixture(scope="module")
def quad_probes() -> ProbeSet:
    """The validation's protocol: noise and coupling after a burn-in, bias in the transient."""
    lr = 0.02
    burn = int(math.log(1e6) / lr)
    still = simulate_replay(TRUTH, [(N, B, R)], steps=burn + 500, lrs=[lr], probe_every=4,
                            probe_start=burn, seed=1).probes
    moving = simulate_replay(TRUTH, [(N, B, R)], steps=120, lrs=[lr], probe_every=1,
                             seed=2).probes
    tables = dict(still.tables)
    tables["bias"] = {**moving.tables["bias"], "run": moving.tables["bias"]["run"] + 1e7}
    return ProbeSet(tables)


def _inside(value, interval):
    return interval[0] <= value <= interval[1]


def test_fits_recover_the_quadratic_constants_within_their_intervals(quad_probes):
    noise = fit_noise_model(quad_probes)
    assert noise.power_law_ok and noise.p_value > 0.01
    assert _inside(TRUTH.alpha, noise.alpha_interval)
    assert _inside(TRUTH.tau, noise.tau_interval)
    assert noise.alpha_interval[1] - noise.alpha_interval[0] < 0.05  # informative, not vague
    coupling = fit_coupling(quad_probes)
    assert coupling.gap_form_ok and coupling.form == "gap"
    assert _inside(TRUTH.rho, coupling.rho_gap_interval)
    bias = fit_bias(quad_probes)
    assert bias.drift_form_ok
    assert _inside(TRUTH.kappa, bias.kappa_interval)


def _mean_pair_coupling(prob, n, r) -> float:
    """R x the pair-weighted correlation the probes aggregate, from the definition."""
    h = n // r
    sig = np.sqrt(prob.sigma2(np.arange(h)))
    inner = np.zeros(h)
    sq = np.zeros(h)
    pairs = np.zeros(h)
    for a in range(h):
        for b in range(h):
            g = abs(a - b)
            cnt = r * r - (r if a == b else 0)
            pairs[g] += cnt
            inner[g] += 0 if a == b else cnt * sig[a] * sig[b] * prob.rho * g / n
            sq[g] += cnt * (sig[a] ** 2 + sig[b] ** 2) / 2
    return float(r * np.sum(pairs * inner / sq) / pairs.sum())


def test_effective_rho_is_the_buffer_mean_coupling(quad_probes):
    coupling = fit_coupling(quad_probes)
    exact = _mean_pair_coupling(TRUTH, N, R)
    assert _inside(exact, coupling.rho_eff_interval)
    assert exact < TRUTH.rho / 2.5  # A3's gap form overstates the realised coupling ~3x


def test_decomposition_of_v_is_tested(quad_probes):
    eff = fit_coupling(quad_probes).rho_eff
    assert check_decomposition(quad_probes, eff).holds
    loose = check_decomposition(quad_probes, 1.0)
    assert not loose.holds and loose.ratio[0] < 0.9
    assert _inside(eff, check_decomposition(quad_probes, eff).rho_v_interval) or \
        abs(loose.rho_v - eff) < 0.05


def test_calibration_predicts_through_the_calculator(quad_probes):
    cal = calibrate(quad_probes, mu=6.84)
    assert isinstance(cal, Calibration) and cal.mu == 6.84 and cal.mu_source == "argument"
    cfg = cal.optimal_config(batch_size=60)
    # No reuse table, so the supported variant is section 5's: not the calculator's default c.
    assert cfg.variant == "standard" and "Model: section 5's" in cfg.explanation
    direct = optimal_config(mu=6.84, rho=cal.coupling.rho, noise=cal.noise.model, batch_size=60,
                            reuse=None, horizon_source="model")
    assert cfg.horizon_source == "model" and cfg.horizon_validated is False
    assert (cfg.buffer_size, cfg.rollouts_per_step) == (direct.buffer_size,
                                                        direct.rollouts_per_step)
    eff = cal.design(coupling="effective")
    assert eff.replay_ratio > cal.design().replay_ratio  # weaker coupling: more replay
    fin = cal.finite_lr_design(batch_size=32, smoothness=1.0, f0=10.0, budget=1e5)
    assert fin.horizon >= 1
    json.dumps(cal.to_dict())  # JSON-ready


def test_mu_from_counts_and_missing_mu(quad_probes):
    counts = {"unique_rollouts": 10_000, "samples_consumed": 22_800, "workers": 6,
              "trainers": 2}
    assert calibrate(quad_probes, counts).mu == pytest.approx(6.84)
    cal = calibrate(quad_probes, {})
    assert cal.mu is None
    with pytest.raises(ValueError, match="mu"):
        cal.design()


def test_probe_round_trip_npz_and_jsonl(quad_probes, tmp_path):
    small = ProbeSet({name: {c: col[:400] for c, col in t.items()}
                      for name, t in quad_probes.tables.items()}, {"steps": 3.0})
    for ext in ("npz", "jsonl"):
        path = str(tmp_path / f"p.{ext}")
        small.save(path)
        back = ProbeSet.load(path)
        assert back.counts == small.counts
        for name in SCHEMA:
            assert set(back.tables[name]) == set(small.tables[name])  # extra columns kept
            for c, col in small.tables[name].items():
                assert np.allclose(back.tables[name][c], col)


# ---- synthetic tables: fallbacks and artefacts -------------------------------------------

def _noise_table(means_by_s, probes=8, per=50, seed=0, tail=False):
    rng = np.random.default_rng(seed)
    rows = {c: [] for c in SCHEMA["noise"]}
    for p in range(probes):
        for s, m in means_by_s.items():
            x = rng.exponential(m, per)
            if tail:
                x[0] *= 200  # a few samples carry most of the squared noise
            for c, val in (("probe_step", p), ("staleness", s), ("drift", 0.1 * s),
                           ("sq_noise", x), ("ref_sq_error", 0.0), ("unit", 0)):
                rows[c].append(np.broadcast_to(val, (per,)).astype(float))
    return {c: np.concatenate(v) for c, v in rows.items()}


def test_flat_then_falling_noise_falls_back_to_the_table():
    # section 8: sigma^2(0) several times sigma^2(1), then flat (PPO clipping)
    probes = ProbeSet({"noise": _noise_table({0: 3.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})})
    fit = fit_noise_model(probes)
    assert not fit.power_law_ok and "negative" in fit.reason
    assert isinstance(fit.model, TabulatedNoise) and not fit.model.satisfies_a3
    assert fit.bins["mean"][0] == pytest.approx(3.0, rel=0.1)


def test_heavy_tails_are_reported():
    probes = ProbeSet({"noise": _noise_table({s: 1.0 + s for s in range(4)}, tail=True)})
    fit = fit_noise_model(probes)
    assert np.all(fit.bins["top1_share"] > 0.4)
    assert np.all(fit.bins["median"] < 0.5 * fit.bins["mean"])
    light = fit_noise_model(ProbeSet({"noise": _noise_table({s: 1.0 + s for s in range(4)})}))
    assert np.all(light.bins["top1_share"] < 0.1)  # exponential noise: ~5%


def _coupling_table(corr_of, ref_err=0.0, probes=6, n=64, r=4, seed=0):
    rng = np.random.default_rng(seed)
    rows = {c: [] for c in SCHEMA["coupling"]}
    for p in range(probes):
        for g in range(n // r):
            c = corr_of(g, n) + 0.002 * rng.standard_normal()
            vals = {"probe_step": p, "gap": g, "n_pairs": 100, "mean_inner": c + ref_err,
                    "mean_sq": 1.0 + ref_err, "ref_sq_error": ref_err, "buffer_size": n,
                    "rollouts_per_step": r, "unit": 0}
            for k, val in vals.items():
                rows[k].append(float(val))
    return {c: np.array(v) for c, v in rows.items()}


def test_flat_coupling_falls_back_to_effective_rho():
    probes = ProbeSet({"coupling": _coupling_table(lambda g, n: 0.03)})
    fit = fit_coupling(probes)
    assert not fit.gap_form_ok and fit.form == "effective"
    assert fit.rho == pytest.approx(fit.rho_eff) and fit.rho_eff == pytest.approx(0.12, rel=0.1)


def test_reference_error_is_subtracted():
    truth = 0.2
    table = _coupling_table(lambda g, n: truth * g / n, ref_err=0.02)
    fit = fit_coupling(ProbeSet({"coupling": table}))
    assert fit.gap_form_ok and _inside(truth, fit.rho_gap_interval)
    ignored = dict(table, ref_sq_error=np.zeros_like(table["ref_sq_error"]))
    naive = fit_coupling(ProbeSet({"coupling": ignored}))
    # the shared reference error alone looks like a flat coupling of ~0.02
    assert not naive.gap_form_ok and naive.intercept > 0.01


def test_bias_not_growing_with_drift_uses_the_envelope():
    rows = {c: [] for c in SCHEMA["bias"]}
    for p in range(6):
        for s in range(1, 8):
            vals = {"probe_step": p, "staleness": s, "drift": 0.01 * s, "n_samples": 50,
                    "mean_sq": 0.5 + 1.0 / 50, "noise_sq": 1.0, "grad_sq": 1.0,
                    "cos_grad": -0.4, "ref_sq_error": 0.0, "unit": 0}
            for k, val in vals.items():
                rows[k].append(float(val) * (1 + 0.01 * np.sin(p + s)))
    fit = fit_bias(ProbeSet({"bias": {c: np.array(v) for c, v in rows.items()}}))
    assert not fit.drift_form_ok and fit.kappa == fit.kappa_envelope
    assert fit.mean_cos_grad < 0 and fit.bias_to_grad > 0.3


# ---- loud failures -------------------------------------------------------------------------

def test_too_few_and_degenerate_probes_fail_loudly():
    good = _noise_table({0: 1.0, 1: 1.5, 2: 2.0})
    with pytest.raises(ValueError, match="at least 10 rows"):
        fit_noise_model(ProbeSet({"noise": {c: v[:5] for c, v in good.items()}}))
    one_probe = {c: v[good["probe_step"] == 0] for c, v in good.items()}
    with pytest.raises(ValueError, match="probe steps"):
        fit_noise_model(ProbeSet({"noise": one_probe}))
    one_s = {c: v[good["staleness"] == 0] for c, v in good.items()}
    with pytest.raises(ValueError, match="staleness"):
        fit_noise_model(ProbeSet({"noise": one_s}))
    zero = dict(good, sq_noise=np.zeros_like(good["sq_noise"]))
    with pytest.raises(ValueError, match="degenerate"):
        fit_noise_model(ProbeSet({"noise": zero}))
    coup = _coupling_table(lambda g, n: 0.0)
    with pytest.raises(ValueError, match="gaps"):
        fit_coupling(ProbeSet({"coupling": {c: v[coup["gap"] == 0] for c, v in coup.items()}}))
    with pytest.raises(ValueError, match="degenerate"):
        fit_coupling(ProbeSet({"coupling": dict(coup, mean_sq=np.zeros_like(coup["mean_sq"]))}))
    with pytest.raises(ValueError, match="ProbeSet"):
        fit_noise_model({"noise": good})
    with pytest.raises(ValueError, match="n_boot"):
        fit_noise_model(ProbeSet({"noise": good}), n_boot=3)


def test_nan_probes_fail_loudly():
    good = _noise_table({0: 1.0, 1: 1.5, 2: 2.0})
    bad = dict(good, sq_noise=good["sq_noise"].copy())
    bad["sq_noise"][3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ProbeSet({"noise": bad})
    probes = ProbeSet({"noise": good})
    probes.tables["noise"]["sq_noise"][3] = np.nan  # corrupted after construction
    with pytest.raises(ValueError, match="NaN"):
        fit_noise_model(probes)


def test_zero_drift_bias_is_not_identifiable():
    rows = {c: np.ones(12) for c in SCHEMA["bias"]}
    rows.update(probe_step=np.repeat([0.0, 1.0, 2.0], 4), staleness=np.tile([0.0, 1, 2, 3], 3),
                drift=np.zeros(12), n_samples=np.full(12, 10.0))
    with pytest.raises(ValueError, match="drift"):
        fit_bias(ProbeSet({"bias": rows}))


def test_extrapolating_a_falling_table_lifts_the_horizon_cap(quad_probes):
    # heldout_digits3 (theory.md section 10.9): noise falling with staleness, so a capped search
    # stops at the table's edge and only "hold_last" looks past it (section 4.6).
    falling = _noise_table({0: 3.0, 1: 2.5, 2: 2.0, 3: 1.8, 4: 1.6})
    cal = calibrate(ProbeSet({**quad_probes.tables, "noise": falling}), mu=2.0)
    assert isinstance(cal.noise_model(), TabulatedNoise)
    assert cal.noise_model().extrapolate == "none"
    assert cal.noise_model(extrapolate="hold_last").extrapolate == "hold_last"
    capped, held = cal.design(), cal.design(extrapolate="hold_last")
    assert capped.horizon <= cal.noise.model.measured_horizon == 5.0
    assert held.horizon > 5.0
    cfg = cal.optimal_config(batch_size=60, extrapolate="hold_last", max_horizon=200)
    assert cfg.horizon == cfg.horizon_limit == 200.0  # still falling: the user's cap binds
    assert "beyond the measured range" in cfg.explanation
    assert cal.optimal_config(batch_size=60).horizon_limit == 5.0
    with pytest.raises(ValueError, match="extrapolate must be one of"):
        cal.noise_model(extrapolate="linear")
