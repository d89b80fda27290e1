"""Fit the theory's constants from probe measurements (theory.md sections 4-5 and 8).

Reads a ``ProbeSet`` (layout in ``probes``) and returns:

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
* ``calibrate``: all of them and mu, bundled in a ``Calibration`` that predicts through the
  calculator.

Every squared noise is measured against a reference gradient g_ref; its error e_ref adds
||e_ref||^2 to every squared norm and to every pairwise inner product (the artefact of
section 8), so ``ref_sq_error`` is subtracted from both. Intervals come from a bootstrap over
probes (rows of one probe step of one run share theta and the reference, so they are
resampled together). Too few, degenerate or NaN probes raise ``ValueError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from .. import checks
from ..calculator import optimal_config as _optimal_config
from ..model.compute import estimate_mu
from ..model.design import finite_lr_design as _finite_lr_design
from ..model.design import optimal_design
from ..model.noise import EXTRAPOLATIONS, PowerLawNoise, TabulatedNoise
from .probes import ProbeSet
from ..model.reuse import STANDARD, ConstantReuse, ExpContribution, TabulatedReuse, variant_name
from ..model.reuse import VARIANTS as REUSE_VARIANTS
from ..model.reuse import optimal_design as reuse_optimal_design

CI_LEVEL = 0.95
P_VALUE_MIN = 0.01  # goodness-of-fit threshold below which a form is declared not to fit


def _interval(samples: np.ndarray) -> tuple[float, float]:
    s = samples[np.isfinite(samples)]
    if s.size == 0:
        return (math.nan, math.nan)
    lo, hi = np.percentile(s, [50 * (1 - CI_LEVEL), 50 * (1 + CI_LEVEL)])
    return (float(lo), float(hi))


def _table(probes, name: str, min_rows: int) -> dict[str, np.ndarray]:
    if not isinstance(probes, ProbeSet):
        raise ValueError(f"probes must be a ProbeSet, got {type(probes).__name__}")
    probes.validate()  # NaN, ragged or missing columns
    t = probes.tables[name]
    rows = probes.n_rows(name)
    if rows < min_rows:
        raise ValueError(f"probes.{name} must hold at least {min_rows} rows for a fit, got "
                         f"{rows}")
    for col, arr in t.items():
        if not np.all(np.isfinite(arr)):
            bad = arr[~np.isfinite(arr)][0]
            raise ValueError(f"probes.{name}.{col} must be finite, found {bad!r}")
    return t


def _cluster_ids(t: dict[str, np.ndarray]) -> np.ndarray:
    """Cluster id per row: one probe step of one run (``run`` column if present)."""
    run = t["run"] if "run" in t else np.zeros_like(t["probe_step"])
    _, ids = np.unique(np.stack([run, t["probe_step"]], 1), axis=0, return_inverse=True)
    return ids.ravel()


def _clusters(t: dict[str, np.ndarray], name: str, min_clusters: int) -> np.ndarray:
    ids = _cluster_ids(t)
    n = int(ids.max()) + 1
    if n < min_clusters:
        raise ValueError(f"probes.{name} must come from at least {min_clusters} probe steps for "
                         f"a bootstrap, got {n}")
    return ids


def _per_cluster(ids, bins, n_bins, *values):
    """Sums of each value per (cluster, bin): arrays of shape (clusters, bins)."""
    n_c = int(ids.max()) + 1
    flat = ids * n_bins + bins
    return [np.bincount(flat, weights=val, minlength=n_c * n_bins).reshape(n_c, n_bins)
            for val in values]


def _boot_weights(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot + 1, clusters) resampling counts; row 0 is the data itself."""
    rng = np.random.default_rng(seed)
    w = rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot)
    return np.vstack([np.ones(n_clusters), w]).astype(float)


def _wls(x, y, w, through_origin: bool):
    """Weighted least squares along the last axis; returns (slope, intercept)."""
    if through_origin:
        slope = np.sum(w * x * y, -1) / np.sum(w * x * x, -1)
        return slope, np.zeros_like(slope)
    sw = np.sum(w, -1)
    mx, my = np.sum(w * x, -1) / sw, np.sum(w * y, -1) / sw
    cov = np.sum(w * (x - mx[..., None]) * (y - my[..., None]), -1)
    var = np.sum(w * (x - mx[..., None]) ** 2, -1)
    slope = cov / var
    return slope, my - slope * mx


