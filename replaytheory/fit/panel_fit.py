"""Constants of the horizon model from long-range panel probes (theory.md section 11.3).

A panel is a set of on-policy groups made at a birth step and never trained on, measured
again 1 ... 256 steps later (``probes`` tables ``panel``, ``diversity`` and the ``bias`` rows of
method 2). Per gap g (the staleness, at use count 0) this module estimates

* sigma2(g): the squared noise of one sequence's trained (clipped) gradient;
* c(g): the correlation of one sequence's noise now with its noise at birth;
* c_mate(g): the same between a sequence now and a group mate at birth;
* r(g): the correlation of two sequences of one group at the same step (batch diversity);
* kept(g): the share of the unclipped gradient the clipped loss keeps (section 10.4's f);
* align(g): the component of the panel's mean gradient along grad F, over ||grad F||^2
  (1 for a fresh sample; below 1 when stale samples point elsewhere);
* the stale bias as a norm ratio ||bias|| / ||grad F|| and a cosine with grad F (8.9.4).

Every squared norm is net of the reference error. Intervals are 95% percentile intervals of a
cluster bootstrap over panels: a cluster is one (run, birth step), whose rows share the panel's
rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bootstrap import _boot_weights, _interval
from .probes import UNIT_SEQUENCE, ProbeSet

MIN_PANELS = 2


@dataclass(frozen=True)
class Curve:
    """A quantity per gap: values at ``gaps`` (steps) with 95% bootstrap intervals."""

    gaps: tuple
    value: tuple
    low: tuple
    high: tuple

    def to_dict(self) -> dict:
        return {"gaps": list(self.gaps), "value": list(self.value), "low": list(self.low),
                "high": list(self.high)}


@dataclass(frozen=True)
class PanelFit:
    """What the panels measured (module docstring), per gap, with the group size G and the
    numbers of panels and sequence rows behind it."""

    sigma2: Curve
    corr: Curve
    corr_mate: Curve
    within: Curve
    kept: Curve
    align: Curve
    bias_ratio: Curve
    bias_cos: Curve
    group_size: int
    n_panels: int
    n_rows: int

    CURVES = ("sigma2", "corr", "corr_mate", "within", "kept", "align", "bias_ratio",
              "bias_cos")

    def to_dict(self) -> dict:
        out = {name: getattr(self, name).to_dict() for name in self.CURVES}
        return {**out, "group_size": self.group_size, "n_panels": self.n_panels,
                "n_rows": self.n_rows}

    @classmethod
    def from_dict(cls, d: dict) -> "PanelFit":
        """The fit written by ``to_dict`` (a registration's ``horizon_model.panel_fit``)."""
        curves = {name: Curve(**{k: tuple(v) for k, v in d[name].items()})
                  for name in cls.CURVES}
        return cls(**curves, group_size=int(d["group_size"]), n_panels=int(d["n_panels"]),
                   n_rows=int(d["n_rows"]))


def _panel_ids(t: dict) -> tuple[np.ndarray, int]:
    """Cluster index per row: one cluster per (run, birth step)."""
    run = t.get("run", np.zeros(len(t["birth_step"])))
    keys = np.stack([run, t["birth_step"]], axis=1)
    _, ids = np.unique(keys, axis=0, return_inverse=True)
    return ids.reshape(-1), int(ids.max()) + 1 if ids.size else 0


def _sums(ids, gap_idx, n_c, n_g, w, *values) -> list[np.ndarray]:
    """Per bootstrap replicate (rows of ``w``, (B, clusters)) and gap: weighted sums."""
    flat = ids * n_g + gap_idx
    out = []
    for val in values:
        per = np.bincount(flat, weights=val, minlength=n_c * n_g).reshape(n_c, n_g)
        out.append(w @ per)
    return out


def _curve(gaps, reps: np.ndarray) -> Curve:
    """Curve from replicates (B, gaps), row 0 the data's own value."""
    lo, hi = zip(*(_interval(reps[1:, k]) for k in range(reps.shape[1])))
    return Curve(tuple(float(g) for g in gaps), tuple(float(x) for x in reps[0]),
                 tuple(float(x) for x in lo), tuple(float(x) for x in hi))


def _sequence_curves(t, gaps, w, ids, n_c) -> dict:
    """sigma2, c, c_mate and kept per gap from the sequence rows of the panel table."""
    gi = np.searchsorted(gaps, t["gap"])
    ng = len(gaps)
    now = t["sq_noise"] - t["ref_sq_error"]
    then = t["sq_birth"] - t["ref_sq_error_birth"]
    n, s_now, s_then, inner, mates, n_mates, kept, full = _sums(
        ids, gi, n_c, ng, w, np.ones(len(gi)), now, then, t["inner_birth"],
        t["inner_mates"], t["n_mates"], t["contribution"] * t["sq_unclip"], t["sq_unclip"])
    with np.errstate(divide="ignore", invalid="ignore"):
        sig_now, sig_then = s_now / n, s_then / n
        scale = np.sqrt(np.clip(sig_now * sig_then, 0, None))
        return {"sigma2": sig_now, "corr": inner / n / scale,
                "corr_mate": mates / n_mates / scale, "kept": kept / full}


def _diversity_curve(d, gaps, w, ids, n_c) -> np.ndarray:
    """r(g) = (within - ref) / (mean_sq - ref), pooled over the panel measurements."""
    gi = np.searchsorted(gaps, d["gap"])
    within, total = _sums(ids, gi, n_c, len(gaps), w, d["within_inner"] - d["ref_sq_error"],
                          d["mean_sq"] - d["ref_sq_error"])
    with np.errstate(divide="ignore", invalid="ignore"):
        return within / total


def _bias_curves(b, gaps, w, ids, n_c) -> dict:
    """align, bias norm ratio and cosine per gap from the panel's bias rows (section 8.9.4)."""
    gi = np.searchsorted(gaps, b["staleness"])
    n = b["n_samples"]
    inner_m = b["cos_grad"] * np.sqrt(b["mean_sq"] * b["grad_sq"])  # <mean eps, g_ref>
    bias_sq = (b["mean_sq"] - b["noise_sq"] / n) / (1 - 1 / n) - b["ref_sq_error"]
    grad_f = b["grad_sq"] - b["ref_sq_error"]
    along = inner_m + b["ref_sq_error"]  # <bias, grad F>
    s_bias, s_grad, s_along = _sums(ids, gi, n_c, len(gaps), w, bias_sq, grad_f, along)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"align": 1 + s_along / s_grad,
                "bias_ratio": np.sqrt(np.clip(s_bias, 0, None) / s_grad),
                "bias_cos": s_along / np.sqrt(np.clip(s_bias, 0, None) * s_grad)}


