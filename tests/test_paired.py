"""The paired validation on the tiny committed fixture: results, validation, claims, figures,
and the main job end to end on a tiny model."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llm_experiments import claims
from llm_experiments.paired import cell_scores, compute_score, gate, kind, tail_score
from llm_experiments.results import compact_run, load_runs
from llm_experiments.results import main as results_main
from llm_experiments.validation import VARIANTS, load_probes, smoothness, validate

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
    g = gate(runs, compute_score(6.84, 0.65), "min")
    assert math.isnan(g) or -1 <= g <= 1


def test_validation_records():
    records = validate(CURVES, str(FIXTURE / "calibration"), target=0.65)
    rows = [r for r in records if "variant" in r and "error" not in r]
    assert {r["variant"] for r in rows} == set(VARIANTS)
    for r in rows:
        for key in ("mu", "loss", "variant", "predicted_horizon", "predicted_replay_ratio",
                    "best_horizon", "best_replay_ratio", "spearman", "regret",
                    "gate_spearman", "gate_passed"):
            assert key in r
        assert r["gate_passed"] == (r["gate_spearman"] >= 0.9)
        assert math.isnan(r["regret"]) or r["regret"] >= 0
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


def test_claims_table(tmp_path):
    records = claims.evaluate(CURVES, target=0.65)
    ids = [r["claim"].split(".")[0] for r in records]
    for needed in ("1", "2", "3", "4", "5", "6", "7a", "7b", "8"):
        assert needed in ids
    assert all(set(r) == {"claim", "paper", "ours", "holds"} for r in records)
    paths = claims.write(records, str(tmp_path))
    md = Path(paths[0]).read_text()
    assert md.startswith("| claim | paper | ours (number) | holds? |")
    assert len(json.loads(Path(paths[1]).read_text())) == len(records)


def test_paired_figures_from_fixture(tmp_path):
    import shutil

    from figures import paired
    from replaytheory.io import write_json
    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    write_json(str(results / "validation.json"),
               validate(CURVES, str(FIXTURE / "calibration"), target=0.65))
    paths = paired.main(tmp_path / "out", results)
    names = {p.name for p in paths}
    for stem in ("paired_accuracy_vs_compute_grpo", "paired_heatmaps_grpo",
                 "paired_pareto_grpo", "paired_passk_grpo", "paired_histograms",
                 "paired_noise_grpo", "paired_j_vs_measured_grpo"):
        assert f"{stem}.png" in names and f"{stem}.pdf" in names
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.slow
def test_demo_end_to_end_on_a_tiny_model(tmp_path):
    from llm_experiments.demo import run_demo
    from tests.llm.llm_helpers import SMALL
    tiny = dict(s.split("=", 1) for s in SMALL if not s.startswith(("run.", "probe.")))
    tiny = {k: (json.loads(v) if v[:1] in "[0123456789-" else v) for k, v in tiny.items()}
    s = run_demo(str(tmp_path), mu=6.84, steps=8, workers=2, progress=False,
                 overrides={**tiny, "eval.every": 4, "probe.fresh_groups": 8,
                            "probe.buffer_groups": 4, "probe.crn_groups": 2})
    assert (tmp_path / "demo.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text())["mu"] == 6.84
    assert any(r["config"] == "on-policy" for r in s["runs"]) and len(s["runs"]) >= 3
    again = run_demo(str(tmp_path), mu=6.84, steps=8, workers=2, progress=False,
                     overrides={**tiny, "eval.every": 4, "probe.fresh_groups": 8,
                                "probe.buffer_groups": 4, "probe.crn_groups": 2})
    assert again["runs"] == s["runs"]  # resumed: nothing rerun, same results


def test_speed_settings_do_not_split_a_cell():
    from llm_experiments.results import Run
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