def _as_json(fit) -> dict:
    """A fit dataclass as JSON-ready values: tuples and arrays become lists."""
    def plain(val):
        if isinstance(val, dict):
            return {k: plain(x) for k, x in val.items()}
        if isinstance(val, (tuple, np.ndarray)):
            return np.asarray(val).tolist()
        return val
    return {k: plain(val) for k, val in fit.__dict__.items()}


def _origin_line_test(slope, icpt, quantity: str, driver: str):
    """Is y = b x (through the origin) supported: slope interval above 0, intercept interval
    containing 0? ``slope``/``icpt`` hold the data's value then bootstrap replicates.
    Returns (slope interval, intercept interval, reasons it is not)."""
    s_int, i_int = _interval(slope[1:]), _interval(icpt[1:])
    reasons = []
    if not s_int[0] > 0:
        reasons.append(f"the {quantity} does not grow with the {driver} (slope interval "
                       f"[{s_int[0]:.3g}, {s_int[1]:.3g}] reaches 0)")
    if not i_int[0] <= 0 <= i_int[1]:
        reasons.append(f"the {quantity} at zero {driver} is not 0 (intercept interval "
                       f"[{i_int[0]:.3g}, {i_int[1]:.3g}])")
    return s_int, i_int, reasons


def _r2(y, fitted, w) -> float:
    mean = np.sum(w * y) / np.sum(w)
    tot = np.sum(w * (y - mean) ** 2)
    return float(1 - np.sum(w * (y - fitted) ** 2) / tot) if tot > 0 else math.nan


# ---- noise -------------------------------------------------------------------------------

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


# ---- coupling ----------------------------------------------------------------------------

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


# ---- bias --------------------------------------------------------------------------------

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


# ---- the decomposition of V --------------------------------------------------------------

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


# ---- reuse: one rollout's self-correlation and the clipped contribution (section 10) -------

@dataclass(frozen=True)
class ReuseFit:
    """Self-correlation c(g) of one rollout's noise at two steps g apart (``fit_reuse``; 10.7).

    Attributes:
        c, c_interval: the pooled correlation sum(inner) / sqrt(sum(sq_now) sum(sq_then)) over
            every gap, with its bootstrap 95% interval.
        slope, slope_interval: weighted least-squares slope of c(g) against log g.
        chi2, dof, p_value: chi-square test of the per-gap correlations against constant c.
        constant_ok: the constant form fits (p >= 0.01); else the table is used. reason.
        supported: c's interval lies above 0 (the term is measurably there).
        by_gap: gap, corr, se, rows per gap. model: ``reuse.ConstantReuse`` or
            ``reuse.TabulatedReuse`` (correlations clipped to [0, 1]).
    """

    c: float
    c_interval: tuple[float, float]
    slope: float
    slope_interval: tuple[float, float]
    chi2: float
    dof: int
    p_value: float
    constant_ok: bool
    supported: bool
    reason: str
    by_gap: dict
    model: object = field(repr=False)

    def to_dict(self) -> dict:
        d = _as_json(self)
        d["model"] = self.model.to_dict()
        return d


