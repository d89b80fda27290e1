"""The demo's figure: held-out accuracy against compute for each compared run, the advised
cell drawn thick, the target accuracy dotted and the ranking window shaded, each named in the
legend.

Reads what ``python -m llm_experiments demo --out DIR`` saved (``DIR/summary.json`` and
``DIR/curves.jsonl``) and writes ``DIR/demo.png`` and ``DIR/demo.pdf``; the demo runs it as
``python -m figures.demo DIR``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from figures.style import ON_POLICY_COLOR, PALETTE, plt, save
from llm_experiments.study.cells import kind
from llm_experiments.study.results import load_runs


def draw(demo_dir: str | Path) -> list[Path]:
    """``demo.png``/``demo.pdf`` in ``demo_dir`` from its summary and curves; returns the
    paths. Compute is in trainer updates at the summary's mu (theory.md section 3)."""
    demo_dir = Path(demo_dir)
    summary = json.loads((demo_dir / "summary.json").read_text())
    runs = {r.run_id: r for r in load_runs(str(demo_dir / "curves.jsonl"))}
    mu = summary["mu"]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for i, row in enumerate(summary["runs"]):
        run = runs[row["run_id"]]
        color = ON_POLICY_COLOR if kind(run) == "on_policy" else PALETTE[1 + i % 6]
        ax.plot(run.compute(mu), run.eval["eval_accuracy"], color=color,
                lw=2.2 if row["predicted"] else 1.2,
                label=row["config"] + (" (advised)" if row["predicted"] else ""))
    warm, target = summary["warm_start_accuracy"], summary["target_accuracy"]
    best = max(row["final_accuracy"] for row in summary["runs"])
    share = (target - warm) / max(best - warm, 1e-12)
    ax.axhline(target, color="grey", ls=":", lw=0.8,
               label=f"target accuracy {target:.3f} ({share:.0%} of the way from the warm "
                     f"start to the best final)")
    window = min(row["compute"] for row in summary["runs"])
    ax.axvspan(0, window, color="grey", alpha=0.08, lw=0,
               label=f"ranking window: first {window:.4g} updates (the compute every run spent)")
    ax.set(xlabel=f"compute (trainer updates; a generated batch counts as mu = {mu:g})",
           ylabel="held-out accuracy",
           title=f"advised horizon x = {summary['advised_horizon']:.3g} updates, "
                 f"replay ratio y = {summary['advised_replay_ratio']:.3g}")
    ax.legend(fontsize=6)
    return save(fig, "demo", demo_dir)


def main(argv=None) -> int:
    """Command line: ``python -m figures.demo DIR``; prints the paths written."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("demo_dir", help="the demo's output folder (--out of the demo)")
    a = p.parse_args(argv)
    for path in draw(a.demo_dir):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
