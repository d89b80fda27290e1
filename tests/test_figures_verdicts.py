"""The verdict figure and table draw what the judge's records hold."""

import json

import numpy as np
import pytest

from figures import style, verdicts


def _records(tmp_path):
    from llm_experiments.judge import Registration, judge
    reg = {"name": "tiny", "loss": "grpo", "steps": 24, "horizons": [1, 4],
           "replay_ratios": [1.0, 2.0], "accounting_mus": [2.0],
           "primary_measure": {"budget_replay_ratio": 2.0}, "secondary_targets": [],
           "bootstrap": {"draws": 50, "interval": 0.9, "rng_seed": 0},
           "gate": {"threshold": 0.9},
           "predictions_judged": {"asymptotic": {"2.0": [4.0, 2.0], "0.9": [1.0, 1.0]},
                                  "finite_eta": {"2.0": [1.0, 1.0]}}}
    path = tmp_path / "reg.json"
    path.write_text(json.dumps(reg))
    return judge("tests/fixtures/tiny_sweep/curves.jsonl", Registration.load(str(path)), None)


def test_heatmaps_hold_each_cells_probability_of_being_best(tmp_path):
    records = _records(tmp_path)
    fig = verdicts.draw(records, "tiny")
    primary = [r for r in records if r["measure"] == verdicts.PRIMARY]
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == len(primary)
    for ax, r in zip(panels, primary):
        shown = np.asarray(ax.images[0].get_array())
        grid = [c["p_best"] for c in r["cells"] if c["label"] != "on-policy"]
        assert sorted(shown[np.isfinite(shown)].ravel()) == pytest.approx(sorted(grid))
        marked = {line.get_label() for line in ax.lines}
        assert marked == set(r["predictions"])
    style.plt.close(fig)


def test_table_has_a_row_per_mu_and_prediction_with_its_regret(tmp_path):
    records = _records(tmp_path)
    text = verdicts.table(records, "tiny")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    primary = [r for r in records if r["measure"] == verdicts.PRIMARY]
    assert len(rows) - 1 == sum(len(r["predictions"]) for r in primary)
    for r in primary:
        for v, d in r["predictions"].items():
            assert any(f"| {v} | {d['cell']} |" in row and
                       f"{d['regret']['median']:.2f}" in row for row in rows)


def test_a_file_that_is_not_the_judges_is_refused(tmp_path):
    path = tmp_path / "validation.json"
    path.write_text(json.dumps([{"variant": "asymptotic"}]))
    with pytest.raises(ValueError, match="not a validation.json written by the judge"):
        verdicts.load_records(path)


def test_a_second_registrations_verdicts_are_named_after_it(tmp_path):
    (tmp_path / "heldout_wide").mkdir()
    path = tmp_path / "heldout_wide" / "validation_hold_last.json"
    path.write_text(json.dumps(_records(tmp_path)))
    assert verdicts.default_name(path) == "heldout_wide_hold_last"
    assert verdicts.default_name(tmp_path / "heldout_wide" / "validation.json") == "heldout_wide"
    out = verdicts.main_one(path, tmp_path / "out")
    assert {p.name for p in out} >= {"verdicts_heldout_wide_hold_last.png",
                                     "verdicts_heldout_wide_hold_last.md"}
    style.plt.close("all")
