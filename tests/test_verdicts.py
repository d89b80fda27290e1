"""Seed-bootstrap verdicts (replaytheory.verdicts) and the target-free budget mean."""

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaytheory.analysis import mean_over_budget
from replaytheory.verdicts import (bootstrap_verdict, gate_distribution, interval,
                                   regret_gain, regret_ratio, scores_per_draw, seed_draws)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=8), st.floats(0.5, 3.0))
def test_mean_over_budget_is_the_integral_of_the_interpolated_curve(values, frac):
    compute = np.cumsum(np.linspace(1.0, 2.0, len(values)))
    budget = frac * compute[-1]
    dense = np.linspace(0, budget, 200_001)
    expected = np.interp(dense, compute, values).mean()  # holds the ends, like the function
    assert mean_over_budget(compute, values, budget) == pytest.approx(expected, abs=1e-4)


def test_mean_over_budget_rejects_a_non_positive_budget():
    with pytest.raises(ValueError, match="budget"):
        mean_over_budget([0, 1], [0, 1], 0.0)


def test_first_draw_is_the_observed_data():
    idx = seed_draws(7, 5, seed=3)
    assert idx.shape == (5, 7) and list(idx[0]) == list(range(7))


def test_scores_per_draw_rechooses_the_learning_rate_in_each_draw():
    # One cell, two learning rates; seed 0 favours lr 0, seed 1 favours lr 1.
    table = np.array([[[1.0, 0.0], [0.0, 2.0]]])
    idx = np.array([[0, 0], [1, 1]])
    assert list(scores_per_draw(table, idx, "max")[0]) == [1.0, 2.0]
    assert list(scores_per_draw(table, idx, "min")[0]) == [0.0, 0.0]


def test_a_dominant_cell_is_best_in_every_draw_and_its_regret_is_zero():
    rng = np.random.default_rng(0)
    table = rng.normal(0, 0.1, size=(4, 2, 10))
    table += np.array([0.0, 1.0, 5.0, 2.0])[:, None, None]
    j = np.array([3.0, 2.0, 0.0, 1.0])  # lower J = predicted better: the measured order
    v = bootstrap_verdict(table, "max", np.ones(4, bool), {"right": 2, "wrong": 0},
                          regret_gain(0.0), objectives={"good": j, "reversed": -j},
                          draws=200, seed=1)
    assert v.mode == 2 and v.p_best[2] == 1.0 and v.p_best.sum() == pytest.approx(1.0)
    assert v.regret["right"].median == 0.0 and v.regret["right"].high == 0.0
    assert v.regret["wrong"].median == pytest.approx(1.0, abs=0.05)  # loses all the gain
    assert v.spearman["good"].low == pytest.approx(1.0)
    assert v.spearman["reversed"].high == pytest.approx(-1.0)


def test_non_candidates_never_win():
    table = np.zeros((3, 1, 4))
    table[0] = 10.0
    v = bootstrap_verdict(table, "max", np.array([False, True, True]), {}, regret_gain(0.0),
                          draws=10)
    assert v.p_best[0] == 0.0 and v.mode in (1, 2)


def test_compute_regret_is_a_ratio_and_never_reaching_is_inf():
    assert list(regret_ratio([150.0, np.inf], [100.0, 100.0])) == [0.5, np.inf]
    v = bootstrap_verdict(np.array([[[100.0, 100.0]], [[np.inf, np.inf]]]), "min",
                          np.ones(2, bool), {"never": 1}, regret_ratio, draws=5)
    assert v.mode == 0 and v.regret["never"].median == np.inf


def test_interval_quantiles():
    i = interval(np.arange(101), level=0.9)
    assert (i.low, i.median, i.high) == (5.0, 50.0, 95.0)
    with pytest.raises(ValueError, match="level"):
        interval([1.0], level=1.0)


def test_gate_is_one_for_a_grid_that_agrees_with_itself_and_low_for_noise():
    clean = np.repeat(np.arange(6.0)[:, None, None], 8, axis=2)
    clean = clean + np.random.default_rng(0).normal(0, 0.01, clean.shape)
    assert gate_distribution(clean, "max", halvings=30).low == pytest.approx(1.0)
    noise = np.random.default_rng(1).normal(size=(6, 1, 8))
    assert gate_distribution(noise, "max", halvings=30).median < 0.9


