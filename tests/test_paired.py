"""The paired validation on the tiny committed fixture: results, validation and figures
(the claims report: test_claims.py; the main job: test_demo.py)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llm_experiments.study.cells import TARGET, cell_scores, gate, kind, tail_score
from llm_experiments.study.results import Run, compact_run, load_runs
from llm_experiments.study.results import main as results_main
from llm_experiments.study.validation import (VARIANTS, calibrated, load_probes, smoothness,
                                              validate)

# The fixture's calibration has no reuse / contribution tables: the reuse-aware variants
# (theory.md section 10) are left out of its validation.
STANDARD_VARIANTS = ("asymptotic", "effective_coupling", "finite_eta")

FIXTURE = Path(__file__).with_name("fixtures") / "tiny_sweep"
CURVES = str(FIXTURE / "curves.jsonl")


def test_compaction_counts_compute_before_each_evaluation(tmp_path):
    recs = [{"step": 0, "samples_generated": 32, "new_rollouts": 32, "eval_accuracy": 0.3},
            {"step": 1, "samples_generated": 64, "new_rollouts": 32},
            {"step": 2, "samples_generated": 96, "new_rollouts": 32, "eval_accuracy": 0.4},
            {"step": 3, "samples_generated": 96, "eval_accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs)
                                            + '{"step": 4, "trunc')  # a line cut by a kill
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "config.yaml").write_text("schedule: {batch_size: 64}\n")
    rec = compact_run(str(tmp_path), "r", {"run.seed": 0})
    assert rec["eval"]["step"] == [0, 2, 3]
    assert rec["eval"]["samples_generated"] == [0, 64, 96]


def test_results_cli_refuses_a_folder_that_is_not_a_sweep(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        results_main(["--sweep", str(tmp_path), "--out", str(tmp_path / "c.jsonl")])
    assert exc.value.code == 2 and "not a sweep folder" in capsys.readouterr().err


def test_runs_cells_and_scores():
    runs = load_runs(CURVES, trainer__loss="grpo")
    assert {kind(r) for r in runs} == {"on_policy", "grid", "delta", "lag"}
    r = runs[0]
    assert np.allclose(r.compute(2.0), r.eval["step"] + 2.0 * r.eval["samples_generated"]
                       / r.batch_size)
    scores = cell_scores(runs, tail_score, "max")
    assert len(scores) == len({r.cell for r in runs})
    for c in scores:
        assert c.q25 <= c.median <= c.q75 and len(c.values) == 4


def _scored_runs(scores: dict) -> tuple[list, object]:
    """Runs of a made-up grid, one per key (horizon, lr, seed) of ``scores``, and the score
    function that reads each run's value from ``scores``."""
    runs = [Run(f"{h}-{lr}-{seed}", {"buffer.horizon": h, "trainer.lr": lr, "run.seed": seed},
                16, {}, {}) for h, lr, seed in scores]
    return runs, lambda run: scores[(run.get("buffer.horizon"), run.lr, run.seed)]


def test_gate_is_one_for_concordant_seeds_and_minus_one_for_reversed_ones():
    # Four cells, two learning rates, four seeds that all rank the cells 1 < 2 < 4 < 8 (the
    # values differ by seed but never reorder the cells): every split half agrees.
    horizons = (1, 2, 4, 8)
    same = {(h, lr, seed): i + 0.1 * seed + lr for i, h in enumerate(horizons)
            for lr in (0.0, 5.0) for seed in range(4)}
    runs, score = _scored_runs(same)
    assert gate(runs, score, "min") == pytest.approx(1.0)
    assert gate(runs, score, "max") == pytest.approx(1.0)
    # Two seeds, the second ranking the cells in the opposite order: the only split disagrees.
    reversed_ = {(h, 0.0, seed): (i if seed == 0 else -i) for i, h in enumerate(horizons)
                 for seed in range(2)}
    assert gate(*_scored_runs(reversed_), "min") == pytest.approx(-1.0)
    one_seed = {k: v for k, v in reversed_.items() if k[2] == 0}
    assert math.isnan(gate(*_scored_runs(one_seed), "min"))


def test_gate_chooses_the_learning_rate_within_each_half():
    # Seed 0 is fast (low compute) at lr 1 and ranks the cells 1 < 2 < 4 < 8; seed 1 is fast at
    # lr 2 with the same ranking, while its lr-1 runs rank them in reverse. Choosing the
    # learning rate within each half compares the two fast rankings (Spearman 1); carrying
    # seed 0's choice over to seed 1 would compare reversed rankings (-1).
    scores = {}
    for i, h in enumerate((1, 2, 4, 8)):
        scores[(h, 1.0, 0)], scores[(h, 2.0, 0)] = i, 100 + i
        scores[(h, 1.0, 1)], scores[(h, 2.0, 1)] = 50 - i, i
    assert gate(*_scored_runs(scores), "min") == pytest.approx(1.0)


