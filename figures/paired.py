"""Prediction and measurement together: figures of the paired validation.

Reads the committed compact results (``results/cpu_sweep/``: ``curves.jsonl`` from the sweep,
``validation.json`` from ``llm_experiments.study.validation``, ``histograms.jsonl`` and the
calibration probes) and writes into ``figures/out/``:

* ``paired_accuracy_vs_compute``: median eval accuracy and IQR band over seeds against
  compute, on-policy vs the best buffer cells, one panel per mu (paper Fig. 1/3 left);
* ``paired_heatmaps``: tail accuracy and compute to target over (x, y), best learning rate per
  cell, with the predicted optimum marked (paper Fig. 3 right / 14);
* ``paired_pareto``: accuracy against compute over learning rates, buffer vs on-policy
  (paper Fig. 4);
* ``paired_passk``: pass@k gain over on-policy against k (paper Fig. 3 middle);
* ``paired_histograms``: the three axes (off-policiness, replay ratio, steps since last use)
  for several N and (W, T) from the harness (paper Fig. 2);
* ``paired_noise``: measured sigma^2(s) against staleness with the fitted power law, and the
  noise correlation against insertion gap with the fitted rho;
* ``paired_j_vs_measured``: predicted J against measured compute to target, one point a cell.

Run: ``python -m figures.paired [--results DIR] [--out DIR]``.
"""

from __future__ import annotations

import glob
import json
import math
import os
from pathlib import Path

import numpy as np

from figures.style import ON_POLICY_COLOR, PALETTE, figure_parser, plt, save
from llm_experiments.study.cells import (TARGET, cell_scores, compute_score, kind, measured_mu,
                                         tail_score)
from llm_experiments.study.results import load_runs
from llm_experiments.study.validation import load_probes
from replaytheory import calibrate
from replaytheory.stats.analysis import curves_on_grid, median_iqr

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cpu_sweep"


def validation_mus(runs, results_dir, loss: str = "grpo") -> list:
    """The loss's mu values of the validation: measured, then the accounting values."""
    mus = sorted({r["mu"] for r in _validation(results_dir) if "mu" in r and r["loss"] == loss})
    if mus:
        return mus
    mine = [r for r in runs if r.get("trainer.loss") == loss]
    return [round(measured_mu(mine), 3), 2.0, 6.84]


def _band(ax, runs, mu, color, label, grid):
    curves = [(r.compute(mu), r.eval["eval_accuracy"]) for r in runs]
    vals = curves_on_grid(curves, grid)
    med, lo, hi = median_iqr(vals, axis=0)
    ax.plot(grid, med, color=color, label=label)
    ax.fill_between(grid, lo, hi, color=color, alpha=0.2, linewidth=0)


def accuracy_vs_compute(runs, mus, out_dir=None, loss="grpo"):
    runs = [r for r in runs if r.get("trainer.loss") == loss]
    fig, axes = plt.subplots(1, len(mus), figsize=(3.6 * len(mus), 3.1), sharey=True)
    for ax, mu in zip(np.atleast_1d(axes), mus):
        scores = cell_scores(runs, compute_score(mu), "min")
        onp = [c for c in scores if c.kind == "on_policy"]
        grid_cells = sorted((c for c in scores if c.kind == "grid"), key=lambda c: c.median)
        chosen = onp + grid_cells[:3]
        top = max(float(np.nanmax(r.compute(mu))) for c in chosen for r in c.runs)
        grid = np.linspace(0, top, 200)
        for i, c in enumerate(chosen):
            color = ON_POLICY_COLOR if c.kind == "on_policy" else PALETTE[1 + i % 6]
            _band(ax, c.runs, mu, color, f"{c.label} (lr {c.lr:g})", grid)
        ax.axhline(TARGET, color="grey", ls=":", lw=0.8)
        ax.set(xlabel=f"compute (trainer updates, mu={mu:g})", title=f"mu = {mu:g}")
        ax.legend(fontsize=6.5, loc="lower right")
    np.atleast_1d(axes)[0].set_ylabel("held-out accuracy (median, IQR)")
    fig.suptitle(f"{loss}: on-policy vs the three buffer cells fastest to {TARGET:g}",
                 fontsize=9)
    return save(fig, f"paired_accuracy_vs_compute_{loss}", out_dir)


def _grid_matrix(scores):
    xs = sorted({c.horizon for c in scores if c.kind == "grid"})
    ys = sorted({c.replay_ratio for c in scores if c.kind == "grid"})
    m = np.full((len(ys), len(xs)), np.nan)
    for c in scores:
        if c.kind == "grid":
            m[ys.index(c.replay_ratio), xs.index(c.horizon)] = c.median
    return xs, ys, m


