"""Where the wall time goes, per schedule (issue 37, docs/experiments/cpu_long.md): the
``time_breakdown`` of each run that ``benchmarks/overlap.py`` saved, serial against each
overlapped arm, per ``sampler.max_concurrent`` level, for the sampler and the trainer side.

``python -m figures.time_breakdown [--results F] [--out DIR]`` writes
``time_breakdown.md`` (seconds per part and side, each schedule's first round) and
``time_breakdown.png`` / ``.pdf`` (stacked bars: one panel per level, a pair of bars per
schedule, sampler above trainer). Each side's parts sum to the run's wall time
(``llm_experiments.engines.timing``).
"""

from __future__ import annotations

import json
from pathlib import Path


from figures.style import PALETTE, figure_parser, plt, save, write_text

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "overlap.json"
PARTS = ("generate", "grade", "update", "eval", "probe", "checkpoint", "idle", "other")
SIDES = ("sampler", "trainer")


def load(path: Path = BENCHMARK) -> dict:
    """{level: [(schedule label, breakdown)]}: per level the serial run and each arm's
    overlapped run of the first round (a Ray arm's: each side the mean over its actors;
    results from before the Ray engine wrote a breakdown have none, and leave it out)."""
    runs = json.loads(Path(path).read_text())["runs"]
    out: dict = {}
    for r in runs:
        level = r["max_concurrent"]
        have = out.setdefault(level, [])
        tb = r.get("time_breakdown") or {}
        if not any(label == "serial" for label, _ in have) and tb.get("serial"):
            have.append(("serial", tb["serial"]))
        if tb.get("overlap") and not any(label == r["arm"] for label, _ in have):
            have.append((r["arm"], tb["overlap"]))
    return out


def table(data: dict) -> str:
    """Seconds per part and side, as markdown."""
    lines = ["# Where the wall time goes, per schedule (benchmarks/overlap.py)", "",
             "Seconds over each run (the first round of each schedule); each side's parts "
             "sum to the wall time.", "",
             "| max_concurrent | schedule | side | wall | " + " | ".join(PARTS) + " |",
             "|---|---|---|---|" + "---|" * len(PARTS)]
    for level, rows in sorted(data.items()):
        for label, tb in rows:
            for side in SIDES:
                vals = " | ".join(f"{tb[side][k]:.1f}" for k in PARTS)
                lines.append(f"| {level} | {label} | {side} | {tb['wall_seconds']:.1f} | "
                             f"{vals} |")
    return "\n".join(lines) + "\n"


def draw(data: dict):
    """Stacked horizontal bars: per level a panel, per schedule a sampler and a trainer bar."""
    levels = sorted(data)
    fig, axes = plt.subplots(1, len(levels), figsize=(4.6 * len(levels), 3.2), squeeze=False)
    colours = {k: PALETTE[(i + 1) % len(PALETTE)] for i, k in enumerate(PARTS)}
    for ax, level in zip(axes[0], levels):
        labels = []
        for j, (label, tb) in enumerate(data[level]):
            for k, side in enumerate(SIDES):
                y = 2.5 * j + k
                left = 0.0
                for part in PARTS:
                    w = max(tb[side][part], 0.0)
                    ax.barh(y, w, left=left, color=colours[part],
                            label=part if (j, k) == (0, 0) else None)
                    left += w
                labels.append((y, f"{label}: {side}"))
        ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=6)
        ax.invert_yaxis()
        ax.set(xlabel="seconds", title=f"max_concurrent = {level or 'all'}")
    handles, names = axes[0][0].get_legend_handles_labels()
    # below the panels: inside, it would cover the bars of the longest (Ray) runs
    fig.legend(handles, names, fontsize=6, ncol=len(PARTS), loc="lower center",
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--results", default=str(BENCHMARK), help="the benchmark's result JSON")
    a = p.parse_args(argv)
    data = load(Path(a.results))  # FileNotFoundError when the benchmark has not been run
    if not data:
        raise FileNotFoundError(f"{a.results} holds no run with a time breakdown")
    return [write_text(table(data), "time_breakdown.md", a.out),
            *save(draw(data), "time_breakdown", a.out)]


if __name__ == "__main__":
    main()
