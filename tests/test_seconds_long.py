"""The verdict of experiments/seconds_long.yaml (llm_experiments.study.verdicts.seconds_long):
seconds to on-policy's final accuracy from each run's own clocks, by hand, and SL1-SL4 read
from them."""

import gzip
import json

import pytest

from llm_experiments.study.verdicts import seconds_long as sl


def _run(level, cell, seed, gen_per_batch, accs, steps=100):
    """A run whose clocks charge 1 s an update and ``gen_per_batch`` s per 64 rollouts."""
    x, y = cell
    rps = 64 / y
    settings = {"sampler.max_concurrent": level, "run.seed": seed}
    settings.update({"schedule.mode": "on_policy"} if x == 1 else
                    {"schedule.mode": "sync", "buffer.horizon": x, "schedule.replay_ratio": y})
    evals = [0, steps // 2, steps]
    return {"run_id": f"{level}-{x}-{y}-{seed}", "settings": settings, "batch_size": 64,
            "summary": {"steps": steps, "samples_generated": steps * rps,
                        "train_seconds_per_step": 1.0, "gen_seconds_per_step": gen_per_batch / y,
                        "mu_measured": gen_per_batch},
            "eval": {"step": evals, "samples_generated": [e * rps for e in evals],
                     "samples_consumed": [64 * e for e in evals], "eval_accuracy": accs},
            "train": {"step": [], "samples_generated": [], "samples_consumed": []}}


def _write(tmp_path, runs):
    path = tmp_path / "curves.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in runs)
    return str(path)


def test_ratios_by_hand_and_the_claims(tmp_path):
    """Every cell learns alike per update: on-policy's target (0.5 + 0.7) / 2 = 0.6 falls at
    update 75 everywhere, so a cell's ratio is its seconds per update over on-policy's: at
    level 16, (1 + 9 / 2.8) / 10 = 0.421; at level 0, (1 + 2 / 1.4) / 3 = 0.810."""
    same = [0.3, 0.5, 0.7]
    runs = []
    for seed in (0, 1, 2):
        for level, gen, cells in ((16, 9.0, [(1, 1), (16, 2.8), (16, 2.0), (64, 2.8)]),
                                  (0, 2.0, [(1, 1), (16, 1.4), (16, 2.0), (64, 1.4)])):
            runs += [_run(level, c, seed, gen, same) for c in cells]
    v = sl.judge(_write(tmp_path, runs))
    hi, lo = v["levels"]["16"], v["levels"]["0"]
    assert hi["cells"]["x=16, y=2.8"]["ratio"] == pytest.approx((0.4214,) * 3, abs=1e-4)
    assert lo["cells"]["x=64, y=1.4"]["ratio"][0] == pytest.approx(0.8095, abs=1e-4)
    assert hi["cells"]["on-policy"]["ratio"][0] == pytest.approx(1.0)
    assert hi["best_buffer"] in ("x=16, y=2.8", "x=64, y=2.8") and hi["mu"] == 9.0
    # per update alike, a cheaper update wins in seconds: at level 16 the advice's (16, 2)
    # (5.5 s an update) is below the rule's (64, 2.8) (4.2 s) by more than 0.02 AUC
    assert v["claims"] == {"SL1": True, "SL2": True, "SL3": True, "SL4": False}
    a, r = (hi["cells"][k]["auc_seconds"] for k in ("x=16, y=2", "x=64, y=2.8"))
    assert r - a > sl.NEAR


def test_a_cell_that_never_reaches_the_target_has_an_infinite_ratio(tmp_path):
    runs = [_run(16, (1, 1), s, 9.0, [0.3, 0.5, 0.7]) for s in (0, 1)]
    runs += [_run(16, (64, 2.8), s, 9.0, [0.3, 0.4, 0.5]) for s in (0, 1)]
    v = sl.judge(_write(tmp_path, runs))
    cell = v["levels"]["16"]["cells"]["x=64, y=2.8"]
    assert cell["ratio"][0] == float("inf") and v["claims"]["SL1"] is False
    assert cell["reached"] == 0 and cell["median_ratio"] == float("inf")
    assert "SL2" not in v["claims"]  # the natural level has no runs yet


def test_seeds_that_reach_the_target_and_the_paired_auc_are_reported_beside_the_mean(tmp_path):
    """Seed 0 of (16, 2.8) reaches on-policy's 0.6 at update 75 (ratio 0.421, as above),
    seed 1 never: the mean is inf, one seed of two reached it, the median is inf (numpy's
    median of 0.421 and inf). Its AUC over seconds minus on-policy's is negative on both
    seeds, and on-policy's own difference is 0."""
    runs = [_run(16, (1, 1), s, 9.0, [0.3, 0.5, 0.7]) for s in (0, 1)]
    runs += [_run(16, (16, 2.8), 0, 9.0, [0.3, 0.5, 0.7]),
             _run(16, (16, 2.8), 1, 9.0, [0.3, 0.35, 0.4])]
    cells = sl.judge(_write(tmp_path, runs))["levels"]["16"]["cells"]
    cell = cells["x=16, y=2.8"]
    assert cell["ratio_per_seed"][0] == pytest.approx(0.4214, abs=1e-4)
    assert cell["ratio_per_seed"][1] == float("inf") and cell["reached"] == 1
    assert cell["median_ratio"] == float("inf")
    assert cells["on-policy"]["auc_seconds_minus_on_policy"] == (0.0, 0.0, 0.0)
    # seed 0 learns alike per update at 0.42x the seconds (higher AUC over seconds), seed 1
    # learns far less: the two differences have opposite signs
    d = cell["auc_seconds_minus_on_policy"]
    assert d[1] <= d[0] <= d[2] and d[1] < 0 < d[2]


def test_the_figure_and_table_are_made_from_the_saved_results(tmp_path):
    from figures.cpu_long import seconds as fig
    runs = []
    for seed in (0, 1, 2):
        for level, gen, cells in ((16, 9.0, [(1, 1), (16, 2.8)]), (0, 2.0, [(1, 1), (16, 1.4)])):
            runs += [_run(level, c, seed, gen, [0.3, 0.5, 0.7]) for c in cells]
    res = tmp_path / "res"
    res.mkdir()
    (res / "verdict.json").write_text(json.dumps(sl.judge(_write(res, runs))))
    paths = fig.main(["--results", str(res), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "seconds_long.md").read_text()
    assert "| x=16, y=2.8 | 0.42 [0.42, 0.42] |" in text and "* SL1 (" in text
    assert "INTERIM" in text  # 3 of the 5 registered seeds
    assert {p.suffix for p in paths} >= {".md", ".png"}
