"""Theory figures (theory.md section 5), computed from ``replaytheory`` directly.

* ``optimum_vs_mu``: x* and y* against mu (log-log) for (rho, alpha) in
  {(0.1, 0.1), (1, 0.1), (0.1, 0.2), (1, 0.2)}, the on-policy region (x* < 1 step) shaded;
* ``k_function``: K(x) = x^alpha (1/sqrt(mu) + sqrt(rho + 1/x)) for alpha in
  {0, 0.1, 0.2, 0.3, 0.5}, normalised at x = 1, with x* marked;
* ``saving_heatmap``: predicted compute saving 1 - J*/J(1, 1) over (mu, alpha), one panel per
  rho.

Run: ``python -m figures.theory [--out DIR]``.
"""

from __future__ import annotations

import math

import numpy as np

from figures.style import SHADE, figure_parser, plt, save
from replaytheory import design_grid, k_function, power_law_optimum

CASES = [(0.1, 0.1), (1.0, 0.1), (0.1, 0.2), (1.0, 0.2)]


def optimum_vs_mu(out_dir=None):
    mus = np.geomspace(0.1, 1000, 400)
    fig, (ax_x, ax_y) = plt.subplots(1, 2, figsize=(8, 3.3))
    ax_x.axhspan(1e-3, 1.0, color=SHADE, zorder=0, label="on-policy (x* < 1 step)")
    for rho, alpha in CASES:
        x, y = power_law_optimum(mus, rho, alpha)
        on = x < 1
        label = f"rho={rho:g}, alpha={alpha:g}"
        line, = ax_x.loglog(mus, x, label=label)
        ax_y.loglog(mus, np.where(on, np.nan, y), color=line.get_color(), label=label)
        ax_y.loglog(mus, np.where(on, y, np.nan), color=line.get_color(), ls=":")
    ax_x.set(xlabel="mu (generation cost of a batch / update cost)",
             ylabel="x* = N/R (staleness horizon, steps)", ylim=(1e-2, 1e4))
    ax_y.set(xlabel="mu", ylabel="y* = B/R (replay ratio)", ylim=(1e-2, 1e3))
    ax_y.set_title("dotted: on-policy regime", fontsize=8)
    ax_x.legend(loc="upper left")
    return save(fig, "theory_optimum_vs_mu", out_dir)


def k_curves(out_dir=None, mu=6.84, rho=0.1):
    xs = np.geomspace(0.05, 1e4, 600)
    fig, ax = plt.subplots(figsize=(4.6, 3.3))
    for alpha in (0.0, 0.1, 0.2, 0.3, 0.5):
        k = k_function(xs, mu=mu, rho=rho, alpha=alpha)
        k1 = float(k_function(1.0, mu=mu, rho=rho, alpha=alpha))
        line, = ax.loglog(xs, k / k1, label=f"alpha={alpha:g}")
        x_star, _ = power_law_optimum(mu, rho, alpha)
        if 0 < x_star < math.inf:
            ks = float(k_function(x_star, mu=mu, rho=rho, alpha=alpha)) / k1
            ax.plot([x_star], [ks], "o", color=line.get_color())
        else:  # x* at an end of the axis: 0 (alpha >= 1/2) or infinity (alpha = 0)
            edge = xs[0] if x_star == 0 else xs[-1]
            ax.annotate("x*", (edge, float(np.interp(edge, xs, k / k1))),
                        color=line.get_color(), fontsize=8)
    ax.axvspan(xs[0], 1.0, color=SHADE, zorder=0)
    ax.set(xlabel="x = N/R (steps)", ylabel="K(x) / K(1)",
           title=f"K(x), mu={mu:g}, rho={rho:g}; dots: x*")
    ax.legend()
    return save(fig, "theory_k_function", out_dir)


def saving_heatmap(out_dir=None, rhos=(0.01, 0.1, 1.0)):
    mus = np.geomspace(0.25, 100, 60)
    alphas = np.linspace(0.0, 0.6, 61)
    fig, axes = plt.subplots(1, len(rhos), figsize=(3.4 * len(rhos), 3.0), sharey=True,
                             layout="constrained")
    for ax, rho in zip(np.atleast_1d(axes), rhos):
        grid = design_grid(mus, alphas, rho)
        im = ax.pcolormesh(mus, alphas, grid["predicted_saving"].T, vmin=0, vmax=1,
                           cmap="viridis", shading="nearest")
        ax.contour(mus, alphas, grid["on_policy"].T.astype(float), levels=[0.5], colors="w",
                   linewidths=1)
        ax.set_xscale("log")
        ax.set(xlabel="mu", title=f"rho = {rho:g}")
    np.atleast_1d(axes)[0].set_ylabel("alpha (noise growth exponent)")
    fig.colorbar(im, ax=axes, label="predicted compute saving vs on-policy")
    fig.suptitle("white line: on-policy boundary (above it: stay on-policy)", fontsize=8)
    return save(fig, "theory_saving_heatmap", out_dir)


def main(out_dir=None) -> list:
    """Write every theory figure; returns the paths written."""
    return optimum_vs_mu(out_dir) + k_curves(out_dir) + saving_heatmap(out_dir)


if __name__ == "__main__":
    p = figure_parser(__doc__)
    for path in main(p.parse_args().out):
        print(path)
