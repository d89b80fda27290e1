"""A stale rollout's worth, bias and noise from the align panels (theory.md 11.15-11.17).

An align measurement (run, probe step t, birth step b) holds the mean gradients m_k of K
chunks of a panel made at b and never trained on, taken at theta_t under the training loss
or a variant loss, and those r_a of A chunks of fresh rollouts at theta_t (the reference).
The ``align`` table keeps <m_k, r_a> and <r_a, r_b> (a < b); ``align_pairs`` (written with
``probe.align_moments``) adds <m_k, m_l> (k <= l) and ||r_a||^2. Distinct chunks are
independent, so per gap g = t - b:

* align(g) = mean <m_k, r_a> / mean_{a<b} <r_a, r_b>: the panel's mean gradient along grad F
  over ||grad F||^2 (1 for fresh rollouts; 11.15);
* bias(g) = ||E m - grad F||^2 / ||grad F||^2, from mean_{k<l} <m_k, m_l> - 2 mean <m_k, r_a>
  + mean_{a<b} <r_a, r_b> (0 for fresh rollouts);
* orthogonal(g) = bias(g) - (1 - align(g))^2: the part of the bias off grad F;
* noise(g): the panel's per-sequence noise, n_m (mean ||m_k||^2 - mean_{k<l} <m_k, m_l>),
  n_m sequences per chunk, over the reference's, the same for its chunks (1 for fresh
  rollouts: the same policy at the same weights).

Pooled over measurements at a gap each is a ratio of sums. Intervals are 95% percentile
intervals of a bootstrap that resamples a measurement's panel chunks and reference chunks
(the reference jointly in numerators and denominators, whose noise both carry); every loss is
resampled with the same draws, so changes between losses are paired.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import checks
from .panel_fit import Curve, _curve
from .probes import ALIGN_PANEL, ALIGN_REFERENCE, ProbeSet, align_part


@dataclass(frozen=True)
class AlignFit:
    """align(g) from the ``align`` table (theory.md section 11.15): ``pooled`` over births per
    gap, and ``by_birth`` (birth step -> Curve); each a ratio of sums over measurements
    (runs x births at a gap) of the panel's mean inner product with the reference and the
    reference's estimate of ||grad F||^2, with 95% bootstrap intervals; ``n_seq`` the
    sequences per panel."""

    pooled: Curve
    by_birth: dict
    n_seq: int

    def to_dict(self) -> dict:
        return {"pooled": self.pooled.to_dict(), "n_seq": self.n_seq,
                "by_birth": {str(b): c.to_dict() for b, c in self.by_birth.items()}}


@dataclass(frozen=True)
class AlignMoments:
    """The panel's second moments by gap under one loss (module docstring, theory.md 11.17):
    ``bias``, ``orthogonal`` and ``noise`` pooled over births (Curves) and ``by_birth``
    (birth step -> {"bias", "orthogonal", "noise"} -> Curve)."""

    bias: Curve
    orthogonal: Curve
    noise: Curve
    by_birth: dict

    def to_dict(self) -> dict:
        return {"bias": self.bias.to_dict(), "orthogonal": self.orthogonal.to_dict(),
                "noise": self.noise.to_dict(),
                "by_birth": {str(b): {k: c.to_dict() for k, c in v.items()}
                             for b, v in self.by_birth.items()}}


@dataclass(frozen=True)
class _Sums:
    """Bootstrap replicates (B + 1,), replicate 0 the data, of one measurement's means:
    ``cross`` mean <m_k, r_a> per panel part (part -> replicates); ``ref`` mean_{a<b} <r_a,
    r_b>; with pairs, ``panel_pairs`` mean_{k<l} <m_k, m_l> and ``panel_sq`` the per-sequence
    noise n_m (mean ||m_k||^2 - panel_pairs) per part, ``ref_sq`` the reference's."""

    cross: dict
    ref: np.ndarray
    panel_pairs: dict | None = None
    panel_sq: dict | None = None
    ref_sq: np.ndarray | None = None


@dataclass(frozen=True)
class _AlignMeasurement:
    """One align measurement (run, probe step, birth): its birth and gap (steps) and sums."""

    birth: float
    gap: float
    sums: _Sums


def _matrix(t: dict, rows: np.ndarray, shape: tuple) -> np.ndarray:
    m = np.zeros(shape)
    m[t["chunk"][rows].astype(int), t["other"][rows].astype(int)] = t["value"][rows]
    return m