def fit_reuse(probes: ProbeSet, *, n_boot: int = 200, seed: int = 0,
              min_probes: int = 3) -> ReuseFit:
    """Estimate c(g) from the ``reuse`` table (theory.md sections 10.2 and 10.7).

    Per gap, c(g) = sum(inner) / sqrt(sum(sq_now) sum(sq_then)); the bootstrap resamples
    probes. The constant form is used when a chi-square test of the per-gap values against
    their pooled value does not reject it (p >= 0.01), the table of per-gap values otherwise.
    Raises: ValueError with too few rows or probes, NaN, or no positive squared norm.
    """
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _table(probes, "reuse", 4)
    ids = _clusters(t, "reuse", checks.integer("min_probes", min_probes, 2))
    if np.any(t["gap"] < 1):
        raise ValueError("probes.reuse.gap must be >= 1")
    gaps, g_idx = np.unique(t["gap"], return_inverse=True)
    inner, now, then, rows = _per_cluster(ids, g_idx.ravel(), gaps.size, t["inner"],
                                          t["sq_now"], t["sq_then"], np.ones_like(t["gap"]))
    wts = _boot_weights(inner.shape[0], n_boot, seed)
    s_in, s_now, s_then = wts @ inner, wts @ now, wts @ then
    if not (np.all(s_now[0] > 0) and np.all(s_then[0] > 0)):
        raise ValueError("probes.reuse is degenerate: sq_now and sq_then must sum to > 0 at "
                         "every gap")
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = s_in / np.sqrt(s_now * s_then)
        pooled = s_in.sum(-1) / np.sqrt(s_now.sum(-1) * s_then.sum(-1))
    se = np.nanstd(corr[1:], axis=0, ddof=1)
    n_rows = rows.sum(0)
    if gaps.size >= 2:
        w = np.where(se > 0, 1 / np.maximum(se, 1e-12) ** 2, 0.0)
        slope, _ = _wls(np.broadcast_to(np.log(gaps), corr.shape), corr, w,
                        through_origin=False)
        usable = se > 0
        chi2 = float(np.sum(((corr[0] - pooled[0])[usable] / se[usable]) ** 2))
        dof = int(usable.sum()) - 1
        p_value = float(stats.chi2.sf(chi2, dof)) if dof > 0 else math.nan
    else:
        slope, chi2, dof, p_value = np.zeros(corr.shape[0]), 0.0, 0, math.nan
    constant_ok = not (dof > 0 and p_value < P_VALUE_MIN)
    c_int = _interval(pooled[1:])
    if constant_ok:
        model = ConstantReuse(float(np.clip(pooled[0], 0, 1)))
        reason = "c(g) is flat in the gap" if dof > 0 else "a single gap: constant c"
    else:
        model = TabulatedReuse(tuple(gaps.astype(float)),
                               tuple(np.clip(corr[0], 0, 1).astype(float)))
        reason = (f"c(g) is not flat in the gap (chi2 = {chi2:.3g} on {dof} dof, "
                  f"p = {p_value:.2g}): using the table of per-gap correlations")
    return ReuseFit(c=float(pooled[0]), c_interval=c_int, slope=float(slope[0]),
                    slope_interval=_interval(slope[1:]), chi2=chi2, dof=dof, p_value=p_value,
                    constant_ok=constant_ok, supported=bool(c_int[0] > 0), reason=reason,
                    by_gap={"gap": gaps, "corr": corr[0], "se": se, "rows": n_rows},
                    model=model)


@dataclass(frozen=True)
class ContributionFit:
    """Share of its gradient a clipped sample keeps, f(u, s) = exp(-a u - b s)
    (``fit_contribution``; section 10.7).

    Attributes:
        per_use, per_use_interval: a, per earlier use, with its bootstrap 95% interval.
        per_step, per_step_interval: b, per step of staleness.
        r2, chi2, dof, p_value: weighted R^2 of log f and a chi-square test of the (u, s) bin
            means against the fit (bootstrap errors). fits: p >= 0.01.
        supported: a or b has its interval above 0 (clipping measurably removes signal).
        mean_contribution, mean_clip_fraction: over all rows. bins: uses, staleness, n, mean.
        model: ``reuse.ExpContribution`` (a, b clipped at 0).
    """

    per_use: float
    per_use_interval: tuple[float, float]
    per_step: float
    per_step_interval: tuple[float, float]
    r2: float
    chi2: float
    dof: int
    p_value: float
    fits: bool
    supported: bool
    mean_contribution: float
    mean_clip_fraction: float
    bins: dict
    model: object = field(repr=False)

    def to_dict(self) -> dict:
        d = _as_json(self)
        d["model"] = self.model.to_dict()
        return d


def _log_linear_fit(u, s, z, w):
    """Weighted least squares of z = -a u - b s (no intercept: f(0, 0) = 1) per row of z."""
    a11, a12, a22 = np.sum(w * u * u, -1), np.sum(w * u * s, -1), np.sum(w * s * s, -1)
    r1, r2 = -np.sum(w * u * z, -1), -np.sum(w * s * z, -1)
    det = a11 * a22 - a12 ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a22 * r1 - a12 * r2) / det, (a11 * r2 - a12 * r1) / det


