"""The probe layout: what a run measures for calibration, as plain column tables.

A ``ProbeSet`` holds four core tables and two optional ones (each a dict of equal-length 1-d
numpy arrays) and a dict of run counts. The LLM harness (``llm_experiments``) and the simulators (``replay_sim``) write this
layout; ``calibrate`` reads it. Files: ``.npz`` (one array per ``table/column``) or JSONL (one
record per row, with a ``table`` key; counts in a record with ``table = "counts"``).

Tables and columns (units in brackets; every table may carry extra columns, kept as they are):

``noise``: one row per probed sample (a sequence or a prompt group) at a probe.
    probe_step [trainer step t of the probe], staleness [steps, t - generation step],
    drift [||theta_t - theta_{t-s}||, parameter-norm units], sq_noise
    [||G(theta_t, z) - g_ref||^2, squared gradient units], ref_sq_error [estimated
    ||g_ref - grad F(theta_t)||^2 at that probe; 0 if unknown], unit [0 = sequence, 1 = group];
    optional: uses [training uses of the sampled rollout before the probe step; 0 = never].
``coupling``: one row per (probe, insertion gap) aggregate of sample pairs.
    probe_step, gap [|t_i - t_j| in steps], n_pairs, mean_inner [mean <eps_i, eps_j> over the
    pairs, noise measured against g_ref], mean_sq [mean ||eps||^2 of the samples involved],
    ref_sq_error, buffer_size [N], rollouts_per_step [R], unit. Aggregate all pairs of
    distinct buffer slots (or a uniform sample): the effective rho weights gaps by n_pairs.
``bias``: one row per (probe, staleness) aggregate.
    probe_step, staleness, drift, n_samples, mean_sq [||mean of eps over the samples||^2],
    noise_sq [mean ||eps||^2 of those samples], grad_sq [||g_ref||^2], cos_grad [cosine of the
    mean eps with g_ref], ref_sq_error, unit. The bias estimate is
    (mean_sq - noise_sq / n_samples) / (1 - 1/n_samples) - ref_sq_error (the variance of a
    mean of independent samples and the reference error removed).
``minibatch``: one row per measured training batch.
    probe_step, horizon [x = N/R], replay_ratio [y = B/R], batch_size [B], buffer_size [N],
    rollouts_per_step [R], sq_error [||g_t - g_ref||^2 of the actual minibatch gradient],
    ref_sq_error, sigma_bar2 [mean sq_noise of the buffer's samples at that probe].

``reuse`` (optional): one row per (probe, probed buffer rollout z, gap g): how correlated ONE
    rollout's per-sample noise is with itself at two training steps (a reused sample is not a
    new noise draw). probe_step [t], gap [g >= 1 steps, the evaluations at t and t - g],
    staleness [t - generation step of z], uses [training uses of z before t], inner
    [<eps_t(z), eps_{t-g}(z)>, eps_s(z) = G(theta_s, z) - g_ref(s), squared gradient units],
    sq_now [||eps_t(z)||^2], sq_then [||eps_{t-g}(z)||^2], unit. Only rollouts that existed at
    t - g. The self-correlation at gap g is sum(inner) / sqrt(sum(sq_now) sum(sq_then)) over
    the rows of that gap.
``contribution`` (optional): one row per probed buffer rollout z at a probe: what the clipped
    loss keeps of a stale or reused sample. probe_step [t], staleness [steps], uses [training
    uses before t], clip_fraction [share in [0, 1] of z's completion tokens with non-zero
    advantage whose ratio pi_theta_t / pi_behaviour lies outside the clip range on the side
    where the clip removes the gradient: above 1 + eps_high for A > 0, below 1 - eps_low for
    A < 0, as the training metric clip_fraction], contribution
    [<G_clip(z), G_unclip(z)> / ||G_unclip(z)||^2: G_clip the per-sample gradient of the loss
    trained on, G_unclip the same with the clip removed (plain importance weight); 1 = fully
    kept, 0 = cut], is_weight [mean over z's tokens of the ratio], unit.
``panel`` (optional): long-range probes of a panel of rollouts made at a birth step and never
    trained on, measured again as the policy moves (theory.md section 11.1); one row per
    (measurement, sequence) and per (measurement, group). probe_step [t], birth_step [b], gap
    [g = t - b steps: the staleness at use count 0], unit, sq_noise [||eps_t(z)||^2 against
    g_ref(t)], ref_sq_error [of g_ref(t)], sq_birth [||eps_b(z)||^2 against g_ref(b)],
    inner_birth [<eps_t(z), eps_b(z)>], inner_mates [sum over z's group mates z' of
    <eps_t(z), eps_b(z')>; 0 for group rows], contribution, clip_fraction, is_weight [as in
    ``contribution``, at staleness g and no earlier use].
``diversity`` (optional): one row per panel measurement: the second moments of the panel's
    sequence noise that fix the variance of a batch by how many distinct prompts it holds
    (section 11.2). probe_step, birth_step, gap, n_groups, group_size [sequences per group],
    mean_sq [mean ||eps||^2], within_inner [mean <eps_i, eps_j> over ordered pairs i != j of one
    group], across_inner [the same over pairs of different groups], ref_sq_error (every eps
    carries -e_ref, so both means carry +||e_ref||^2).
``align`` (optional): the inner products of an align measurement (theory.md section 11.15,
    ``llm_experiments.probing.align``). probe_step [t], birth_step [b], gap [t - b], part [0:
    <m_k, r_a>, panel chunk k's mean gradient at t against reference chunk a's; 1: <r_a, r_b>
    for reference chunks a < b], chunk [k, or a], other [a, or b], value, n_seq [sequences of
    the panel, or of the reference]; parts 2, 3, ...: part 0's inner products with the
    panel's gradient under each loss of ``probe.align_variants`` (``ALIGN_VARIANTS``, part
    2 + its index), the same chunks at the same weights.
``align_stats`` (optional, written with ``probe.align_variants``): one row per align panel
    chunk measured: probe_step, birth_step, gap, chunk, clip_fraction, is_ess, approx_kl [as
    ``losses.loss_stats``, over the chunk's tokens], mean_ratio [mean importance ratio over
    its tokens], n_seq [sequences in the chunk].
``align_pairs`` (optional, written with ``probe.align_moments``): per align measurement, the
    same columns as ``align``: parts 0, 2, 3, ...: <m_k, m_l> for panel chunks k <= l under
    that part's loss; part 1: ||r_a||^2 (chunk = other = a) for the reference chunks.
An optional table absent from a file has no rows (files written before they existed load).

Any table may carry ``run`` [id of the run]: a probe is one (run, probe_step), the unit that
``calibrate`` resamples in its bootstrap (rows of one probe share theta and g_ref).
``probe_measure.measure_probe`` builds all four tables from one probe's noise vectors.

``counts`` (dict of numbers): unique_rollouts, samples_consumed, workers, trainers, and
optionally mu_measured, mu_accounting, steps.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..io import atomic_write

SCHEMA: dict[str, tuple[str, ...]] = {
    "noise": ("probe_step", "staleness", "drift", "sq_noise", "ref_sq_error", "unit"),
    "coupling": ("probe_step", "gap", "n_pairs", "mean_inner", "mean_sq", "ref_sq_error",
                 "buffer_size", "rollouts_per_step", "unit"),
    "bias": ("probe_step", "staleness", "drift", "n_samples", "mean_sq", "noise_sq", "grad_sq",
             "cos_grad", "ref_sq_error", "unit"),
    "minibatch": ("probe_step", "horizon", "replay_ratio", "batch_size", "buffer_size",
                  "rollouts_per_step", "sq_error", "ref_sq_error", "sigma_bar2"),
    "reuse": ("probe_step", "gap", "staleness", "uses", "inner", "sq_now", "sq_then", "unit"),
    "contribution": ("probe_step", "staleness", "uses", "clip_fraction", "contribution",
                     "is_weight", "unit"),
    "panel": ("probe_step", "birth_step", "gap", "unit", "sq_noise", "ref_sq_error",
              "sq_birth", "inner_birth", "inner_mates", "contribution", "clip_fraction",
              "is_weight"),
    "diversity": ("probe_step", "birth_step", "gap", "n_groups", "group_size", "mean_sq",
                  "within_inner", "across_inner", "ref_sq_error"),
    "align": ("probe_step", "birth_step", "gap", "part", "chunk", "other", "value", "n_seq"),
    "align_pairs": ("probe_step", "birth_step", "gap", "part", "chunk", "other", "value",
                    "n_seq"),
    "align_stats": ("probe_step", "birth_step", "gap", "chunk", "clip_fraction", "is_ess",
                    "approx_kl", "mean_ratio", "n_seq"),
}
# Tables a run writes only when the matching probes are on; a file without them has no rows
# there, and ``save`` leaves them out when empty so that files of runs without them keep
# their old content.
OPTIONAL_TABLES = ("reuse", "contribution", "panel", "diversity", "align", "align_pairs",
                   "align_stats")
UNIT_SEQUENCE, UNIT_GROUP = 0, 1
# The ``align`` table's parts (theory.md section 11.15): the panel's inner products under the
# training loss, the reference's own, then the panel's under each variant loss in turn:
# "unclipped" keeps the importance ratio and drops the clip; "ratio_one" drops both (the
# gradient of -A log pi at the current weights on the stale rollouts).
ALIGN_PANEL, ALIGN_REFERENCE = 0, 1
ALIGN_VARIANTS = ("unclipped", "ratio_one")


def align_part(variant: str | None) -> int:
    """The ``align`` table's part holding the panel rows of ``variant`` (one of
    ``ALIGN_VARIANTS``; None = the training loss, part 0)."""
    if variant is None:
        return ALIGN_PANEL
    if variant not in ALIGN_VARIANTS:
        raise ValueError(f"variant must be one of {list(ALIGN_VARIANTS)} or None, got "
                         f"{variant!r}")
    return 2 + ALIGN_VARIANTS.index(variant)
COUNT_KEYS = ("unique_rollouts", "samples_consumed", "workers", "trainers")


def empty_table(name: str) -> dict[str, np.ndarray]:
    """A table of the given kind with its required columns and no rows."""
    if name not in SCHEMA:
        raise ValueError(f"table must be one of {sorted(SCHEMA)}, got {name!r}")
    return {c: np.zeros(0) for c in SCHEMA[name]}


@dataclass
class ProbeSet:
    """The probe tables and the run counts (see the module docstring for the columns)."""

    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        for name in SCHEMA:
            self.tables.setdefault(name, empty_table(name))
        self.tables = {name: {c: np.asarray(col, dtype=float) for c, col in t.items()}
                       for name, t in self.tables.items()}
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` on a missing column, ragged table, NaN or negative count."""
        for name, table in self.tables.items():
            if name not in SCHEMA:
                raise ValueError(f"unknown probe table {name!r}; allowed: {sorted(SCHEMA)}")
            missing = [c for c in SCHEMA[name] if c not in table]
            if missing:
                raise ValueError(f"probe table {name!r} lacks columns {missing}")
            lengths = {c: len(col) for c, col in table.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"probe table {name!r} has columns of different lengths "
                                 f"{lengths}")
            for c, col in table.items():
                if col.ndim != 1:
                    raise ValueError(f"probe column {name}.{c} must be 1-d")
                if np.any(np.isnan(col)):
                    raise ValueError(f"probe column {name}.{c} holds NaN "
                                     f"(row {int(np.flatnonzero(np.isnan(col))[0])})")
        for k, val in self.counts.items():
            if not isinstance(val, (int, float)) or isinstance(val, bool) or val != val:
                raise ValueError(f"count {k!r} must be a number, got {val!r}")

    def n_rows(self, name: str) -> int:
        return len(next(iter(self.tables[name].values()), []))

    def extend(self, other: "ProbeSet") -> "ProbeSet":
        """Rows of both sets (columns present in both), counts of ``other`` win."""
        tables = {}
        for name in SCHEMA:
            a, b = self.tables[name], other.tables[name]
            if not other.n_rows(name) or not self.n_rows(name):  # keep the extra columns
                tables[name] = dict(a if self.n_rows(name) else b)
                continue
            cols = [c for c in a if c in b]
            tables[name] = {c: np.concatenate([a[c], b[c]]) for c in cols}
        return ProbeSet(tables, {**self.counts, **other.counts})

    # ---- files -------------------------------------------------------------------------

    def save(self, path) -> None:
        """Write atomically to ``.npz`` or ``.jsonl`` (chosen by the extension)."""
        path = os.fspath(path)
        if path.endswith(".npz"):
            arrays = {f"{n}/{c}": col for n, t in self.tables.items() for c, col in t.items()
                      if n not in OPTIONAL_TABLES or self.n_rows(n)}
            arrays["counts"] = np.array(json.dumps(self.counts))
            atomic_write(path, lambda fh: np.savez_compressed(fh, **arrays), binary=True)
        elif path.endswith(".jsonl"):
            def write(fh):
                fh.write(json.dumps({"table": "counts", **self.counts}) + "\n")
                for name, t in self.tables.items():
                    cols = list(t)
                    for i in range(self.n_rows(name)):
                        fh.write(json.dumps({"table": name,
                                             **{c: float(t[c][i]) for c in cols}}) + "\n")
            atomic_write(path, write)
        else:
            raise ValueError(f"path must end in .npz or .jsonl, got {path!r}")

    @classmethod
    def load(cls, path) -> "ProbeSet":
        """Read a ``.npz`` or ``.jsonl`` written by ``save`` (or by the harness)."""
        path = os.fspath(path)
        if path.endswith(".npz"):
            with np.load(path) as z:
                tables: dict[str, dict] = {}
                counts = json.loads(str(z["counts"])) if "counts" in z.files else {}
                for key in z.files:
                    if "/" in key:
                        name, col = key.split("/", 1)
                        tables.setdefault(name, {})[col] = z[key]
            return cls(tables, counts)
        if path.endswith(".jsonl"):
            rows: dict[str, list[dict]] = {}
            counts = {}
            with open(path) as fh:
                for line_no, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        raise ValueError(f"{path}:{line_no}: not a JSON record") from None
                    name = rec.pop("table", None)
                    if name == "counts":
                        counts.update(rec)
                    elif name is not None:
                        rows.setdefault(name, []).append(rec)
            tables = {}
            for name, recs in rows.items():
                cols = list(recs[0])
                tables[name] = {c: np.array([r.get(c, np.nan) for r in recs], dtype=float)
                                for c in cols}
            return cls(tables, counts)
        raise ValueError(f"path must end in .npz or .jsonl, got {path!r}")
