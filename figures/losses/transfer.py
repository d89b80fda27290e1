"""The adaptive horizon on settings it never ran on (C1-C4, ``experiments/adaptive_transfer.yaml``)
and on cpu_long (C5, ``experiments/adaptive_long.yaml``), for ``figures.losses.report``.

The wide model and 3-digit addition train their warm start on the machine; the one that ran
their seeds 10-15 is gone, and this one trains another initial policy, which a grid never
mixes (``llm_experiments.study.sweep``). Their verdict is read at those 6 seeds
(``LOST_MACHINE_SEEDS``); seeds 16-19 from this machine's warm starts are a second replicate
(``experiments/adaptive_transfer_b.yaml``), judged by C1's and C3's tests on its own and kept
out of the advice's rule.

The paired differences are the advice's own (``replaytheory.adaptive_advice.compare_adaptive``
on ``replaytheory.evidence.collect_adaptive``): AUC(adaptive) - AUC(x = 64) per setting, with
95% seed-bootstrap intervals. The pooled difference of C2 weighs every seed pair alike and
resamples seeds within each setting. The drop share is the mean of the logged ``dropped``
(every 5th update) over the rollouts made per update; what x = 64 holds is 64 updates of
rollouts, the buffer's bound once full.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from figures.losses.verdicts import held, staleness
from figures.unclipped import auc
from llm_experiments.study.results import load_runs
from replaytheory.adaptive_advice import (ARMS, FIXED_HORIZON, AdaptivePair, compare_adaptive,
                                          judge_arm)
from replaytheory.evidence import (adaptive_pairs, collect_adaptive, paired_signature,
                                   setting_names)
from replaytheory.loss_advice import DRAWS, paired_interval
from replaytheory.stats.verdicts import seed_draws

TRANSFER = "adaptive_transfer"
LONG = "adaptive_long"
REPLICATE = "adaptive_transfer_b"
SCALED = "adaptive_scaled_long"  # S1-S3: the drift-scaled threshold on cpu_long
SCALED_TAU = 0.004
TRANSFER_SETTINGS = 4  # registered
TRANSFER_SEEDS = 10  # registered seeds per setting
LOST_MACHINE_SEEDS = 6  # seeds 10-15 of a setting whose warm start is not pinned
LONG_SEEDS = 3
ALL_TOKENS = ARMS[-1]  # the arm these grids registered: tau = 0.05 over every token
TAU = ALL_TOKENS.tau


def drop_share(run) -> float:
    """Share of the rollouts made that the adaptive buffer dropped (module docstring)."""
    dropped = np.asarray(run.train.get("dropped", []), float)
    return float(np.nanmean(dropped) / run.summary["rollouts_per_step"]) if dropped.size \
        else float("nan")


@dataclass(frozen=True)
class Mechanism:
    """How the adaptive arm of one setting behaved, seed means: the share of rollouts made it
    dropped, the rollouts it held at the end, what x = 64 holds once full, and whether the
    setting pins its warm start (``model.warm_start_path``)."""

    drop_share: float
    held: float
    held_fixed: float
    pinned: bool


def mechanism(results: Path, grid: str) -> dict:
    """{setting: ``Mechanism``} of the adaptive arm at ``TAU`` in ``grid``."""
    path = results / grid / "curves.jsonl.gz"
    if not path.exists():
        return {}
    runs = [r for r in load_runs(str(path)) if float(r.get("buffer.drop_logr2") or 0) == TAU
            and float(r.get("buffer.drop_tokens_below_p") or 1) == ALL_TOKENS.below_p]
    names = setting_names(grid, {paired_signature(r.settings) for r in runs})
    out: dict = {}
    for r in runs:
        out.setdefault(names[paired_signature(r.settings)], []).append(r)
    return {name: Mechanism(
        drop_share=float(np.mean([drop_share(r) for r in rs])),
        held=float(np.mean([held(r) for r in rs])),
        held_fixed=FIXED_HORIZON * float(np.mean([r.summary["rollouts_per_step"] for r in rs])),
        pinned=all(r.settings.get("model.warm_start_path") for r in rs))
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


def _rows(pairs, mech: dict, grids: tuple) -> dict:
    """{setting: grid, paired difference, seeds, drop share, rollouts held (adaptive, x = 64),
    pinned} for the settings of ``grids``."""
    grid = {p.setting: p.grid for p in pairs}
    rows = {}
    for c in compare_adaptive(pairs, ALL_TOKENS):
        m = mech.get(c.setting, Mechanism(np.nan, np.nan, np.nan, False))
        if grid[c.setting] in grids:
            rows[c.setting] = {"grid": grid[c.setting], "minus": (c.mean, c.low, c.high),
                               "seeds": c.seeds, "drop_share": m.drop_share,
                               "held": (m.held, m.held_fixed), "pinned": m.pinned}
    return rows


def _per_setting(rows: dict) -> dict:
    """C1's and C3's tests over ``rows``."""
    return {"C1": all(r["minus"][0] >= -0.01 for r in rows.values()),
            "C3": all(0.2 <= r["drop_share"] <= 0.8 and r["held"][0] > r["held"][1]
                      for r in rows.values())}


def _replicate(results: Path) -> dict:
    """The second replicate's rows (module docstring); empty before its runs."""
    path = results / REPLICATE / "curves.jsonl.gz"
    if not path.exists():
        return {}
    pairs = [AdaptivePair.from_record(r) for r in adaptive_pairs(REPLICATE, path, path)]
    return _rows(pairs, mechanism(results, REPLICATE), (REPLICATE,))