# Made-up accuracy gained per evaluation by each grpo cell of the fixture: with every run
# generating the same rollouts per step, compute to the target ranks the cells by these.
SLOPES = {("on_policy", None, None): 0.15, ("grid", 1, 1.0): 0.2, ("grid", 1, 2.0): 0.25,
          ("grid", 4, 1.0): 0.3, ("grid", 4, 2.0): 0.4}


def _synthetic_curves(path, seeds, reverse_seed=None) -> str:
    """The fixture's grpo grid and on-policy runs of ``seeds`` with accuracy min(1, slope * i)
    at the i-th evaluation (slopes from ``SLOPES``, in reverse order for ``reverse_seed``) and
    8 rollouts generated per step."""
    backwards = dict(zip(SLOPES, reversed(SLOPES.values())))
    lines = []
    for line in Path(CURVES).read_text().splitlines():
        rec = json.loads(line)
        s = rec["settings"]
        if s["trainer.loss"] != "grpo" or s["run.seed"] not in seeds or \
                s.get("buffer.delta") or s.get("schedule.mode") == "async":
            continue
        key = ("on_policy", None, None) if s.get("schedule.mode") == "on_policy" else \
            ("grid", s["buffer.horizon"], s["schedule.replay_ratio"])
        slope = (backwards if s["run.seed"] == reverse_seed else SLOPES)[key]
        ev = rec["eval"]
        ev["eval_accuracy"] = [min(1.0, slope * i) for i in range(len(ev["step"]))]
        ev["samples_generated"] = [8 * step for step in ev["step"]]
        lines.append(json.dumps(rec))
    Path(path).write_text("\n".join(lines) + "\n")
    return str(path)


def test_validation_gate_on_made_up_sweeps(tmp_path):
    cal = str(FIXTURE / "calibration")
    agree = validate(_synthetic_curves(tmp_path / "a.jsonl", seeds=(0, 1, 2, 3)), cal,
                     target=0.5, mus=[2.0])
    rows = [r for r in agree if "variant" in r and "error" not in r]
    assert {r["variant"] for r in rows} == set(STANDARD_VARIANTS)
    for r in rows:
        assert r["gate_spearman"] == pytest.approx(1.0) and r["gate_passed"] is True
        # the fastest slope: 0.5 / 0.4 evaluations of 6 steps, each 1 + mu * 8 / 16 updates
        assert r["best_cell"] == "x=4, y=2"
        assert r["best_compute"] == pytest.approx(0.5 / 0.4 * 6 * (1 + 2.0 * 8 / 16))
    disagree = validate(_synthetic_curves(tmp_path / "d.jsonl", seeds=(0, 1), reverse_seed=1),
                        cal, target=0.5, mus=[2.0])
    rows = [r for r in disagree if "variant" in r and "error" not in r]
    assert {r["variant"] for r in rows} == set(STANDARD_VARIANTS)
    for r in rows:
        assert r["gate_spearman"] == pytest.approx(-1.0) and r["gate_passed"] is False


def test_validation_records():
    records = validate(CURVES, str(FIXTURE / "calibration"), target=0.65)
    rows = [r for r in records if "variant" in r and "error" not in r]
    assert {r["variant"] for r in rows} == set(STANDARD_VARIANTS)
    for r in rows:
        for key in ("mu", "loss", "variant", "predicted_horizon", "predicted_replay_ratio",
                    "best_horizon", "best_replay_ratio", "spearman", "regret",
                    "gate_spearman", "gate_passed"):
            assert key in r
    cal = [r for r in records if "calibration" in r]
    assert {r["loss"] for r in cal} == {"grpo", "asymre"}
    assert cal[0]["calibration"]["smoothness_L"] > 0


def test_smoothness_needs_the_new_columns(tmp_path):
    probes = load_probes([str(FIXTURE / "calibration" / "grpo_seed0.npz")])
    big_l, f0 = smoothness(probes)
    assert big_l > 0 and f0 > 0
    del probes.tables["minibatch"]["grad_change_sq"]
    with pytest.raises(ValueError, match="grad_change_sq"):
        smoothness(probes)


@pytest.fixture
def drawn(drawn_by):
    """The figures ``figures.paired`` draws, by name, kept open instead of saved."""
    from figures import paired
    return drawn_by(paired)


def test_paired_figures_from_fixture(tmp_path, drawn):
    import shutil

    from figures import paired
    from replaytheory.io import write_json
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    write_json(str(results / "validation.json"),
               validate(CURVES, str(FIXTURE / "calibration"), target=0.65))
    paired.main(tmp_path / "out", results)
    assert set(drawn) == {f"paired_{stem}_{loss}" for loss in ("grpo", "asymre")
                          for stem in ("accuracy_vs_compute", "heatmaps", "pareto", "passk",
                                       "noise", "j_vs_measured")} | {"paired_histograms"}
    # one step line per histogram record on each of the three axes
    n_records = len((FIXTURE / "histograms.jsonl").read_text().splitlines())
    for ax in drawn["paired_histograms"].axes:
        assert len([ln for ln in ax.lines if ln.get_drawstyle() == "steps-mid"]) == n_records