def test_judge_on_the_tiny_sweep(tmp_path):
    """The judge's records on a committed fixture: probabilities sum to one, the point
    estimate's best cell has the best median, and a prediction at that cell has zero
    regret in the observed draw."""
    from llm_experiments.judge import Registration, judge
    reg = {"name": "tiny", "loss": "grpo", "steps": 24, "horizons": [1, 4],
           "replay_ratios": [1.0, 2.0], "accounting_mus": [2.0],
           "primary_measure": {"budget_replay_ratio": 2.0}, "secondary_targets": [0.3],
           "bootstrap": {"draws": 1, "interval": 0.9, "rng_seed": 0},
           "gate": {"threshold": 0.9},
           "predictions_judged": {"asymptotic": {"2.0": [4.0, 2.0], "0.9": [1.0, 1.0]},
                                  "finite_eta": {"2.0": [0.5, 1.0]}}}
    path = tmp_path / "reg.json"
    path.write_text(json.dumps(reg))
    records = judge("tests/fixtures/tiny_sweep/curves.jsonl", Registration.load(str(path)),
                    None)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert all(r["registration"] == {"path": str(path), "sha256": sha} for r in records)
    assert {(r["mu_source"], r["measure"]) for r in records} == {
        (m, s) for m in ("measured", "2", "cell") for s in ("auc", "target=0.3")}
    for r in records:
        cells = r["cells"]
        assert sum(c["p_best"] for c in cells) == pytest.approx(1.0)
        pick = max if r["better"] == "max" else min
        assert pick(cells, key=lambda c: c["score"])["label"] == r["best_cell"]
        if r["mu_source"] == "2":
            # on-policy's regret is what a prediction of no buffer (x* < 1) gets
            assert r["predictions"]["finite_eta"]["cell"] == "on-policy"
            assert r["on_policy_regret"] == r["predictions"]["finite_eta"]["regret"]
            p = r["predictions"]["asymptotic"]
            assert p["cell"] == "x=4, y=2"
            if p["cell"] == r["best_cell"]:
                assert p["regret"]["median"] == 0.0


def test_interim_judge_keeps_only_seeds_that_finished_every_run(tmp_path):
    """A seed-major sweep cut short: the seed missing one run is left out whole."""
    from llm_experiments.judge import complete_seeds
    from llm_experiments.results import load_runs
    runs = load_runs("tests/fixtures/tiny_sweep/curves.jsonl")
    seeds = sorted({r.seed for r in runs})
    assert len(seeds) >= 2
    dropped = next(r for r in runs if r.seed == seeds[-1])
    partial = [r for r in runs if r is not dropped]
    kept = complete_seeds(partial)
    assert sorted({r.seed for r in kept}) == seeds[:-1]
    assert len(kept) == sum(r.seed != seeds[-1] for r in runs)
    assert complete_seeds(runs) == runs


def test_judge_refuses_a_single_seed_by_name(tmp_path):
    """One seed leaves nothing to resample: the judge says so instead of failing deep in
    the split-half gate."""
    from llm_experiments.judge import judge
    rows = [json.loads(line) for line in open("tests/fixtures/tiny_sweep/curves.jsonl")]
    one = [r for r in rows if r["settings"]["run.seed"] == rows[0]["settings"]["run.seed"]]
    curves = tmp_path / "curves.jsonl"
    curves.write_text("".join(json.dumps(r) + "\n" for r in one))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        judge(str(curves), _bare_registration(tmp_path, draws=1), None)


