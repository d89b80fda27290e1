"""The horizon without the clip (figures.unclipped, theory.md 11.19) pairs each unclipped run
with the clipped run of its seed and cell: an unclipped arm that is a copy of the clipped one
differs by exactly 0, and the registered claims are read from its means."""

import gzip
import json
from pathlib import Path

from figures import unclipped

RESULTS = Path(__file__).resolve().parent.parent / "results"


def test_a_copy_of_the_clipped_arm_differs_by_nothing(tmp_path):
    (tmp_path / "horizon_unclipped").mkdir()
    (tmp_path / "cpu_sweep_v3").symlink_to(RESULTS / "cpu_sweep_v3")
    with gzip.open(RESULTS / "cpu_sweep_v3" / "curves.jsonl.gz", "rt") as src, \
            gzip.open(tmp_path / "horizon_unclipped" / "curves.jsonl.gz", "wt") as dst:
        for line in src:
            rec = json.loads(line)
            s = rec["settings"]
            if (s.get("schedule.mode"), s.get("trainer.lr"), s.get("schedule.replay_ratio")) \
                    == ("sync", 1e-4, 2.0):
                s["trainer.loss"] = "grpo_unclipped"
                dst.write(json.dumps(rec) + "\n")
    paths = unclipped.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])
    got = json.loads((tmp_path / "out" / "unclipped.json").read_text())
    assert set(got["rows"]) == {"4", "16", "64", "256"}
    for row in got["rows"].values():
        assert row["seeds"] == 10 and row["difference"] == [0.0, 0.0, 0.0]
        assert row["clipped"] == row["unclipped"]
    # the clipped means (0.560 / 0.586 / 0.564 at 16 / 64 / 256) fail U1; a zero
    # difference fails U2
    assert got["claims"]["U1"] is False and got["claims"]["U2"] is False
    assert got["claims"]["U3"] is True and len(paths) == 4