def judge_transfer(results: Path) -> dict:
    """Rows per setting of both grids (and of the replicate) and the claims C1-C5 as far as
    the runs allow (``claims`` empty until all four transfer settings have paired seeds)."""
    pairs = [AdaptivePair.from_record(r) for r in collect_adaptive(results)]
    rows = _rows(pairs, {**mechanism(results, TRANSFER), **mechanism(results, LONG)},
                 (TRANSFER, LONG))
    transfer = {k: r for k, r in rows.items() if r["grid"] == TRANSFER}
    claims: dict = {}
    if len(transfer) == TRANSFER_SETTINGS:
        pool = pooled([p for p in pairs if p.setting in transfer])
        advice = judge_arm(ALL_TOKENS, pairs)
        claims.update({**_per_setting(transfer),
                       "C2": bool(pool[0] > 0 and pool[1] > 0),
                       "C4": not advice.named, "pooled": pool, "rule": advice.reason})
    for r in rows.values():
        if r["grid"] == LONG:
            claims.update({"C5": r["minus"][0] >= -0.01,
                           "C5 drop share below 0.46": bool(r["drop_share"] < 0.46)})
    replicate = _replicate(results)
    return {"rows": rows, "claims": claims, "replicate": replicate,
            "replicate_tests": _per_setting(replicate) if replicate else {},
            "complete": {TRANSFER: len(transfer) == TRANSFER_SETTINGS and all(
                r["seeds"] >= (TRANSFER_SEEDS if r["pinned"] else LOST_MACHINE_SEEDS)
                for r in transfer.values()),
                LONG: any(r["grid"] == LONG and r["seeds"] >= LONG_SEEDS
                          for r in rows.values())},
            "seeds": {g: min((r["seeds"] for r in rows.values() if r["grid"] == g),
                             default=0) for g in (TRANSFER, LONG)}}


def judge_scaled(results: Path) -> dict:
    """S1-S3 (``experiments/adaptive_scaled_long.yaml``): the drift-scaled arm against x = 64
    and tau = 0.05 on cpu_long, paired by seed; empty before its runs."""
    paths = [results / g / "curves.jsonl.gz" for g in (SCALED, LONG)]
    if not all(p.exists() for p in paths):
        return {}
    arms: dict = {}
    for r in load_runs(str(paths[0])) + load_runs(str(paths[1])):
        tau = float(r.settings.get("buffer.drop_logr2") or 0)
        arms.setdefault(tau, {})[int(r.settings["run.seed"])] = r
    if not all(arms.get(t) for t in (SCALED_TAU, TAU, 0.0)):
        return {}
    scaled = arms[SCALED_TAU]
    score = {tau: {s: auc(r) for s, r in by.items()} for tau, by in arms.items()}
    vs64, vs05 = (paired_interval(score[SCALED_TAU], score[t]) for t in (0.0, TAU))
    share = float(np.mean([drop_share(r) for r in scaled.values()]))
    age = {tau: float(np.mean([staleness(r) for r in by.values()])) for tau, by in arms.items()}
    return {"seeds": len(scaled), "drop_share": share, "staleness": age,
            "held": float(np.mean([held(r) for r in scaled.values()])),
            **{k: None if d is None else (d.mean, d.low, d.high)
               for k, d in (("minus_x64", vs64), ("minus_tau", vs05))},
            "claims": {"S1": 0.2 <= share <= 0.6,
                       "S2": vs64 is not None and vs64.mean >= -0.01,
                       "S3": vs05 is not None and vs05.mean > 0
                       and age[SCALED_TAU] < age[TAU]}}


