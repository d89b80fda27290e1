"""A horizon that grows during the run against fixed horizons (issue 25, theory.md 11.14): the
registered comparison of ``results/horizon_growth/prediction.json``, judged per window T.

``python -m figures.growth [--out DIR]`` writes ``growth.md`` (each arm's median AUC at its
best learning rate, the growing buffer's paired differences with a seed-bootstrap interval and
whether each registered claim holds) and ``growth.png`` / ``.pdf`` (median AUC against T).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from figures.style import PALETTE, figure_parser, plt, save, write_text
from llm_experiments.study.results import Run, load_runs
from replaytheory.stats.analysis import mean_over_budget

RESULTS = Path(__file__).resolve().parents[1] / "results"
FIXED = {"fixed x=16": 16.0, "fixed x=64": 64.0}
DRAWS, LEVEL = 2000, 0.9


@dataclass(frozen=True)
class Arms:
    """Per arm name: {learning rate: {seed: run}}."""

    runs: dict

    def table(self, score) -> dict:
        """arm -> (lr, {seed: score}) at the lr whose median score over seeds is highest."""
        out = {}
        for arm, by_lr in self.runs.items():
            scored = {lr: {s: score(r) for s, r in runs.items()} for lr, runs in by_lr.items()}
            best = max(scored, key=lambda lr: np.median(list(scored[lr].values())))
            out[arm] = (best, scored[best])
        return out


def load_arms(reg: dict, folder: Path = RESULTS) -> tuple[Arms, float]:
    """The registered arms' runs (growing from ``horizon_growth``, the others from
    ``cpu_sweep_v3``) at the registered learning rates and seeds, and the measured mu (the
    on-policy runs' median ``mu_measured``)."""
    lrs, seeds = set(reg["learning_rates"]), set(reg["seeds"])
    base = load_runs(str(folder / "cpu_sweep_v3" / "curves.jsonl.gz"))
    grow = load_runs(str(folder / "horizon_growth" / "curves.jsonl.gz"))

    def pick(runs: list[Run], keep) -> dict:
        out: dict = {}
        for r in runs:
            if keep(r) and r.lr in lrs and r.seed in seeds:
                out.setdefault(r.lr, {})[r.seed] = r
        return out

    def sync_at(x):
        return lambda r: (r.get("schedule.mode") == "sync" and r.get("buffer.horizon") == x
                          and r.get("schedule.replay_ratio") == 1.0)

    arms = {"growing": pick(grow, lambda r: r.get("buffer.horizon_growth", 0) > 0),
            **{name: pick(base, sync_at(x)) for name, x in FIXED.items()},
            "on-policy": pick(base, lambda r: r.get("schedule.mode") == "on_policy")}
    onp = [r for by_seed in arms["on-policy"].values() for r in by_seed.values()]
    mu = float(np.median([r.summary["mu_measured"] for r in onp]))
    return Arms(arms), mu


def auc(r: Run, mu: float, steps: int) -> float:
    """AUC over compute in [0, steps (1 + mu)] (theory.md 8.3 with y_max = 1)."""
    return mean_over_budget(r.compute(mu), r.eval["eval_accuracy"], steps * (1 + mu))


def paired(a: dict, b: dict, rng: np.random.Generator) -> tuple[float, float, float]:
    """Median over shared seeds of a - b, and its 90% seed-bootstrap interval."""
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds])
    boots = np.median(d[rng.integers(0, len(d), (DRAWS, len(d)))], axis=1)
    lo, hi = np.quantile(boots, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(np.median(d)), float(lo), float(hi)


def verdicts(reg: dict, arms: Arms, mu: float) -> list[dict]:
    """Per registered window: each arm's (lr, median AUC) and the growing arm's paired
    differences to each fixed arm and to the better of them."""
    out = []
    for steps in reg["windows"]:
        rng = np.random.default_rng(0)
        tab = arms.table(lambda r, T=steps: auc(r, mu, T))
        medians = {a: float(np.median(list(v.values()))) for a, (_, v) in tab.items()}
        better = max(FIXED, key=lambda a: medians[a])
        diffs = {a: paired(tab["growing"][1], tab[a][1], rng) for a in FIXED}
        out.append({"steps": steps, "lr": {a: lr for a, (lr, _) in tab.items()},
                    "median_auc": medians, "better_fixed": better, "vs": diffs,
                    "holds": diffs[better][0] >= 0, "resolved": diffs[better][1] > 0
                    or diffs[better][2] < 0})
    return out


def table(reg: dict, rows: list[dict], mu: float) -> str:
    """The markdown page."""
    arms = list(rows[0]["median_auc"])
    lines = ["# A horizon that grows against fixed horizons (theory.md 11.14)", "",
             f"Registered in `results/horizon_growth/prediction.json`; AUC at the measured mu "
             f"= {mu:.3f}, each arm at its best learning rate by the median over "
             f"{len(reg['seeds'])} seeds; differences: growing minus fixed, same seed, median "
             "[90% seed-bootstrap interval].", "",
             "| T | " + " | ".join(f"{a} (lr)" for a in arms)
             + " | growing - fixed x=16 | growing - fixed x=64 | claim (2) vs the better |",
             "|" + "---|" * (len(arms) + 4)]
    for r in rows:
        cells = [f"{r['median_auc'][a]:.4f} ({r['lr'][a]:g})" for a in arms]
        diffs = [f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]" for m, lo, hi in
                 (r["vs"][a] for a in FIXED)]
        claim = ("holds" if r["holds"] else "fails") + (", resolved" if r["resolved"]
                                                        else ", not resolved")
        lines.append(f"| {r['steps']} | " + " | ".join(cells + diffs) + f" | {claim} "
                     f"({r['better_fixed']}) |")
    return "\n".join(lines) + "\n"


def draw(rows: list[dict]):
    """Median AUC of each arm against the window T."""
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    for arm, colour in zip(rows[0]["median_auc"], PALETTE[1:]):
        ax.plot([r["steps"] for r in rows], [r["median_auc"][arm] for r in rows], "o-",
                color=colour, label=arm)
    ax.set(xlabel="window T (updates)", ylabel="median AUC", xscale="log")
    ax.legend()
    return fig


def main(argv=None) -> list[Path]:
    p = figure_parser(__doc__)
    p.add_argument("--results", default=str(RESULTS), help="the results folder")
    a = p.parse_args(argv)
    folder = Path(a.results)
    reg = json.loads((folder / "horizon_growth" / "prediction.json").read_text())
    arms, mu = load_arms(reg, folder)
    rows = verdicts(reg, arms, mu)
    return [write_text(table(reg, rows, mu), "growth.md", a.out),
            write_text(json.dumps(rows, indent=1), "growth.json", a.out),
            *save(draw(rows), "growth", a.out)]


if __name__ == "__main__":
    for written in main():
        print(written)
