"""Figure of the corrected diagnosis (theory.md section 8.9) from the committed JSON.

Reads what ``python -m llm_experiments.study.diagnose`` wrote (default
``results/diagnosis/diagnosis.json``) and draws ``diagnosis``: squared noise by staleness at
fixed use count and by use count at fixed staleness, the self-correlation of one rollout's
noise by gap, the kept share of the gradient and the clip fraction by staleness at fixed use
count, and the buffer bias as a norm ratio and a cosine by staleness. Error bars: 95%
cluster-bootstrap intervals over probes.

Usage: ``python -m figures.diagnosis [JSON] [--out OUT]`` (default OUT: figures/out).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures import style

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "diagnosis" / "diagnosis.json"


def _arr(x) -> np.ndarray:
    """A JSON list (None = NaN) as a float array."""
    return np.array([np.nan if v is None else v for v in np.ravel(np.array(x, dtype=object))],
                    dtype=float).reshape(np.shape(np.array(x, dtype=object)))


def _labels(edges) -> list[str]:
    return [f"{a:g}" if b - a == 1 else f"{a:g}-{b - 1:g}" for a, b in zip(edges, edges[1:])]


def _errorbar(ax, x, q, k, axis, label, color, min_n=None, n=None):
    """Cross-section ``k`` of a grid quantity ``q`` along ``axis`` (0: fixed staleness bin,
    1: fixed uses bin), cells with fewer than ``min_n`` rows left out."""
    take = (lambda a: _arr(a)[k, :]) if axis == 0 else (lambda a: _arr(a)[:, k])
    val, lo, hi = take(q["value"]), take(q["low"]), take(q["high"])
    ok = np.isfinite(val) & (take(n) >= min_n if n is not None else True)
    if not ok.any():
        return
    ax.errorbar(x[ok], val[ok], yerr=[val[ok] - lo[ok], hi[ok] - val[ok]], marker="o", ms=3,
                capsize=2, label=label, color=color)


def _grid_panel(ax, grid, name, along, min_n, ylabel, title):
    """Lines of a grid quantity: by staleness per uses bin (along = "staleness") or by uses
    per staleness bin."""
    s_edges, u_edges = grid["staleness_edges"], grid["uses_edges"]
    s_mid = (np.array(s_edges[:-1]) + np.array(s_edges[1:]) - 1) / 2
    q, n = grid["quantities"][name], grid["n"]
    # Lines are shifted apart a little so that their error bars do not hide each other.
    if along == "staleness":
        labels = _labels(u_edges)
        for k, lab in enumerate(labels):
            _errorbar(ax, s_mid + 0.15 * (k - len(labels) / 2), q, k, 1, f"uses {lab}",
                      style.PALETTE[1 + k % 7], min_n, n)
        ax.set_xlabel("staleness (steps)")
    else:
        labels, uses_labels = _labels(s_edges), _labels(u_edges)
        x = np.arange(len(uses_labels), dtype=float)
        for k, lab in enumerate(labels):
            _errorbar(ax, x + 0.04 * (k - len(labels) / 2), q, k, 0, f"staleness {lab}",
                      style.PALETTE[1 + k % 7], min_n, n)
        ax.set_xticks(x, uses_labels)
        ax.set_xlabel("earlier uses")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=False)


def draw(path=DEFAULT, out_dir=None, min_n: int = 30) -> list[Path]:
    """Draw the diagnosis figure from ``path``; cells with fewer than ``min_n`` rows are
    left out. Returns the files written."""
    import matplotlib.pyplot as plt

    d = json.loads(Path(path).read_text())
    style.apply()
    fig, axes = plt.subplots(2, 3, figsize=(11, 6.2))
    r = d["regression"]
    _grid_panel(axes[0, 0], d["noise"], "sq_noise", "staleness", min_n,
                "sq noise (net of ref. error)",
                f"noise at fixed uses (fit: {r['per_step']['value']:+.3g}/step, "
                f"{r['per_use']['value']:+.3g}/use)")
    _grid_panel(axes[0, 1], d["noise"], "sq_noise", "uses", min_n,
                "sq noise (net of ref. error)", "noise at fixed staleness")
    ax = axes[0, 2]
    for key, lab, color in (("self_corr", "sequence", style.PALETTE[1]),
                            ("self_corr_group", "group", style.PALETTE[2])):
        sc = d[key]
        val = _arr([c["value"] for c in sc["corr"]])
        lo, hi = _arr([c["low"] for c in sc["corr"]]), _arr([c["high"] for c in sc["corr"]])
        ax.errorbar(sc["gap"], val, yerr=[val - lo, hi - val], marker="o", ms=3, capsize=2,
                    label=lab, color=color)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylim(min(-0.05, ax.get_ylim()[0]), 1.05)
    ax.set_xlabel("gap between the two steps (steps)")
    ax.set_ylabel("corr(eps_t(z), eps_{t-g}(z))")
    ax.set_title("one rollout's noise with itself")
    ax.legend(frameon=False)
    _grid_panel(axes[1, 0], d["contribution"], "contribution", "staleness", min_n,
                "kept share of the gradient", "contribution (pooled)")
    _grid_panel(axes[1, 1], d["contribution"], "clip_fraction", "staleness", min_n,
                "clip fraction", "clipped tokens")
    ax = axes[1, 2]
    b = d["bias"]
    edges = np.array(b["staleness_edges"])
    mid = (edges[:-1] + edges[1:] - 1) / 2
    for key, lab, color in (("norm_ratio", "||bias|| / ||grad F||", style.PALETTE[5]),
                            ("cosine", "cos(bias, grad F)", style.PALETTE[4])):
        val = _arr([c["value"] for c in b[key]])
        lo, hi = _arr([c["low"] for c in b[key]]), _arr([c["high"] for c in b[key]])
        ok = np.isfinite(val)
        ax.errorbar(mid[ok], val[ok], yerr=[val[ok] - lo[ok], hi[ok] - val[ok]], marker="o",
                    ms=3, capsize=2, label=lab, color=color)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("staleness (steps)")
    ax.set_title(f"buffer bias: ratio {b['all_norm_ratio']['value']:.2f}, cosine "
                 f"{b['all_cosine']['value']:+.2f} (all)")
    ax.legend(frameon=False)
    return style.save(fig, "diagnosis", out_dir)


def main(argv=None) -> list[Path]:
    p = style.figure_parser(__doc__)
    p.add_argument("json", nargs="?", default=str(DEFAULT), help="diagnosis JSON")
    a = p.parse_args(argv)
    return draw(a.json, a.out)


if __name__ == "__main__":
    for path in main():
        print(path)
