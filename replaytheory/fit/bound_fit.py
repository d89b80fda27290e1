"""Fit the constants of the convergence bound from probe measurements (theory.md sections 4
and 8). Reads a ``ProbeSet`` (layout in ``probes``) and returns:

* ``fit_noise_model``: sigma^2(s) per staleness bin with robust statistics, the top-1% share
  of the squared noise and bootstrap intervals, and a power-law fit sigma^2(s) =
  ((s + s0)/tau)^(2 alpha) (s0 = 1/2 by default: discrete staleness s stands for the interval
  [s, s + 1) of section 5's continuous staleness) with bootstrap intervals and goodness of fit.
  Falls back to the tabulated model when the power law does not describe the data.
* ``fit_coupling``: rho from the A3 form corr = rho gap / N, and the effective rho_eff =
  R x (mean correlation over the buffer's pairs), the coefficient for which the coupling term
  of V is sigma_bar^2 rho_eff / R. The form is tested; when it fails, rho_eff is used.
* ``fit_bias``: kappa from A2, ||bias||^2 = kappa^2 drift^2, tested the same way.
* ``check_decomposition``: the measured minibatch noise against sigma_bar^2 (1/B + 1/N + rho/R).

Every squared noise is measured against a reference gradient g_ref; its error e_ref adds
||e_ref||^2 to every squared norm and to every pairwise inner product (the artefact of
section 8), so ``ref_sq_error`` is subtracted from both. Intervals come from a bootstrap over
probes (rows of one probe step of one run share theta and the reference, so they are
resampled together). Too few, degenerate or NaN probes raise ``ValueError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from .. import checks
from ..model.noise import PowerLawNoise, TabulatedNoise
from .bootstrap import (P_VALUE_MIN, _as_json, _boot_weights, _clusters, _interval,
                        _origin_line_test, _per_cluster, _r2, _table, _wls)
from .probes import ProbeSet


@dataclass(frozen=True)
class NoiseFit:
    """sigma^2(s) measured per staleness bin and the power-law fit (``fit_noise_model``).

    Attributes:
        alpha, tau: power-law fit of sigma^2(s) = ((s + staleness_offset)/tau)^(2 alpha);
            alpha_interval, tau_interval: bootstrap 95% intervals.
        r2: weighted R^2 of the log-space fit; chi2, dof, p_value: its chi-square test
            against the bootstrap errors of the bin means.
        power_law_ok: whether the power law describes the data (alpha >= 0 and p >= 0.01);
            reason says why not.
        bins: per staleness value: staleness, n, mean (reference error removed), se, ci_low,
            ci_high, median, trimmed_mean (5% each side), top1_share (share of the bin's
            summed squared noise carried by its top 1% of samples).
        tabulated: ``TabulatedNoise`` of the bin means. power_law: ``PowerLawNoise`` or None.
        model: the one to use (power law if it fits, else the table).
    """

    alpha: float
    alpha_interval: tuple[float, float]
    tau: float
    tau_interval: tuple[float, float]
    r2: float
    chi2: float
    dof: int
    p_value: float
    power_law_ok: bool
    reason: str
    staleness_offset: float
    bins: dict
    tabulated: TabulatedNoise
    power_law: PowerLawNoise | None
    model: object = field(repr=False)

    def to_dict(self) -> dict:
        d = _as_json(self)
        for key in ("tabulated", "power_law", "model"):
            d[key] = None if d[key] is None else d[key].to_dict()
        return d


def _power_fit(s, means, w, offset):
    """Log-space WLS of means on s; rows of ``means`` are bootstrap replicates."""
    u = np.log(s + offset)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(means)
    good = np.all(np.isfinite(z), axis=-1)
    slope, icpt = _wls(np.broadcast_to(u, z.shape), np.where(np.isfinite(z), z, 0), w,
                       through_origin=False)
    slope = np.where(good, slope, np.nan)
    alpha = slope / 2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tau = np.where(slope > 0, np.exp(-icpt / slope), np.nan)
    return alpha, tau, slope, icpt


@dataclass(frozen=True)
class _NoiseBins:
    """sigma^2(s) per integer staleness bin with bootstrap replicates (theory.md section 8.2).

    Attributes:
        means: (1 + n_boot, k) bin means of squared noise minus reference error; row 0 is
            the data, the others bootstrap replicates over probes (NaN for an empty bin).
        se: (k,) bootstrap standard errors of the bin means.
        table: ``NoiseFit.bins``. tabulated: ``TabulatedNoise`` of the bin means (clipped at 0).
    """

    means: np.ndarray
    se: np.ndarray
    table: dict
    tabulated: TabulatedNoise


@dataclass(frozen=True)
class _PowerLawTest:
    """The log-space power-law fit of the bin means and its verdict (theory.md section 8.2).

    Attributes:
        alpha, tau: (1 + n_boot,) fits, row 0 the data's, the rest per bootstrap replicate.
        r2: weighted R^2. chi2, dof, p_value: chi-square test of the bin means against the fit
            (p_value NaN when dof <= 0). reasons: why the power law is rejected (empty: it fits).
    """

    alpha: np.ndarray
    tau: np.ndarray
    r2: float
    chi2: float
    dof: int
    p_value: float
    reasons: list[str]


def fit_noise_model(probes: ProbeSet, *, staleness_offset: float = 0.5, n_boot: int = 200,
                    seed: int = 0, min_probes: int = 3, min_staleness_values: int = 3
                    ) -> NoiseFit:
    """Fit sigma^2(s) from the ``noise`` table (theory.md sections 4-5, 8).

    Args:
        probes: ``ProbeSet`` with a ``noise`` table (per-sample squared noise, staleness).
        staleness_offset: s0 >= 0 in the fitted ((s + s0)/tau)^(2 alpha) (module docstring).
        n_boot: bootstrap replicates over probe steps, integer >= 20.
        seed: bootstrap seed. min_probes: fewest probe steps accepted (>= 2).
        min_staleness_values: fewest distinct staleness values accepted (>= 3).
    Raises:
        ValueError: too few rows, probe steps or staleness values; NaN; no positive noise.
    """
    offset = checks.nonnegative("staleness_offset", staleness_offset)
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _table(probes, "noise", 10)
    ids = _clusters(t, "noise", checks.integer("min_probes", min_probes, 2))
    s_int = np.rint(t["staleness"]).astype(np.int64)
    if np.any(s_int < 0):
        raise ValueError("probes.noise.staleness must be >= 0")
    values, bins = np.unique(s_int, return_inverse=True)
    need = checks.integer("min_staleness_values", min_staleness_values, 3)
    if values.size < need:
        raise ValueError(f"probes.noise must span at least {need} distinct staleness values "
                         f"for a power-law fit, got {values.size}")
    nb = _noise_bins(t, ids, bins, values, n_boot, seed)
    fit = _power_law_test(values, nb, offset)
    a0, t0 = float(fit.alpha[0]), float(fit.tau[0])
    ok = not fit.reasons
    power = PowerLawNoise(alpha=a0, tau=t0 if math.isfinite(t0) and t0 > 0 else 1.0) \
        if a0 >= 0 else None
    return NoiseFit(alpha=a0, alpha_interval=_interval(fit.alpha[1:]), tau=t0,
                    tau_interval=_interval(fit.tau[1:]), r2=fit.r2, chi2=fit.chi2,
                    dof=fit.dof, p_value=fit.p_value, power_law_ok=ok,
                    reason="; ".join(fit.reasons) if fit.reasons else "power law fits",
                    staleness_offset=offset, bins=nb.table, tabulated=nb.tabulated,
                    power_law=power, model=power if ok else nb.tabulated)


def _noise_bins(t: dict, ids: np.ndarray, bins: np.ndarray, values: np.ndarray, n_boot: int,
                seed: int) -> _NoiseBins:
    """Bin means of (squared noise - reference error) per staleness ``values`` (rows mapped
    by ``bins``), bootstrapped over the probe clusters ``ids``, with the robust statistics of
    theory.md section 8.2. Raises ValueError when no bin mean is > 0."""
    y = t["sq_noise"] - t["ref_sq_error"]
    sums, counts = _per_cluster(ids, bins, values.size, y, np.ones_like(y))
    wts = _boot_weights(sums.shape[0], n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (wts @ sums) / (wts @ counts)
    mean, boot = means[0], means[1:]
    if not np.any(mean > 0):
        raise ValueError("probes.noise is degenerate: after removing the reference error the "
                         "mean squared noise is <= 0 at every staleness")
    se = np.nanstd(boot, axis=0, ddof=1)
    lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    raw = t["sq_noise"]
    median = np.array([np.median(y[bins == i]) for i in range(values.size)])
    trimmed = np.array([stats.trim_mean(y[bins == i], 0.05) for i in range(values.size)])
    top1 = np.array([_top_share(raw[bins == i]) for i in range(values.size)])
    n_bin = counts.sum(axis=0)
    bin_table = {"staleness": values.astype(float), "n": n_bin, "mean": mean, "se": se,
                 "ci_low": lo, "ci_high": hi, "median": median, "trimmed_mean": trimmed,
                 "top1_share": top1}
    tab = TabulatedNoise(values.astype(float), np.clip(mean, 0, None), n_bin)
    return _NoiseBins(means=means, se=se, table=bin_table, tabulated=tab)


def _power_law_test(values: np.ndarray, nb: _NoiseBins, offset: float) -> _PowerLawTest:
    """Fit log sigma^2 = 2 alpha log(s + s0) - 2 alpha log tau to the positive bin means
    (weights (mean / se)^2, s0 = ``offset`` >= 0) and test it: the power law is rejected with
    fewer than 3 positive bins, alpha < 0 (A3, theory.md section 4.2) or chi-square p below
    ``P_VALUE_MIN`` (section 8.2)."""
    means, se = nb.means, nb.se
    mean = means[0]
    pos = mean > 0
    rel = np.where(pos, se / np.where(pos, mean, 1), np.inf)
    rel = np.maximum(rel, 1e-6)
    w = np.where(pos, 1 / rel**2, 0.0)
    alpha, tau, slope, icpt = _power_fit(values.astype(float)[pos], means[:, pos], w[pos],
                                         offset)
    a0 = float(alpha[0])
    z = np.log(mean[pos])
    fitted = slope[0] * np.log(values[pos] + offset) + icpt[0]
    chi2 = float(np.sum(w[pos] * (z - fitted) ** 2))
    dof = int(pos.sum()) - 2
    p_value = float(stats.chi2.sf(chi2, dof)) if dof > 0 else math.nan
    r2 = _r2(z, fitted, w[pos])
    reasons = []
    if pos.sum() < 3:
        reasons.append("fewer than 3 staleness bins with positive noise")
    if not a0 >= 0:
        reasons.append(f"the fitted exponent is negative (alpha = {a0:.3g}): noise falls with "
                       "staleness, which the power law (and assumption A3) excludes")
    if dof > 0 and p_value < P_VALUE_MIN:
        reasons.append(f"the power law misfits the bin means (chi2 = {chi2:.3g} on {dof} dof, "
                       f"p = {p_value:.2g}, R^2 = {r2:.2f})")
    return _PowerLawTest(alpha=alpha, tau=tau, r2=r2, chi2=chi2, dof=dof, p_value=p_value,
                         reasons=reasons)


def _top_share(x: np.ndarray) -> float:
    """Share of sum(x) carried by the largest 1% of the values (at least one value)."""
    total = float(np.sum(x))
    if total <= 0:
        return math.nan
    k = max(1, int(math.ceil(0.01 * x.size)))
    return float(np.sum(np.partition(x, x.size - k)[x.size - k:]) / total)


@dataclass(frozen=True)
class CouplingFit:
    """Coupling of buffer samples (``fit_coupling``; A3, section 4).

    Attributes:
        rho: the value to use: rho_gap if the gap form fits, else rho_eff, clipped to [0, 1].
        rho_interval: its bootstrap 95% interval (clipped). form: "gap" or "effective".
        rho_gap, rho_gap_interval: slope of corr = rho gap / N (through the origin).
        rho_eff, rho_eff_interval: R x pair-weighted mean correlation (the coefficient that
            makes the coupling term of V equal sigma_bar^2 rho_eff / R).
        intercept, intercept_interval, slope, slope_interval: free line corr = c + b gap/N.
        r2_gap: weighted R^2 of the gap form against a flat correlation.
        gap_form_ok: slope interval above 0 and intercept interval containing 0.
        reason: why the gap form was (not) accepted. by_gap: corr per (gap, N, R) group.
    """

    rho: float
    rho_interval: tuple[float, float]
    form: str
    rho_gap: float
    rho_gap_interval: tuple[float, float]
    rho_eff: float
    rho_eff_interval: tuple[float, float]
    intercept: float
    intercept_interval: tuple[float, float]
    slope: float
    slope_interval: tuple[float, float]
    r2_gap: float
    gap_form_ok: bool
    reason: str
    by_gap: dict

    def to_dict(self) -> dict:
        return _as_json(self)


def fit_coupling(probes: ProbeSet, *, n_boot: int = 200, seed: int = 0,
                 min_probes: int = 3) -> CouplingFit:
    """Estimate rho from the ``coupling`` table (A3, theory.md sections 4 and 8).

    Args:
        probes: ``ProbeSet`` with a ``coupling`` table. n_boot: replicates >= 20.
        seed: bootstrap seed. min_probes: fewest probe steps accepted (>= 2).
    Raises:
        ValueError: too few rows or probe steps, fewer than 2 gaps, NaN, or no positive
        squared noise after the reference correction.
    """
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _table(probes, "coupling", 4)
    ids = _clusters(t, "coupling", checks.integer("min_probes", min_probes, 2))
    if np.unique(t["gap"]).size < 2:
        raise ValueError("probes.coupling must hold at least 2 distinct gaps")
    if np.any(t["buffer_size"] <= 0) or np.any(t["rollouts_per_step"] <= 0):
        raise ValueError("probes.coupling.buffer_size and rollouts_per_step must be > 0")
    keys = np.stack([t["gap"], t["buffer_size"], t["rollouts_per_step"]], 1)
    groups, g_idx = np.unique(keys, axis=0, return_inverse=True)
    g_idx = g_idx.ravel()
    n = t["n_pairs"]
    num, den, cnt = _per_cluster(ids, g_idx, groups.shape[0],
                                 n * (t["mean_inner"] - t["ref_sq_error"]),
                                 n * (t["mean_sq"] - t["ref_sq_error"]), n)
    wts = _boot_weights(num.shape[0], n_boot, seed)
    den_b = wts @ den
    if not np.all(den_b[0] > 0):
        raise ValueError("probes.coupling is degenerate: mean_sq - ref_sq_error must be > 0 "
                         "in every (gap, N, R) group")
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (wts @ num) / den_b
    pairs = wts @ cnt
    u = groups[:, 0] / groups[:, 1]
    r = groups[:, 2]
    rho_gap, _ = _wls(u, corr, pairs, through_origin=True)
    slope, icpt = _wls(u, corr, pairs, through_origin=False)
    rho_eff = np.sum(pairs * corr * r, -1) / np.sum(pairs, -1)
    r2 = _r2(corr[0], rho_gap[0] * u, pairs[0])
    s_int, i_int, reasons = _origin_line_test(slope, icpt, "correlation", "gap")
    ok = not reasons
    pick = rho_gap if ok else rho_eff
    lo, hi = _interval(pick[1:])
    return CouplingFit(
        rho=float(np.clip(pick[0], 0, 1)), rho_interval=(float(np.clip(lo, 0, 1)),
                                                         float(np.clip(hi, 0, 1))),
        form="gap" if ok else "effective", rho_gap=float(rho_gap[0]),
        rho_gap_interval=_interval(rho_gap[1:]), rho_eff=float(rho_eff[0]),
        rho_eff_interval=_interval(rho_eff[1:]), intercept=float(icpt[0]),
        intercept_interval=i_int, slope=float(slope[0]), slope_interval=s_int, r2_gap=r2,
        gap_form_ok=ok,
        reason="; ".join(reasons) if reasons else "corr = rho gap / N fits",
        by_gap={"gap": groups[:, 0], "buffer_size": groups[:, 1],
                "rollouts_per_step": groups[:, 2], "corr": corr[0], "pairs": pairs[0]})


@dataclass(frozen=True)
class BiasFit:
    """Bias of stale samples (``fit_bias``; A2, section 4).

    Attributes:
        kappa: the value to use: sqrt of the slope of ||bias||^2 = kappa^2 drift^2 if that
            form fits, else the envelope max_s ||bias_s|| / drift_s. kappa_interval: 95%.
        kappa_fit, kappa_envelope: both estimates. drift_form_ok, reason: the form test
            (slope of the free line above 0, intercept interval containing 0).
        mean_cos_grad: mean cosine of the bias with the reference gradient (negative =
            anti-aligned, as under PPO clipping in section 8).
        bias_to_grad: mean ||bias||^2 / ||g_ref||^2. by_staleness: the binned estimates.
    """

    kappa: float
    kappa_interval: tuple[float, float]
    kappa_fit: float
    kappa_envelope: float
    drift_form_ok: bool
    reason: str
    mean_cos_grad: float
    bias_to_grad: float
    by_staleness: dict

    def to_dict(self) -> dict:
        return _as_json(self)


def fit_bias(probes: ProbeSet, *, n_boot: int = 200, seed: int = 0,
             min_probes: int = 3) -> BiasFit:
    """Estimate kappa from the ``bias`` table (A2, theory.md sections 4 and 8).

    Per row, ||bias||^2 = (mean_sq - noise_sq / n) / (1 - 1/n) - ref_sq_error (the variance
    of a mean of n samples and the reference error removed; n >= 2).

    Raises:
        ValueError: too few rows or probe steps, fewer than 2 staleness values, NaN, or no
        drift > 0.
    """
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _table(probes, "bias", 4)
    keep = t["n_samples"] >= 2
    t = {k: col[keep] for k, col in t.items()}
    if keep.sum() < 4:
        raise ValueError("probes.bias must hold at least 4 rows with n_samples >= 2")
    ids = _clusters(t, "bias", checks.integer("min_probes", min_probes, 2))
    n = t["n_samples"]
    b2 = (t["mean_sq"] - t["noise_sq"] / n) / (1 - 1 / n) - t["ref_sq_error"]
    values, bins = np.unique(np.rint(t["staleness"]).astype(np.int64), return_inverse=True)
    if values.size < 2:
        raise ValueError("probes.bias must span at least 2 distinct staleness values")
    if not np.any(t["drift"] > 0):
        raise ValueError("probes.bias is degenerate: drift is 0 everywhere, kappa is not "
                         "identifiable")
    grad = np.maximum(t["grad_sq"], 1e-300)
    sb, sd, sc, scos, sg = _per_cluster(ids, bins, values.size, b2, t["drift"] ** 2,
                                        np.ones_like(b2), t["cos_grad"], b2 / grad)
    wts = _boot_weights(sb.shape[0], n_boot, seed)
    cnt = wts @ sc
    with np.errstate(invalid="ignore", divide="ignore"):
        bias_s, d2_s = (wts @ sb) / cnt, (wts @ sd) / cnt
    k2, _ = _wls(d2_s, bias_s, cnt, through_origin=True)
    slope, icpt = _wls(d2_s, bias_s, cnt, through_origin=False)
    moving = d2_s[0] > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        env = np.nanmax(np.sqrt(np.clip(bias_s[:, moving], 0, None) / d2_s[:, moving]), -1)
    s_int, i_int, reasons = _origin_line_test(slope, icpt, "squared bias", "drift")
    ok = not reasons
    kfit = np.sqrt(np.clip(k2, 0, None))
    pick = kfit if ok else env
    total = sc.sum(0)
    return BiasFit(kappa=float(pick[0]), kappa_interval=_interval(pick[1:]),
                   kappa_fit=float(kfit[0]), kappa_envelope=float(env[0]), drift_form_ok=ok,
                   reason="; ".join(reasons) if reasons else "||bias|| = kappa drift fits",
                   mean_cos_grad=float(scos.sum() / total.sum()),
                   bias_to_grad=float(sg.sum() / total.sum()),
                   by_staleness={"staleness": values.astype(float), "bias_sq": bias_s[0],
                                 "drift_sq": d2_s[0], "n": total})


@dataclass(frozen=True)
class DecompositionCheck:
    """Measured minibatch noise V against sigma_bar^2 (1/B + 1/N + rho/R) (section 4).

    Attributes:
        cells: (N, B, R) per group of minibatch rows. ratio, ratio_interval: mean measured V
            over mean predicted V per group, with bootstrap 95% intervals.
        rho_v, rho_v_interval: the coupling implied by the measurements, R (V/sigma_bar^2 -
            1/B - 1/N), averaged over groups weighted by rows.
        chi2, p_value: joint test of ratio = 1 in every group against the bootstrap errors.
        holds: p_value >= 0.01.
    """

    cells: list
    ratio: list
    ratio_interval: list
    rho_v: float
    rho_v_interval: tuple[float, float]
    chi2: float
    p_value: float
    holds: bool

    def to_dict(self) -> dict:
        return _as_json(self)


def check_decomposition(probes: ProbeSet, rho: float, *, n_boot: int = 200, seed: int = 0,
                        min_probes: int = 2) -> DecompositionCheck:
    """Test V ~ sigma_bar^2 (1/B + 1/N + rho/R) on the ``minibatch`` table (section 4).

    Args:
        probes: ``ProbeSet`` with minibatch rows. rho: coupling in [0, 1] to test.
    """
    rho = checks.unit_interval("rho", rho)
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _table(probes, "minibatch", 2)
    cells, g_idx = np.unique(np.stack([t["buffer_size"], t["batch_size"],
                                       t["rollouts_per_step"]], 1), axis=0, return_inverse=True)
    g_idx = g_idx.ravel()
    ids = _clusters(t, "minibatch", checks.integer("min_probes", min_probes, 2))
    n_c, b_c, r_c = cells[:, 0], cells[:, 1], cells[:, 2]
    meas = t["sq_error"] - t["ref_sq_error"]
    sb2 = t["sigma_bar2"] - t["ref_sq_error"]
    sm, ss, sn = _per_cluster(ids, g_idx, cells.shape[0], meas, sb2, np.ones_like(meas))
    wts = _boot_weights(sm.shape[0], n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_vs = (wts @ sm) / (wts @ ss)
        factor = 1 / b_c + 1 / n_c + rho / r_c
        ratio = ratio_vs / factor
        rho_g = r_c * (ratio_vs - 1 / b_c - 1 / n_c)
        rows = wts @ sn
        rho_v = np.nansum(rows * rho_g, -1) / np.sum(np.where(np.isfinite(rho_g), rows, 0), -1)
    intervals = [_interval(ratio[1:, j]) for j in range(cells.shape[0])]
    se = np.nanstd(ratio[1:], axis=0, ddof=1)
    usable = np.isfinite(ratio[0]) & (se > 0)
    chi2 = float(np.sum(((ratio[0][usable] - 1) / se[usable]) ** 2))
    p_value = float(stats.chi2.sf(chi2, int(usable.sum()))) if usable.any() else math.nan
    return DecompositionCheck(cells=cells.astype(int).tolist(), ratio=ratio[0].tolist(),
                              ratio_interval=[list(i) for i in intervals],
                              rho_v=float(rho_v[0]), rho_v_interval=_interval(rho_v[1:]),
                              chi2=chi2, p_value=p_value, holds=p_value >= P_VALUE_MIN)