def _validation(results_dir) -> list[dict]:
    """The records of ``validation.json`` ([] when the validation has not been run)."""
    path = Path(results_dir) / "validation.json"
    if not path.exists():
        return []
    with open(path) as fh:
        return json.load(fh)


def _predictions(results_dir, loss, mu):
    return [r for r in _validation(results_dir) if r["loss"] == loss and "mu" in r
            and math.isclose(r["mu"], mu, rel_tol=1e-6)]


def heatmaps(runs, mus, results_dir, out_dir=None, loss="grpo"):
    runs = [r for r in runs if r.get("trainer.loss") == loss]
    panels = [("tail accuracy", cell_scores(runs, tail_score, "max"), None)]
    for mu in mus:
        scores = cell_scores(runs, compute_score(mu), "min")
        onp = [c.median for c in scores if c.kind == "on_policy"]
        extra = f"\n(on-policy {onp[0]:.0f})" if onp else ""
        panels.append((f"compute to {TARGET:g}, mu={mu:.3g}{extra}", scores, mu))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.8),
                             layout="constrained")
    markers = {"asymptotic": "*", "finite_eta": "P"}
    for ax, (title, scores, mu) in zip(np.atleast_1d(axes), panels):
        xs, ys, m = _grid_matrix(scores)
        finite = np.where(np.isfinite(m), m, np.nan)
        cmap = "viridis" if mu is None else "viridis_r"
        im = ax.imshow(finite, origin="lower", cmap=cmap, aspect="auto")
        for (i, j), val in np.ndenumerate(m):
            text = "inf" if np.isinf(val) else f"{val:.2f}" if mu is None else f"{val:.0f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=6, color="w")
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
        ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
        ax.set(xlabel="horizon x = N/R (steps)", ylabel="replay ratio y = B/R", title=title)
        ax.grid(False)
        if np.any(np.isfinite(finite)):
            bi, bj = np.unravel_index(np.nanargmin(finite) if mu is not None
                                      else np.nanargmax(finite), finite.shape)
            ax.plot(bj, bi, "s", mfc="none", mec="k", ms=16, mew=1.5, label="measured best")
        if mu is not None:
            # Variants that predict the same point share one marker.
            points: dict = {}
            for rec in _predictions(results_dir, loss, mu):
                key = (round(rec["predicted_horizon"], 6), round(rec["predicted_replay_ratio"], 6))
                points.setdefault(key, []).append(rec["variant"])
            for (hx, hy), names in points.items():
                px = np.interp(np.log(max(hx, 1e-9)), np.log(xs), np.arange(len(xs)))
                py = np.interp(np.log(max(hy, 1e-9)), np.log(ys), np.arange(len(ys)))
                ax.plot(px, py, markers.get(names[0], "X"), color="r", ms=9, mec="w",
                        label=" = ".join(names) + f" ({hx:.3g}, {hy:.3g})")
        ax.legend(fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1,
                  frameon=False)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"{loss}: best learning rate per cell, median over seeds; markers: predicted "
                 "optimum (clipped to the grid)", fontsize=8)
    return save(fig, f"paired_heatmaps_{loss}", out_dir)


def pareto(runs, mu, out_dir=None, loss="grpo"):
    """The Pareto frontier of accuracy against compute over (cell, learning rate): the upper
    envelope of the median curves, on-policy vs buffer (claim 1 counts where one is above)."""
    runs = [r for r in runs if r.get("trainer.loss") == loss]
    top = max(float(r.compute(mu)[-1]) for r in runs)
    grid = np.linspace(0, top, 200)
    fig, ax = plt.subplots(figsize=(4.6, 3.4))
    for label, kinds, color in (("on-policy", ("on_policy",), ON_POLICY_COLOR),
                                ("buffer", ("grid", "delta"), PALETTE[2])):
        envelope = np.full(grid.size, -np.inf)
        for cell_runs in _cells_by_lr(runs, kinds):
            curves = [(r.compute(mu), r.eval["eval_accuracy"]) for r in cell_runs]
            med = median_iqr(curves_on_grid(curves, grid), axis=0)[0]
            ax.plot(grid, med, color=color, alpha=0.15, lw=0.6)
            envelope = np.fmax(envelope, med)
        if np.any(np.isfinite(envelope)):
            ax.plot(grid, envelope, color=color, lw=1.8, label=f"{label} frontier")
    ax.set(xlabel=f"compute (trainer updates, mu={mu:g})",
           ylabel="held-out accuracy (median over seeds)",
           title=f"{loss}: frontier over cells and learning rates")
    ax.legend()
    return save(fig, f"paired_pareto_{loss}", out_dir)


