"""The saving in seconds on cpu_long (issue 37 part 3): accuracy against each run's own
measured seconds, per mu level, beside the verdict. Three grids: ``seconds_long``
(``experiments/seconds_long.yaml``, SL1-SL4: 150 updates at two levels), ``seconds_late``
(``experiments/seconds_late.yaml``, LT1-LT3: 300 updates at one) and ``seconds_equal``
(``experiments/seconds_equal.yaml``, EQ1-EQ2: the buffer as long in seconds as on-policy).

``python -m figures.cpu_long.seconds [--grid seconds_long|seconds_late|seconds_equal] [--results
DIR] [--out DIR]`` reads ``results/GRID/curves.jsonl.gz`` and ``verdict.json`` (``python -m
llm_experiments.study.verdicts.GRID``) and writes ``GRID.md`` (per level and cell: the ratio
of seconds to on-policy's final accuracy, its mean, each seed's, the seeds reaching it and the
median; AUC over seconds, its paired difference from on-policy's, AUC over compute, measured
mu; where the verdict has them, the early and late halves of the seconds budget and where the
buffer runs end against on-policy, and each cell's median seconds per update and per rollout;
the claims)
and ``GRID.png`` / ``.pdf`` (per level, each cell's mean eval accuracy over its seeds against
the median of their seconds at each evaluation; the dashed line is on-policy's final
accuracy, the seeds' mean target; a dotted line marks half the budget where halves are
judged).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures.style import PALETTE, figure_parser, plt, save, write_text
from llm_experiments.study.results import load_runs
from llm_experiments.study.seconds import seconds_at_evals
from llm_experiments.study.verdicts.seconds_long import LEVEL, TARGET_EVALS, Cell

RESULTS = Path(__file__).resolve().parents[2] / "results"
TITLES = {"seconds_long": "The saving in seconds on cpu_long (issue 37 part 3, "
                          "experiments/seconds_long.yaml)",
          "seconds_late": "Does on-policy lead only early? cpu_long at 300 updates in seconds "
                          "(experiments/seconds_late.yaml)",
          "seconds_equal": "Seconds to on-policy's final accuracy, the buffer as long in seconds "
                           "as on-policy (experiments/seconds_equal.yaml)"}
WORDS = {"SL1": "at level 16 the best buffer cell reaches on-policy's final accuracy in <= 0.6x "
                "its seconds",
         "SL2": "the saving grows with mu", "SL3": "the best cell's replay ratio grows with mu",
         "SL4": "the advice is within 0.02 AUC (seconds) of the rule's cell at both levels",
         "LT1": "on-policy leads only early: x = 64, y = 2's late-minus-early gap is > 0 "
                "(predicted: holds)",
         "LT2": "x = 64, y = 2 reaches on-policy's final accuracy on every seed, mean ratio < 1 "
                "(predicted: holds, near 0.63)",
         "LT3": "the best buffer cell's mean ratio is <= 0.6 (predicted: fails)",
         "EQ1": "x = 64, y = 2 reaches on-policy's final accuracy on every seed, its mean "
                "ratio's interval below 1 (predicted: holds, ~0.75)",
         "EQ2": "x = 64, y = 2's mean ratio is <= 0.6 (predicted: fails)"}


def _cell(v, fmt: str = ".2f") -> str:
    return "inf" if not np.isfinite(v[0]) else f"{v[0]:{fmt}} [{v[1]:{fmt}}, {v[2]:{fmt}}]"


def _halves(level: dict) -> list[str]:
    """The early and late halves of the seconds budget, where the verdict judges them."""
    if "halves" not in level:
        return []
    lines = [f"AUC over seconds in the budget's halves ([0, {level['budget_seconds'] / 2:.0f}] "
             f"and [{level['budget_seconds'] / 2:.0f}, {level['budget_seconds']:.0f}] s) minus "
             "on-policy's, paired by seed [95%]:", "",
             "| cell | early | late | late minus early |", "|---|---|---|---|"]
    lines += [f"| {label} | {_cell(h['early_minus_on_policy'], '+.3f')} | "
              f"{_cell(h['late_minus_on_policy'], '+.3f')} | "
              f"{_cell(h['late_minus_early'], '+.3f')} |" for label, h in level["halves"].items()]
    return lines + [""]


def _ends(level: dict) -> list[str]:
    """Where each buffer run ended, against on-policy (reported beside the claims)."""
    if "ends" not in level:
        return []
    lines = ["Where the runs end (not registered), paired by seed [95%]:", "",
             "| cell | run seconds / on-policy's | final accuracy minus on-policy's final | "
             "minus on-policy's at the same seconds |", "|---|---|---|---|"]
    lines += [f"| {label} | {_cell(e['seconds_over_on_policy'])} | "
              f"{_cell(e['final_minus_on_policy_final'], '+.3f')} | "
              f"{_cell(e['final_minus_on_policy_same_seconds'], '+.3f')} |"
              for label, e in level["ends"].items()]
    return lines + [""]


def _costs(level: dict) -> list[str]:
    """Each cell's median seconds per update and per rollout, where the verdict has them."""
    if "costs" not in level:
        return []
    lines = ["Median seconds per update and per generated rollout (each run's own clocks):", "",
             "| cell | s / update | s / rollout |", "|---|---|---|"]
    lines += [f"| {label} | {c['update']:.3f} | {c['rollout']:.4f} |"
              for label, c in level["costs"].items()]
    return lines + [""]


