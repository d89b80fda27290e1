"""The horizon under each stale-rollout loss (figures.losses, theory.md section 12) pairs each
loss's run with grpo's run of its seed and x: losses that are copies of grpo's runs differ by
exactly 0, and the registered claims are read from the means."""

import gzip
import json
from pathlib import Path

from figures import losses

RESULTS = Path(__file__).resolve().parent.parent / "results"


def test_copies_of_grpo_differ_by_nothing_and_claims_follow_the_means(tmp_path):
    (tmp_path / "horizon_losses").mkdir()
    out = gzip.open(tmp_path / "horizon_losses" / "curves.jsonl.gz", "wt")
    with gzip.open(RESULTS / "cpu_sweep_v3" / "curves.jsonl.gz", "rt") as src, out:
        for line in src:
            rec = json.loads(line)
            s = rec["settings"]
            if s.get("run.seed") not in (0, 1, 2) or s.get("trainer.lr") != 1e-4:
                continue
            if s.get("schedule.mode") == "on_policy":
                out.write(json.dumps(rec) + "\n")
            elif s.get("schedule.replay_ratio") == 2.0:
                for loss in losses.LOSSES:
                    out.write(json.dumps({**rec, "settings": {**s, "trainer.loss": loss}})
                              + "\n")
    paths = losses.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])
    got = json.loads((tmp_path / "out" / "losses.json").read_text())
    assert got["seeds"] == [0, 1, 2] and got["on_policy"] is not None
    for loss, by_x in got["rows"].items():
        assert set(k for k, r in by_x.items() if r) == {"4", "16", "64", "256"}
        for r in by_x.values():
            if r:
                assert r["seeds"] == 3 and r["minus_grpo"] == [0.0, 0.0, 0.0]
    assert len(set(got["best"].values())) == 1  # every copy has grpo's best x
    # identical arms cannot sit 0.03 below grpo, so P3 fails; G1 is the same for every loss
    assert got["claims"]["P3"] is False and len(set(got["claims"]["G1"].values())) == 1
    assert len(paths) == 6
