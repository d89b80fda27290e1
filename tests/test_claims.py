"""The claims report: verdicts on a hand-made sweep whose truth is known by construction, each
claim flipped by changing only the curves it judges, and the committed table reproduced."""

import json
from pathlib import Path

import numpy as np
import pytest

from llm_experiments.study import claims
from llm_experiments.study.results import Run, load_runs

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny_sweep" / "curves.jsonl"
B = 16  # rollouts per trainer step
STEPS = np.arange(0, 101, 10)  # evaluation steps
TARGET = 0.5

# Eval accuracy at STEPS per cell. By construction, at mu = 6.84 (one step costs 1 + 6.84 / y
# updates): the buffer x=1, y=2 reaches 0.5 in as many steps as on-policy (40) for 56% less
# compute and its frontier is never below on-policy's (claims 1, 2); at y = 2 the larger x
# needs more steps (50) without dropping from its peak, on-policy crashes (drop 0.2) and no
# buffer does (3); at each x the highest y ends lower than the lowest y (4); the lag cell and
# the positive-bias cell end above on-policy and above their delta = 0 cell (6, 7a); AsymRE's
# best grid cell ends above GRPO's (7b).
CURVES = {
    "on_policy": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.55, 0.5, 0.45, 0.4],
    "x1y1": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.65, 0.65, 0.65],
    "x1y2": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.6, 0.6, 0.6, 0.6],
    "x4y1": [0.3, 0.33, 0.36, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.68, 0.68],
    "x4y2": [0.3, 0.33, 0.36, 0.4, 0.45, 0.5, 0.55, 0.58, 0.58, 0.58, 0.58],
    "delta": [0.3, 0.33, 0.36, 0.4, 0.45, 0.5, 0.55, 0.6, 0.62, 0.62, 0.62],
    "lag": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.65, 0.65, 0.65],
    "asymre_x4y2": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.75, 0.75, 0.75],
}
SETTINGS = {
    "on_policy": {"schedule.mode": "on_policy"},
    "x1y1": {"buffer.horizon": 1, "schedule.replay_ratio": 1.0},
    "x1y2": {"buffer.horizon": 1, "schedule.replay_ratio": 2.0},
    "x4y1": {"buffer.horizon": 4, "schedule.replay_ratio": 1.0},
    "x4y2": {"buffer.horizon": 4, "schedule.replay_ratio": 2.0},
    "delta": {"buffer.horizon": 4, "schedule.replay_ratio": 2.0, "buffer.delta": 0.5},
    "lag": {"schedule.mode": "async", "buffer.lifo": True, "schedule.latency_steps": 2},
    "asymre_x4y2": {"trainer.loss": "asymre", "buffer.horizon": 4,
                    "schedule.replay_ratio": 2.0},
}
# Final pass@1 / pass@16 and training entropy: the best buffer (x1y2) gains more at pass@16
# than at pass@1 and keeps a higher entropy (claim 5).
PASS = {"on_policy": (0.32, 0.8), "x1y2": (0.3, 0.9)}
ENTROPY = {"on_policy": 0.4, "x1y2": 0.6}


def _run(name: str, seed: int, acc, entropy: float, passk) -> Run:
    settings = {"trainer.loss": "grpo", **SETTINGS[name], "trainer.lr": 1e-3, "run.seed": seed}
    y = float(settings.get("schedule.replay_ratio", 1.0))
    generated = STEPS * B / y
    p1, p16 = passk
    ones = np.ones(STEPS.size)
    return Run(f"{name}_{seed}", settings, B,
               {"step": STEPS.astype(float), "samples_generated": generated,
                "eval_accuracy": np.asarray(acc, dtype=float), "pass@1": p1 * ones,
                "pass@16": p16 * ones},
               {"step": STEPS.astype(float), "samples_generated": generated,
                "entropy": entropy * ones},
               {"mu_measured": 0.5})


def hand_made(curves=None, entropy=None, passk=None) -> list[Run]:
    """Two identical seeds per cell of ``CURVES``, with the given cells' curves, entropies or
    (pass@1, pass@16) replaced."""
    curves = {**CURVES, **(curves or {})}
    entropy = {**ENTROPY, **(entropy or {})}
    passk = {**PASS, **(passk or {})}
    return [_run(name, seed, acc, entropy.get(name, 0.5), passk.get(name, (0.3, 0.8)))
            for name, acc in curves.items() for seed in (0, 1)]


def verdicts(runs) -> dict[str, claims.Verdict]:
    """Verdicts by claim number ("1" ... "8")."""
    return {v.claim.split(".")[0]: v for v in claims.evaluate(runs, target=TARGET)}


def test_every_claim_holds_where_it_was_built_to():
    v = verdicts(hand_made())
    assert {k: v[k].holds for k in v} == {"1": True, "2": True, "3": True, "4": True,
                                         "5": True, "6": True, "7a": True, "7b": True,
                                         "8": None}
    assert v["1"].evidence["compute_on_policy"] == pytest.approx(40 * (1 + 6.84))
    assert v["1"].evidence["compute_buffer"] == pytest.approx(40 * (1 + 6.84 / 2))
    assert v["1"].evidence["frontier_share"] == 1.0
    assert v["2"].evidence["step_ratio"] == pytest.approx(1.0)
    assert v["3"].evidence["crash_rate_on_policy"] == 1.0
    assert v["3"].evidence["crash_rate_buffer"] == 0.0
    assert v["4"].evidence["horizons_worse"] == 2
    assert "x=1, y=2" in v["1"].ours and v["8"].threshold == ""