def _cells_by_lr(runs, kinds):
    groups = {}
    for r in runs:
        if kind(r) in kinds:
            groups.setdefault((r.cell, r.lr), []).append(r)
    return list(groups.values())


def passk(runs, mu, out_dir=None, loss="grpo"):
    runs = [r for r in runs if r.get("trainer.loss") == loss]
    scores = cell_scores(runs, compute_score(mu), "min")
    onp = [c for c in scores if c.kind == "on_policy"]
    if not onp:
        raise FileNotFoundError("no on-policy runs in the results")
    ks = [1, 2, 4, 8, 16]

    def final_passk(cell):
        return np.array([[r.eval[f"pass@{k}"][-1] for k in ks] for r in cell.runs])

    base = np.median(final_passk(onp[0]), axis=0)
    fig, ax = plt.subplots(figsize=(4.4, 3.2))
    grid_cells = sorted((c for c in scores if c.kind == "grid"), key=lambda c: c.median)[:4]
    for i, c in enumerate(grid_cells):
        gain = final_passk(c) - base
        med, lo, hi = median_iqr(gain, axis=0)
        ax.errorbar(ks, med, yerr=[med - lo, hi - med], capsize=2, marker="o", ms=3,
                    color=PALETTE[1 + i], label=c.label)
    ax.axhline(0, color=ON_POLICY_COLOR, lw=0.8)
    ax.set(xscale="log", xticks=ks, xticklabels=[str(k) for k in ks], xlabel="k",
           ylabel="pass@k gain over on-policy (final)", title=f"{loss}: diversity")
    ax.legend(fontsize=7)
    return save(fig, f"paired_passk_{loss}", out_dir)


def histograms(results_dir, out_dir=None):
    path = Path(results_dir) / "histograms.jsonl"
    if not path.exists():
        raise FileNotFoundError(path)
    with open(path) as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    axes_names = [("off_policiness", "off-policiness (steps)"),
                  ("replay_ratio", "replay ratio (uses per rollout)"),
                  ("steps_since_last_use", "steps since last use")]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.0))
    for i, rec in enumerate(recs):
        for ax, (key, title) in zip(axes, axes_names):
            h = rec["histograms"][key]
            new = h.pop("new", 0) if key == "steps_since_last_use" else 0
            xs = np.array(sorted(int(k) for k in h))
            counts = np.array([h[str(k)] if str(k) in h else h[k] for k in xs], dtype=float)
            total = counts.sum() + new
            ax.step(xs, counts / total, where="mid", color=PALETTE[(i + 1) % 8],
                    label=rec["label"])
            if new:
                ax.plot([-1], [new / total], "o", color=PALETTE[(i + 1) % 8], ms=3)
            ax.set(title=title, yscale="log")
    axes[0].set_ylabel("fraction")
    axes[2].set_xlabel("(dot at -1: first use)")
    axes[1].legend(fontsize=6.5)
    return save(fig, "paired_histograms", out_dir)


def noise(results_dir, out_dir=None, loss="grpo"):
    """The calibration of ``loss`` from its committed probes: sigma^2(s) per staleness bin
    (mean with bootstrap 95% interval, median) with the power law, and the noise correlation
    of buffer samples against the insertion gap with rho."""
    paths = glob.glob(os.path.join(results_dir, "calibration", f"*{loss}*.npz"))
    probes = load_probes(paths)
    cal = calibrate(probes, probes.counts)
    n, c = cal.noise, cal.coupling
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    b = n.bins
    s = np.asarray(b["staleness"], float)
    a1.errorbar(s, b["mean"], yerr=[np.asarray(b["mean"]) - b["ci_low"],
                                    np.asarray(b["ci_high"]) - b["mean"]],
                fmt="o", ms=3, color=PALETTE[2], label="mean (95% CI)")
    a1.plot(s, b["median"], "s", ms=3, color=PALETTE[5], label="median")
    if np.isfinite(n.alpha) and n.tau is not None and np.isfinite(n.tau) and n.tau > 0:
        fit = ((s + n.staleness_offset) / n.tau) ** (2 * n.alpha)
        a1.plot(s, fit, "k-" if n.power_law_ok else "k--",
                label=f"power law, alpha={n.alpha:.3f}" +
                ("" if n.power_law_ok else " (rejected)"))
    else:
        a1.plot([], [], " ", label=f"alpha={n.alpha:.3f}: power law rejected")
    a1.set(xlabel="staleness s (steps)", ylabel="per-sample squared noise",
           yscale="log", title=f"{loss}: sigma^2(s)")
    a1.legend(fontsize=6.5)
    g = c.by_gap
    gap_n = np.asarray(g["gap"], float) / np.asarray(g["buffer_size"], float)
    a2.scatter(gap_n, g["corr"], s=6 + 40 * np.asarray(g["pairs"]) / max(np.max(g["pairs"]), 1),
               color=PALETTE[2], alpha=0.7, label="measured (size: pairs)")
    xs = np.linspace(0, max(gap_n.max(), 1e-9), 50)
    a2.plot(xs, c.rho_gap * xs, "k-" if c.gap_form_ok else "k--",
            label=f"rho gap/N, rho={c.rho_gap:.3f}" + ("" if c.gap_form_ok else " (rejected)"))
    a2.axhline(0, color="0.6", lw=0.8)
    a2.set(xlabel="insertion gap / N", ylabel="noise correlation",
           title=f"{loss}: coupling (effective rho={c.rho_eff:.3f})")
    a2.legend(fontsize=6.5)
    return save(fig, f"paired_noise_{loss}", out_dir)


