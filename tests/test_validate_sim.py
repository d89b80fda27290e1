"""validate-sim end to end on the tiny preset (issue 3, item 4)."""

import json
import math
import os

import pytest

from replaytheory.cli import main
from replaytheory.validate_sim import DESIGNS, pipeline_histograms, preset

KEYS = {"problem", "loss", "mu", "design", "predicted_horizon", "predicted_replay_ratio",
        "best_horizon", "best_replay_ratio", "regret", "alpha", "alpha_interval", "tau",
        "tau_interval", "rho", "rho_interval", "goodness_of_fit"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("matplotlib").use("Agg")
    out = str(tmp_path_factory.mktemp("vsim"))
    assert main(["validate-sim", "--out", out, "--preset", "tiny"]) == 0
    return out


def test_summary_has_one_record_per_problem_loss_mu_design(tiny_run):
    with open(os.path.join(tiny_run, "summary.json")) as fh:
        records = json.load(fh)
    settings = preset("tiny")
    assert len(records) == len(settings.variants) * len(settings.mus) * len(DESIGNS)
    combos = {(r["problem"], r["loss"], r["mu"], r["design"]) for r in records}
    assert len(combos) == len(records)
    assert {r["problem"] for r in records} == {"quadratic", "tabular"}
    assert {r["loss"] for r in records} == {"quadratic", "grpo_clip", "unclipped"}
    for r in records:
        assert KEYS <= set(r)
        assert r["predicted_horizon"] >= 1 and r["predicted_replay_ratio"] > 0
        assert r["predicted_replay_ratio"] <= r["predicted_horizon"] + 1e-9  # N >= B
        assert r["regret"] is None or math.isfinite(r["regret"])
        assert len(r["alpha_interval"]) == 2 and len(r["rho_interval"]) == 2
        assert "power_law_ok" in r["goodness_of_fit"]


def test_outputs_and_figures_are_written(tiny_run):
    names = set(os.listdir(tiny_run))
    assert {"summary.json", "pipeline_histograms.json", "grid_quadratic.json",
            "calibration_quadratic.json", "probes_quadratic.npz"} <= names
    for stem in ("sim_validation_quadratic", "sim_validation_tabular-grpo_clip",
                 "sim_pipeline_histograms"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names


def test_pipeline_histograms_cover_the_fig2_settings():
    runs = pipeline_histograms(2_000)
    assert [(r["workers"], r["trainers"], r["buffer_size"]) for r in runs] == [
        (6, 2, 84), (6, 2, 252), (6, 2, 756), (6, 2, 2268), (5, 3, 252), (4, 4, 252)]
    assert all(set(r["histograms"]) == {"off_policiness", "replay_ratio",
                                        "steps_since_last_use"} for r in runs)


def test_cli_bad_input(capsys):
    with pytest.raises(SystemExit):
        main(["validate-sim"])  # --out is required
    with pytest.raises(SystemExit):
        main(["validate-sim", "--out", "x", "--preset", "huge"])
    with pytest.raises(ValueError, match="preset"):
        preset("huge")
