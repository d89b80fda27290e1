"""The best horizon by scored window (issue 25, theory.md 11.12): each registered grid judged
over its first T updates (``results/windows/<setting>_T<T>/``), beside the finite-run model's
x* with and without phases. ``python -m figures.windows [--out DIR]`` writes
``windows.md`` (per window and mu, then the goal's criteria over the unscored windows and over
all)
and ``windows.png`` / ``.pdf``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from figures.style import PALETTE, figure_parser, plt, save, write_text
from figures.verdicts import neighbours_text

WINDOWS = Path(__file__).resolve().parents[1] / "results" / "windows"
MUS = ("measured", "2", "6.84")
# what each readout's regret is read from in a verdict record
READOUTS = {"model (phases)": ("predictions", "horizon"),
            "model (one phase)": ("predictions", "horizon_one_phase"),
            "x=64, y=sqrt(mu)": ("baselines", "x=64, y=sqrt(mu)"),
            "on-policy": ("baselines", "on-policy"),
            "section 5": ("baselines", "section 5")}


@dataclass(frozen=True)
class WindowCase:
    """One (window, mu) verdict: the grid, the window T (updates), whether the window was
    unscored when its prediction was registered (the prediction preceded the window's verdict,
    not its curves: all were predicted after the curves existed, so none is a blind test), the
    best horizon and its neighbours' differences, the model's x* (phases, one phase), each
    readout's median regret and the model's Spearman."""

    setting: str
    steps: int
    unscored: bool
    mu: str
    best: float
    neighbours: str
    x_phases: float
    x_one: float
    regret: dict
    spearman: float


def load_cases(folder: Path = WINDOWS) -> list[WindowCase]:
    """Every judged window under ``folder`` (AUC records at the measured and accounting mus)."""
    out = []
    for path in sorted(folder.glob("*/validation.json")):
        reg = json.loads((path.parent / "prediction.json").read_text())
        setting = re.sub(r"_T\d+$", "", path.parent.name)
        for r in json.loads(path.read_text()):
            if r["measure"] != "auc" or r["mu_source"] not in MUS:
                continue
            pred = r["predictions"]
            out.append(WindowCase(
                setting=setting, steps=int(reg["steps"]),
                unscored="Registered before this window was scored" in reg["note"],
                mu=r["mu_source"], best=r["best_horizon"]["horizon"],
                neighbours=neighbours_text(r["best_horizon"]),
                x_phases=pred["horizon"]["x_star"], x_one=pred["horizon_one_phase"]["x_star"],
                regret={k: r[kind][name]["regret"]["median"]
                        for k, (kind, name) in READOUTS.items()},
                spearman=pred["horizon"]["spearman"]["median"]))
    return sorted(out, key=lambda c: (c.setting, c.steps, MUS.index(c.mu)))


def _within2(x: float, best: float) -> bool:
    return abs(math.log2(max(x, 1.0) / best)) <= 1 + 1e-9


def summary(cases: list[WindowCase]) -> str:
    """The goal's criteria (issue 25) over ``cases``: x* within a factor 2 of the best
    horizon, mean regret of each readout, Spearman >= 0.7."""
    n = len(cases)
    within = sum(_within2(c.x_phases, c.best) for c in cases)
    within_one = sum(_within2(c.x_one, c.best) for c in cases)
    means = {k: float(np.mean([c.regret[k] for c in cases])) for k in READOUTS}
    spear = sum(c.spearman >= 0.7 for c in cases)
    return (f"{n} cases: model x* within 2x of the best horizon in {within} (one phase: "
            f"{within_one}); Spearman >= 0.7 in {spear}; mean regret "
            + ", ".join(f"{k} {v:.3f}" for k, v in means.items()))


def table(cases: list[WindowCase]) -> str:
    """The markdown page: one row per (window, mu), then the summaries."""
    lines = ["# The best horizon by scored window (theory.md 11.12)", "",
             "Each grid judged over its first T updates (AUC, median regret: share of the best "
             "cell's gain lost). Every prediction was committed after the curves it scores "
             "existed (predictions made after the curves existed, not blind tests). unscored: "
             "the window's prediction was committed before the window was scored; dev: the "
             "window had been scored (the whole run) or shares runs with one that had.", "",
             "| setting | T | kind | mu | best horizon | neighbours | x* phases | x* one phase | "
             + " | ".join(f"regret {k}" for k in READOUTS) + " | Spearman |",
             "|" + "---|" * (9 + len(READOUTS))]
    for c in cases:
        kind = "unscored" if c.unscored else "dev"
        lines.append(f"| {c.setting} | {c.steps} | {kind} | {c.mu} | {c.best:g} | "
                     f"{c.neighbours} | {c.x_phases:g} | {c.x_one:g} | "
                     + " | ".join(f"{c.regret[k]:.2f}" for k in READOUTS)
                     + f" | {c.spearman:.2f} |")
    lines += ["", "**Unscored windows:** " + summary([c for c in cases if c.unscored]), "",
              "**All windows:** " + summary(cases), ""]
    return "\n".join(lines)


def draw(cases: list[WindowCase]):
    """Best horizon (markers) and the model's x* (line) against the window T, per setting,
    at the measured mu."""
    settings = sorted({c.setting for c in cases})
    fig, axes = plt.subplots(1, len(settings), figsize=(3.0 * len(settings), 2.8),
                             squeeze=False, sharey=True)
    for ax, s in zip(axes[0], settings):
        for k, (mu, colour) in enumerate(zip(MUS, PALETTE[1:])):
            cs = [c for c in cases if c.setting == s and c.mu == mu]
            nudge = 1.08 ** (k - 1)  # the three mu's markers side by side, not on top
            t = [c.steps * nudge for c in cs]
            ax.plot(t, [c.best for c in cs], "o", color=colour, label=f"best, mu={mu}")
            ax.plot(t, [max(c.x_phases, 1) for c in cs], "--", color=colour, alpha=0.7,
                    label=f"model x*, mu={mu}")
        ax.set(title=s, xlabel="window T (updates)", xscale="log", yscale="log",
               ylim=(0.8, 320))
        ax.set_yticks([1, 4, 16, 64, 256], ["1", "4", "16", "64", "256"])
        ticks = sorted({c.steps for c in cases if c.setting == s})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    axes[0][0].set_ylabel("horizon x (updates)")
    axes[0][0].legend(loc="upper left", ncol=1, fontsize=6)
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--windows", default=str(WINDOWS), help="folder of the judged windows")
    a = p.parse_args(argv)
    cases = load_cases(Path(a.windows))
    if not cases:
        raise FileNotFoundError(f"no judged window under {a.windows}")
    return [write_text(table(cases), "windows.md", a.out), *save(draw(cases), "windows", a.out)]


if __name__ == "__main__":
    for written in main():
        print(written)
