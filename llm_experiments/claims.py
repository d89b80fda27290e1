"""The paper's empirical claims (theory.md section 7), evaluated on a sweep at our scale.

Writes ``claims.md`` (a table ``claim | paper | ours | holds?``) and ``claims.json`` (one
record per claim: ``claim``, ``paper``, ``ours``, ``holds``). A claim that does not hold at our
scale is reported as such with its numbers; ``holds`` is null where our setting cannot test it.

Conventions (``paired.py``): the best learning rate per cell by median over seeds; compute to
the target accuracy at mu = 6.84 (the paper's Qwen3-0.6B regime) unless said otherwise;
"drop" = best eval accuracy minus the final one (a peak-then-crash measure); a "crash" is a
drop above 0.1.

``python -m llm_experiments.claims --results results/cpu_sweep --out figures/out``
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from replaytheory.analysis import curves_on_grid, median_iqr, spearman
from replaytheory.io import atomic_write, write_json

from .paired import (TARGET, CellScore, best_cell, cell_scores, compute_score, kind,
                     measured_mu, tail_score)
from .results import Run, load_runs

PAPER_MU = 6.84
CRASH = 0.1


def _drop(run: Run) -> float:
    acc = run.eval["eval_accuracy"]
    return float(np.nanmax(acc) - acc[-1])


def _steps_to_target(run: Run, target: float) -> float:
    return run.compute_to_target(0.0, target)  # mu = 0: compute = steps


def _med(values) -> float:
    return float(median_iqr(np.asarray(values, dtype=float))[0])


def _fmt(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "n/a"
    if isinstance(x, float) and np.isinf(x):
        return "never"
    return f"{x:.{digits}g}"


def _cell(scores: list[CellScore], pred) -> CellScore | None:
    return next((c for c in scores if pred(c)), None)


def _frontier_share(runs, mu, buffer_kinds=("grid", "delta")) -> float:
    """Share of compute budgets where the best buffer (cell, lr) median accuracy is at least
    the best on-policy one (Pareto frontier over learning rates)."""
    groups: dict = {}
    for r in runs:
        groups.setdefault((kind(r) == "on_policy", r.cell, r.lr), []).append(r)
    top = min(max(float(r.compute(mu)[-1]) for r in g) for g in groups.values())
    budgets = np.linspace(top * 0.1, top, 20)
    best = {True: np.full(budgets.size, -np.inf), False: np.full(budgets.size, -np.inf)}
    for (is_onp, _, _), g in groups.items():
        if not is_onp and kind(g[0]) not in buffer_kinds:
            continue
        curves = [(r.compute(mu), r.eval["eval_accuracy"]) for r in g]
        med = median_iqr(curves_on_grid(curves, budgets), axis=0)[0]
        best[is_onp] = np.fmax(best[is_onp], med)
    return float(np.mean(best[False] >= best[True]))


def evaluate(curves: str, *, target: float = TARGET, loss: str = "grpo") -> list[dict]:
    """The claims table from a ``curves.jsonl`` (see the module docstring)."""
    all_runs = load_runs(curves)
    runs = [r for r in all_runs if r.get("trainer.loss") == loss]
    mu_m = measured_mu(runs)
    comp = cell_scores(runs, compute_score(PAPER_MU, target), "min")
    comp_m = cell_scores(runs, compute_score(mu_m, target), "min")
    tail = cell_scores(runs, tail_score, "max")
    onp = _cell(comp, lambda c: c.kind == "on_policy")
    onp_m = _cell(comp_m, lambda c: c.kind == "on_policy")
    buf = best_cell(comp, "min")
    buf_m = best_cell(comp_m, "min")
    out = []

    # 1. compute saving and Pareto frontier
    saving = 1 - buf.median / onp.median
    saving_m = 1 - buf_m.median / onp_m.median
    share = _frontier_share(runs, PAPER_MU)
    out.append({"claim": "1. a well-chosen buffer reaches the same accuracy with less compute;"
                         " its Pareto frontier over learning rates beats on-policy's",
                "paper": "up to ~40% less compute (Qwen2.5-7B); buffer frontier above "
                         "on-policy at every budget",
                "ours": f"compute to {target:g}: best buffer ({buf.label}) {_fmt(buf.median)}"
                        f" vs on-policy {_fmt(onp.median)} updates at mu={PAPER_MU:g}: "
                        f"{100 * saving:.0f}% saved; at measured mu={mu_m:.2f}: "
                        f"{100 * saving_m:.0f}% ({buf_m.label}); buffer frontier >= "
                        f"on-policy at {100 * share:.0f}% of budgets",
                "holds": bool(saving > 0 and share >= 0.8)})

    # 2. per step worse, per compute better
    def steps(cell):
        return _med([_steps_to_target(r, target) for r in cell.runs])
    step_ratio = steps(buf) / steps(onp)
    out.append({"claim": "2. per gradient step replay can be slightly worse; per unit of "
                         "compute it is better",
                "paper": "qualitative (accuracy vs steps and vs compute)",
                "ours": f"{buf.label} vs on-policy: steps to {target:g} x{_fmt(step_ratio)}, "
                        f"compute x{_fmt(buf.median / onp.median)} (mu={PAPER_MU:g})",
                "holds": bool(step_ratio >= 1 and buf.median < onp.median)})

    # 3. larger N: slower but more stable; on-policy crashes more often
    def at(x, y):
        return _cell(comp, lambda c: c.kind == "grid" and c.horizon == x
                     and c.replay_ratio == y)
    xs = sorted({c.horizon for c in comp if c.kind == "grid"})
    small, large = at(xs[0], 2.0), at(xs[-1], 2.0)
    buffer_runs = [r for r in runs if kind(r) == "grid"]
    onp_runs = [r for r in runs if kind(r) == "on_policy"]
    crash_onp = float(np.mean([_drop(r) > CRASH for r in onp_runs]))
    crash_buf = float(np.mean([_drop(r) > CRASH for r in buffer_runs]))
    if small and large:
        s_small, s_large = steps(small), steps(large)
        d_small = _med([_drop(r) for r in small.runs])
        d_large = _med([_drop(r) for r in large.runs])
        ours3 = (f"y=2: steps to {target:g} x={xs[0]:g}: {_fmt(s_small)}, x={xs[-1]:g}: "
                 f"{_fmt(s_large)}; median drop from peak {_fmt(d_small)} vs {_fmt(d_large)};"
                 f" crash (drop > {CRASH:g}) rate on-policy {100 * crash_onp:.0f}% vs buffer "
                 f"{100 * crash_buf:.0f}%")
        holds3 = bool(s_large >= s_small and d_large <= d_small and crash_onp > crash_buf)
    else:
        ours3, holds3 = "cells x at y=2 missing", None
    out.append({"claim": "3. larger N learns more slowly but more stably; on-policy runs peak "
                         "then crash more often", "paper": "qualitative (Fig. 3, 14)",
                "ours": ours3, "holds": holds3})

    # 4. heavy reuse hurts the best accuracy
    grid_tail = [c for c in tail if c.kind == "grid"]
    rho_y = spearman([c.replay_ratio for c in grid_tail], [c.median for c in grid_tail])
    per_x = []
    for x in xs:
        row = sorted((c for c in grid_tail if c.horizon == x), key=lambda c: c.replay_ratio)
        if len(row) >= 2:
            per_x.append((x, row[0].median, row[-1].median, row[0].replay_ratio,
                          row[-1].replay_ratio))
    worse = sum(hi < lo for _, lo, hi, _, _ in per_x)
    out.append({"claim": "4. heavy reuse (high replay ratio) eventually hurts the best "
                         "accuracy (loss of local diversity)",
                "paper": "avg replay ratios 2.2 / 5.6 / 17.6 at (W,T) = (6,2) / (5,3) / (4,4);"
                         " best accuracy falls with reuse",
                "ours": "tail accuracy, lowest vs highest y per x: " + "; ".join(
                    f"x={x:g}: {lo:.3f} (y={y0:g}) -> {hi:.3f} (y={y1:g})"
                    for x, lo, hi, y0, y1 in per_x) + f"; Spearman(y, accuracy) = "
                    f"{_fmt(rho_y, 2)}",
                "holds": bool(per_x) and worse > len(per_x) / 2})

    # 5. diversity: pass@k gain grows with k, entropy stays higher
    ks = (1, 16)

    def final(cell, key):
        return _med([r.eval[key][-1] for r in cell.runs])

    def entropy(cell):
        vals = []
        for r in cell.runs:
            e = r.train["entropy"]
            vals.append(float(np.nanmean(e[len(e) * 3 // 4:])))
        return _med(vals)
    gains = {k: final(buf, f"pass@{k}") - final(onp, f"pass@{k}") for k in ks}
    ent_buf, ent_onp = entropy(buf), entropy(onp)
    out.append({"claim": "5. replay preserves output diversity: the pass@k gain over on-policy "
                         "grows with k; training entropy stays higher",
                "paper": "qualitative (Fig. 3 middle)",
                "ours": f"{buf.label} - on-policy: pass@1 {gains[1]:+.3f}, pass@16 "
                        f"{gains[16]:+.3f}; entropy (last quarter) {ent_buf:.3f} vs "
                        f"{ent_onp:.3f}",
                "holds": bool(gains[16] > gains[1] and ent_buf > ent_onp)})

    # 6. stale weights alone stabilise
    lags = [c for c in tail if c.kind == "lag"]
    onp_tail = _cell(tail, lambda c: c.kind == "on_policy")
    if lags and onp_tail:
        d_onp = _med([_drop(r) for r in onp_tail.runs])
        parts, ok = [], []
        for c in sorted(lags, key=lambda c: float(c.runs[0].get("schedule.latency_steps"))):
            d = _med([_drop(r) for r in c.runs])
            parts.append(f"{c.label}: tail {c.median:.3f}, drop {d:.3f}")
            ok.append(d <= d_onp and c.median >= onp_tail.median)
        out.append({"claim": "6. moderate off-policiness alone (stale weights, no replay) "
                             "stabilises training",
                    "paper": "median staleness 3, 13, 28, 98 all stabilise",
                    "ours": "; ".join(parts) + f"; on-policy: tail {onp_tail.median:.3f}, "
                            f"drop {d_onp:.3f}",
                    "holds": bool(all(ok))})

    # 7. positive bias and AsymRE
    deltas = [c for c in tail if c.kind == "delta"]
    if deltas:
        base = _cell(tail, lambda c: c.kind == "grid" and c.horizon == deltas[0].horizon
                     and c.replay_ratio == deltas[0].replay_ratio)
        parts = [f"{c.label}: {c.median:.3f}" for c in deltas]
        out.append({"claim": "7a. positive-bias sampling (delta in {0.2, 0.5}) improves further",
                    "paper": "improves (Fig. 6)",
                    "ours": "tail accuracy " + "; ".join(parts) +
                            f"; delta=0 at the same cell: {base.median:.3f}",
                    "holds": bool(all(c.median > base.median for c in deltas))})
    other = [r for r in all_runs if r.get("trainer.loss") != loss]
    if other:
        alt = best_cell(cell_scores(other, tail_score, "max"), "max", kinds=("grid",))
        mine = best_cell(tail, "max", kinds=("grid",))
        alt_loss = other[0].get("trainer.loss")
        out.append({"claim": f"7b. {alt_loss} instead of {loss} improves further",
                    "paper": "AsymRE better than GRPO with a buffer",
                    "ours": f"best tail accuracy {alt_loss} {alt.median:.3f} ({alt.label}, "
                            f"lr {alt.lr:g}) vs {loss} {mine.median:.3f} ({mine.label}, lr "
                            f"{mine.lr:g})",
                    "holds": bool(alt.median > mine.median)})

    out.append({"claim": "8. wall-clock gains match or exceed the compute gains",
                "paper": "yes (buffer smooths producer/consumer stalls)",
                "ours": "not testable here: the harness emulates the asynchronous system "
                        "deterministically on one CPU, so there are no stalls to smooth",
                "holds": None})
    return out


def to_markdown(records: list[dict]) -> str:
    """The claims table in Markdown."""
    lines = ["| claim | paper | ours (number) | holds? |", "|---|---|---|---|"]
    for r in records:
        holds = {True: "yes", False: "no", None: "not tested"}[r["holds"]]
        cells = [r["claim"], r["paper"], r["ours"], holds]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write(records: list[dict], out_dir: str) -> list[str]:
    """``claims.md`` and ``claims.json`` in ``out_dir``, atomically."""
    md, js = os.path.join(out_dir, "claims.md"), os.path.join(out_dir, "claims.json")
    text = to_markdown(records)
    atomic_write(md, lambda fh: fh.write(text))
    write_json(js, records)
    return [md, js]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="results/cpu_sweep", help="folder with curves.jsonl")
    p.add_argument("--out", default="figures/out", help="where to write claims.md/.json")
    p.add_argument("--target", type=float, default=TARGET)
    a = p.parse_args(argv)
    records = evaluate(os.path.join(a.results, "curves.jsonl"), target=a.target)
    for path in write(records, a.out):
        print(path)
    print(to_markdown(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