def fit_contribution(probes: ProbeSet, *, n_boot: int = 200, seed: int = 0,
                     min_probes: int = 3) -> ContributionFit:
    """Fit f(u, s) = exp(-a u - b s) to the ``contribution`` table (theory.md section 10.7).

    Rows are binned by (uses, staleness) (both rounded to integers); the log of each bin's
    mean contribution is fitted through the origin by weighted least squares (weights:
    (mean / se)^2, se from the bootstrap over probes), on bins with a positive mean. A bin
    mean of 0 (everything clipped) is kept in the chi-square test. When uses and staleness
    do not vary independently, a and b are not both identifiable and the fit says so through
    wide intervals.
    Raises: ValueError with too few rows or probes, NaN, or fewer than 2 bins.
    """
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _table(probes, "contribution", 4)
    ids = _clusters(t, "contribution", checks.integer("min_probes", min_probes, 2))
    keys = np.stack([np.rint(t["uses"]), np.rint(t["staleness"])], 1)
    if np.any(keys < 0):
        raise ValueError("probes.contribution.uses and staleness must be >= 0")
    bins, b_idx = np.unique(keys, axis=0, return_inverse=True)
    if bins.shape[0] < 2:
        raise ValueError("probes.contribution must span at least 2 (uses, staleness) bins")
    sums, counts = _per_cluster(ids, b_idx.ravel(), bins.shape[0], t["contribution"],
                                np.ones_like(t["contribution"]))
    wts = _boot_weights(sums.shape[0], n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (wts @ sums) / (wts @ counts)
        z = np.log(np.clip(means, 1e-300, None))
    se = np.nanstd(means[1:], axis=0, ddof=1)
    pos = (means[0] > 0) & (se > 0)
    w = np.where(pos, (means[0] / np.where(se > 0, se, 1)) ** 2, 0.0)
    w = w * np.all(np.isfinite(z), axis=0)
    a, b = _log_linear_fit(bins[:, 0], bins[:, 1], np.where(np.isfinite(z), z, 0), w)
    # No bin with a spread (every sample kept, as without a clip): nothing is cut, a = b = 0.
    a, b = np.where(np.isfinite(a), a, 0.0), np.where(np.isfinite(b), b, 0.0)
    fitted = np.exp(-a[0] * bins[:, 0] - b[0] * bins[:, 1])
    usable = se > 0
    chi2 = float(np.sum(((means[0] - fitted)[usable] / se[usable]) ** 2))
    dof = int(usable.sum()) - 2
    p_value = float(stats.chi2.sf(chi2, dof)) if dof > 0 else math.nan
    a_int, b_int = _interval(a[1:]), _interval(b[1:])
    return ContributionFit(
        per_use=float(a[0]), per_use_interval=a_int, per_step=float(b[0]),
        per_step_interval=b_int,
        r2=_r2(z[0][pos], np.log(fitted[pos]), w[pos]) if pos.sum() > 1 else math.nan,
        chi2=chi2, dof=dof, p_value=p_value, fits=not (dof > 0 and p_value < P_VALUE_MIN),
        supported=bool(a_int[0] > 0 or b_int[0] > 0),
        mean_contribution=float(np.mean(t["contribution"])),
        mean_clip_fraction=float(np.mean(t["clip_fraction"])),
        bins={"uses": bins[:, 0], "staleness": bins[:, 1], "n": counts.sum(0),
              "mean": means[0]},
        model=ExpContribution(per_use=float(max(a[0], 0.0)), per_step=float(max(b[0], 0.0))))


@dataclass(frozen=True)
class VariantChoice:
    """Which model variant the probes support (``choose_variant``; section 10.7).

    Attributes: variant: "standard" or one of ``reuse.VARIANTS``. reasons: one line per term
    (measured or not, and why).
    """

    variant: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"variant": self.variant, "reasons": list(self.reasons)}


