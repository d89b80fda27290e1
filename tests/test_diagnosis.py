"""The corrected diagnosis (replaytheory.fit.diagnosis) recovers what synthetic probes put in."""

import json

import numpy as np
import pytest

from replaytheory.fit import diagnosis as dg
from replaytheory.fit.probes import UNIT_GROUP, UNIT_SEQUENCE, ProbeSet

N_PROBES = 30


def noise_probes(per_step=3.0, per_use=-8.0, seed=0):
    """Noise rows where uses and staleness are confounded (uses ~ Poisson(s / 4)) and
    sq_noise = 50 + per_step s + per_use u + a per-probe shift + row noise."""
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("probe_step", "staleness", "drift", "sq_noise", "ref_sq_error",
                            "unit", "uses")}
    for p in range(N_PROBES):
        s = rng.integers(0, 16, 200)
        u = rng.poisson(s / 4)
        shift = rng.normal(0, 2)
        y = 50 + per_step * s + per_use * u + shift + rng.normal(0, 5, s.size)
        for k, col in (("probe_step", np.full(s.size, p)), ("staleness", s),
                       ("drift", s * 0.1), ("sq_noise", y + 10.0),
                       ("ref_sq_error", np.full(s.size, 10.0)),
                       ("unit", np.full(s.size, UNIT_SEQUENCE)), ("uses", u)):
            rows[k].append(col)
    return ProbeSet({"noise": {k: np.concatenate(c) for k, c in rows.items()}})


def test_noise_regression_separates_staleness_and_uses():
    fit = dg.noise_regression(noise_probes(), n_boot=200)
    assert fit.spearman > 0.3  # confounded by construction
    assert fit.per_step.low < 3.0 < fit.per_step.high
    assert fit.per_use.low < -8.0 < fit.per_use.high
    assert fit.per_step.high - fit.per_step.low < 1.0
    assert fit.intercept.value == pytest.approx(50, abs=2)  # the reference error removed
    assert fit.n_probes == N_PROBES
    json.dumps(fit.to_dict())


def test_noise_grid_cells_are_conditional_means():
    fit = dg.noise_grid(noise_probes(per_step=2.0, per_use=10.0), [0, 4, 8, 16], [0, 1, 2, 9],
                        n_boot=100)
    q = fit.quantities["sq_noise"]
    assert q["value"].shape == (3, 3) and fit.n.sum() > 0
    # at fixed staleness bin, one more use adds 10; at fixed uses, later bins add 2 per step
    assert q["value"][1, 1] - q["value"][1, 0] == pytest.approx(10, abs=2)
    assert np.all(np.diff(q["value"][:, 0]) > 4)
    ok = np.isfinite(q["low"])
    assert np.all(q["low"][ok] <= q["value"][ok]) and np.all(q["value"][ok] <= q["high"][ok])


def test_noise_regression_errors():
    ps = noise_probes()
    no_uses = {k: c for k, c in ps.tables["noise"].items() if k != "uses"}
    with pytest.raises(ValueError, match="uses"):
        dg.noise_regression(ProbeSet({"noise": no_uses}))
    flat = dict(ps.tables["noise"])
    flat["uses"] = flat["staleness"] * 2.0
    with pytest.raises(ValueError, match="collinear"):
        dg.noise_regression(ProbeSet({"noise": flat}))
    with pytest.raises(ValueError, match="unit"):
        dg.noise_regression(ps, unit=3)
    with pytest.raises(ValueError, match="staleness_edges"):
        dg.noise_grid(ps, [4, 2], [0, 1])


def reuse_probes(corr_by_gap, dim=40, per_probe=20, seed=1):
    """Reuse rows of vectors whose correlation at each gap is set: then = 1.5 (c now +
    sqrt(1 - c^2) z), with now and z independent, of unequal scales per rollout."""
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("probe_step", "gap", "staleness", "uses", "inner", "sq_now",
                            "sq_then", "unit")}
    for p in range(N_PROBES):
        for gap, c in corr_by_gap.items():
            scale = rng.uniform(0.5, 2.0, per_probe)[:, None]
            now = rng.normal(size=(per_probe, dim)) * scale
            then = 1.5 * (c * now + np.sqrt(1 - c ** 2) * rng.normal(size=(per_probe, dim))
                          * scale)
            for k, col in (("probe_step", np.full(per_probe, p)), ("gap", np.full(per_probe, gap)),
                           ("staleness", np.full(per_probe, gap + 1)),
                           ("uses", rng.poisson(1, per_probe)),
                           ("inner", np.einsum("ij,ij->i", now, then)),
                           ("sq_now", np.einsum("ij,ij->i", now, now)),
                           ("sq_then", np.einsum("ij,ij->i", then, then)),
                           ("unit", np.full(per_probe, UNIT_SEQUENCE))):
                rows[k].append(col)
    return ProbeSet({"reuse": {k: np.concatenate(c) for k, c in rows.items()}})


