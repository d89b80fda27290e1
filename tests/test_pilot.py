"""The pilot of theory.md 13.3 (replaytheory.pilot, llm_experiments.study.verdicts.pilot): its
length, price, arms, budget and pick by hand, the committed spec is what the evidence gives, and the
judge scores a pick on the record at its nearest cell."""

import gzip
import json
import math

import numpy as np
import pytest
import yaml

from replaytheory.advice import load_evidence
from replaytheory.pilot import (PilotArm, pick, pilot_arms, pilot_budget, pilot_price,
                                pilot_updates)


def test_length_and_price():
    assert [pilot_updates(t) for t in (100, 150, 200, 300, 333)] == [20, 30, 40, 60, 65]
    assert pilot_price(300) == pytest.approx(0.4)
    with pytest.raises(ValueError, match=r"run_updates must be"):
        pilot_updates(50)


def test_arms_follow_the_rule_and_drop_repeats():
    arms = pilot_arms((16.0, 2.0), 4.0)
    assert [(a.name, a.x, a.y) for a in arms] == [("advice", 16, 2), ("rule", 64, 2),
                                                  ("on-policy", 1, 1)]
    low = pilot_arms((64.0, 1.0), 0.5)  # the rule's y is max(1, sqrt(mu)): the advice's cell
    assert [a.name for a in low] == ["advice", "on-policy"]
    assert pilot_budget(arms, 4.0, 100) == pytest.approx(20 * (1 + 4 / 2))
    with pytest.raises(ValueError, match="mu must be"):
        pilot_arms((16.0, 2.0), 0.0)


def test_pick_takes_the_best_score_and_an_earlier_arm_on_a_tie():
    arms = pilot_arms((16.0, 2.0), 4.0)
    assert pick(arms, {"advice": 0.3, "rule": 0.5, "on-policy": 0.4}).name == "rule"
    assert pick(arms, {"advice": 0.5, "rule": 0.5, "on-policy": 0.4}).name == "advice"
    with pytest.raises(ValueError, match="missing"):
        pick(arms, {"advice": 0.5})


def test_the_committed_spec_is_what_the_evidence_gives():
    from llm_experiments.study.verdicts.pilot import pilot_spec
    from pathlib import Path
    committed = yaml.safe_load(Path("experiments/pilot.yaml").read_text())
    assert committed == pilot_spec(load_evidence())


def _run(settings, steps, accs, seed):
    evals = list(range(0, steps + 1, 5))
    per_step = 64 / settings.get("schedule.replay_ratio", 1.0)
    return {"run_id": f"r{seed}{sorted(settings.items())}",
            "settings": {**settings, "run.seed": seed},
            "batch_size": 64, "summary": {},
            "eval": {"step": evals, "samples_generated": [per_step * s for s in evals],
                     "samples_consumed": [64 * s for s in evals],
                     "eval_accuracy": [accs(s) for s in evals]},
            "train": {"step": [], "samples_generated": [], "samples_consumed": []}}


def test_the_judge_scores_each_seeds_pick_on_the_record(tmp_path, monkeypatch):
    """One case: on-policy climbs fastest in the pilot on seed 30 and slowest on seed 31; the
    pick and its regret follow, read at the record's nearest cell."""
    from llm_experiments.study.verdicts import pilot as study
    from tests.test_advice import _grid
    record = _grid("fam", "fam", [0.60, 0.52, 0.50, 0.45], run_updates=100, mu=2.0)
    monkeypatch.setattr(study, "FAMILIES", {"fam": ({}, 1e-4)})
    monkeypatch.setattr(study, "SEEDS", (30, 31))
    cases = study.pilot_cases([record])
    assert len(cases) == 1 and cases[0].updates == 20
    rows = []
    for arm in cases[0].arms:
        s = {"trainer.lr": 1e-4, **study._arm_settings(arm)}
        fast = arm.name == "on-policy"
        rows.append(_run(s, 20, lambda t, f=fast: 0.3 + (0.02 if f else 0.01) * t, 30))
        rows.append(_run(s, 20, lambda t, f=fast: 0.3 + (0.0 if f else 0.01) * t, 31))
    path = tmp_path / "curves.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    v = study.judge_pilot(str(path), [record])
    assert v["complete"] and [r["pick"] for r in v["rows"]] == ["on-policy", "advice"]
    reg = record.regret()
    assert v["rows"][0]["regret"] == pytest.approx(reg[record.on_policy()])
    assert v["rows"][1]["regret"] == pytest.approx(v["rows"][1]["advice_regret"])
    assert v["pilot"]["cases"] == 2 and math.isfinite(v["pilot"]["mean_regret"])
    from figures.advice import registered_pilot
    text = registered_pilot(v)
    assert "2 (case, seed) pilots of 1 cases x 2 seeds (verdict)" in text
    assert "* PL1 (G3 over every (case, seed)): fails" in text  # 2 seeds: no PL2 interval
    # seed 30 picked on-policy, the record's best cell; seed 31 the advice, the worst
    assert v["picks"]["counts"] == {"advice": 1, "rule": 0, "on-policy": 1}
    assert v["picks"]["right"] == 1 and v["picks"]["oracle_mean_regret"] == 0.0


def test_the_claims_compare_the_pilot_with_the_advice_alone_per_seed():
    from llm_experiments.study.verdicts.pilot import claims
    from replaytheory.advice import Case, goal_summary
    rows = [{"seed": s, "regret": 0.1 - 0.01 * s, "advice_regret": 0.2} for s in (1, 2, 3)]
    cases = [Case("a", 100, 2.0, (1, 1), r["regret"], 0.15, None) for r in rows]
    alone = [Case("a", 100, 2.0, (1, 1), 0.2, 0.15, None) for _ in rows]
    c = claims(rows, goal_summary(cases), goal_summary(alone))
    assert c["PL2"] and c["PL2_difference"][0] == pytest.approx(-0.12)
    assert c["PL3"] and not c["PL1"]  # mean regret 0.08 > 0.05
