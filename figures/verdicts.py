"""Figures and tables of a judged sweep: where the optimum is and how each prediction fares.

Reads a ``validation.json`` written by ``python -m llm_experiments judge`` (or ``verify``):
one record per (mu, measure) with each cell's probability of being best and each
prediction's nearest cell, regret and Spearman (theory.md section 8). Writes, for the primary
measure (``auc``):

Where the judge also scored the runs over measured seconds (``--seconds``: the
``auc_seconds`` record, theory.md section 3.7) every table and the figure show it beside the
compute-unit rows, and ``verdicts_<name>.md`` adds each cell's update cost and mu in the
unit C = an on-policy update of B rollouts.

* ``verdicts_<name>``: one panel per mu, the probability that each (x, y) cell is best over
  the seed bootstrap (on-policy's in the title), each prediction's cell marked;
* ``verdicts_<name>.md``: per mu, the best cell with its probability and, per prediction,
  its cell, regret (median and interval) and Spearman (median and interval).
  Below it, where the judge recorded them (``llm_experiments.study.best_region``): the best
  horizon with leave-one-seed-out differences to its neighbours, the cells within the noise
  of the best, compute to two targets, and the rule baseline x = 64, y = sqrt(mu);
* ``verdicts_goal.md`` (``python -m figures.make_all``, every judged setting together): each
  prediction against the held-out goal of theory.md section 10.9 (``GoalRow``): predicted y
  against the best cell's, regret, Spearman and the split-half gate;
* ``verdicts_closing.md`` (``--closing``): issue 25's table per setting and mu, the best
  horizon with its neighbours' differences, the primary prediction, its regret and each
  baseline's (on-policy, x = 64 with y = sqrt(mu), section 5's model), Spearman and gate.

Run: ``python -m figures.verdicts RESULTS [...] [--out DIR] [--name NAME] [--closing]``; each
RESULTS is a folder holding ``validation.json`` or a ``validation*.json`` file (a second
registration's ``validation_<x>.json``); ``<name>`` is the folder's name plus ``_<x>`` (e.g.
``heldout_wide_hold_last``) unless ``--name`` gives one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from figures.style import PALETTE, figure_parser, plt, save, write_text

PRIMARY = "auc"
# The verdicts the tables and the figure show: the primary measure over compute units and,
# where the judge ran with --seconds, the same over measured seconds (theory.md section 3.7).
SECONDS = "auc_seconds"
SHOWN = (PRIMARY, SECONDS)


def shown(records: list[dict]) -> list[dict]:
    """The records of the measures shown (``SHOWN``), in the judge's order."""
    return [r for r in records if r["measure"] in SHOWN]


def _measures(records: list[dict]) -> str:
    """The shown measures the records hold, as 'auc' or 'auc, auc_seconds'."""
    return ", ".join(dict.fromkeys(r["measure"] for r in shown(records)))
MARKERS = "os^vDP*X"


def load_records(path) -> list[dict]:
    """The judge's records of one ``validation.json`` (a list of per-(mu, measure) dicts)."""
    with open(path) as fh:
        records = json.load(fh)
    if not (isinstance(records, list) and records and "predictions" in records[0]
            and "measure" in records[0]):
        raise ValueError(f"{path} is not a validation.json written by the judge")
    return records


def mu_label(r: dict) -> str:
    """Which mu a record is judged at, in words."""
    if r["mu_source"] == "measured":
        return f"measured mu = {r['mu']:.3g}"
    if r["mu_source"] == "cell":
        return f"each cell's own mu (on-policy {r['mu']:.3g})"
    if r["mu_source"] == "seconds":
        return f"measured seconds (budget {r['budget']:.3g} s)"
    return f"accounting mu = {r['mu']:.3g}"


def _fmt(d: dict | None, null: str = "n/a") -> str:
    """An interval record as 'median [low, high]'; 'n/a' without a median. A bound JSON could
    not hold (inf or NaN, stored as null) shows as ``null`` ("inf" for compute that never
    reached its target)."""
    median = (d or {}).get("median")
    if not d or median is None and null == "n/a" or median is not None and math.isnan(median):
        return "n/a"
    low, high = (null if d[k] is None else f"{d[k]:.2f}" for k in ("low", "high"))
    return f"{null if median is None else f'{median:.2f}'} [{low}, {high}]"