def _pair_mean(weights: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Per replicate, the weighted mean of the strictly-upper entries of ``upper`` over the
    distinct-chunk pairs the weights (B + 1, n) draw; NaN where one chunk is drawn alone."""
    pairs = (weights.sum(1) ** 2 - (weights ** 2).sum(1)) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.einsum("ba,ac,bc->b", weights, np.triu(upper, 1), weights) / pairs


def _sq_mean(weights: np.ndarray, square: np.ndarray) -> np.ndarray:
    """Per replicate, the weighted mean of the diagonal of ``square``."""
    return weights @ np.diag(square) / weights.sum(1)


def _measurement(t, pairs, here, pair_here, parts, n_boot, rng) -> _Sums:
    """One measurement's sums (``_Sums``) from its rows of the align table (``here``) and, if
    given, of ``align_pairs`` (``pair_here``)."""
    panels = {p: here & (t["part"] == p) for p in parts}
    first = panels[parts[0]]
    n_k, n_a = int(t["chunk"][first].max()) + 1, int(t["other"][first].max()) + 1
    w = np.vstack([np.ones(n_k), rng.multinomial(n_k, np.full(n_k, 1 / n_k), n_boot)])
    v = np.vstack([np.ones(n_a), rng.multinomial(n_a, np.full(n_a, 1 / n_a), n_boot)])
    cross = {p: np.einsum("bk,ka,ba->b", w, _matrix(t, rows, (n_k, n_a)), v) / (n_k * n_a)
             for p, rows in panels.items()}
    ref_rows = here & (t["part"] == ALIGN_REFERENCE)
    ref = _pair_mean(v, _matrix(t, ref_rows, (n_a, n_a)))
    if pairs is None:
        return _Sums(cross=cross, ref=ref)
    n_m = np.median(t["n_seq"][first]) / n_k
    n_r = np.median(t["n_seq"][ref_rows]) / n_a
    grams = {p: _matrix(pairs, pair_here & (pairs["part"] == p), (n_k, n_k)) for p in parts}
    ref_sq = _sq_mean(v, _matrix(pairs, pair_here & (pairs["part"] == ALIGN_REFERENCE),
                                 (n_a, n_a)))
    panel_pairs = {p: _pair_mean(w, g) for p, g in grams.items()}
    return _Sums(cross=cross, ref=ref, panel_pairs=panel_pairs,
                 panel_sq={p: n_m * (_sq_mean(w, g) - panel_pairs[p]) for p, g in grams.items()},
                 ref_sq=n_r * (ref_sq - ref))


def _measurements(probes: ProbeSet, n_boot: int, seed: int, parts,
                  moments: bool = False) -> list[_AlignMeasurement]:
    """Every measurement of the ``align`` table, with sums for each panel part of ``parts``
    (and the second moments from ``align_pairs`` with ``moments``); the same bootstrap draws
    for every part."""
    t = probes.tables["align"]
    if not len(t["value"]):
        raise ValueError("probes.align has no rows: run with probe.align_groups > 0")
    checks.integer("n_boot", n_boot, 1)
    pairs = probes.tables.get("align_pairs") if moments else None
    if moments and (pairs is None or not len(pairs["value"])):
        raise ValueError("probes.align_pairs has no rows: run with probe.align_moments=true")
    rng = np.random.default_rng(seed)

    def keys(table):
        run = table.get("run", np.zeros(len(table["value"])))
        return np.stack([run, table["probe_step"], table["birth_step"]], axis=1)
    k, pk = keys(t), None if pairs is None else keys(pairs)
    out = []
    for key in np.unique(k, axis=0):
        here = np.all(k == key, axis=1)
        missing = [p for p in parts if not (here & (t["part"] == p)).any()]
        pair_here = None if pk is None else np.all(pk == key, axis=1)
        if pair_here is not None and not pair_here.any():
            missing.append("align_pairs")
        if missing:
            raise ValueError(f"align measurement (run {key[0]:g}, step {key[1]:g}, birth "
                             f"{key[2]:g}) lacks the rows of {missing}: measure with those "
                             f"probe.align_variants (and probe.align_moments for pairs)")
        out.append(_AlignMeasurement(birth=float(key[2]), gap=float(key[1] - key[2]),
                                     sums=_measurement(t, pairs, here, pair_here, parts,
                                                       n_boot, rng)))
    return out


def _chosen(meas: list[_AlignMeasurement], births) -> list[_AlignMeasurement]:
    """The measurements of panels born at ``births`` (None = all)."""
    if births is None:
        return meas
    chosen = [m for m in meas if m.birth in set(births)]
    if not chosen:
        raise ValueError(f"births {list(births)} match no align measurement")
    return chosen


def _per_gap(meas: list[_AlignMeasurement], gaps: list, value) -> np.ndarray:
    """Replicates (B + 1, gaps) of ``value`` (a function of the measurements at one gap)."""
    return np.stack([value([m.sums for m in meas if m.gap == gap]) for gap in gaps], 1)


def _align_of(part: int):
    """align at a gap under ``part``: a ratio of sums, so measurements with a larger
    ||grad F||^2 weigh more."""
    return lambda sums: sum(s.cross[part] for s in sums) / sum(s.ref for s in sums)


def _by_birth(meas: list[_AlignMeasurement], gaps: list, curves) -> dict:
    """``curves(chosen)`` for each birth measured at every gap."""
    out = {}
    for birth in sorted({m.birth for m in meas}):
        chosen = [m for m in meas if m.birth == birth]
        if {m.gap for m in chosen} == set(gaps):
            out[int(birth)] = curves(chosen)
    return out


def fit_align(probes: ProbeSet, *, variant: str | None = None, births=None,
              n_boot: int = 400, seed: int = 0) -> AlignFit:
    """align(g) per gap, pooled over births and per birth (``AlignFit``), from the ``align``
    rows of ``probes`` (merged runs carry a ``run`` column) under the training loss, or under
    ``variant`` (one of ``probes.ALIGN_VARIANTS``, measured with ``probe.align_variants``), of
    the panels born at ``births`` (steps; None = all); n_boot >= 1 replicates."""
    part = align_part(variant)
    meas = _chosen(_measurements(probes, n_boot, seed, [part]), births)
    gaps = sorted({m.gap for m in meas})
    t = probes.tables["align"]
    return AlignFit(pooled=_curve(gaps, _per_gap(meas, gaps, _align_of(part))),
                    by_birth=_by_birth(meas, gaps, lambda chosen: _curve(
                        gaps, _per_gap(chosen, gaps, _align_of(part)))),
                    n_seq=int(np.median(t["n_seq"][t["part"] == ALIGN_PANEL])))


def align_change(probes: ProbeSet, variant: str, *, births=None, n_boot: int = 400,
                 seed: int = 0) -> Curve:
    """align(g) under ``variant`` minus align(g) under the training loss, pooled over the
    births in ``births`` (None = all), per gap, with a paired 95% bootstrap interval: both
    are measured on the same chunks against the same reference (theory.md section 11.16),
    and each replicate resamples them once for both."""
    parts = [ALIGN_PANEL, align_part(variant)]
    meas = _chosen(_measurements(probes, n_boot, seed, parts), births)
    gaps = sorted({m.gap for m in meas})
    return _curve(gaps, _per_gap(meas, gaps, _align_of(parts[1]))
                  - _per_gap(meas, gaps, _align_of(parts[0])))


def _moment_curves(meas: list[_AlignMeasurement], gaps: list, part: int) -> dict:
    def bias(sums):
        return sum(s.panel_pairs[part] - 2 * s.cross[part] + s.ref for s in sums) \
            / sum(s.ref for s in sums)

    def orthogonal(sums):
        return bias(sums) - (1 - _align_of(part)(sums)) ** 2

    def noise(sums):
        return sum(s.panel_sq[part] for s in sums) / sum(s.ref_sq for s in sums)
    return {name: _curve(gaps, _per_gap(meas, gaps, f))
            for name, f in (("bias", bias), ("orthogonal", orthogonal), ("noise", noise))}


def fit_align_moments(probes: ProbeSet, *, variant: str | None = None, births=None,
                      n_boot: int = 400, seed: int = 0) -> AlignMoments:
    """The panel's bias, its part off grad F and its per-sequence noise by gap (module
    docstring; theory.md 11.17), under the training loss or ``variant``, pooled over the
    births in ``births`` (steps; None = all) and per birth, from the ``align`` and
    ``align_pairs`` rows of ``probes`` (written with ``probe.align_moments``); n_boot >= 1
    replicates."""
    part = align_part(variant)
    meas = _chosen(_measurements(probes, n_boot, seed, [part], moments=True), births)
    gaps = sorted({m.gap for m in meas})
    return AlignMoments(**_moment_curves(meas, gaps, part),
                        by_birth=_by_birth(meas, gaps,
                                           lambda chosen: _moment_curves(chosen, gaps, part)))
