"""The registered pilot (theory.md section 13.3, ``replaytheory.pilot``): its runs' spec
and its verdict on the committed evidence.

``python -m llm_experiments.study.verdicts.pilot spec --out experiments/pilot.yaml`` writes
the sweep of every pilot arm, and ``python -m llm_experiments.study.verdicts.pilot judge
--curves results/pilot/curves.jsonl.gz --out results/pilot/verdict.json`` scores it.

Cases: every evidence record of a setting family whose warm start is pinned (``FAMILIES``) with
a run of T >= ``replaytheory.pilot.MIN_RUN_UPDATES`` updates. A case's arms are the advice
from the other families' evidence alone (what a user of a setting not in the evidence gets),
the rule and on-policy. Each family's pilot runs each arm once per pilot seed (``SEEDS``, none
used by the evidence's grids) at the family's settings and learning rate for the longest T_p
its cases need, evaluated every ``replaytheory.pilot.EVAL_EVERY`` updates; a shorter pilot is
the same run's first T_p updates (the learning rate is constant and a run depends only on its
past). One seed is one pilot, as a user would run it; the seeds are replicates of it.

The pick of each (case, seed) is scored on the case's record at its nearest grid cell
(``replaytheory.advice.case_at``), beside the advice alone on the same cases, by the counts of
issue 36's G3 (``replaytheory.advice.goal_summary``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import numpy as np
import yaml

from replaytheory.advice import Evidence, advise, case_at, goal_summary, load_evidence
from replaytheory.loss_advice import paired_interval
from replaytheory.pilot import (ARM_ORDER, EVAL_EVERY, MIN_RUN_UPDATES, PilotArm, pick,
                                pilot_arms, pilot_budget, pilot_price, pilot_updates)
from replaytheory.stats.analysis import mean_over_budget

from replaytheory.io import write_text
from ..results import load_runs

WARM_START = {"model.warm_start_path": "results/heldout_init/warm_start",
              "model.warm_start_sha256":
                  "0b81f4bf0eb282a2014664bd5072c4f25bc85d66a5ade0caaed1e4e04a4f0bf1"}
# Each family's settings beside the shared ones and its learning rate: the middle of its
# grid's learning rates, of two the larger. cpu_sweep_v3 and heldout_init are one setting (the
# same warm start and config), so they share their pilot runs.
FAMILIES = {
    "cpu_sweep_v3": ({}, 5.0e-5),
    "heldout_init": ({}, 5.0e-5),
    "seconds_groups": ({"buffer.sampling": "groups_with_replacement"}, 1.0e-4),
    "horizon_short": ({}, 1.0e-4),
    "horizon_lr2": ({}, 2.0e-4),
    "horizon_g4": ({"schedule.group_size": 4}, 1.0e-4),
}
SEEDS = (30, 31, 32, 33, 34)
SHARED = {**WARM_START, "probe.every": 0, "run.progress": False, "trainer.loss": "grpo",
          "eval.every": EVAL_EVERY}


@dataclass(frozen=True)
class PilotCase:
    """One evidence record with its pilot: the record, the arms and T_p (updates)."""

    record: Evidence
    arms: tuple[PilotArm, ...]
    updates: int


def pilot_cases(evidence: list[Evidence]) -> list[PilotCase]:
    """The module's cases, in the evidence's order."""
    out = []
    for e in evidence:
        if e.family not in FAMILIES or e.run_updates < MIN_RUN_UPDATES:
            continue
        a = advise(e.mu, e.run_updates, evidence=evidence, exclude_families=(e.family,))
        out.append(PilotCase(e, pilot_arms((a.horizon, a.replay_ratio), e.mu),
                             pilot_updates(e.run_updates)))
    return out


def _base(family: str) -> tuple:
    settings, lr = FAMILIES[family]
    return tuple(sorted({**settings, "trainer.lr": lr}.items()))


def _on_policy(arm: PilotArm) -> bool:
    """Advice of (1, 1) says on-policy too (``replaytheory.advice.Advice.on_policy``)."""
    return arm.x <= 1 and arm.y <= 1


def _arm_settings(arm: PilotArm) -> dict:
    if _on_policy(arm):
        return {"schedule.mode": "on_policy"}
    return {"schedule.mode": "sync", "buffer.horizon": arm.x,
            "schedule.replay_ratio": round(arm.y, 6)}


def pilot_spec(evidence: list[Evidence]) -> dict:
    """The sweep spec of every pilot arm (module docstring)."""
    longest: dict = {}
    for c in pilot_cases(evidence):
        for arm in c.arms:
            key = (_base(c.record.family), (arm.x, round(arm.y, 6)))
            longest[key] = max(longest.get(key, 0), c.updates)
    cells = []
    for (base, (x, y)), steps in sorted(longest.items()):
        cells.append({**dict(base), **_arm_settings(PilotArm("arm", x, y)), "run.steps": steps})
    return {"config": "cpu_tiny", "set": dict(SHARED), "cells": cells,
            "grid": {"run.seed": list(SEEDS)}}


BASE_KEYS = {"trainer.lr", *(k for settings, _ in FAMILIES.values() for k in settings)}


def _run_key(settings: dict) -> tuple:
    base = tuple(sorted((k, v) for k, v in settings.items() if k in BASE_KEYS))
    if settings.get("schedule.mode") == "on_policy":
        return base, (1.0, 1.0), int(settings["run.seed"])
    return base, (float(settings["buffer.horizon"]),
                  round(float(settings["schedule.replay_ratio"]), 6)), int(settings["run.seed"])


def arm_score(run, mu: float, updates: int, budget: float) -> float:
    """A pilot run's mean accuracy over the accounted compute in [0, ``budget``], from its
    evaluations up to update ``updates``."""
    keep = np.asarray(run.eval["step"]) <= updates
    return mean_over_budget(run.compute(mu)[keep], np.asarray(run.eval["eval_accuracy"])[keep],
                            budget)


def judge_pilot(curves: str, evidence: list[Evidence]) -> dict:
    """Per (case, seed) the arms' scores, the pick and its regret, and the summaries of the
    pilot and of the advice alone on the cases every seed could judge."""
    runs = {_run_key(r.settings): r for r in load_runs(curves)}
    rows, picked, alone = [], [], []
    for c in pilot_cases(evidence):
        e, base = c.record, _base(c.record.family)
        budget = pilot_budget(c.arms, e.mu, e.run_updates)
        for seed in SEEDS:
            found = {a.name: runs.get((base, (a.x, round(a.y, 6)), seed)) for a in c.arms}
            if any(r is None for r in found.values()):
                continue
            scores = {n: arm_score(r, e.mu, c.updates, budget) for n, r in found.items()}
            chosen = pick(c.arms, scores)
            case = case_at(e, (chosen.x, chosen.y))
            picked.append(case)
            alone.append(case_at(e, (c.arms[0].x, c.arms[0].y)))
            arm_regret = {a.name: case_at(e, (a.x, a.y)).regret for a in c.arms}
            rows.append({"setting": e.setting, "run_updates": e.run_updates, "mu": e.mu,
                         "seed": seed, "pilot_updates": c.updates,
                         "price": pilot_price(e.run_updates), "scores": scores,
                         "arms": [asdict(a) for a in c.arms], "arm_regret": arm_regret,
                         "pick": chosen.name,
                         "regret": case.regret, "advice_regret": alone[-1].regret,
                         "rule_regret": case.rule_regret,
                         "on_policy_regret": case.on_policy_regret})
    cases = len(pilot_cases(evidence))
    pilot, advice = (goal_summary(c) if c else None for c in (picked, alone))
    return {"cases": cases, "seeds": list(SEEDS), "rows": rows,
            "complete": len(rows) == cases * len(SEEDS), "pilot": pilot,
            "advice_alone": advice, "claims": claims(rows, pilot, advice),
            "picks": pick_summary(rows)}


def pick_summary(rows: list[dict]) -> dict:
    """How the picks went: how often each arm was picked, how often the pick was an arm of
    least regret on the record (ties count), and the mean regret of a pilot that always
    picked such an arm (the best any pilot among these arms can do)."""
    best = [min(r["arm_regret"].values()) for r in rows]
    return {"counts": {n: sum(r["pick"] == n for r in rows) for n in ARM_ORDER},
            "right": sum(r["regret"] <= b + 1e-12 for r, b in zip(rows, best)),
            "oracle_mean_regret": float(np.mean(best)) if rows else None}


def claims(rows: list[dict], pilot: dict | None, advice: dict | None) -> dict:
    """PL1-PL3 of ``experiments/pilot.yaml`` over the judged (case, seed) rows; PL2's
    difference is each seed's mean (pilot - advice alone) regret, with its 95% interval over
    the seeds (None below ``loss_advice.MIN_SEEDS`` seeds)."""
    if not rows:
        return {}
    by_seed = {k: {s: float(np.mean([r[k] for r in rows if r["seed"] == s]))
                   for s in {r["seed"] for r in rows}} for k in ("regret", "advice_regret")}
    d = paired_interval(by_seed["regret"], by_seed["advice_regret"])
    return {"PL1": pilot["goal_met"],
            "PL2": d is not None and d.mean < 0,
            "PL2_difference": None if d is None else (d.mean, d.low, d.high),
            "PL3": pilot["worse_than_rule"] < advice["worse_than_rule"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("spec", help="write the pilot arms' sweep spec")
    s.add_argument("--out", required=True)
    j = sub.add_parser("judge", help="score the pilot on the committed evidence")
    j.add_argument("--curves", required=True)
    j.add_argument("--out", required=True)
    a = p.parse_args(argv)
    evidence = load_evidence()
    if a.command == "spec":
        write_text(a.out, yaml.safe_dump(pilot_spec(evidence), sort_keys=False, width=200))
    else:
        verdict = judge_pilot(a.curves, evidence)
        write_text(a.out, json.dumps(verdict, indent=1, sort_keys=True) + "\n")
        print(json.dumps({k: verdict[k] for k in ("complete", "pilot", "advice_alone",
                                                   "claims")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
