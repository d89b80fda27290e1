"""Fit the constants of the reuse-aware variants from probe measurements (theory.md section
10.7) and choose the variant the data support. Reads a ``ProbeSet`` (layout in ``probes``):

* ``fit_reuse``: c(g), the self-correlation of one rollout's gradient noise between its uses
  g steps apart (the ``reuse`` table);
* ``fit_contribution``: f(u, s), the share of a stale or reused sample's gradient the clipped
  loss keeps (the ``contribution`` table);
* ``choose_variant``: the variant whose terms the two fits support.

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
from ..model.reuse import ConstantReuse, ExpContribution, TabulatedReuse, variant_name
from .bootstrap import (P_VALUE_MIN, _as_json, _boot_weights, _clusters, _interval,
                        _per_cluster, _r2, _table, _wls)
from .probes import ProbeSet


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
