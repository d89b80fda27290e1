"""The horizon without the clip (theory.md 11.19): ``results/horizon_unclipped`` (trainer.loss
grpo_unclipped) against ``cpu_sweep_v3``'s clipped runs of the same cells (lr 1e-4, y = 2,
x in {4, 16, 64, 256}, seeds 0-9), judged against the predictions registered in
``experiments/horizon_unclipped.yaml``.

``python -m figures.unclipped [--out DIR]`` writes ``unclipped.md`` (each arm's mean AUC per x,
the paired differences with 95% seed-bootstrap intervals, the registered claims),
``unclipped.json`` and ``unclipped.png`` / ``.pdf`` (AUC against x, both arms).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from figures.style import PALETTE, figure_parser, plt, save, write_text
from llm_experiments.study.results import Run, load_runs

RESULTS = Path(__file__).resolve().parents[1] / "results"
HORIZONS = (4, 16, 64, 256)
LR, REPLAY = 1e-4, 2.0
WARM_START_ACCURACY = 0.26
DRAWS = 4000


def load(folder: Path = RESULTS) -> dict:
    """{loss: {x: {seed: run}}} for the clipped (``cpu_sweep_v3``) and unclipped
    (``horizon_unclipped``) runs of the registered cells."""
    runs = load_runs(str(folder / "cpu_sweep_v3" / "curves.jsonl.gz")) + \
        load_runs(str(folder / "horizon_unclipped" / "curves.jsonl.gz"))
    out: dict = {"grpo": {}, "grpo_unclipped": {}}
    for r in runs:
        if (r.get("schedule.mode") == "sync" and r.lr == LR
                and r.get("schedule.replay_ratio") == REPLAY
                and r.get("buffer.horizon") in HORIZONS and r.get("trainer.loss") in out):
            out[r.get("trainer.loss")].setdefault(int(r.get("buffer.horizon")), {})[r.seed] = r
    return out


def auc(r: Run) -> float:
    """Mean eval accuracy over the run's evaluations (equally spaced updates, as registered)."""
    return float(np.mean(r.eval["eval_accuracy"]))


def mean_interval(values: np.ndarray, draws: np.ndarray) -> tuple[float, float, float]:
    """Mean of ``values`` (one per seed) and its 95% seed-bootstrap interval over ``draws``
    (resampled seed indices, (DRAWS, seeds))."""
    boots = values[draws].mean(1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(values.mean()), float(lo), float(hi)


def judge(arms: dict) -> dict:
    """Per x each arm's mean AUC with its interval and the paired difference unclipped minus
    clipped over shared seeds; the registered claims U1-U3."""
    rng = np.random.default_rng(0)
    rows = {}
    for x in HORIZONS:
        clip, free = arms["grpo"].get(x, {}), arms["grpo_unclipped"].get(x, {})
        seeds = sorted(set(clip) & set(free))
        draws = rng.integers(0, len(seeds), (DRAWS, len(seeds)))  # shared: paired arms
        a, b = (np.array([auc(arm[s]) for s in seeds]) for arm in (clip, free))
        rows[x] = {"seeds": len(seeds), "clipped": mean_interval(a, draws),
                   "unclipped": mean_interval(b, draws),
                   "difference": mean_interval(b - a, draws)}
    free = {x: rows[x]["unclipped"][0] for x in HORIZONS}
    finals = [r.eval["eval_accuracy"][-1] for by_seed in arms["grpo_unclipped"].values()
              for r in by_seed.values()]
    claims = {"U1": bool(free[64] >= free[16] - 0.01 and free[256] >= free[64] - 0.01),
              "U2": bool(rows[16]["difference"][1] > 0 and rows[64]["difference"][1] > 0),
              "U3": bool(finals) and bool(min(finals) > WARM_START_ACCURACY)}
    return {"rows": rows, "claims": claims, "lowest_final": float(min(finals))}


def _cell(v) -> str:
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def table(v: dict) -> str:
    """The verdict as markdown."""
    lines = ["# The horizon without the clip (theory.md 11.19)", "",
             "AUC: mean eval accuracy over the run's 13 evaluations; lr 1e-4, y = 2; 95% "
             "seed-bootstrap intervals; differences paired by seed.", "",
             "| x | seeds | clipped (cpu_sweep_v3) | unclipped | unclipped - clipped |",
             "|---|---|---|---|---|"]
    for x, r in v["rows"].items():
        lines.append(f"| {x} | {r['seeds']} | {_cell(r['clipped'])} | {_cell(r['unclipped'])} "
                     f"| {_cell(r['difference'])} |")
    lines += ["", "Registered claims (experiments/horizon_unclipped.yaml):", ""]
    lines += [f"* {k}: {'holds' if ok else 'fails'}" for k, ok in v["claims"].items()]
    lines.append(f"* lowest final accuracy of an unclipped run: {v['lowest_final']:.3f}")
    return "\n".join(lines) + "\n"


def draw(v: dict):
    """Mean AUC against x (log), both arms, with intervals."""
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    xs = np.array(HORIZONS, float)
    for arm, colour, shift in (("clipped", PALETTE[0], 0.97), ("unclipped", PALETTE[1], 1.03)):
        m = np.array([v["rows"][x][arm] for x in HORIZONS])
        ax.errorbar(xs * shift, m[:, 0], yerr=[m[:, 0] - m[:, 1], m[:, 2] - m[:, 0]],
                    fmt="o-", color=colour, capsize=2, label=arm)
    ax.set(xscale="log", xlabel="buffer x (updates)", ylabel="AUC (mean eval accuracy)")
    ax.legend(fontsize=7)
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--results", default=str(RESULTS), help="the results folder")
    a = p.parse_args(argv)
    v = judge(load(Path(a.results)))
    record = {"rows": {str(x): r for x, r in v["rows"].items()}, "claims": v["claims"],
              "lowest_final": v["lowest_final"]}
    return [write_text(table(v), "unclipped.md", a.out),
            write_text(json.dumps(record, indent=1), "unclipped.json", a.out),
            *save(draw(v), "unclipped", a.out)]


if __name__ == "__main__":
    main()