def _cell(d: dict) -> str:
    """A judged cell with the cells as near its advice (``tied``) and a flag for a horizon
    past the grid."""
    return d["cell"] + "".join(f" (tied: {t['cell']}, regret {_fmt(t['regret'])})"
                               for t in d.get("tied", ())) + \
        (" (x* past the grid)" if d.get("x_beyond_grid") else "")


def table(records: list[dict], name: str) -> str:
    """The primary measure's verdicts as markdown: one row per (mu, prediction) and baseline,
    then, where the judge recorded them, the best horizon, the cells within the noise of the
    best and compute to target (``sceptic_tables``)."""
    seeds = records[0].get("seeds")
    lines = [f"# Verdicts of {name} ({_measures(records)}, seeds "
             f"{seeds if seeds else 'n/a'})", "",
             "Regret: the share of the best cell's gain over the warm start that the "
             "predicted cell loses (median and 90% bootstrap interval over seeds); "
             "Spearman: predicted J against the measured score over the grid. A prediction "
             "as near two cells is judged at the worse and the other shown as tied.", "",
             "| mu | best cell (P) | gate | prediction | its cell | P(its cell best) | regret "
             "| Spearman |", "|---|---|---|---|---|---|---|---|"]
    for r in shown(records):
        p_best = {c["label"]: c["p_best"] for c in r["cells"]}
        head = (f"{mu_label(r)} | {r['best_cell']} "
                f"({r['best_probability']:.2f}) | {r['gate_spearman']:.2f}")
        for v, d in r["predictions"].items():
            lines.append(f"| {head} | {v} | {_cell(d)} | {p_best.get(d['cell'], 0.0):.2f} | "
                         f"{_fmt(d['regret'])} | {_fmt(d['spearman'])} |")
            head = " | | "
        if r.get("on_policy_regret"):
            lines.append(f"| {head} | (no buffer) | on-policy | "
                         f"{p_best.get('on-policy', 0.0):.2f} | {_fmt(r['on_policy_regret'])} "
                         "| n/a |")
        rule = (r.get("baselines") or {}).get(RULE)
        if rule:
            lines.append(f"| {head} | (rule {RULE}) | {_cell(rule)} | "
                         f"{p_best.get(rule['cell'], 0.0):.2f} | {_fmt(rule['regret'])} | n/a |")
    return "\n".join(lines) + "\n" + cost_table(records) + sceptic_tables(records)


def cost_table(records: list[dict]) -> str:
    """Each cell's update cost and mu in the unit C (an on-policy update of B rollouts) and
    its median run seconds, from the judge's seconds record ('' without one)."""
    rec = next((r for r in records if r.get("costs")), None)
    if rec is None:
        return ""
    c = rec["costs"]
    lines = ["", f"## Cost per cell in the unit C = {c['unit']}", "",
             f"C = {c['unit_seconds']:.4g} s (the median update of {c['unit_cell']}); "
             "update cost: the cell's median seconds per update in C; mu: its seconds to "
             "generate B rollouts in C (theory.md section 3.7).", "",
             "| cell | update cost | mu | median run seconds |", "|---|---|---|---|"]
    lines += [f"| {x['label']} | {x['update_cost']:.2f} | {x['mu']:.3g} | {x['seconds']:.3g} |"
              for x in c["cells"]]
    return "\n".join(lines) + "\n"


RULE = "x=64, y=sqrt(mu)"  # the judge's name of issue 25's rule baseline (judge.RULE)


def _diff(d: dict | None) -> str:
    """A paired difference record as 'mean [low, high] (won k/n)'."""
    if not d or d.get("mean") is None:
        return "n/a"
    ci = "n/a" if d.get("low") is None else f"{d['low']:+.3f}, {d['high']:+.3f}"
    return f"{d['mean']:+.3f} [{ci}] (won {d['wins']}/{d['seeds']})"


def neighbours_text(h: dict) -> str:
    return "; ".join(f"vs x={n['horizon']:g}: {_diff(n['difference'])}" for n in h["neighbours"])


