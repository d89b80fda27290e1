"""Figures of the simulation validation: predicted vs measured, and Fig. 2 histograms.

Reads what ``python -m replaytheory validate-sim --out DIR`` saved, through
``replaytheory.sim.sim_records.load_validation`` (theory.md sections 2 and 5), and draws:

* ``sim_validation_<variant>``: measured loss at the compute budget over the (x, y) grid,
  relative to the best cell (log colour), one panel per mu, with the best cell and each
  design's prediction marked;
* ``sim_pipeline_histograms``: off-policiness, replay ratio and steps-since-last-use from the
  pipeline simulator, for N in {84, 252, 756, 2268} at (W, T) = (6, 2) and N = 252 at
  (6, 2), (5, 3), (4, 4).

Usage: ``python -m figures.sim_validation DIR [--out OUT]`` (default OUT: figures/out).
"""

from __future__ import annotations

import argparse

import numpy as np

from figures import style
from replaytheory.sim.sim_records import PipelineRun, VariantResult, load_validation
from replaytheory.sim.validate_sim import DESIGNS

MARKERS = dict(zip(DESIGNS, [("o", "tab:red"), ("s", "tab:blue"), ("^", "tab:green")]))


def _edges(values: np.ndarray) -> np.ndarray:
    """Cell edges on a log axis: geometric midpoints, extended by half a step at the ends."""
    lv = np.log(values)
    mid = (lv[1:] + lv[:-1]) / 2
    first = lv[0] - (mid[0] - lv[0]) if lv.size > 1 else lv[0] - 0.3
    last = lv[-1] + (lv[-1] - mid[-1]) if lv.size > 1 else lv[-1] + 0.3
    return np.exp(np.concatenate([[first], mid, [last]]))


def draw_heatmaps(variant: VariantResult, out_dir: str | None = None) -> list[str]:
    """One panel per mu: loss at budget / best loss over (x, y), predictions marked."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    style.apply()
    grid = variant.grid
    xs, ys = grid.horizon, grid.replay_ratio
    ux, uy = np.unique(xs), np.unique(ys)
    mus = grid.mus
    fig, axes = plt.subplots(1, len(mus), figsize=(3.3 * len(mus), 2.9), squeeze=False)
    for m, (mu, ax) in enumerate(zip(mus, axes[0])):
        loss = grid.loss[m]
        best = grid.best(m)
        img = np.full((uy.size, ux.size), np.nan)
        img[np.searchsorted(uy, ys), np.searchsorted(ux, xs)] = np.log10(loss / loss[best])
        mesh = ax.pcolormesh(_edges(ux), _edges(uy), img, cmap="viridis", vmin=0,
                             vmax=max(0.3, float(np.nanpercentile(img, 90))))
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%.3g"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xticks(ux[:: -(-ux.size // 6)])  # at most six labels per axis
        ax.set_yticks(uy[:: -(-uy.size // 6)])
        ax.plot(xs[best], ys[best], marker="*", color="white", ms=12, mec="black",
                ls="none", label="best cell")
        for pred in variant.predictions[m]:
            marker, colour = MARKERS[pred.design]
            n, b, r = pred.cell
            ax.plot(n / r, b / r, marker=marker, color=colour, mec="white", ms=7, ls="none",
                    label=pred.design.replace("_", " "))
        ax.set_title(f"{variant.label}, mu = {mu:g}")
        ax.set_xlabel("horizon x = N/R (steps)")
        ax.set_ylabel("replay ratio y = B/R")
        fig.colorbar(mesh, ax=ax, label="log10 loss / best")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return style.save(fig, f"sim_validation_{variant.label}", out_dir)


def _hist_line(ax, hist: dict, label: str, new_at: float | None = None):
    items = {(new_at if k == "new" else float(k)): c for k, c in hist.items()}
    keys = np.array(sorted(items))
    counts = np.array([items[k] for k in keys], dtype=float)
    ax.plot(keys, counts / counts.sum(), marker=".", ms=3, lw=0.8, label=label)


def draw_histograms(runs: tuple[PipelineRun, ...], out_dir: str | None = None) -> list[str]:
    """Fig. 2 style: the three axes of section 2 for the two families of pipeline runs."""
    import matplotlib.pyplot as plt

    style.apply()
    families = [[r for r in runs if (r.workers, r.trainers) == (6, 2)],
                [r for r in runs if r.buffer_size == 252]]
    axes_names = [("off_policiness", "off-policiness (steps)"),
                  ("replay_ratio", "replay ratio (uses per rollout)"),
                  ("steps_since_last_use", "steps since last use (new = -1)")]
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.2))
    for row, family in enumerate(families):
        for col, (key, title) in enumerate(axes_names):
            ax = axes[row][col]
            for run in family:
                label = (f"N = {run.buffer_size}" if row == 0 else
                         f"(W, T) = ({run.workers}, {run.trainers})")
                _hist_line(ax, run.histograms[key], label, new_at=-1.0)
            ax.set_xscale("symlog", linthresh=1)
            ax.set_yscale("log")
            ax.set_xlabel(title)
            ax.set_ylabel("fraction")
        axes[row][0].legend(title="(W, T) = (6, 2)" if row == 0 else "N = 252")
    fig.suptitle("Pipeline simulator, mu = 6.84, B = 60, sharded FIFO")
    fig.tight_layout()
    return style.save(fig, "sim_pipeline_histograms", out_dir)


def draw_all(in_dir: str, out_dir: str | None = None) -> list[str]:
    """Every figure from a validate-sim output folder; returns the files written.

    Raises FileNotFoundError if the folder holds no ``summary.json``."""
    results = load_validation(in_dir)
    paths = []
    for variant in results.variants:
        paths += draw_heatmaps(variant, out_dir)
    if results.pipeline:
        paths += draw_histograms(results.pipeline, out_dir)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("in_dir", help="output folder of validate-sim")
    p.add_argument("--out", default=None, help="where to write (default figures/out)")
    args = p.parse_args(argv)
    for path in draw_all(args.in_dir, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