def test_self_correlation_recovers_the_set_correlations():
    truth = {4: 0.9, 8: 0.5, 16: 0.0}
    fit = dg.self_correlation(reuse_probes(truth), n_boot=200)
    assert list(fit.gap) == [4, 8, 16]
    for est, c in zip(fit.corr, truth.values()):
        assert est.low < c < est.high and est.high - est.low < 0.15
    assert np.all(fit.n_probes == N_PROBES)
    json.dumps(fit.to_dict())


def test_contribution_grid_pools_by_gradient_weight():
    rng = np.random.default_rng(2)
    n = 400
    stal = rng.integers(0, 8, n)
    uses = rng.integers(0, 3, n)
    # rows with a large unclipped gradient keep half of it, small ones all of it
    big = rng.random(n) < 0.5
    sq = np.where(big, 9.0, 1.0)
    table = {"probe_step": np.repeat(np.arange(20), n // 20), "staleness": stal, "uses": uses,
             "clip_fraction": np.where(stal >= 4, 0.25, 0.0),
             "contribution": np.where(big, 0.5, 1.0), "is_weight": 1 + 0.01 * stal,
             "unit": np.zeros(n), "sq_unclip": sq}
    fit = dg.contribution_grid(ProbeSet({"contribution": table}), [0, 4, 8], [0, 1, 3],
                               n_boot=100)
    q = fit.quantities
    np.testing.assert_allclose(q["clip_fraction"]["value"], [[0, 0], [0.25, 0.25]])
    cell = (stal < 4) & (uses == 0)
    want = np.sum((0.5 * 9) * big[cell] + 1.0 * ~big[cell]) / np.sum(9 * big[cell] + ~big[cell])
    assert q["contribution"]["value"][0, 0] == pytest.approx(want)
    assert want < 0.6  # weighted by the gradient; a plain mean would give ~0.75
    assert fit.n.sum() == n


def bias_probes(ratio=0.3, cos=-0.6, dim=200, n_samples=4, seed=3):
    """Buffer bias rows: grad F of norm 1 plus a bias of norm ``ratio`` at cosine ``cos``;
    n_samples noisy samples (noise norm ~2) per staleness; a reference gradient with error."""
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("probe_step", "staleness", "drift", "n_samples", "mean_sq",
                            "noise_sq", "grad_sq", "cos_grad", "ref_sq_error", "unit",
                            "method")}
    ref_sd = 0.05
    for p in range(N_PROBES):
        g = rng.normal(size=dim)
        g /= np.linalg.norm(g)
        orth = rng.normal(size=dim)
        orth -= orth @ g * g
        orth /= np.linalg.norm(orth)
        bias = ratio * (cos * g + np.sqrt(1 - cos ** 2) * orth)
        g_ref = g + rng.normal(0, ref_sd, dim)
        for s in range(1, 9):
            eps = bias + (g - g_ref) + rng.normal(0, 2 / np.sqrt(dim), (n_samples, dim))
            m = eps.mean(0)
            vals = {"probe_step": p, "staleness": s, "drift": 0.1 * s, "n_samples": n_samples,
                    "mean_sq": m @ m, "noise_sq": np.mean(np.sum(eps ** 2, 1)),
                    "grad_sq": g_ref @ g_ref,
                    "cos_grad": m @ g_ref / np.linalg.norm(m) / np.linalg.norm(g_ref),
                    "ref_sq_error": dim * ref_sd ** 2, "unit": UNIT_GROUP, "method": 0}
            for k, val in vals.items():
                rows[k].append(val)
        # a regenerated-rollout row (method 1) that must be ignored
        for k in rows:
            rows[k].append({"method": 1, "mean_sq": 100.0, "n_samples": 8}.get(k, rows[k][-1]))
    return ProbeSet({"bias": {k: np.array(c, float) for k, c in rows.items()}})


def test_buffer_bias_norm_ratio_and_cosine():
    fit = dg.buffer_bias(bias_probes(), [1, 5, 9], n_boot=200)
    assert fit.all_norm_ratio.low < 0.3 < fit.all_norm_ratio.high
    assert fit.all_cosine.low < -0.6 < fit.all_cosine.high
    assert fit.all_norm_ratio.high - fit.all_norm_ratio.low < 0.1
    assert list(fit.n_rows) == [4 * N_PROBES, 4 * N_PROBES]
    for est in fit.norm_ratio:
        assert est.low < 0.3 < est.high
    # the plain mean cosine of the noisy means is diluted towards 0
    assert fit.raw_cos_grad.value > -0.6 + 0.1
    json.dumps(fit.to_dict())


def test_buffer_bias_needs_two_samples_per_row():
    ps = bias_probes()
    t = dict(ps.tables["bias"])
    t["n_samples"] = np.ones_like(t["n_samples"])
    with pytest.raises(ValueError, match="at least 2 rows"):
        dg.buffer_bias(ProbeSet({"bias": t}), [1, 9])