def sceptic_tables(records: list[dict]) -> str:
    """The primary measure's best horizon, cells within the noise of the best and compute to
    target, as markdown ('' for verdicts from before the judge recorded them)."""
    recs = [r for r in shown(records) if "best_horizon" in r]
    if not recs:
        return ""
    lines = ["", "## Best horizon, out of sample", "",
             "The best grid cell's horizon (P: a cell of it is best in the bootstrap); per "
             "horizon its best cell's score; leave-one-seed-out paired differences to the "
             "adjacent grid horizons (mean [90% t interval], seeds the best horizon won; each "
             "horizon's y and learning rate chosen on the other seeds).", "",
             "| mu | best horizon (P) | best score per horizon | neighbours |", "|---|---|---|---|"]
    for r in recs:
        h = r["best_horizon"]
        per = ", ".join(f"x={p['horizon']:g}: {p['score']:.3f}" for p in h["per_horizon"]
                        if p["score"] is not None)
        lines.append(f"| {mu_label(r)} | x={h['horizon']:g} ({h['p_best']:.2f}) | {per} | "
                     f"{neighbours_text(h)} |")
    lines += ["", "## Within the noise of the best", "",
              "Cells whose paired loss against the best cell (share of its gain, same "
              "bootstrap draws) has a 90% interval reaching 0: the data cannot tell them from "
              "the best. Loss: median [interval].", "",
              "| mu | cells | within noise |", "|---|---|---|"]
    for r in recs:
        near = ", ".join(f"{n['cell']} {_fmt(n['loss'])}" for n in r["within_noise"])
        lines.append(f"| {mu_label(r)} | {len(r['within_noise'])} | {near} |")
    targets = [(r, t) for r in recs for t in r.get("compute_to_target", ())]
    if targets:
        lines += ["", "## Compute to target", "",
                  "Compute to first reach each accuracy, as a multiple of the fastest cell's in "
                  "the same draws (median [90% interval]; inf: never reached); in seconds on "
                  "the measured-seconds rows.", "",
                  "| mu | target | fastest cell (P) | compute ratio by cell |",
                  "|---|---|---|---|"]
    for r, t in targets:
        ratios = ", ".join(f"{c} {_fmt(i, null='inf')}"
                           for c, i in t["compute_ratio"].items())
        lines.append(f"| {mu_label(r)} | {t['target']:g} | {t['fastest_cell']} "
                     f"({t['fastest_probability']:.2f}) | {ratios} |")
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    """A predicted coordinate; None is how JSON holds an infinite one."""
    return "inf" if x is None else f"{x:.3g}"