def fit_panels(probes: ProbeSet, *, n_boot: int = 400, seed: int = 0) -> PanelFit:
    """Every panel quantity per measured gap (module docstring), from ``probes`` with the
    ``panel``, ``diversity`` and method-2 ``bias`` rows of at least ``MIN_PANELS`` panels
    (merged runs carry a ``run`` column). n_boot >= 1 bootstrap replicates over panels."""
    t = {c: col[probes.tables["panel"]["unit"] == UNIT_SEQUENCE]
         for c, col in probes.tables["panel"].items()}
    ids, n_c = _panel_ids(t)
    if n_c < MIN_PANELS:
        raise ValueError(f"probes.panel must hold at least {MIN_PANELS} panels (run, birth "
                         f"step) for the horizon fit, got {n_c}")
    gaps = np.unique(t["gap"])
    w = _boot_weights(n_c, n_boot, seed)
    # Other tables map to the same clusters through (run, birth).
    keys = {k: i for i, k in enumerate(sorted(set(zip(t.get("run", np.zeros(len(ids))),
                                                       t["birth_step"]))))}
    d = probes.tables["diversity"]
    d_ids = np.array([keys[k] for k in zip(d.get("run", np.zeros(len(d["gap"]))),
                                          d["birth_step"])], dtype=int)
    b = {c: col[probes.tables["bias"]["method"] == 2] for c, col in probes.tables["bias"].items()}
    births = b["probe_step"] - b["staleness"]
    b_ids = np.array([keys[k] for k in zip(b.get("run", np.zeros(len(births))), births)],
                     dtype=int)
    seq = _sequence_curves(t, gaps, w, ids, n_c)
    bias = _bias_curves(b, gaps, w, b_ids, n_c)
    within = _diversity_curve(d, gaps, w, d_ids, n_c)
    curves = {**{k: _curve(gaps, v) for k, v in {**seq, **bias}.items()},
              "within": _curve(gaps, within)}
    group = float(np.median(d["group_size"]))
    return PanelFit(**curves, group_size=int(round(group)), n_panels=n_c, n_rows=len(ids))