def j_vs_measured(results_dir, out_dir=None, loss="grpo"):
    """Predicted J against measured compute to target, one labelled point per grid cell, one
    panel per (mu, variant) of ``validation.json`` (cells that never reach the target are
    drawn at the top edge)."""
    recs = [r for r in _validation(results_dir) if r.get("loss") == loss and r.get("cells")]
    if not recs:
        return []
    variants = sorted({r["variant"] for r in recs})
    mus = sorted({r["mu"] for r in recs})
    fig, axes = plt.subplots(len(variants), len(mus), figsize=(3.4 * len(mus),
                             2.9 * len(variants)), layout="constrained", squeeze=False)
    for r in recs:
        ax = axes[variants.index(r["variant"]), mus.index(r["mu"])]
        j = np.array([c["predicted_objective"] for c in r["cells"]], float)
        m = np.array([np.inf if c["measured_compute"] is None else c["measured_compute"]
                      for c in r["cells"]], float)
        top = np.nanmax(m[np.isfinite(m)]) * 1.15 if np.any(np.isfinite(m)) else 1.0
        shown = np.where(np.isfinite(m), m, top)
        ax.scatter(j, shown, s=12, color=np.where(np.isfinite(m), PALETTE[2], "0.6"))
        for c, x, y in zip(r["cells"], j, shown):
            ax.annotate(c["label"].replace("x=", "").replace(" y=", ""), (x, y), fontsize=5,
                        xytext=(2, 2), textcoords="offset points")
        rs = r["spearman"]  # null in JSON when undefined (e.g. constant ranks)
        ax.set(xscale="log" if np.all(j > 0) else "linear",
               title=f"{r['variant']}, mu={r['mu']:.3g}: Spearman "
                     + ("n/a" if rs is None or not math.isfinite(rs) else f"{rs:.2f}"))
        ax.title.set_fontsize(7)
    for ax in axes[-1]:
        ax.set_xlabel("predicted objective")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"compute to {TARGET:g}")
    fig.suptitle(f"{loss}: prediction vs measurement per (x, y) cell (grey: never reached)",
                 fontsize=8)
    return save(fig, f"paired_j_vs_measured_{loss}", out_dir)


def main(out_dir=None, results_dir=RESULTS) -> list:
    """Write every paired figure from the saved results; returns the paths."""
    runs = load_runs(os.path.join(results_dir, "curves.jsonl"))
    paths = []
    for loss in sorted({r.get("trainer.loss") for r in runs}):
        mus = validation_mus(runs, results_dir, loss)
        paths += accuracy_vs_compute(runs, mus, out_dir, loss)
        paths += heatmaps(runs, mus, results_dir, out_dir, loss)
        paths += pareto(runs, mus[-1], out_dir, loss)
        paths += passk(runs, mus[-1], out_dir, loss)
        if (Path(results_dir) / "calibration").is_dir():
            paths += noise(results_dir, out_dir, loss)
        paths += j_vs_measured(results_dir, out_dir, loss)
    paths += histograms(results_dir, out_dir)
    return paths


if __name__ == "__main__":
    p = figure_parser(__doc__)
    p.add_argument("--results", default=str(RESULTS), help="compact results folder")
    a = p.parse_args()
    for path in main(a.out, a.results):
        print(path)