def choose_variant(reuse: ReuseFit | None, contribution: ContributionFit | None
                   ) -> VariantChoice:
    """The variant whose extra terms the probes measure above zero (section 10.7): the
    self-correlation term when c's interval is above 0, the contribution term when a's or
    b's interval is above 0; "standard" when neither (or neither table was measured)."""
    reasons = []
    if reuse is None:
        reasons.append("self-correlation: no reuse table")
    else:
        reasons.append(f"self-correlation: c = {reuse.c:.3g} "
                       f"[{reuse.c_interval[0]:.3g}, {reuse.c_interval[1]:.3g}] "
                       + ("is above 0" if reuse.supported else "reaches 0"))
    if contribution is None:
        reasons.append("contribution: no contribution table")
    else:
        c = contribution
        reasons.append(f"contribution: a = {c.per_use:.3g} [{c.per_use_interval[0]:.3g}, "
                       f"{c.per_use_interval[1]:.3g}] per use, b = {c.per_step:.3g} "
                       f"[{c.per_step_interval[0]:.3g}, {c.per_step_interval[1]:.3g}] per step"
                       + (": below 1" if c.supported else ": not below 1"))
    variant = variant_name(reuse.model if reuse is not None and reuse.supported else None,
                           contribution.model if contribution is not None
                           and contribution.supported else None)
    return VariantChoice(variant=variant, reasons=tuple(reasons))


