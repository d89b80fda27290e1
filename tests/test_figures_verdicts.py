"""The verdict figure and table draw what the judge's records hold."""

import json

import numpy as np
import pytest

from figures import style, verdicts


def _records(tmp_path, **extra):
    from llm_experiments.study.judge import Registration, judge
    reg = {**extra, "name": "tiny", "loss": "grpo", "steps": 24, "horizons": [1, 4],
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
    text = verdicts.table(records, "tiny").split("\n## ")[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    primary = [r for r in records if r["measure"] == verdicts.PRIMARY]
    # a row per prediction, one for on-policy (no buffer) and one for the rule x = 64,
    # y = sqrt(mu) per mu, below the header
    assert len(rows) - 1 == sum(len(r["predictions"]) + 2 for r in primary)
    assert sum(f"(rule {verdicts.RULE})" in row for row in rows) == len(primary)
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


def test_goal_rows_judge_each_prediction_by_the_four_criteria(tmp_path):
    records = _records(tmp_path)
    rows = verdicts.goal_rows({"tiny": records})
    primary = [r for r in records if r["measure"] == verdicts.PRIMARY]
    assert len(rows) == sum(len(r["predictions"]) for r in primary)
    for row in rows:
        assert row.y_star >= 1.0 and row.y_factor >= 1.0
        met = row.goals_met
        assert met["y"] == (max(row.y_star, row.y_best) / min(row.y_star, row.y_best) <= 1.5)
        assert met["regret"] == (row.regret is not None and row.regret["median"] <= 0.10)
        assert met["spearman"] == (row.spearman is not None
                                   and row.spearman["median"] >= 0.7)
    text = verdicts.goal_table(rows)
    table_rows = [line for line in text.splitlines() if line.startswith("| tiny |")]
    assert len(table_rows) == len(rows)
    assert all(f"{sum(r.goals_met.values())}/4" in line for r, line in zip(rows, table_rows))


def test_goal_row_y_factor_is_symmetric():
    base = dict(setting="s", mu="m", gate=0.9, gate_passed=True, best_cell="x=4, y=2",
                best_probability=0.5, variant="v", cell="x=4, y=2",
                regret={"median": 0.05, "low": 0.0, "high": 0.1},
                spearman={"median": 0.8, "low": 0.7, "high": 0.9})
    over = verdicts.GoalRow(**base, y_star=3.0, y_best=2.0)
    under = verdicts.GoalRow(**base, y_star=2.0, y_best=3.0)
    assert over.y_factor == under.y_factor == pytest.approx(1.5)
    assert over.goals_met == {"y": True, "regret": True, "spearman": True, "gate": True}
    assert not verdicts.GoalRow(**base, y_star=3.1, y_best=2.0).goals_met["y"]


def test_goal_table_shows_a_tied_cell_beside_the_judged_one():
    row = verdicts.GoalRow(setting="s", mu="m", gate=0.9, gate_passed=True,
                           best_cell="x=16, y=1", best_probability=0.5, variant="v",
                           cell="x=16, y=1", y_star=1.0, y_best=1.0,
                           regret={"median": 0.0, "low": 0.0, "high": 0.1}, spearman=None,
                           tied=(("x=4, y=1", {"median": 0.13, "low": 0.1, "high": 0.2}),))
    line = verdicts.goal_table([row]).splitlines()[-1]
    assert "x=16, y=1 (tied: x=4, y=1, regret 0.13 [0.10, 0.20])" in line
    assert "| x=16, y=1 (0.50) | n/a | v |" in line  # no on-policy regret recorded


def test_goal_rows_carry_the_no_buffer_regret_of_the_same_verdict(tmp_path):
    records = _records(tmp_path)
    rows = verdicts.goal_rows({"tiny": records})
    by_mu = {verdicts.mu_label(r): r["on_policy_regret"] for r in records
             if r["measure"] == verdicts.PRIMARY}
    assert rows and all(row.on_policy_regret == by_mu[row.mu] for row in rows)
    text = verdicts.goal_table(rows)
    assert all(verdicts._fmt(row.on_policy_regret) in line for row, line in
               zip(rows, [ln for ln in text.splitlines() if ln.startswith("| tiny |")]))
    assert "(no buffer) | on-policy" in verdicts.table(records, "tiny")


def _section(text: str, title: str) -> list[str]:
    """The body rows of the markdown table under heading ``## title``."""
    body = text.split(f"## {title}")[1].split("\n## ")[0]
    return [line for line in body.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_table_shows_the_best_horizon_the_cells_within_noise_and_compute_to_target(tmp_path):
    records = _records(tmp_path)
    primary = [r for r in records if r["measure"] == verdicts.PRIMARY]
    text = verdicts.table(records, "tiny")
    horizon = _section(text, "Best horizon, out of sample")
    noise = _section(text, "Within the noise of the best")
    assert len(horizon) == len(noise) == len(primary)
    for r, h_row, n_row in zip(primary, horizon, noise):
        h = r["best_horizon"]
        assert f"| x={h['horizon']:g} ({h['p_best']:.2f}) |" in h_row
        for n in h["neighbours"]:
            assert f"vs x={n['horizon']:g}: {n['difference']['mean']:+.3f}" in h_row
        assert f"| {len(r['within_noise'])} |" in n_row
        assert all(n["cell"] in n_row for n in r["within_noise"])
    # the fixture's curves fall from the warm start: no default target to reach
    assert all(r["compute_to_target"] == [] for r in primary)
    assert "## Compute to target" not in text


def test_tables_of_verdicts_from_before_the_new_fields_still_draw(tmp_path):
    records = _records(tmp_path)
    old = [{k: v for k, v in r.items() if k not in ("best_horizon", "within_noise", "baselines",
                                                    "compute_to_target", "primary_variant")}
           for r in records]
    assert "## Best horizon" not in verdicts.table(old, "tiny")
    rows = [ln for ln in verdicts.closing_table({"old": old}).splitlines()
            if ln.startswith("| old |")]
    assert rows and all("| n/a | n/a |" in row for row in rows)


def test_closing_table_has_a_row_per_setting_and_mu_with_the_primary_and_baselines(tmp_path):
    records = _records(tmp_path, primary_variant="asymptotic")
    primary = [r for r in records if r["measure"] == verdicts.PRIMARY]
    text = verdicts.closing_table({"tiny": records, "again": records})
    rows = [ln for ln in text.splitlines() if ln.startswith(("| tiny |", "| again |"))]
    assert len(rows) == 2 * len(primary)
    for r, row in zip(primary, rows):
        d = r["predictions"]["asymptotic"]
        assert f"| asymptotic: x*={d['x_star']:.3g}, y*={d['y_star']:.3g} -> {d['cell']}" in row
        assert f"| {verdicts._fmt(d['regret'])} | {verdicts._fmt(r['on_policy_regret'])} | " \
               f"{verdicts._fmt(r['baselines'][verdicts.RULE]['regret'])} | " \
               f"{verdicts._fmt(r['baselines']['section 5']['regret'])} | " \
               f"{verdicts._fmt(d['spearman'])} | {r['gate_spearman']:.2f} |" in row
        assert f"x={r['best_horizon']['horizon']:g}" in row
    out = verdicts.main_closing({"tiny": records}, tmp_path)
    assert out.name == "verdicts_closing.md" and out.read_text() == verdicts.closing_table(
        {"tiny": records})


def test_compute_to_target_rows_show_each_cells_ratio_to_the_fastest(tmp_path):
    records = _records(tmp_path)
    first = next(r for r in records if r["measure"] == verdicts.PRIMARY)
    first["compute_to_target"] = [{
        "target": 0.6, "fastest_cell": "x=4, y=1", "fastest_probability": 0.7,
        "fastest_compute": 100.0,
        "compute_ratio": {"on-policy": {"median": 1.7, "low": 1.2, "high": 2.5, "level": 0.9},
                          "x=1, y=1": {"median": 1.3, "low": 1.1, "high": None,
                                       "level": 0.9},
                          "x=4, y=2": {"median": None, "low": None, "high": None,
                                       "level": 0.9}}}]
    (row,) = _section(verdicts.table(records, "tiny"), "Compute to target")
    # JSON holds a compute that never reached the target (inf) as null
    assert row == (f"| {verdicts.mu_label(first)} | 0.6 | x=4, y=1 (0.70) | "
                   "on-policy 1.70 [1.20, 2.50], x=1, y=1 1.30 [1.10, inf], "
                   "x=4, y=2 inf [inf, inf] |")


def test_tables_and_figure_show_the_seconds_verdict_beside_compute_units(tmp_path):
    """A registration with "wall_clock": the seconds record gets its rows in every table,
    its own heatmap panel, and the cost of each cell in the unit C."""
    records = _records(tmp_path, wall_clock=True)
    sec = records[-1]
    assert sec["measure"] == verdicts.SECONDS
    text = verdicts.table(records, "tiny")
    head = text.split("\n## ")[0]
    label = verdicts.mu_label(sec)
    assert label.startswith("measured seconds (budget ")
    assert any(row.startswith(f"| {label} | {sec['best_cell']} ") for row in head.splitlines())
    assert "auc, auc_seconds" in head.splitlines()[0]
    costs = _section(text, "Cost per cell in the unit C")
    assert len(costs) == len(sec["costs"]["cells"])
    assert any(row.startswith("| on-policy | 1.00 |") for row in costs)
    assert any(row.startswith(f"| {label} ") for row in _section(text, "Best horizon, out of "
                                                                       "sample"))
    closing = verdicts.closing_table({"tiny": records})
    assert sum(f"| {label} |" in row for row in closing.splitlines()) >= 1
    fig = verdicts.draw(records, "tiny")
    assert len([ax for ax in fig.axes if ax.images]) == len(verdicts.shown(records))
    style.plt.close(fig)


def test_the_goal_table_and_pdfs_rebuild_to_the_committed_bytes(tmp_path):
    """``make_all``'s verdict family reproduces the committed goal table (a study's devcheck
    verdicts are not a judged setting), and a figure saved twice is the same PDF (no
    creation date)."""
    import hashlib
    from pathlib import Path

    from figures import make_all
    from figures.style import plt, save
    make_all.main(["--out", str(tmp_path), "--only", "verdicts"])
    committed = Path(__file__).resolve().parent.parent / "figures" / "out" / "verdicts_goal.md"
    assert (tmp_path / "verdicts_goal.md").read_bytes() == committed.read_bytes()
    digests = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        fig, ax = plt.subplots()
        ax.plot([1, 2], [3, 4])
        save(fig, "same", tmp_path / sub)
        digests.append(hashlib.sha256((tmp_path / sub / "same.pdf").read_bytes()).hexdigest())
    assert digests[0] == digests[1]