def test_paired_heatmap_and_curves_show_the_made_up_sweep(tmp_path, drawn):
    from figures import paired
    from replaytheory.io import write_json
    write_json(str(tmp_path / "validation.json"),
               [{"loss": "grpo", "mu": 2.0, "variant": "asymptotic", "predicted_horizon": 4.0,
                 "predicted_replay_ratio": 1.0}])
    runs = load_runs(_synthetic_curves(tmp_path / "c.jsonl", seeds=(0, 1, 2, 3)))
    paired.heatmaps(runs, [2.0], tmp_path)
    tail, compute = [ax for ax in drawn["paired_heatmaps_grpo"].axes if ax.get_title()]
    # compute to TARGET: slope s reaches it after TARGET / s evaluations of 6 steps, each step
    # costing 1 + mu * 8 / 16 = 2 updates; rows replay ratio (1, 2), columns horizon (1, 4)
    expected = np.array([[TARGET / SLOPES[("grid", x, y)] * 6 * 2.0 for x in (1, 4)]
                         for y in (1.0, 2.0)])
    np.testing.assert_allclose(compute.images[0].get_array(), expected)
    for ax in (tail, compute):  # the fastest cell, x=4 y=2, is the best on both scores
        (best,) = [ln for ln in ax.lines if ln.get_label() == "measured best"]
        assert (best.get_xdata()[0], best.get_ydata()[0]) == (1, 1)
    (pred,) = [ln for ln in compute.lines if ln.get_label().startswith("asymptotic")]
    assert (pred.get_xdata()[0], pred.get_ydata()[0]) == (1, 0)  # x=4, y=1
    paired.accuracy_vs_compute(runs, [2.0])
    (ax,) = drawn["paired_accuracy_vs_compute_grpo"].axes
    # on-policy and the three grid cells fastest to the target, each its seeds' median curve,
    # holding the accuracy of the last evaluation (every 12 updates) reached
    medians = [ln for ln in ax.lines if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in medians] == [
        f"{label} (lr 0.001)" for label in ("on-policy", "x=4, y=2", "x=4, y=1", "x=1, y=2")]
    for ln, key in zip(medians, (("on_policy", None, None), ("grid", 4, 2.0),
                                 ("grid", 4, 1.0), ("grid", 1, 2.0))):
        evaluations = np.floor(np.asarray(ln.get_xdata()) / 12 + 1e-9).astype(int)
        np.testing.assert_allclose(ln.get_ydata(),
                                   np.minimum(1.0, SLOPES[key] * evaluations))


def test_speed_settings_do_not_split_a_cell():
    base = {"buffer.horizon": 4, "run.seed": 0, "trainer.lr": 1e-4}
    a = Run("a", base, 64, {}, {})
    b = Run("b", {**base, "run.seed": 5, "run.fast_kernels": False,
                  "run.direct_forward": False}, 64, {}, {})
    c = Run("c", {**base, "buffer.horizon": 16}, 64, {}, {})
    assert a.cell == b.cell != c.cell


def test_compaction_of_several_sweep_folders(tmp_path):
    for name, seed in (("a", 0), ("b", 5)):
        run = tmp_path / name / "runs" / f"r{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps(
            {"step": 0, "samples_generated": 8, "new_rollouts": 8, "eval_accuracy": 0.3}) + "\n")
        (run / "summary.json").write_text("{}")
        (run / "config.yaml").write_text("schedule: {batch_size: 8}\n")
        (tmp_path / name / "sweep.json").write_text(json.dumps(
            {"runs": [{"run_id": f"r{seed}", "overrides": {"run.seed": seed}},
                      {"run_id": "unfinished", "overrides": {"run.seed": 9}}]}))
    out = tmp_path / "curves.jsonl"
    assert results_main(["--sweep", str(tmp_path / "a"), str(tmp_path / "b"),
                         "--out", str(out)]) == 0
    assert sorted(r.seed for r in load_runs(str(out))) == [0, 5]


def test_reuse_aware_variants_need_their_fits():
    from types import SimpleNamespace as Cal
    none, both = Cal(reuse=None, contribution=None), Cal(reuse=1, contribution=1)
    assert [v for v in VARIANTS if calibrated(none, v)] == list(STANDARD_VARIANTS)
    assert [v for v in VARIANTS if calibrated(both, v)] == list(VARIANTS)
    only_c = Cal(reuse=1, contribution=None)
    assert {v for v in VARIANTS if calibrated(only_c, v)} == {*STANDARD_VARIANTS,
                                                               "self_correlated"}
