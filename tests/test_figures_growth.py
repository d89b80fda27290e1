"""The growing-horizon comparison (figures.growth, theory.md 11.14) pairs runs by seed and reads
its claims from the registration: a growing arm that is a copy of fixed x = 64 ties it exactly."""

import gzip
import json
import shutil
from pathlib import Path

from figures import growth

RESULTS = Path(__file__).resolve().parent.parent / "results"


def test_a_copy_of_fixed_x64_ties_it_and_the_claim_is_unresolved(tmp_path):
    (tmp_path / "horizon_growth").mkdir()
    (tmp_path / "cpu_sweep_v3").symlink_to(RESULTS / "cpu_sweep_v3")
    shutil.copy(RESULTS / "horizon_growth" / "prediction.json", tmp_path / "horizon_growth")
    with gzip.open(RESULTS / "cpu_sweep_v3" / "curves.jsonl.gz", "rt") as src, \
            gzip.open(tmp_path / "horizon_growth" / "curves.jsonl.gz", "wt") as dst:
        for line in src:
            rec = json.loads(line)
            s = rec["settings"]
            if (s.get("schedule.mode"), s.get("buffer.horizon"),
                    s.get("schedule.replay_ratio")) == ("sync", 64.0, 1.0):
                s["buffer.horizon_growth"] = 0.25
                dst.write(json.dumps(rec) + "\n")
    paths = growth.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])
    rows = json.loads((tmp_path / "out" / "growth.json").read_text())
    assert [r["steps"] for r in rows] == [50, 100, 150, 200, 300]
    for r in rows:
        assert r["vs"]["fixed x=64"] == [0.0, 0.0, 0.0]
        assert r["median_auc"]["growing"] == r["median_auc"]["fixed x=64"]
        if r["better_fixed"] == "fixed x=64":
            assert r["holds"] and not r["resolved"]
    assert len(paths) == 4
