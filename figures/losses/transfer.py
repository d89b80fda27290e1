"""The adaptive horizon on settings it never ran on (C1-C4, ``experiments/adaptive_transfer.yaml``)
and on cpu_long (C5, ``experiments/adaptive_long.yaml``), for ``figures.losses.report``.

The paired differences are the advice's own (``replaytheory.adaptive_advice.compare_adaptive``
on ``replaytheory.evidence.collect_adaptive``): AUC(adaptive) - AUC(x = 64) per setting, with
95% seed-bootstrap intervals. The pooled difference of C2 weighs every seed pair alike and
resamples seeds within each setting. The drop share is the mean of the logged ``dropped``
(every 5th update) over the rollouts made per update; what x = 64 holds is 64 updates of
rollouts, the buffer's bound once full.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from figures.losses.verdicts import held
from llm_experiments.study.results import load_runs
from replaytheory.adaptive_advice import (FIXED_HORIZON, TAU, AdaptivePair, choose_adaptive,
                                          compare_adaptive)
from replaytheory.evidence import collect_adaptive, paired_signature, setting_names
from replaytheory.loss_advice import DRAWS
from replaytheory.stats.verdicts import seed_draws

TRANSFER = "adaptive_transfer"
LONG = "adaptive_long"
TRANSFER_SETTINGS = 4  # registered
TRANSFER_SEEDS = 10  # registered seeds per setting
LONG_SEEDS = 3


def drop_share(run) -> float:
    """Share of the rollouts made that the adaptive buffer dropped (module docstring)."""
    dropped = np.asarray(run.train.get("dropped", []), float)
    return float(np.nanmean(dropped) / run.summary["rollouts_per_step"]) if dropped.size \
        else float("nan")


def mechanism(results: Path, grid: str) -> dict:
    """{setting: (mean drop share, mean rollouts held at the end) of the adaptive arm at
    ``TAU``, rollouts x = 64 holds}."""
    path = results / grid / "curves.jsonl.gz"
    if not path.exists():
        return {}
    runs = [r for r in load_runs(str(path)) if float(r.get("buffer.drop_logr2") or 0) == TAU]
    names = setting_names(grid, {paired_signature(r.settings) for r in runs})
    out: dict = {}
    for r in runs:
        out.setdefault(names[paired_signature(r.settings)], []).append(r)
    return {name: (float(np.mean([drop_share(r) for r in rs])),
                   float(np.mean([held(r) for r in rs])),
                   FIXED_HORIZON * float(np.mean([r.summary["rollouts_per_step"] for r in rs])))
            for name, rs in out.items()}


def pooled(pairs) -> tuple[float, float, float] | None:
    """The mean paired difference over every seed pair of ``pairs`` and its 95% interval,
    seeds resampled within each setting."""
    diffs = [np.array([p.adaptive[s] - p.fixed[s] for s in sorted(set(p.adaptive) & set(p.fixed))])
             for p in pairs]
    diffs = [d for d in diffs if d.size]
    if not diffs:
        return None
    boots = np.concatenate([d[seed_draws(d.size, DRAWS, i)] for i, d in enumerate(diffs)], axis=1)
    lo, hi = np.quantile(boots.mean(1), [0.025, 0.975])
    return float(np.concatenate(diffs).mean()), float(lo), float(hi)


def _rows(pairs, mech: dict) -> dict:
    """{setting: grid, paired difference, seeds, drop share, rollouts held (adaptive, x = 64)}
    for the settings of the two grids judged here."""
    grid = {p.setting: p.grid for p in pairs}
    rows = {}
    for c in compare_adaptive(pairs):
        if grid[c.setting] in (TRANSFER, LONG):
            share, kept, fixed = mech.get(c.setting, (np.nan, np.nan, np.nan))
            rows[c.setting] = {"grid": grid[c.setting], "minus": (c.mean, c.low, c.high),
                               "seeds": c.seeds, "drop_share": share, "held": (kept, fixed)}
    return rows


def judge_transfer(results: Path) -> dict:
    """Rows per setting of both grids and the claims C1-C5 as far as the runs allow
    (``claims`` empty until all four transfer settings have paired seeds)."""
    pairs = [AdaptivePair.from_record(r) for r in collect_adaptive(results)]
    rows = _rows(pairs, {**mechanism(results, TRANSFER), **mechanism(results, LONG)})
    transfer = {k: r for k, r in rows.items() if r["grid"] == TRANSFER}
    claims: dict = {}
    if len(transfer) == TRANSFER_SETTINGS:
        pool = pooled([p for p in pairs if p.setting in transfer])
        advice = choose_adaptive("grpo", False, pairs)
        claims.update({
            "C1": all(r["minus"][0] >= -0.01 for r in transfer.values()),
            "C2": bool(pool[0] > 0 and pool[1] > 0),
            "C3": all(0.2 <= r["drop_share"] <= 0.8 and r["held"][0] > r["held"][1]
                      for r in transfer.values()),
            "C4": not advice.named, "pooled": pool, "rule": advice.reason})
    for r in rows.values():
        if r["grid"] == LONG:
            claims.update({"C5": r["minus"][0] >= -0.01,
                           "C5 drop share below 0.46": bool(r["drop_share"] < 0.46)})
    return {"rows": rows, "claims": claims,
            "seeds": {g: min((r["seeds"] for r in rows.values() if r["grid"] == g),
                             default=0) for g in (TRANSFER, LONG)}}


def _cell(v) -> str:
    return "-" if v is None else f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"


CLAIM_WORDS = {"C1": "no worse than x = 64 on each setting (mean >= -0.01)",
               "C2": "pooled over the four, interval above 0",
               "C3": "drops 20-80% of the rollouts made and holds more than x = 64, on each",
               "C4": "predicted: the advice's rule (theory.md 13.2) does not name it",
               "C5": "cpu_long: no worse than x = 64 (mean >= -0.01)",
               "C5 drop share below 0.46": "cpu_long drops less than cpu_tiny's 46%"}


def transfer_table(v: dict) -> str:
    """The transfer grids' verdict as markdown, each claims list marked verdict or interim."""
    lines = ["## The adaptive horizon where it never ran (C1-C5, "
             "experiments/adaptive_transfer.yaml, experiments/adaptive_long.yaml)", "",
             f"tau = {TAU:g}, horizon 1024, grpo, y = 2, against x = 64 on the same seeds. "
             "AUC: mean eval accuracy over the run's evaluations; 95% seed-bootstrap intervals.",
             "", "| setting | seeds | adaptive minus x = 64 | drop share | held at the end "
             "(adaptive, x = 64) |", "|---|---|---|---|---|"]
    for name, r in sorted(v["rows"].items()):
        lines.append(f"| {name} | {r['seeds']} | {_cell(r['minus'])} | "
                     f"{r['drop_share']:.2f} | {r['held'][0]:.0f}, {r['held'][1]:.0f} |")
    c = v["claims"]
    if "pooled" in c:
        lines += ["", f"Pooled over the four transfer settings: {_cell(c['pooled'])}. "
                      f"The advice's rule: {c['rule']}."]
    done = {TRANSFER: v["seeds"][TRANSFER] >= TRANSFER_SEEDS,
            LONG: v["seeds"][LONG] >= LONG_SEEDS}
    lines += ["", "Registered claims:", ""]
    for key, words in CLAIM_WORDS.items():
        if key in c:
            grid = LONG if key.startswith("C5") else TRANSFER
            status = "verdict" if done[grid] else "INTERIM, not the verdict"
            lines.append(f"* {key} ({words}): {'holds' if c[key] else 'fails'} ({status}: "
                         f"{v['seeds'][grid]} seeds)")
    if not c:
        lines.append("* not judged yet: some setting has no paired runs")
    return "\n".join(lines) + "\n"
