"""validate-sim end to end on the tiny preset, its records and the committed results
(theory.md sections 5 and 8.7)."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from replaytheory.cli import main
from replaytheory.sim.sim_records import PipelineRun, ScoreRecord, VariantResult, load_validation
from replaytheory.sim.validate_sim import DESIGNS, pipeline_histograms, preset

COMMITTED = Path(__file__).resolve().parent.parent / "results" / "sim_validation"

KEYS = {"problem", "loss", "mu", "design", "predicted_horizon", "predicted_replay_ratio",
        "best_horizon", "best_replay_ratio", "regret", "alpha", "alpha_interval", "tau",
        "tau_interval", "rho", "rho_interval", "goodness_of_fit"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
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
    assert {r["loss"] for r in records} == {"quadratic", "grpo", "grpo_unclipped"}
    for r in records:
        assert KEYS <= set(r)
        assert r["predicted_horizon"] >= 1 and r["predicted_replay_ratio"] > 0
        assert r["predicted_replay_ratio"] <= r["predicted_horizon"] + 1e-9  # N >= B
        assert r["regret"] is None or math.isfinite(r["regret"])
        assert len(r["alpha_interval"]) == 2 and len(r["rho_interval"]) == 2
        assert "power_law_ok" in r["goodness_of_fit"]


def test_outputs_are_written_and_no_figures(tiny_run):
    names = set(os.listdir(tiny_run))
    for label in ("quadratic", "tabular-grpo", "tabular-grpo_unclipped"):
        assert {f"grid_{label}.json", f"calibration_{label}.json",
                f"probes_{label}.npz"} <= names
    assert {"summary.json", "pipeline_histograms.json"} <= names
    assert not [n for n in names if n.endswith((".png", ".pdf"))]  # figures/ draws them


def _same_as_files(results, folder):
    """The records written back out equal the files they were read from."""
    def read(name):
        with open(os.path.join(folder, name)) as fh:
            return json.load(fh)
    as_json = lambda obj: json.loads(json.dumps(obj))  # noqa: E731 (tuples -> lists)
    assert as_json([r.to_json() for r in results.records]) == read("summary.json")
    assert as_json([r.to_json() for r in results.pipeline]) == read("pipeline_histograms.json")
    for variant in results.variants:
        assert as_json(variant.grid_json()) == read(f"grid_{variant.label}.json")


def test_loader_reads_the_run_back_into_records(tiny_run):
    results = load_validation(tiny_run)
    settings = preset("tiny")
    assert [v.label for v in results.variants] == [s.label for s in settings.variants]
    assert all(isinstance(v, VariantResult) for v in results.variants)
    assert all(isinstance(r, ScoreRecord) for r in results.records)
    assert all(isinstance(r, PipelineRun) for r in results.pipeline)
    for variant in results.variants:
        g = variant.grid
        assert g.mus == settings.mus
        assert g.loss.shape == (len(settings.mus), g.cells.shape[0])
        assert {r.label for r in variant.records} == {variant.label}
        for m, per_mu in enumerate(variant.predictions):
            assert tuple(p.design for p in per_mu) == DESIGNS
            # every record names the grid's best cell at its mu
            best = tuple(int(c) for c in g.cells[g.best(m)])
            assert {r.best_cell for r in variant.records if r.mu == g.mus[m]} == {best}
        finite = [r for r in variant.records if r.design == "finite_eta"]
        assert all(r.design_detail is not None and r.design_detail.lr > 0 for r in finite)
    _same_as_files(results, tiny_run)


def test_committed_results_load_with_the_harness_loss_names():
    results = load_validation(str(COMMITTED))
    assert [v.label for v in results.variants] == ["quadratic", "tabular-grpo",
                                                  "tabular-grpo_unclipped"]
    assert {r.loss for r in results.records} == {"quadratic", "grpo", "grpo_unclipped"}
    quad = results.records[0]
    assert (quad.label, quad.mu, quad.design) == ("quadratic", 2.0, "asymptotic")
    assert quad.fits.alpha == pytest.approx(0.1995, abs=1e-4)  # docs/findings.md's recovered alpha
    assert np.all(np.isfinite(results.variants[0].grid.loss))
    _same_as_files(results, str(COMMITTED))


def test_figures_draw_from_the_saved_run(tiny_run, tmp_path):
    pytest.importorskip("matplotlib").use("Agg")
    from figures.sim_validation import draw_all
    names = {os.path.basename(p) for p in draw_all(tiny_run, str(tmp_path))}
    for stem in ("sim_validation_quadratic", "sim_validation_tabular-grpo",
                 "sim_validation_tabular-grpo_unclipped", "sim_pipeline_histograms"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
    with pytest.raises(FileNotFoundError):
        draw_all(str(tmp_path / "empty"), str(tmp_path))


def test_pipeline_histograms_cover_the_fig2_settings():
    runs = pipeline_histograms(2_000)
    assert [(r.workers, r.trainers, r.buffer_size) for r in runs] == [
        (6, 2, 84), (6, 2, 252), (6, 2, 756), (6, 2, 2268), (5, 3, 252), (4, 4, 252)]
    assert all(set(r.histograms) == {"off_policiness", "replay_ratio",
                                     "steps_since_last_use"} for r in runs)


def test_cli_bad_input(capsys):
    with pytest.raises(SystemExit):
        main(["validate-sim"])  # --out is required
    with pytest.raises(SystemExit):
        main(["validate-sim", "--out", "x", "--preset", "huge"])
    with pytest.raises(ValueError, match="preset"):
        preset("huge")
