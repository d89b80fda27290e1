"""A stale rollout's worth through grad F by phase (theory.md 11.15): align(g) of the align panels
in ``results/horizon_align_large/runs`` (``replaytheory.fit.align_fit.fit_align``), and the
development check of the finite-run model with that worth (``results/horizon_align_large/
devcheck``, made by ``experiments/align_devcheck.sh``) beside the windows' registered model.

``python -m figures.align [--runs DIR] [--devcheck DIR] [--out DIR]`` writes ``align.md``
(align(g) with 95% intervals per birth step and pooled over births; the development check per
window and mu, with the goal's criteria), ``align.json`` and ``align.png`` / ``.pdf`` (align
against the gap, one line per birth).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures import windows
from figures.style import PALETTE, figure_parser, plt, save, write_text
from llm_experiments.study.validation import load_probes
from replaytheory.fit.align_fit import AlignFit, fit_align
from replaytheory.fit.probes import ProbeSet

RUNS = Path(__file__).resolve().parents[1] / "results" / "horizon_align_large" / "runs"
DEVCHECK = RUNS.parent / "devcheck"


def load(runs: Path, match: str = "*") -> ProbeSet:
    """The probes of every run folder under ``runs`` whose name matches the glob ``match``,
    merged (a ``run`` column apart)."""
    paths = sorted(str(p) for p in runs.glob(f"{match}/probes.npz"))
    if not paths:
        raise FileNotFoundError(f"no {match}/probes.npz under {runs}")
    return load_probes(paths)


def _cell(curve, i: int) -> str:
    return f"{curve.value[i]:.2f} [{curve.low[i]:.2f}, {curve.high[i]:.2f}]"


def table(fit: AlignFit, n_runs: int) -> str:
    """align(g) per birth and pooled, as markdown."""
    gaps = [int(g) for g in fit.pooled.gaps]
    lines = ["# align(g) by phase (theory.md 11.15)", "",
             f"{n_runs} runs, panels of {fit.n_seq} sequences; 95% bootstrap intervals over "
             f"panel and reference chunks. align(0) must be 1.", "",
             "| born at step | " + " | ".join(f"g = {g}" for g in gaps) + " |",
             "|---|" + "---|" * len(gaps)]
    for birth, curve in sorted(fit.by_birth.items()):
        lines.append(f"| {birth} | " + " | ".join(_cell(curve, i) for i in range(len(gaps)))
                     + " |")
    lines.append("| pooled | " + " | ".join(_cell(fit.pooled, i) for i in range(len(gaps)))
                 + " |")
    return "\n".join(lines) + "\n"


def devcheck_table(folder: Path, registered: Path) -> str:
    """The finite-run model with worth = align (``folder``, judged windows) against the
    windows' registered model (``registered``), per (window, mu), then the goal's criteria
    over the windows unscored when they were registered and over all (windows.summary)."""
    ref = {(c.setting, c.steps, c.mu): c for c in windows.load_cases(registered)}
    dev = [windows.WindowCase(**{**c.__dict__,
                                 "unscored": ref[(c.setting, c.steps, c.mu)].unscored})
           for c in windows.load_cases(folder)]
    lines = ["## Development check: the finite-run model with worth = align", "",
             "Every window was scored before (not a test). x*, regret: the model with the large "
             "panels' align as a stale rollout's worth, then the windows' registered model "
             "(worth = the clip's kept share).", "",
             "| setting | T | window | mu | best x | x* (align) | regret | x* (registered) | "
             "regret |", "|---|---|---|---|---|---|---|---|---|"]
    for c in dev:
        r = ref[(c.setting, c.steps, c.mu)]
        kind = "unscored" if c.unscored else "dev"
        lines.append(f"| {c.setting} | {c.steps} | {kind} | {c.mu} | {c.best:g} |"
                     f" {c.x_phases:g} | {c.regret['model (phases)']:.3f} | "
                     f"{r.x_phases:g} | {r.regret['model (phases)']:.3f} |")
    lines += ["", "**Windows unscored at registration:** "
              + windows.summary([c for c in dev if c.unscored]), "",
              "**All windows:** " + windows.summary(dev)]
    return "\n".join(lines) + "\n"


def draw(fit: AlignFit):
    """align against the gap (symlog), one line per birth, with intervals."""
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    for (birth, curve), colour in zip(sorted(fit.by_birth.items()), PALETTE):
        g = np.array(curve.gaps)
        ax.errorbar(g * (1 + 0.03 * (birth / 100 - 1)), curve.value,
                    yerr=[np.subtract(curve.value, curve.low),
                          np.subtract(curve.high, curve.value)],
                    fmt="o-", color=colour, capsize=2, label=f"born at {birth}")
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set(xlabel="gap g (updates)", ylabel="align(g)", xscale="symlog")
    ax.legend(fontsize=6)
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--runs", default=str(RUNS), help="folder of the align runs")
    p.add_argument("--devcheck", default=str(DEVCHECK),
                   help="folder of the judged development-check windows (skipped if absent)")
    p.add_argument("--windows", default=str(windows.WINDOWS),
                   help="folder of the windows' registered verdicts")
    a = p.parse_args(argv)
    probes = load(Path(a.runs))
    fit = fit_align(probes, n_boot=1000)
    n_runs = len(set(probes.tables["align"]["run"].tolist()))
    text = table(fit, n_runs)
    if Path(a.devcheck).is_dir():
        text += "\n" + devcheck_table(Path(a.devcheck), Path(a.windows))
    return [write_text(text, "align.md", a.out),
            write_text(json.dumps(fit.to_dict(), indent=1), "align.json", a.out),
            *save(draw(fit), "align", a.out)]


if __name__ == "__main__":
    main()