def table(verdict: dict, grid: str = "seconds_long") -> str:
    """The verdict of ``grid`` as markdown."""
    status = "verdict" if verdict["complete"] else "INTERIM, not the verdict: fewer seeds " \
        "than registered"
    lines = [f"# {TITLES[grid]}", "", f"Status: {status}.", ""]
    for level, v in verdict["levels"].items():
        lines += [f"## sampler.max_concurrent = {level}: on-policy mu {v['mu']:.2f}, seeds "
                  f"{v['seeds']}", "",
                  "| cell | seconds to on-policy's final accuracy / on-policy's (mean) | "
                  "seeds reaching it | median | per seed | AUC over seconds | minus on-policy's "
                  "| AUC over compute | mu measured |", "|---|---|---|---|---|---|---|---|---|"]
        for label, c in v["cells"].items():
            per_seed = ", ".join(f"{r:.2f}" for r in c["ratio_per_seed"])
            lines.append(f"| {label} | {_cell(c['ratio'])} | {c['reached']} of "
                         f"{len(v['seeds'])} | {c['median_ratio']:.2f} | {per_seed} | "
                         f"{c['auc_seconds']:.3f} | "
                         f"{_cell(c['auc_seconds_minus_on_policy'], '+.3f')} | "
                         f"{c['auc_compute']:.3f} | {c['mu_measured']:.2f} |")
        lines += ["", f"Best buffer cell by that ratio (ties by the median): {v['best_buffer']}; "
                      f"best cell by AUC over seconds: {v['best_auc_seconds']}.", ""]
        lines += _halves(v) + _ends(v) + _costs(v)
    lines += [f"* {k} ({w}): {'holds' if verdict['claims'][k] else 'fails'}"
              for k, w in WORDS.items() if k in verdict["claims"]]
    return "\n".join(lines) + "\n"


def draw(runs: list, verdict: dict):
    """One panel per level: each cell's mean accuracy against its median seconds."""
    levels = sorted(verdict["levels"], key=int)
    fig, axes = plt.subplots(1, len(levels), figsize=(5.5 * len(levels), 4), squeeze=False)
    for ax, level in zip(axes[0], levels):
        v = verdict["levels"][level]
        mine = [r for r in runs if int(r.settings.get(LEVEL) or 0) == int(level)
                and int(r.settings["run.seed"]) in v["seeds"]]
        by_cell: dict = {}
        for r in mine:
            by_cell.setdefault(Cell.of(r.settings).label, []).append(r)
        for i, (label, rs) in enumerate(sorted(by_cell.items())):
            secs = np.median([seconds_at_evals(r) for r in rs], axis=0)
            acc = np.mean([r.eval["eval_accuracy"] for r in rs], axis=0)
            ax.plot(secs, acc, marker="o", ms=3, color=PALETTE[i % len(PALETTE)], label=label)
        target = np.mean([np.mean(r.eval["eval_accuracy"][-TARGET_EVALS:])
                          for r in by_cell.get("on-policy", [])])
        ax.axhline(target, ls="--", color="grey", lw=1)
        if "halves" in v:
            ax.axvline(v["budget_seconds"] / 2, ls=":", color="grey", lw=1)
        ax.set(title=f"max_concurrent = {level} (mu {v['mu']:.1f})", xlabel="seconds (measured)",
               ylabel="eval accuracy")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--grid", choices=sorted(TITLES), default="seconds_long",
                   help="which grid (default seconds_long)")
    p.add_argument("--results", help="the grid's results folder (default results/GRID)")
    a = p.parse_args(argv)
    folder = Path(a.results or RESULTS / a.grid)
    verdict = json.loads((folder / "verdict.json").read_text())  # raises if absent
    runs = load_runs(str(folder / "curves.jsonl.gz"))
    return [write_text(table(verdict, a.grid), f"{a.grid}.md", a.out),
            *save(draw(runs, verdict), a.grid, a.out)]


if __name__ == "__main__":
    main()
