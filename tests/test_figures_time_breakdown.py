"""Where the wall time goes (figures.time_breakdown, issue 37): the benchmark's saved
breakdowns are drawn per level and schedule, each side's bar as long as the run's wall time,
and a missing benchmark is a FileNotFoundError that make_all reports as skipped."""

import json

import pytest

from figures import time_breakdown
from llm_experiments.engines.timing import overlap_breakdown, serial_breakdown

COUNTERS = {"wall_time": 10.0, "gen_seconds": 6.0, "grade_seconds": 0.5,
            "train_seconds": 3.0, "eval_seconds": 0.2}


def _run(level, arm):
    overlap = overlap_breakdown({**COUNTERS, "wall_time": 7.0},
                                {"generate": 6.0, "grade": 0.5, "idle": 0.2}, 3.5)
    return {"max_concurrent": level, "arm": arm,
            "time_breakdown": {"serial": serial_breakdown(COUNTERS), "overlap": overlap}}


def test_each_level_draws_serial_and_each_arm_once(tmp_path):
    runs = [_run(level, arm) for level in (0, 8) for _ in range(2)
            for arm in ("thread", "process", "ray-actors")]
    for r in runs[:6]:
        if r["arm"] == "ray-actors":
            r["time_breakdown"] = {}  # the Ray engine writes no breakdown (level 0 here)
    (tmp_path / "overlap.json").write_text(json.dumps({"runs": runs}))
    data = time_breakdown.load(tmp_path / "overlap.json")
    assert {lvl: [label for label, _ in rows] for lvl, rows in data.items()} == {
        0: ["serial", "thread", "process"], 8: ["serial", "thread", "process", "ray-actors"]}
    for rows in data.values():
        for _, tb in rows:
            for side in time_breakdown.SIDES:
                assert sum(tb[side][k] for k in time_breakdown.PARTS) == pytest.approx(
                    tb["wall_seconds"])
    paths = time_breakdown.main(["--results", str(tmp_path / "overlap.json"),
                                 "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "time_breakdown.md").read_text()
    assert text.count("| serial |") == 4 and len(paths) == 3


def test_a_missing_benchmark_is_reported_not_drawn(tmp_path):
    with pytest.raises(FileNotFoundError):
        time_breakdown.main(["--results", str(tmp_path / "none.json"), "--out", str(tmp_path)])