# Each case changes only what one claim judges, so that claim (alone) turns false.
BROKEN = {
    # on-policy jumps to 0.49 at step 10 (still reaching 0.5 at step 40): its frontier is
    # above the buffers' at 5 of the 20 budgets, so the share (0.75) misses 0.8
    "1": {"curves": {"on_policy": [0.3, 0.49, 0.49, 0.49, 0.5, 0.55, 0.6, 0.55, 0.5, 0.45,
                                   0.4]}},
    # the best buffer reaches 0.5 in fewer steps (30) than on-policy (40)
    "2": {"curves": {"x1y2": [0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]}},
    # the larger x at y = 2 drops from its peak while the smaller one does not
    "3": {"curves": {"x4y2": [0.3, 0.33, 0.36, 0.4, 0.45, 0.5, 0.55, 0.6, 0.58, 0.56, 0.55]}},
    # at both x the highest y ends above the lowest one
    "4": {"curves": {"x1y1": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.58, 0.58, 0.58, 0.58, 0.58],
                     "x4y1": [0.3, 0.33, 0.36, 0.4, 0.45, 0.5, 0.55, 0.56, 0.56, 0.56, 0.56]}},
    # the best buffer's training entropy falls below on-policy's
    "5": {"entropy": {"x1y2": 0.3}},
    # the lag cell crashes like on-policy
    "6": {"curves": {"lag": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.65, 0.6, 0.5, 0.45, 0.4]}},
    # positive bias ends below its delta = 0 cell
    "7a": {"curves": {"delta": [0.3, 0.33, 0.36, 0.4, 0.45, 0.5, 0.55, 0.55, 0.55, 0.55,
                                0.55]}},
    # AsymRE's best grid cell ends below GRPO's
    "7b": {"curves": {"asymre_x4y2": [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.6, 0.6, 0.6,
                                      0.6]}},
}


@pytest.mark.parametrize("claim", sorted(BROKEN))
def test_a_claim_fails_when_its_evidence_is_reversed(claim):
    v = verdicts(hand_made(**BROKEN[claim]))
    assert v[claim].holds is False, v[claim]
    others = {k for k, x in v.items() if k != claim and x.holds is not True and k != "8"}
    assert not others, f"claim {claim}'s change also flipped {others}"


def test_no_compute_saving_fails_claims_1_and_2():
    # on-policy touches 0.5 at step 20 (157 updates), before any buffer (177), then falls
    # back: no saving (claim 1) and no better per unit of compute (claim 2), although the
    # buffers' frontier is at or above on-policy's at 19 of the 20 budgets
    v = verdicts(hand_made(curves={"on_policy": [0.3, 0.3, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4,
                                                 0.35, 0.35]}))
    assert v["1"].evidence["frontier_share"] >= claims.FRONTIER_SHARE_MIN
    assert v["1"].evidence["saving"] < 0 and v["1"].holds is False
    assert v["2"].evidence["compute_ratio"] > 1 and v["2"].holds is False


def test_pass_at_k_gain_must_grow_with_k():
    # pass@16 gain (0.85 - 0.8) now below pass@1 gain (0.4 - 0.32): claim 5 alone fails
    v = verdicts(hand_made(passk={"x1y2": (0.4, 0.85)}))
    assert v["5"].holds is False and v["5"].evidence["pass@16_gain"] < \
        v["5"].evidence["pass@1_gain"]


def test_missing_cells_leave_claims_out_or_untested():
    runs = [r for r in hand_made() if r.get("schedule.mode") != "async"
            and r.get("trainer.loss") == "grpo" and "buffer.delta" not in r.settings
            and r.get("buffer.horizon") != 4]
    v = verdicts(runs)
    assert set(v) == {"1", "2", "3", "4", "5", "8"}
    assert v["3"].holds is None and "missing" in v["3"].ours


def test_a_sweep_without_on_policy_or_the_loss_is_refused():
    no_onp = [r for r in hand_made() if r.get("schedule.mode") != "on_policy"]
    with pytest.raises(ValueError, match="on-policy"):
        claims.evaluate(no_onp, target=TARGET)
    with pytest.raises(ValueError, match="trainer.loss='ppo'"):
        claims.evaluate(hand_made(), target=TARGET, loss="ppo")
    with pytest.raises(ValueError, match="target"):
        claims.evaluate(hand_made(), target=1.5)


def test_table_and_json_from_the_tiny_fixture(tmp_path):
    found = claims.evaluate(load_runs(str(FIXTURE)), target=0.65)
    assert [v.claim.split(".")[0] for v in found] == ["1", "2", "3", "4", "5", "6", "7a",
                                                       "7b", "8"]
    md, js = claims.write(found, str(tmp_path))
    lines = Path(md).read_text().splitlines()
    assert lines[0] == "| claim | paper | ours (number) | holds? |"
    assert len(lines) == 2 + len(found)
    records = json.loads(Path(js).read_text())
    assert [r["holds"] for r in records] == [v.holds for v in found]
    assert set(records[0]) == {"claim", "paper", "ours", "holds", "evidence", "threshold"}


def test_committed_table_matches_the_committed_sweep(tmp_path):
    assert claims.main(["--results", str(ROOT / "results" / "cpu_sweep"),
                        "--out", str(tmp_path)]) == 0
    assert (tmp_path / "claims.md").read_text() == \
        (ROOT / "figures" / "out" / "claims.md").read_text()
