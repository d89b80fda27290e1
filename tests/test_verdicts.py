"""Seed-bootstrap verdicts (replaytheory.stats.verdicts) and the target-free budget mean."""

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaytheory.stats.analysis import mean_over_budget
from replaytheory.stats.verdicts import (bootstrap_verdict, gate_distribution, interval,
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
    from llm_experiments.study.judge import Registration, judge
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
    from llm_experiments.study.judge import complete_seeds
    from llm_experiments.study.results import load_runs
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
    from llm_experiments.study.judge import judge
    rows = [json.loads(line) for line in open("tests/fixtures/tiny_sweep/curves.jsonl")]
    one = [r for r in rows if r["settings"]["run.seed"] == rows[0]["settings"]["run.seed"]]
    curves = tmp_path / "curves.jsonl"
    curves.write_text("".join(json.dumps(r) + "\n" for r in one))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        judge(str(curves), _bare_registration(tmp_path, draws=1), None)


def _bare_registration(tmp_path, draws: int):
    """A registration of the fixture's grid with no prediction to judge."""
    from llm_experiments.study.judge import Registration
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
    from llm_experiments.study.judge import judge, load_grid_runs
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
    from llm_experiments.study.judge import load_grid_runs
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
    from llm_experiments.study.judge import Registration, judge
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


def _registration(tmp_path, predictions: dict, draws: int = 50, **extra):
    """A registration of the fixture's grid (horizons 1, 4; y 1, 2; mu 2) judging
    ``predictions`` ({variant: {mu key: [x*, y*]}})."""
    from llm_experiments.study.judge import Registration
    reg = {"name": "t", "loss": "grpo", "steps": 24, "horizons": [1, 4], "replay_ratios": [1, 2],
           "accounting_mus": [2.0], "primary_measure": {"budget_replay_ratio": 2},
           "secondary_targets": [], "bootstrap": {"draws": draws, "interval": 0.9,
                                                  "rng_seed": 0},
           "gate": {"threshold": 0.9}, "predictions_judged": predictions, **extra}
    path = tmp_path / f"reg{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(reg))
    return Registration.load(str(path))


FIXTURE = "tests/fixtures/tiny_sweep/curves.jsonl"


def test_a_tie_is_judged_at_the_worse_cell_whichever_side_rounding_takes(tmp_path):
    """x* = 2 (1 +- 1e-15) lies midway between horizons 1 and 4 in log x up to rounding: the
    floating-point nearest cell flips with the last digit, the verdict must not. It takes the
    worse of the two (larger median regret) and names both."""
    from llm_experiments.study.judge import judge
    up, down = 2.0 * (1 + 1e-15), 2.0 * (1 - 1e-15)
    reg = _registration(tmp_path, {"asymptotic": {"2.0": [up, 2.0]},
                                   "finite_eta": {"2.0": [down, 2.0]}})
    for r in (r for r in judge(FIXTURE, reg, None) if r["mu_source"] == "2"):
        a, b = r["predictions"]["asymptotic"], r["predictions"]["finite_eta"]
        assert a["cell"] == b["cell"] and a["regret"] == b["regret"]
        assert {a["nearest_cell"], b["nearest_cell"]} == {"x=1, y=2", "x=4, y=2"}
        (other,) = a["tied"]
        assert {a["cell"], other["cell"]} == {"x=1, y=2", "x=4, y=2"}
        assert (a["regret"]["median"], a["regret"]["high"]) >= (
            other["regret"]["median"], other["regret"]["high"])


def test_an_infinite_horizon_is_the_grids_largest_and_flagged(tmp_path):
    """x* = inf (the objective keeps falling with the horizon) is judged at the largest
    horizon and flagged; so is the 1e6 that ``predict`` stores for it. The old nearest()
    raised a math-domain error on inf."""
    import math

    from llm_experiments.study.judge import SweepGrid, judge, load_grid_runs
    reg = _registration(tmp_path, {"self_correlated": {"2.0": [math.inf, 1.0]},
                                   "asymptotic": {"2.0": [1e6, 1.0]},
                                   "finite_eta": {"2.0": [4.0, 1.0]}})
    for r in (r for r in judge(FIXTURE, reg, None) if r["mu_source"] == "2"):
        p = r["predictions"]
        assert p["self_correlated"]["cell"] == p["asymptotic"]["cell"] == "x=4, y=1"
        assert p["self_correlated"]["x_beyond_grid"] and p["asymptotic"]["x_beyond_grid"]
        assert not p["finite_eta"]["x_beyond_grid"]
    grid = SweepGrid.of(load_grid_runs(FIXTURE, "grpo"))
    assert [grid.labels[i] for i in grid.equally_near(math.inf, 2.0)] == ["x=4, y=2"]
    assert [grid.labels[i] for i in grid.equally_near(math.inf, math.inf)] == ["x=4, y=2"]
    assert [grid.labels[i] for i in grid.equally_near(1.0, math.inf)] == ["x=1, y=2"]
    assert grid.beyond_grid(math.inf) and grid.beyond_grid(1e6) and not grid.beyond_grid(4.0)


@pytest.mark.parametrize("x, y, name", [(float("nan"), 1.0, "x_star"), (-1.0, 1.0, "x_star"),
                                        (4.0, -1.0, "y_star")])
def test_a_prediction_off_every_axis_is_refused_by_name(x, y, name):
    from llm_experiments.study.judge import SweepGrid, load_grid_runs
    grid = SweepGrid.of(load_grid_runs(FIXTURE, "grpo"))
    with pytest.raises(ValueError, match=name):
        grid.equally_near(x, y)


def test_a_horizon_under_one_step_is_on_policy():
    """x* = 0 (section 5.4's on-policy regime; the horizon model's on-policy readout) and
    x* = 0.5 are judged at the on-policy cell, whatever y."""
    from llm_experiments.study.judge import SweepGrid, load_grid_runs
    grid = SweepGrid.of(load_grid_runs(FIXTURE, "grpo"))
    for x, y in ((0.0, 1.0), (0.5, 3.0), (0.0, 0.0)):
        assert grid.equally_near(x, y) == [grid.on_policy]


def test_the_sceptics_fields_on_the_tiny_sweep(tmp_path):
    """Baselines in the same draws (on-policy, the rule x = 64, y = sqrt(mu) with its tie at
    mu = 2, section 5's model), the best horizon with its neighbour, the cells within noise and
    compute to two targets beside AUC."""
    from llm_experiments.study.judge import RULE, judge
    reg = _registration(tmp_path, {"asymptotic": {"2.0": [4.0, 2.0]}},
                        primary_variant="asymptotic")
    for r in judge(FIXTURE, reg, None):
        base = r["baselines"]
        assert r["primary_variant"] == "asymptotic"
        assert base["on-policy"]["regret"] == r["on_policy_regret"]
        if r["mu_source"] == "2":
            assert base["section 5"]["regret"] == r["predictions"]["asymptotic"]["regret"]
            # sqrt(2) is midway between y = 1 and y = 2 in log y; x = 64 is past the grid: x = 4
            rule = base[RULE]
            assert {rule["cell"], *(t["cell"] for t in rule["tied"])} == {"x=4, y=1", "x=4, y=2"}
        else:  # the measured mu has no registered prediction
            assert base["section 5"] is None
        h = r["best_horizon"]
        assert h["horizon"] in (1.0, 4.0) and h["cell"] != "on-policy"
        assert [n["horizon"] for n in h["neighbours"]] == [5.0 - h["horizon"]]
        d = h["neighbours"][0]["difference"]
        assert d["seeds"] <= len(r["seeds"]) and 0 <= d["wins"] <= d["seeds"]
        assert sum(p["p_best"] for p in h["per_horizon"]) == pytest.approx(
            1.0 - next(c["p_best"] for c in r["cells"] if c["label"] == "on-policy"))
        noise = r["within_noise"]
        assert noise[0]["cell"] == r["best_cell"] and all(n["loss"]["low"] <= 0 for n in noise)
        if r["measure"] == "auc":  # the fixture's curves fall from the warm start: no gain
            assert r["compute_to_target"] == []
        else:
            assert "compute_to_target" not in r


def _rising_sweep(tmp_path) -> str:
    """The fixture's runs with curves that rise from 0.3 at a rate set by the cell and seed."""
    rows = [json.loads(line) for line in open(FIXTURE)]
    for row in rows:
        s = row["settings"]
        rate = 0.01 * (1 + s.get("buffer.horizon", 0) + 2 * s.get("schedule.replay_ratio", 0)
                       + 0.5 * s["run.seed"] + 1000 * s["trainer.lr"])
        row["eval"]["eval_accuracy"] = [min(0.3 + rate * step, 0.9) for step in
                                        row["eval"]["step"]]
    path = tmp_path / "rising.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_compute_to_two_targets_beside_auc(tmp_path):
    """Default targets: the warm start plus 50% and 90% of the best cell's peak gain; each
    cell's compute as a multiple of the fastest cell's in the same draws (>= 1); registered
    targets replace them."""
    from llm_experiments.study.judge import RULE, judge
    curves = _rising_sweep(tmp_path)
    for r in (r for r in judge(curves, _registration(tmp_path, {}), None)
              if r["measure"] == "auc"):
        targets = [t["target"] for t in r["compute_to_target"]]
        assert len(targets) == 2 and 0.3 < targets[0] < targets[1] <= 0.9
        assert targets[0] == pytest.approx(0.3 + 0.5 * (targets[1] - 0.3) / 0.9, abs=2e-3)
        for t in r["compute_to_target"]:
            assert set(t["compute_ratio"]) == {r["best_cell"], "on-policy",
                                               r["baselines"][RULE]["cell"]}
            assert all(c["low"] >= 1.0 for c in t["compute_ratio"].values())
            assert 0 < t["fastest_compute"] < float("inf")
    reg = _registration(tmp_path, {}, compute_targets=[0.4, 0.7])
    rec = next(r for r in judge(curves, reg, None) if r["measure"] == "auc")
    assert [t["target"] for t in rec["compute_to_target"]] == [0.4, 0.7]


def test_leave_one_seed_out_chooses_the_option_on_the_other_seeds():
    from replaytheory.stats.verdicts import leave_one_seed_out
    # one cell, two learning rates, three seeds; lr 1 wins in sample (median 5 > 1), but
    # without seed 2 lr 0 wins (1 > 0)
    table = np.array([[[1.0, 1.0, 0.0], [0.0, 5.0, 5.0]]])
    oos = leave_one_seed_out(table, "max", [[0]])
    # seed 0: others {1, 2}: lr0 med 0.5, lr1 med 5 -> lr1 -> 0; seed 1: lr0 0.5, lr1 2.5 ->
    # lr1 -> 5; seed 2: lr0 1, lr1 2.5 -> lr1 -> 5
    assert list(oos[0]) == [0.0, 5.0, 5.0]
    assert list(leave_one_seed_out(table, "min", [[0]])[0]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 seeds"):
        leave_one_seed_out(table[:, :, :1], "max", [[0]])


def test_paired_difference_is_a_student_t_interval_of_the_mean():
    from scipy import stats as st

    from replaytheory.stats.verdicts import paired_difference
    a = np.array([0.5, 0.6, 0.55, np.nan, 0.7])
    b = np.array([0.4, 0.62, 0.5, 0.3, 0.6])
    d = (a - b)[:3].tolist() + [0.1]
    pd = paired_difference(a, b, "max", level=0.9)
    half = st.t.ppf(0.95, 3) * np.std(d, ddof=1) / np.sqrt(4)
    assert (pd.seeds, pd.wins) == (4, 3)
    assert pd.mean == pytest.approx(np.mean(d))
    assert (pd.low, pd.high) == pytest.approx((np.mean(d) - half, np.mean(d) + half))
    flipped = paired_difference(b, a, "min", level=0.9)
    assert (flipped.mean, flipped.low) == pytest.approx((pd.mean, pd.low))
    never = paired_difference([np.inf, 3.0], [1.0, 2.0], "min")
    assert never.mean == -np.inf and np.isnan(never.low)


def test_cells_within_noise_of_the_best():
    """A twin of the best cell (same scores up to tiny noise) is within noise of it; a cell
    that loses in every draw is not."""
    from types import SimpleNamespace

    from llm_experiments.study.best_region import within_noise
    rng = np.random.default_rng(0)
    best = 1.0 + rng.normal(0, 0.05, 10)
    table = np.stack([best, best + rng.normal(0, 0.01, 10), best - 0.5])[:, None, :]
    v = bootstrap_verdict(table, "max", np.ones(3, bool), {}, regret_gain(0.0), draws=200)
    grid = SimpleNamespace(labels=["a", "twin", "worse"])
    near = within_noise(grid, v)
    assert {n["cell"] for n in near} == {"a", "twin"}
    assert near[0]["cell"] == grid.labels[v.mode] and near[0]["loss"]["median"] == 0.0
    assert v.versus_mode[2].low == pytest.approx(0.5, abs=0.1)


def test_the_target_validation_judges_a_tie_at_the_cell_needing_more_compute():
    """llm_experiments.study.validation (compute to a target, lower is better): x* = 2 between
    horizons 1 and 4 is judged at the slower cell whichever side rounding takes; x* = inf at
    the largest horizon."""
    import math
    from types import SimpleNamespace

    from llm_experiments.study.validation import _nearest
    cells = [SimpleNamespace(horizon=h, replay_ratio=2.0, median=m, label=f"x={h}")
             for h, m in ((1.0, 300.0), (4.0, 200.0), (16.0, 100.0))]
    for x in (2.0 * (1 + 1e-15), 2.0 * (1 - 1e-15)):
        chosen, tied = _nearest(cells, x, 2.0)
        assert chosen.label == "x=1.0" and [c.label for c in tied] == ["x=4.0"]
    cells[0].median = 100.0
    assert _nearest(cells, 2.0, 2.0)[0].label == "x=4.0"
    assert _nearest(cells, math.inf, 2.0) == (cells[2], [])


def test_the_wall_clock_record_beside_unchanged_compute_records(tmp_path):
    """--seconds adds one record: AUC over each run's measured seconds up to the cheapest
    cell's median run, and each cell's update cost and mu in the unit of an on-policy
    update; the compute-unit records stay as they were."""
    from llm_experiments.study.judge import SweepGrid, judge, load_grid_runs
    reg = _registration(tmp_path, {"asymptotic": {"2.0": [4, 2], "0.5": [4, 2]}})
    plain = judge(FIXTURE, reg, None)
    timed = judge(FIXTURE, reg, None, wall_clock=True)
    assert timed[:-1] == plain
    rec = timed[-1]
    assert (rec["mu_source"], rec["measure"], rec["budget_unit"]) == (
        "seconds", "auc_seconds", "seconds")
    grid = SweepGrid.of(load_grid_runs(FIXTURE, "grpo"))

    def median(rs, f):
        return float(np.median([f(r.summary) for r in rs]))
    cells = [grid.runs[c] for c in grid.cells]  # in the order of rec["costs"]["cells"]
    # a run's seconds are its two clocks: every update and every rollout it made
    assert rec["budget"] == pytest.approx(min(median(rs, lambda s: s["steps"] * (
        s["train_seconds_per_step"] + s["gen_seconds_per_step"])) for rs in cells))
    unit = median(cells[grid.on_policy], lambda s: s["train_seconds_per_step"])
    costs = rec["costs"]["cells"]
    assert rec["costs"]["unit_seconds"] == pytest.approx(unit)
    assert costs[grid.on_policy]["update_cost"] == pytest.approx(1.0)
    for rs, cost in zip(cells, costs, strict=True):
        assert cost["update_cost"] == pytest.approx(
            median(rs, lambda s: s["train_seconds_per_step"]) / unit)
        assert cost["mu"] == pytest.approx(median(rs, lambda s: s[
            "gen_seconds_per_step"] * s["steps"] / s["samples_generated"]) * 16 / unit)
    assert all(0.0 <= c["score"] <= 1.0 for c in rec["cells"])
    assert rec["predictions"]["asymptotic"]["cell"] == "x=4, y=2"
    # seconds to target: within the slowest run's seconds where reached
    longest = max(s * u for s, u in ((r.summary["steps"], r.summary["train_seconds_per_step"]
                                      + r.summary["gen_seconds_per_step"])
                                     for rs in cells for r in rs))
    assert all(0 < t["fastest_compute"] <= longest for t in rec["compute_to_target"])


@pytest.mark.parametrize("change, names", [
    (lambda d: d.update(steps="abc"), "steps must be an integer >= 1"),
    (lambda d: d.update(steps=0), "steps must be an integer >= 1"),
    (lambda d: d["bootstrap"].update(interval=1.5), "bootstrap.interval must be in (0, 1)"),
    (lambda d: d["bootstrap"].update(draws=2.5), "bootstrap.draws must be an integer >= 1"),
    (lambda d: d.update(bootstrap=[1]), "bootstrap must be an object"),
    (lambda d: d["gate"].update(threshold=2), "gate.threshold must be in [-1, 1]"),
    (lambda d: d.update(accounting_mus=[2.0, -1]), "accounting_mus[1] must be in (0, inf)"),
    (lambda d: d["primary_measure"].update(budget_replay_ratio=None),
     "primary_measure.budget_replay_ratio must be in (0, inf)"),
    (lambda d: d.update(compute_targets=[0.5, 2]), "compute_targets[1] must be in [0, 1]"),
    (lambda d: d.update(primary_variant="best"), "primary_variant must be one of"),
    (lambda d: d.update(wall_clock="yes"), "wall_clock must be true or false"),
    (lambda d: d["predictions_judged"]["asymptotic"].update({"two": [4.0, 2.0]}),
     "predictions_judged.asymptotic: the key 'two' must be a mu"),
    (lambda d: d["predictions_judged"]["asymptotic"].update({"2.0": [4.0, 0]}),
     "predictions_judged.asymptotic.2.0 must be [x*, y*] with x* >= 0 and y* > 0"),
])
def test_a_bad_registration_field_is_named_with_the_flag_the_file_and_its_range(
        tmp_path, change, names):
    """Each field of a registration is checked where it is declared: the error names the
    flag, the file and the field with its allowed range (the old loader took steps "abc" as
    a bare int() error and an interval of 1.5 without complaint)."""
    from replaytheory.cli_input import BadInput
    from llm_experiments.study.judge import Registration
    reg = {"name": "t", "loss": "grpo", "steps": 24, "horizons": [1, 4], "replay_ratios": [1, 2],
           "accounting_mus": [2.0], "primary_measure": {"budget_replay_ratio": 2},
           "secondary_targets": [], "bootstrap": {"draws": 50, "interval": 0.9, "rng_seed": 0},
           "gate": {"threshold": 0.9},
           "predictions_judged": {"asymptotic": {"2.0": [4.0, 2.0]}, "finite_eta": {
               "2.0": "no optimum"}}}
    Registration.load(str(_written(tmp_path / "good.json", reg)), "--prediction")
    change(reg)
    path = _written(tmp_path / "bad.json", reg)
    with pytest.raises(BadInput) as err:
        Registration.load(str(path), "--prediction")
    assert f"--prediction {str(path)!r}: " in str(err.value) and names in str(err.value)


def test_a_registration_is_read_by_field_as_the_judge_uses_it(tmp_path):
    """Accounting mus keep their keys, any other mu is "measured", a variant without an
    optimum there is left out, absent optional fields take their defaults."""
    from llm_experiments.study.judge import Registration
    reg = {"name": "t", "loss": "grpo", "steps": 24, "horizons": [1, 4], "replay_ratios": [1, 2],
           "accounting_mus": [2.0, 6.84], "primary_measure": {"budget_replay_ratio": 2},
           "bootstrap": {"draws": 50, "interval": 0.9, "rng_seed": 3},
           "gate": {"threshold": 0.9},
           "predictions_judged": {"asymptotic": {"0.4": [16, 2.8], "6.84": "x* unbounded"},
                                  "finite_eta": "no calibration", "unknown": {"2": [1, 1]}}}
    r = Registration.load(str(_written(tmp_path / "r.json", reg)))
    assert r.predictions == {"asymptotic": {"measured": (16, 2.8)}}
    assert (r.steps, r.draws, r.rng_seed, r.level, r.accounting_mus) == (24, 50, 3, 0.9,
                                                                        (2.0, 6.84))
    assert (r.targets, r.extrapolate, r.warm_start, r.primary_variant, r.compute_targets,
            r.wall_clock, r.horizon_model) == ((), "none", None, None, (), False, None)
    assert r.compute_budget(2.0) == 24 * (1 + 2.0 / 2)


def _written(path, obj):
    path.write_text(json.dumps(obj))
    return path