# ---- the bundle --------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """Fitted constants and the predictions they imply (theory.md sections 3-5).

    ``coupling="theory"`` uses the fitted rho of A3 (rho_gap if its form fits, else rho_eff);
    ``"effective"`` always uses rho_eff (the coupling the buffer realises; a named extension:
    A3's gap form is a bound, and the buffer's mean gap is about a third of the largest).
    ``noise="auto"`` uses the power law if it fits, else the table.
    ``variant`` (``design``, ``optimal_config``): "standard" is section 5's model; one of
    ``reuse.VARIANTS`` adds the fitted self-correlation and/or contribution terms (section
    10); "supported" is the one ``variant_choice`` names.
    """

    noise: NoiseFit
    coupling: CouplingFit
    bias: BiasFit | None
    decomposition: DecompositionCheck | None
    mu: float | None
    mu_source: str
    notes: tuple[str, ...] = ()
    reuse: ReuseFit | None = None
    contribution: ContributionFit | None = None
    variant_choice: VariantChoice | None = None

    def rho(self, coupling: str = "theory") -> float:
        """The coupling coefficient for designs ("theory" or "effective")."""
        checks.choice("coupling", coupling, ("theory", "effective"))
        return self.coupling.rho if coupling == "theory" else float(
            np.clip(self.coupling.rho_eff, 0, 1))

    def noise_model(self, noise: str = "auto", extrapolate: str = "none"):
        """The sigma model for designs: ``noise`` "auto", "power_law" or "tabulated".

        ``extrapolate`` (one of ``noise.EXTRAPOLATIONS``) applies to a table: "none" keeps
        horizon searches inside the measured staleness, "hold_last" holds sigma^2 at its last
        measured value beyond it (theory.md section 4.6); a power law extrapolates itself."""
        checks.choice("noise", noise, ("auto", "power_law", "tabulated"))
        checks.choice("extrapolate", extrapolate, EXTRAPOLATIONS)
        if noise == "power_law" and self.noise.power_law is None:
            raise ValueError(f"noise='power_law' needs a fitted alpha >= 0, got "
                             f"{self.noise.alpha:.3g}")
        model = {"auto": self.noise.model, "tabulated": self.noise.tabulated,
                 "power_law": self.noise.power_law}[noise]
        if isinstance(model, TabulatedNoise):
            return replace(model, extrapolate=extrapolate)
        return model

    def _mu(self, mu):
        if mu is not None:
            return checks.positive("mu", mu)
        if self.mu is None:
            raise ValueError("mu is unknown: pass mu (> 0) or calibrate with counts")
        return self.mu

    def reuse_terms(self, variant: str) -> tuple:
        """(reuse model, contribution model) of a variant (section 10): "standard", "supported"
        or one of ``reuse.VARIANTS``; raises if the variant needs a fit that is missing."""
        checks.choice("variant", variant, (STANDARD, "supported", *REUSE_VARIANTS))
        if variant == "supported":
            variant = STANDARD if self.variant_choice is None else self.variant_choice.variant
        want_c = variant in ("self_correlated", "reuse_clipping")
        want_f = variant in ("clipping", "reuse_clipping")
        if want_c and self.reuse is None:
            raise ValueError(f"variant={variant!r} needs c(g): calibrate with a reuse table")
        if want_f and self.contribution is None:
            raise ValueError(f"variant={variant!r} needs f(u, s): calibrate with a "
                             f"contribution table")
        return (self.reuse.model if want_c else None,
                self.contribution.model if want_f else None)

    def design(self, mu: float | None = None, *, coupling: str = "theory",
               noise: str = "auto", variant: str = "supported", extrapolate: str = "none",
               **kwargs):
        """The optimum with the fitted constants: ``design.optimal_design`` (section 5) for
        variant "standard", ``reuse.optimal_design`` (section 10) otherwise; ``variant``
        defaults to the one the probes support (section 10.11); ``noise`` and
        ``extrapolate`` as in ``noise_model``."""
        reuse_model, contribution = self.reuse_terms(variant)
        sigma = self.noise_model(noise, extrapolate)
        if reuse_model is None and contribution is None:
            return optimal_design(self._mu(mu), self.rho(coupling), sigma, **kwargs)
        return reuse_optimal_design(self._mu(mu), self.rho(coupling), sigma,
                                    reuse=reuse_model, contribution=contribution, **kwargs)

    def optimal_config(self, mu: float | None = None, *, coupling: str = "theory",
                       noise: str = "auto", variant: str = "supported",
                       extrapolate: str = "none", **kwargs):
        """Integers and a GPU split for the optimum (``calculator.optimal_config``) with the
        fitted constants and the variant's fitted terms: by default those the probes support
        (section 10.11), named in the recommendation's ``variant`` and ``explanation``;
        ``noise`` and ``extrapolate`` as in ``noise_model``. The horizon is the model's
        (``horizon_source="model"`` unless given), marked unvalidated (section 10.11)."""
        reuse_model, contribution = self.reuse_terms(variant)
        kwargs.setdefault("horizon_source", "model")
        return _optimal_config(mu=self._mu(mu), rho=self.rho(coupling),
                               noise=self.noise_model(noise, extrapolate), reuse=reuse_model,
                               contribution=contribution, **kwargs)

    def finite_lr_design(self, mu: float | None = None, *, batch_size: int,
                         smoothness: float, f0: float, budget: float,
                         coupling: str = "theory", noise: str = "auto",
                         extrapolate: str = "none", **kwargs):
        """``design.finite_lr_design`` with the fitted constants and kappa (section 4);
        ``noise`` and ``extrapolate`` as in ``noise_model``."""
        if self.bias is None:
            raise ValueError("finite_lr_design needs kappa: calibrate with a bias table")
        return _finite_lr_design(self._mu(mu), self.rho(coupling),
                                 self.noise_model(noise, extrapolate),
                                 batch_size=batch_size, smoothness=smoothness,
                                 kappa=self.bias.kappa, f0=f0, budget=budget, **kwargs)

    def to_dict(self) -> dict:
        return {"noise": self.noise.to_dict(), "coupling": self.coupling.to_dict(),
                "bias": None if self.bias is None else self.bias.to_dict(),
                "decomposition": None if self.decomposition is None
                else self.decomposition.to_dict(),
                "mu": self.mu, "mu_source": self.mu_source, "notes": list(self.notes),
                # Section 10's fits only when measured, so older calibrations read the same.
                **({} if self.reuse is None and self.contribution is None else {
                    "reuse": None if self.reuse is None else self.reuse.to_dict(),
                    "contribution": None if self.contribution is None
                    else self.contribution.to_dict(),
                    "variant_choice": self.variant_choice.to_dict()})}


def _mu_from_counts(counts: dict) -> tuple[float | None, str]:
    if counts.get("mu_measured") is not None:
        return float(counts["mu_measured"]), "counts.mu_measured"
    keys = ("unique_rollouts", "samples_consumed", "workers", "trainers")
    if all(k in counts for k in keys) and (counts["workers"] > 1 or counts["trainers"] > 1):
        return estimate_mu(int(counts["unique_rollouts"]), int(counts["samples_consumed"]),
                           int(counts["workers"]), int(counts["trainers"])), "estimate_mu(counts)"
    if counts.get("mu_accounting") is not None:
        return float(counts["mu_accounting"]), "counts.mu_accounting"
    return None, "unknown"


# Fewest probe steps an optional table (bias, reuse, contribution) needs for its bootstrap,
# the fits' default ``min_probes``.
MIN_OPTIONAL_PROBE_STEPS = 3


def _optional_fit(fit, probes: ProbeSet, name: str, notes: list, **kwargs):
    """``fit(probes)`` of an optional table, or None: without rows, or (with a note) from
    fewer probe steps than its bootstrap needs, which a short or clock-driven run can give
    (e.g. buffer rows evicted before a later probe), so the rest of the calibration stands."""
    if not probes.n_rows(name):
        return None
    steps = int(_cluster_ids(probes.tables[name]).max()) + 1
    if steps < MIN_OPTIONAL_PROBE_STEPS:
        notes.append(f"{name}: rows from {steps} probe step(s), at least "
                     f"{MIN_OPTIONAL_PROBE_STEPS} needed for a bootstrap; not fitted")
        return None
    return fit(probes, **kwargs)


def calibrate(probes: ProbeSet, counts: dict | None = None, *, mu: float | None = None,
              staleness_offset: float = 0.5, n_boot: int = 200, seed: int = 0) -> Calibration:
    """Fit sigma, rho, kappa (and take mu) from a run's probes (theory.md sections 3-5, 8).

    Args:
        probes: ``ProbeSet`` with ``noise`` and ``coupling`` tables (``bias``, ``minibatch``,
            ``reuse`` and ``contribution`` optional; the last two feed section 10's variants
            and ``variant_choice``). An optional table from fewer than
            ``MIN_OPTIONAL_PROBE_STEPS`` probe steps is left out, and ``notes`` says so.
        counts: run counts (default ``probes.counts``): mu is taken from ``mu_measured``,
            else ``estimate_mu`` of an asynchronous run (W or T > 1), else ``mu_accounting``.
        mu: overrides the counts (> 0).
        staleness_offset, n_boot, seed: as in ``fit_noise_model``.
    Raises:
        ValueError: from the fits (too few, degenerate or NaN probes).
    """
    if not isinstance(probes, ProbeSet):
        raise ValueError(f"probes must be a ProbeSet, got {type(probes).__name__}")
    counts = dict(probes.counts if counts is None else counts)
    if mu is not None:
        mu_val, source = checks.positive("mu", mu), "argument"
    else:
        mu_val, source = _mu_from_counts(counts)
    noise = fit_noise_model(probes, staleness_offset=staleness_offset, n_boot=n_boot,
                            seed=seed)
    coupling = fit_coupling(probes, n_boot=n_boot, seed=seed)
    notes = []
    bias, reuse, contribution = (
        _optional_fit(fit, probes, name, notes, n_boot=n_boot, seed=seed)
        for name, fit in (("bias", fit_bias), ("reuse", fit_reuse),
                          ("contribution", fit_contribution)))
    decomposition = check_decomposition(probes, coupling.rho, n_boot=n_boot, seed=seed) \
        if probes.n_rows("minibatch") >= 2 else None
    if not noise.power_law_ok:
        notes.append(f"noise: the power law does not describe the data ({noise.reason}); "
                     f"using the tabulated model")
    if not coupling.gap_form_ok:
        notes.append(f"coupling: corr = rho gap / N does not describe the data "
                     f"({coupling.reason}); using the effective rho = {coupling.rho_eff:.3g}")
    if bias is not None and not bias.drift_form_ok:
        notes.append(f"bias: ||bias|| = kappa drift does not describe the data "
                     f"({bias.reason}); using the envelope kappa = {bias.kappa_envelope:.3g}")
    return Calibration(noise=noise, coupling=coupling, bias=bias, decomposition=decomposition,
                       mu=mu_val, mu_source=source, notes=tuple(notes), reuse=reuse,
                       contribution=contribution,
                       variant_choice=choose_variant(reuse, contribution))


__all__ = ["NoiseFit", "CouplingFit", "BiasFit", "DecompositionCheck", "ReuseFit",
           "ContributionFit", "VariantChoice", "Calibration", "fit_noise_model",
           "fit_coupling", "fit_bias", "check_decomposition", "fit_reuse", "fit_contribution",
           "choose_variant", "calibrate"]