def closing_table(named: dict[str, list[dict]]) -> str:
    """Issue 25's closing table of every judged setting (``{name: records}``), one row per
    (setting, mu) of the primary measure: the best horizon with its neighbours' differences,
    the registered primary prediction and its regret, the regret of each baseline, the
    prediction's Spearman and the gate. A setting without a registered primary variant gets
    a row per prediction."""
    every = [r for records in named.values() for r in records]
    lines = [f"# Best horizon, prediction and baselines per setting and mu "
             f"({_measures(every)})", "",
             "Regret: share of the best cell's gain lost (median [90% interval], one bootstrap "
             "for all); neighbours: leave-one-seed-out differences of the best horizon to the "
             "adjacent ones (positive: the best horizon wins); n/a: not recorded.", "",
             "| setting | mu | best horizon (P) | neighbours | prediction | regret | on-policy | "
             f"{RULE} | section 5 | Spearman | gate |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, records in named.items():
        for r in shown(records):
            h, base = r.get("best_horizon"), r.get("baselines") or {}
            horizon = f"x={h['horizon']:g} ({h['p_best']:.2f}) | {neighbours_text(h)}" if h \
                else "n/a | n/a"
            primary = r.get("primary_variant")
            for v in [primary] if primary in r["predictions"] else list(r["predictions"]):
                d = r["predictions"][v]
                lines.append(
                    f"| {name} | {mu_label(r)} | {horizon} | {v}: x*={_num(d['x_star'])}, "
                    f"y*={_num(d['y_star'])} -> {_cell(d)} | {_fmt(d['regret'])} | "
                    f"{_fmt(r.get('on_policy_regret'))} | "
                    f"{_fmt((base.get(RULE) or {}).get('regret'))} | "
                    f"{_fmt((base.get('section 5') or {}).get('regret'))} | "
                    f"{_fmt(d['spearman'])} | {r['gate_spearman']:.2f} |")
    return "\n".join(lines) + "\n"


# The held-out goal for a prediction (theory.md section 10.9): predicted y within this factor
# of the bootstrap-mode best cell's y, regret median at most this, Spearman median at least
# this; the split-half gate's bar is the registration's own (``gate_passed``).
GOAL_Y_FACTOR = 1.5
GOAL_REGRET = 0.10
GOAL_SPEARMAN = 0.7


@dataclass(frozen=True)
class GoalRow:
    """One prediction at one mu of one judged setting, against the held-out goal (section 10.9).

    y_star: the continuous predicted replay ratio, floored at 1 (below 1 means on-policy).
    y_best: the bootstrap-mode best cell's y (1 for on-policy). regret, spearman: interval
    records (median, low, high), or None where the judge could not compute one. gate: the
    split-half Spearman; gate_passed its verdict.
    """

    setting: str
    mu: str
    gate: float
    gate_passed: bool
    best_cell: str
    best_probability: float
    variant: str
    cell: str
    y_star: float
    y_best: float
    regret: dict | None
    spearman: dict | None
    # (cell, regret record) of cells as near the prediction as ``cell`` (judge.SweepGrid.tied)
    tied: tuple = ()
    # on-policy's regret in the same draws: the no-buffer advice (None: not in the grid, or a
    # verdict from before the judge reported it)
    on_policy_regret: dict | None = None

    @property
    def y_factor(self) -> float:
        """How far the predicted y is from the best cell's, as a factor >= 1."""
        return max(self.y_star, self.y_best) / min(self.y_star, self.y_best)

    @property
    def goals_met(self) -> dict[str, bool]:
        """Each of the four criteria: y within 1.5x, regret <= 10%, Spearman >= 0.7, gate."""
        return {"y": self.y_factor <= GOAL_Y_FACTOR,
                "regret": _median(self.regret) <= GOAL_REGRET,
                "spearman": _median(self.spearman) >= GOAL_SPEARMAN,
                "gate": self.gate_passed}


def _median(d: dict | None) -> float:
    """An interval record's median; NaN (never meets a goal) when the judge had none."""
    return float("nan") if not d or d.get("median") is None else float(d["median"])


def goal_rows(named: dict[str, list[dict]]) -> list[GoalRow]:
    """The primary measure's predictions of every judged setting (``{name: records}``), one
    ``GoalRow`` per (setting, mu, prediction)."""
    rows = []
    for name, records in named.items():
        for r in (r for r in records if r["measure"] == PRIMARY):
            best = next(c for c in r["cells"] if c["label"] == r["best_cell"])
            for v, d in r["predictions"].items():
                rows.append(GoalRow(name, mu_label(r), r["gate_spearman"], r["gate_passed"],
                                    r["best_cell"], r["best_probability"], v, d["cell"],
                                    max(float(d["y_star"]), 1.0), float(best["replay_ratio"]),
                                    d["regret"], d["spearman"],
                                    tuple((t["cell"], t["regret"]) for t in d.get("tied", ())),
                                    r.get("on_policy_regret")))
    return rows


def goal_table(rows: list[GoalRow]) -> str:
    """``goal_rows`` as a markdown table: the goal's four criteria per prediction."""
    lines = [f"# Every judged prediction against the held-out goal ({PRIMARY}; theory.md "
             "section 10.9)", "",
             f"Goal: predicted y within {GOAL_Y_FACTOR:g}x of the bootstrap-mode best cell's y, "
             f"regret median <= {GOAL_REGRET:.0%}, Spearman median >= {GOAL_SPEARMAN:g}, "
             "split-half gate passed. y* is the continuous prediction, floored at 1. A cell "
             "as near the prediction as the judged one is shown beside it (tied). "
             "On-policy: the regret of using no buffer, in the same draws (n/a: not "
             "reported). Met: the criteria met, of y / regret / Spearman / gate.", "",
             "| setting | mu | gate | best cell (P) | on-policy | prediction | its cell | y* | "
             "best y | regret | Spearman | met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        met = [k for k, ok in row.goals_met.items() if ok]
        cell = row.cell + "".join(f" (tied: {c}, regret {_fmt(r)})" for c, r in row.tied)
        lines.append(f"| {row.setting} | {row.mu} | {row.gate:.2f} | {row.best_cell} "
                     f"({row.best_probability:.2f}) | {_fmt(row.on_policy_regret)} | "
                     f"{row.variant} | {cell} | "
                     f"{row.y_star:.2f} | {row.y_best:g} | {_fmt(row.regret)} | "
                     f"{_fmt(row.spearman)} | {len(met)}/4 {' '.join(met)} |")
    return "\n".join(lines) + "\n"


def main_goal(named: dict[str, list[dict]], out=None) -> Path:
    """Write ``verdicts_goal.md`` (``goal_table`` of every setting in ``named``)."""
    return write_text(goal_table(goal_rows(named)), "verdicts_goal.md", out)


def main_closing(named: dict[str, list[dict]], out=None) -> Path:
    """Write ``verdicts_closing.md`` (``closing_table`` of every setting in ``named``)."""
    return write_text(closing_table(named), "verdicts_closing.md", out)


def draw(records: list[dict], name: str):
    """The P(best) heatmaps of the primary measure, one panel per mu, predictions marked."""
    recs = shown(records)
    fig, axes = plt.subplots(1, len(recs), figsize=(3.2 * len(recs) + 1.5, 3.2), squeeze=False,
                             layout="constrained")
    for ax, r in zip(axes[0], recs):
        grid = [c for c in r["cells"] if c["label"] != "on-policy"]
        xs = sorted({c["horizon"] for c in grid})
        ys = sorted({c["replay_ratio"] for c in grid})
        p = np.full((len(ys), len(xs)), np.nan)
        for c in grid:
            p[ys.index(c["replay_ratio"]), xs.index(c["horizon"])] = c["p_best"]
        ax.grid(False)
        im = ax.imshow(p, origin="lower", vmin=0, vmax=1, cmap="Greys", aspect="auto")
        ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
        ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
        ax.set_xlabel("staleness horizon x")
        ax.set_ylabel("replay ratio y")
        onp = next((c["p_best"] for c in r["cells"] if c["label"] == "on-policy"), 0.0)
        ax.set_title(f"{mu_label(r)}\non-policy P(best) = {onp:.2f}")
        for k, (v, d) in enumerate(r["predictions"].items()):
            cell = next((c for c in grid if c["label"] == d["cell"]), None)
            if cell is None:
                continue
            # Markers are spread around the cell centre so that variants on one cell show.
            dx = 0.22 * math.cos(2 * math.pi * k / len(r["predictions"]))
            dy = 0.22 * math.sin(2 * math.pi * k / len(r["predictions"]))
            ax.plot(xs.index(cell["horizon"]) + dx, ys.index(cell["replay_ratio"]) + dy,
                    MARKERS[k % len(MARKERS)], color=PALETTE[1 + k % 7], ms=5, label=v)
    fig.legend(*axes[0][-1].get_legend_handles_labels(), loc="outside right upper",
               title="predicted")
    fig.colorbar(im, ax=axes[0].tolist(), label="P(best)", shrink=0.8, location="left")
    fig.suptitle(f"{name}: probability that each cell is best ({_measures(records)})")
    return fig


def default_name(path) -> str:
    """``<folder>`` for ``<folder>/validation.json``, ``<folder>_<x>`` for
    ``<folder>/validation_<x>.json``."""
    path = Path(path)
    return path.parent.name + path.stem[len("validation"):]


def main_one(results, out=None, name: str | None = None) -> list[Path]:
    """Draw the figure and write the table of ``results``: a folder's ``validation.json`` or a
    ``validation*.json`` file; ``name`` (default ``default_name``) names the outputs."""
    path = Path(results)
    if path.is_dir():
        path = path / "validation.json"
    name = name or default_name(path)
    records = load_records(path)
    paths = save(draw(records, name), f"verdicts_{name}", out)
    return [*paths, write_text(table(records, name), f"verdicts_{name}.md", out)]


def main(argv=None) -> int:
    p = figure_parser(__doc__)
    p.add_argument("results", nargs="+", help="folders holding a judged validation.json, or "
                   "validation*.json files")
    p.add_argument("--name", help="name of the outputs (one results folder only; default: "
                   "the folder's name)")
    p.add_argument("--closing", action="store_true", help="write only verdicts_closing.md, "
                   "the best horizon, prediction and baselines of every results given")
    a = p.parse_args(argv)
    if a.name and len(a.results) > 1:
        p.error("--name takes one results folder")
    if a.closing:
        paths = [Path(d) / "validation.json" if Path(d).is_dir() else Path(d)
                 for d in a.results]
        print(main_closing({default_name(q): load_records(q) for q in paths}, a.out))
        return 0
    for d in a.results:
        for path in main_one(d, a.out, a.name):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