def scaled_table(v: dict) -> str:
    """S1-S3 as markdown (verdict once the 3 registered seeds are in)."""
    if not v:
        return ""
    status = "verdict" if v["seeds"] >= LONG_SEEDS else "INTERIM, not the verdict"
    lines = ["## The drift-scaled threshold on cpu_long (S1-S3, "
             "experiments/adaptive_scaled_long.yaml)", "",
             f"tau = {SCALED_TAU:g} (0.05 scaled by the x = 64 buffer's median per-token "
             f"(log r)^2, cpu_long's against setting 1's), {v['seeds']} seeds ({status}).", "",
             "| | value |", "|---|---|",
             f"| scaled minus x = 64 | {_cell(v['minus_x64'])} |",
             f"| scaled minus tau = 0.05 | {_cell(v['minus_tau'])} |",
             f"| drop share | {v['drop_share']:.2f} |",
             f"| held at the end | {v['held']:.0f} |",
             "| mean staleness (scaled, tau = 0.05, x = 64) | " + ", ".join(
                 f"{v['staleness'][t]:.1f}" for t in (SCALED_TAU, TAU, 0.0)) + " |", ""]
    words = {"S1": "drops 20-60% of the rollouts made",
             "S2": "no worse than x = 64 (mean >= -0.01)",
             "S3": "beats tau = 0.05, on younger rollouts"}
    lines += [f"* {k} ({w}): {'holds' if v['claims'][k] else 'fails'}" for k, w in words.items()]
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    return "-" if v is None else f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"


CLAIM_WORDS = {"C1": "no worse than x = 64 on each setting (mean >= -0.01)",
               "C2": "pooled over the four, interval above 0",
               "C3": "drops 20-80% of the rollouts made and holds more than x = 64, on each",
               "C4": "predicted: the advice's rule (theory.md 13.2) does not name it",
               "C5": "cpu_long: no worse than x = 64 (mean >= -0.01)",
               "C5 drop share below 0.46": "cpu_long drops less than cpu_tiny's 46%"}


def _setting_lines(rows: dict) -> list[str]:
    return [f"| {name} | {r['seeds']} | {_cell(r['minus'])} | {r['drop_share']:.2f} | "
            f"{r['held'][0]:.0f}, {r['held'][1]:.0f} |" for name, r in sorted(rows.items())]


def transfer_table(v: dict) -> str:
    """The transfer grids' verdict as markdown, each claims list marked verdict or interim."""
    head = ["| setting | seeds | adaptive minus x = 64 | drop share | held at the end "
            "(adaptive, x = 64) |", "|---|---|---|---|---|"]
    lines = ["## The adaptive horizon where it never ran (C1-C5, "
             "experiments/adaptive_transfer.yaml, experiments/adaptive_long.yaml)", "",
             f"tau = {TAU:g}, horizon 1024, grpo, y = 2, against x = 64 on the same seeds. "
             "AUC: mean eval accuracy over the run's evaluations; 95% seed-bootstrap intervals. "
             f"Settings that train their own warm start have {LOST_MACHINE_SEEDS} seeds: the "
             "machine that ran them is gone with their initial policy (figures/losses/"
             "transfer.py).", "", *head, *_setting_lines(v["rows"])]
    c = v["claims"]
    if "pooled" in c:
        lines += ["", f"Pooled over the four transfer settings: {_cell(c['pooled'])}. "
                      f"The advice's rule: {c['rule']}."]
    lines += ["", "Registered claims:", ""]
    for key, words in CLAIM_WORDS.items():
        if key in c:
            grid = LONG if key.startswith("C5") else TRANSFER
            status = "verdict" if v["complete"][grid] else "INTERIM, not the verdict"
            lines.append(f"* {key} ({words}): {'holds' if c[key] else 'fails'} ({status}: "
                         f"at least {v['seeds'][grid]} seeds per setting)")
    if not c:
        lines.append("* not judged yet: some setting has no paired runs")
    if v["replicate"]:
        t = v["replicate_tests"]
        lines += ["", f"Second replicate ({REPLICATE}: seeds 16-19 from this machine's warm "
                      "starts; not a registered claim, not read by the advice's rule):", "",
                  *head, *_setting_lines(v["replicate"]), "",
                  f"C1's test there: {'holds' if t['C1'] else 'fails'}; C3's: "
                  f"{'holds' if t['C3'] else 'fails'}."]
    return "\n".join(lines) + "\n"
