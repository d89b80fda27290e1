"""Turn the per-sample noise vectors measured at one probe into ``ProbeSet`` rows.

At a probe (trainer step t) a run knows, for every rollout i in its buffer, the per-sample
gradient G(theta_t, z_i) and a reference g_ref for grad F(theta_t); the noise measured is
e_i = G(theta_t, z_i) - g_ref (theory.md section 4, eps_{t,i}, plus the reference's own error).
This module aggregates those vectors into the four tables of ``probes`` (their columns are
documented there): one noise row per sample, one coupling row per insertion gap (all pairs
of distinct buffer slots, so ``n_pairs`` follows the buffer's own pair distribution), one
bias row per staleness, one minibatch row for the batch actually drawn. Shared by the
simulators; the LLM harness may call it with its own vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import checks
from .probes import SCHEMA, UNIT_SEQUENCE

TABLES = tuple(SCHEMA)


@dataclass(frozen=True)
class _ProbeInputs:
    """One probe's validated inputs (theory.md sections 4.1 and 8.1).

    Attributes:
        noise: (n, D) float, e_i = G(theta_t, z_i) - g_ref (gradient units), n >= 1.
        staleness: (n,) int64 >= 0, steps since each rollout was generated.
        drift: (n,) float >= 0, ||theta_t - theta_{t - s_i}|| (parameter-norm units).
        g_ref: (D,) float, the reference gradient.
        ref_sq_error: estimated ||g_ref - grad F||^2 >= 0 (squared gradient units).
        probe_step: t (trainer steps). buffer_size: N >= 1. rollouts_per_step: R >= 1.
        unit: 0 sequence, 1 group.
    """

    noise: np.ndarray
    staleness: np.ndarray
    drift: np.ndarray
    g_ref: np.ndarray
    ref_sq_error: float
    probe_step: int
    buffer_size: int
    rollouts_per_step: int
    unit: int


@dataclass(frozen=True)
class _StalenessSums:
    """One probe's noise aggregated by staleness 0..h-1 (theory.md section 4.5).

    Attributes:
        sq: (n,) ||e_i||^2 per sample (squared gradient units, >= 0).
        counts: (h,) float, samples per staleness (>= 0); h = max staleness + 1.
        sums: (h, D) S_s = sum of the e_i with staleness s.
        sq_by: (h,) sum of ||e_i||^2 over the samples with staleness s.
    """

    sq: np.ndarray
    counts: np.ndarray
    sums: np.ndarray
    sq_by: np.ndarray


def measure_probe(noise, staleness, drift, g_ref, ref_sq_error: float, drawn, *,
                  probe_step: int, buffer_size: int, rollouts_per_step: int,
                  unit: int = UNIT_SEQUENCE, tables=TABLES) -> dict[str, dict[str, np.ndarray]]:
    """Probe rows from one probe's noise vectors (section 4 quantities, ``probes`` layout).

    Args:
        noise: (n, D) array, e_i = G(theta_t, z_i) - g_ref for the n rollouts in the buffer.
        staleness: (n,) integers >= 0, t minus the step that generated each rollout; rollouts
            inserted at the same step share a staleness, so the insertion gap of a pair is
            the difference of their staleness values.
        drift: (n,) ||theta_t - theta_{t - s_i}|| per rollout (parameter-norm units, >= 0).
        g_ref: (D,) the reference gradient. ref_sq_error: estimated ||g_ref - grad F||^2 >= 0.
        drawn: slot indices (into ``noise``) of the minibatch drawn at this step, repeats
            allowed; may be empty if no minibatch row is wanted.
        probe_step: t. buffer_size: N. rollouts_per_step: R. unit: 0 sequence, 1 group.
        tables: which tables to fill (any of "noise", "coupling", "bias", "minibatch").
    Returns:
        {table: {column: 1-d array}} with the required columns of each table asked for.
    """
    p = _check_probe_inputs(noise, staleness, drift, g_ref, ref_sq_error,
                           probe_step=probe_step, buffer_size=buffer_size,
                           rollouts_per_step=rollouts_per_step, unit=unit)
    for name in tables:
        checks.choice("tables", name, TABLES)
    agg = _staleness_sums(p.noise, p.staleness)
    out: dict[str, dict[str, np.ndarray]] = {}
    if "noise" in tables:
        out["noise"] = _noise_rows(p, agg)
    if "coupling" in tables:
        out["coupling"] = _coupling_rows(p, agg)
    if "bias" in tables:
        out["bias"] = _bias_rows(p, agg)
    if "minibatch" in tables:
        out["minibatch"] = _minibatch_rows(p, agg, drawn)
    return out


def _check_probe_inputs(noise, staleness, drift, g_ref, ref_sq_error: float, *, probe_step: int,
                       buffer_size: int, rollouts_per_step: int, unit: int) -> _ProbeInputs:
    """Validate and convert ``measure_probe``'s arguments (same meanings and ranges there).

    Raises ValueError naming the parameter: noise not (n, D) with n >= 1, staleness or drift
    not of shape (n,), a staleness < 0, ref_sq_error < 0, buffer_size or rollouts_per_step < 1.
    """
    e = np.asarray(noise, dtype=float)
    if e.ndim != 2 or e.shape[0] < 1:
        raise ValueError(f"noise must be an (n, D) array with n >= 1, got shape {e.shape}")
    n = e.shape[0]
    stal = np.asarray(staleness, dtype=np.int64)
    dr = np.asarray(drift, dtype=float)
    if stal.shape != (n,) or dr.shape != (n,):
        raise ValueError(f"staleness and drift must have shape ({n},), got {stal.shape} and "
                         f"{dr.shape}")
    if np.any(stal < 0):
        raise ValueError("staleness must be >= 0 everywhere")
    g = np.asarray(g_ref, dtype=float)
    ref_err = checks.nonnegative("ref_sq_error", ref_sq_error)
    n_buf = checks.integer("buffer_size", buffer_size, 1)
    r = checks.integer("rollouts_per_step", rollouts_per_step, 1)
    return _ProbeInputs(noise=e, staleness=stal, drift=dr, g_ref=g, ref_sq_error=ref_err,
                       probe_step=probe_step, buffer_size=n_buf, rollouts_per_step=r,
                       unit=unit)


def _staleness_sums(e: np.ndarray, stal: np.ndarray) -> _StalenessSums:
    """Squared norms of the (n, D) noise ``e`` and their sums per staleness ``stal`` (>= 0)."""
    sq = np.einsum("ij,ij->i", e, e)
    h = int(stal.max()) + 1
    counts = np.bincount(stal, minlength=h).astype(float)
    sums = np.zeros((h, e.shape[1]))
    np.add.at(sums, stal, e)
    sq_by = np.bincount(stal, weights=sq, minlength=h)
    return _StalenessSums(sq=sq, counts=counts, sums=sums, sq_by=sq_by)


def _noise_rows(p: _ProbeInputs, agg: _StalenessSums) -> dict[str, np.ndarray]:
    """``noise`` rows, one per buffer sample: ||e_i||^2 with its staleness and drift (8.1)."""
    n = p.noise.shape[0]
    return {"probe_step": np.full(n, p.probe_step, float),
            "staleness": p.staleness.astype(float),
            "drift": p.drift, "sq_noise": agg.sq, "ref_sq_error": np.full(n, p.ref_sq_error),
            "unit": np.full(n, p.unit, float)}


def _coupling_rows(p: _ProbeInputs, agg: _StalenessSums) -> dict[str, np.ndarray]:
    """``coupling`` rows, one per insertion gap with a pair: mean <e_i, e_j> over the pairs
    of distinct slots at that gap (the pair-averaged correlation c_bar of theory.md
    section 4.5; A3's gap, section 4.2). ``n_pairs`` counts unordered pairs."""
    counts, sq_by = agg.counts, agg.sq_by
    h = counts.size
    # Ordered pairs of distinct slots, aggregated by |staleness difference| through
    # per-staleness sums: sum_{i in a, j in b} <e_i, e_j> = <S_a, S_b>.
    gram = agg.sums @ agg.sums.T
    a, b = np.indices((h, h))
    gap = np.abs(a - b).ravel()
    pairs = np.outer(counts, counts).ravel()
    inner = gram.ravel()
    sqsum = ((sq_by[:, None] * counts[None, :] + counts[:, None] * sq_by[None, :]) / 2).ravel()
    same = np.arange(h)
    pairs_g = np.bincount(gap, weights=pairs, minlength=h)
    inner_g = np.bincount(gap, weights=inner, minlength=h)
    sq_g = np.bincount(gap, weights=sqsum, minlength=h)
    pairs_g[0] -= counts[same].sum()
    inner_g[0] -= sq_by.sum()
    sq_g[0] -= sq_by.sum()
    keep = pairs_g > 0
    k = int(keep.sum())
    return {
        "probe_step": np.full(k, p.probe_step, float), "gap": np.flatnonzero(keep).astype(float),
        "n_pairs": pairs_g[keep] / 2, "mean_inner": inner_g[keep] / pairs_g[keep],
        "mean_sq": sq_g[keep] / pairs_g[keep], "ref_sq_error": np.full(k, p.ref_sq_error),
        "buffer_size": np.full(k, p.buffer_size, float),
        "rollouts_per_step": np.full(k, p.rollouts_per_step, float),
        "unit": np.full(k, p.unit, float)}


def _bias_rows(p: _ProbeInputs, agg: _StalenessSums) -> dict[str, np.ndarray]:
    """``bias`` rows, one per staleness held by >= 2 samples: the squared norm of their mean
    noise and its cosine with g_ref (the stale bias of A2, theory.md sections 4.2 and
    8.9.4); cos_grad is 0 where either norm is 0."""
    counts, g = agg.counts, p.g_ref
    ok = counts >= 2
    mean_vec = agg.sums[ok] / counts[ok, None]
    drift_by = np.bincount(p.staleness, weights=p.drift, minlength=counts.size)[ok] / counts[ok]
    g_norm = float(np.linalg.norm(g))
    m_norm = np.linalg.norm(mean_vec, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where((m_norm > 0) & (g_norm > 0), mean_vec @ g / (m_norm * g_norm), 0.0)
    k = int(ok.sum())
    return {"probe_step": np.full(k, p.probe_step, float),
            "staleness": np.flatnonzero(ok).astype(float), "drift": drift_by,
            "n_samples": counts[ok], "mean_sq": m_norm**2,
            "noise_sq": agg.sq_by[ok] / counts[ok], "grad_sq": np.full(k, g_norm**2),
            "cos_grad": cos, "ref_sq_error": np.full(k, p.ref_sq_error),
            "unit": np.full(k, p.unit, float)}


def _minibatch_rows(p: _ProbeInputs, agg: _StalenessSums, drawn) -> dict[str, np.ndarray]:
    """The ``minibatch`` row: ||mean of the drawn samples' noise||^2 (the batch error of
    theory.md section 4.5) with x = N/R, y = B/R (section 5.1) and sigma_bar^2 = mean ||e_i||^2.

    ``drawn``: B >= 1 slot indices in [0, n - 1], repeats allowed; raises ValueError otherwise.
    """
    n = p.noise.shape[0]
    n_buf, r = p.buffer_size, p.rollouts_per_step
    idx = np.asarray(drawn, dtype=np.int64)
    if idx.size == 0:
        raise ValueError("drawn must hold the minibatch's slot indices for a minibatch row")
    if np.any((idx < 0) | (idx >= n)):
        raise ValueError(f"drawn indices must be in [0, {n - 1}]")
    err = p.noise[idx].mean(axis=0)
    b = idx.size
    return {"probe_step": np.array([p.probe_step], float),
            "horizon": np.array([n_buf / r]), "replay_ratio": np.array([b / r]),
            "batch_size": np.array([b], float),
            "buffer_size": np.array([n_buf], float),
            "rollouts_per_step": np.array([r], float),
            "sq_error": np.array([float(err @ err)]),
            "ref_sq_error": np.array([p.ref_sq_error]),
            "sigma_bar2": np.array([float(agg.sq.mean())])}


def measure_reuse(noise_now, ins_now, noise_then, ins_then, *, probe_step: int, gap: int,
                  uses, unit: int = UNIT_SEQUENCE) -> dict[str, np.ndarray]:
    """``reuse`` rows (``probes`` layout; theory.md section 10.7) from two probes of one run.

    A slot holds the same rollout at both probes when its insertion step is the same; those
    rollouts get one row each with <eps_t, eps_{t-g}> and both squared norms.

    Args:
        noise_now, noise_then: (n, D) and (m, D) noise vectors per buffer slot at t and t - g.
        ins_now, ins_then: (n,) and (m,) insertion steps per slot. probe_step: t. gap: g >= 1.
        uses: (n,) training uses of each slot's rollout before t. unit: 0 sequence, 1 group.
    """
    g = checks.integer("gap", gap, 1)
    now, then = np.asarray(noise_now, float), np.asarray(noise_then, float)
    ins_now, ins_then = np.asarray(ins_now), np.asarray(ins_then)
    k = min(now.shape[0], then.shape[0])
    same = np.flatnonzero((ins_now[:k] == ins_then[:k]) & (ins_now[:k] >= 0))
    a, b = now[same], then[same]
    rows = same.size
    return {"probe_step": np.full(rows, probe_step, float), "gap": np.full(rows, g, float),
            "staleness": (probe_step - ins_now[same]).astype(float),
            "uses": np.asarray(uses, float)[same], "inner": np.einsum("ij,ij->i", a, b),
            "sq_now": np.einsum("ij,ij->i", a, a), "sq_then": np.einsum("ij,ij->i", b, b),
            "unit": np.full(rows, unit, float)}


def measure_contribution(kept, clip_fraction, is_weight, staleness, uses, *, probe_step: int,
                         unit: int = UNIT_SEQUENCE) -> dict[str, np.ndarray]:
    """``contribution`` rows (``probes`` layout; theory.md section 10.7), one per rollout.

    Args: kept: <G_clip, G_unclip> / ||G_unclip||^2 per rollout. clip_fraction: share of its
    tokens outside the clip range, in [0, 1]. is_weight: mean importance ratio. staleness,
    uses: per rollout (steps, earlier uses). All (n,) arrays; probe_step: t.
    """
    cols = {"contribution": kept, "clip_fraction": clip_fraction, "is_weight": is_weight,
            "staleness": staleness, "uses": uses}
    out = {name: np.asarray(col, dtype=float) for name, col in cols.items()}
    n = out["contribution"].size
    if any(col.shape != (n,) for col in out.values()):
        raise ValueError(f"kept, clip_fraction, is_weight, staleness and uses must all have "
                         f"shape ({n},)")
    return {"probe_step": np.full(n, probe_step, float), **out, "unit": np.full(n, unit, float)}


def concat_rows(parts: list[dict[str, dict[str, np.ndarray]]],
                extra: list[dict[str, float]] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Stack the rows of several ``measure_probe`` results table by table.

    ``extra``: per part, constant columns to add to each of its rows (e.g. a run id).
    """
    tables: dict[str, dict[str, list]] = {}
    for i, part in enumerate(parts):
        for name, cols in part.items():
            rows = len(next(iter(cols.values())))
            dest = tables.setdefault(name, {})
            more = {} if extra is None else {k: np.full(rows, float(val))
                                             for k, val in extra[i].items()}
            for c, col in {**cols, **more}.items():
                dest.setdefault(c, []).append(np.asarray(col, dtype=float))
    return {name: {c: np.concatenate(cols) for c, cols in t.items()}
            for name, t in tables.items()}


__all__ = ["measure_probe", "measure_reuse", "measure_contribution", "concat_rows", "TABLES"]