def _bare_registration(tmp_path, draws: int):
    """A registration of the fixture's grid with no prediction to judge."""
    from llm_experiments.judge import Registration
    reg = tmp_path / "reg.json"
    reg.write_text(json.dumps({"name": "tiny", "loss": "grpo", "steps": 24, "horizons": [1, 4],
                               "replay_ratios": [1.0, 2.0], "accounting_mus": [2.0],
                               "primary_measure": {"budget_replay_ratio": 2.0},
                               "secondary_targets": [],
                               "bootstrap": {"draws": draws, "interval": 0.9, "rng_seed": 0},
                               "gate": {"threshold": 0.9}, "predictions_judged": {}}))
    return Registration.load(str(reg))


def test_a_grid_split_over_two_curves_files_is_judged_as_one_and_overlap_is_refused(tmp_path):
    """A registered extension (its own curves.jsonl) joins the main grid's runs; a run in
    both files is named instead of silently overwriting the other."""
    from llm_experiments.judge import judge, load_grid_runs
    rows = [json.loads(line) for line in open("tests/fixtures/tiny_sweep/curves.jsonl")]
    horizon = [r for r in rows if r["settings"].get("buffer.horizon") == 4]
    assert horizon and len(horizon) < len(rows)
    main, ext = tmp_path / "main.jsonl", tmp_path / "ext.jsonl"
    main.write_text("".join(json.dumps(r) + "\n" for r in rows if r not in horizon))
    ext.write_text("".join(json.dumps(r) + "\n" for r in horizon))
    registration = _bare_registration(tmp_path, draws=20)
    whole = judge("tests/fixtures/tiny_sweep/curves.jsonl", registration, None)
    split = judge([str(main), str(ext)], registration, None)
    assert [r.pop("curves") for r in split][0] == [
        {"path": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in (main, ext)]
    assert split == [{k: v for k, v in r.items() if k != "curves"} for r in whole]
    assert len(load_grid_runs([str(main), str(ext)], "grpo")) == len(
        load_grid_runs("tests/fixtures/tiny_sweep/curves.jsonl", "grpo"))
    with pytest.raises(ValueError, match="repeats"):
        load_grid_runs([str(main), str(ext), str(ext)], "grpo")


def test_a_grid_from_two_initial_policies_is_refused(tmp_path):
    """Runs continued on a machine that trained another warm start are not more seeds."""
    from llm_experiments.judge import load_grid_runs
    rows = [json.loads(line) for line in open("tests/fixtures/tiny_sweep/curves.jsonl")]
    grpo = [r for r in rows if r["settings"]["trainer.loss"] == "grpo"]
    grpo[-1]["summary"]["warm_start_accuracy"] = 0.26
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="mixes initial policies: 1 of"):
        load_grid_runs(str(mixed), "grpo")


def test_a_prediction_midway_between_cells_reports_the_tied_cell(tmp_path):
    """x* = 2 lies midway between horizons 1 and 4 in log x: the verdict names one cell (the
    registered nearest-cell rule) and reports the other's regret beside it."""
    from llm_experiments.judge import Registration, judge
    reg = {"name": "t", "loss": "grpo", "steps": 4, "horizons": [1, 4], "replay_ratios": [1, 2],
           "accounting_mus": [2.0], "primary_measure": {"budget_replay_ratio": 2},
           "secondary_targets": [], "bootstrap": {"draws": 50, "interval": 0.9, "rng_seed": 0},
           "gate": {"threshold": 0.9},
           "predictions_judged": {"asymptotic": {"2.0": [2.0, 2.0]},
                                  "finite_eta": {"2.0": [4.0, 2.0]}}}
    path = tmp_path / "reg.json"
    path.write_text(json.dumps(reg))
    records = judge("tests/fixtures/tiny_sweep/curves.jsonl", Registration.load(str(path)),
                    None)
    for r in (r for r in records if r["mu_source"] == "2"):
        mid, exact = r["predictions"]["asymptotic"], r["predictions"]["finite_eta"]
        assert {mid["cell"], *(t["cell"] for t in mid["tied"])} == {"x=1, y=2", "x=4, y=2"}
        # the tied cell's regret is the one a prediction exactly there gets (same draws)
        other = {**{t["cell"]: t["regret"] for t in mid["tied"]}, mid["cell"]: mid["regret"]}
        assert other["x=4, y=2"] == exact["regret"]
        assert exact["tied"] == []
