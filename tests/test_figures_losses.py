"""The horizon under each stale-rollout loss (figures.losses and figures.losses.verdicts,
theory.md section 12) pairs each loss's run with grpo's run of its seed and x: losses that
are copies of grpo's runs differ by exactly 0, the registered claims are read from the means
once every cell has runs, and the adaptive arms are paired with x = 64 of their loss."""

import gzip
import json
from pathlib import Path

import pytest

from figures import losses
from figures.losses.verdicts import LOSSES

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _copies(folder: Path, name: str, *, longest: int | None = None, adaptive: bool = False,
            only=None):
    """cpu_sweep_v3's lr 1e-4 runs of seeds 0-2 as a loss grid: every loss a copy of grpo's
    run (x = 256 copied as ``longest`` too; only the horizons ``only`` when given), or as
    adaptive arms copied from x = 64."""
    (folder / name).mkdir()
    out = gzip.open(folder / name / "curves.jsonl.gz", "wt")
    with gzip.open(RESULTS / "cpu_sweep_v3" / "curves.jsonl.gz", "rt") as src, out:
        for line in src:
            rec = json.loads(line)
            s = rec["settings"]
            if s.get("run.seed") not in (0, 1, 2) or s.get("trainer.lr") != 1e-4:
                continue
            if s.get("schedule.mode") == "on_policy" and not adaptive:
                out.write(json.dumps(rec) + "\n")
            elif s.get("schedule.replay_ratio") != 2.0:
                continue
            elif adaptive and s.get("buffer.horizon") == 64:
                for loss in ("grpo", "neg_clip"):
                    for tau in (0.05, 0.2):
                        out.write(json.dumps({**rec, "settings": {
                            **s, "trainer.loss": loss, "buffer.drop_logr2": tau}}) + "\n")
            elif not adaptive and (only is None or s["buffer.horizon"] in only):
                xs = [s["buffer.horizon"]] + ([longest] if s["buffer.horizon"] == 256 and
                                              longest else [])
                for loss in LOSSES:
                    for x in xs:
                        out.write(json.dumps({**rec, "settings": {
                            **s, "trainer.loss": loss, "buffer.horizon": x}}) + "\n")


def test_copies_of_grpo_differ_by_nothing_and_claims_follow_the_means(tmp_path):
    _copies(tmp_path, "horizon_losses", longest=1024)
    _copies(tmp_path, "horizon_losses_lr2")
    _copies(tmp_path, "horizon_adaptive", adaptive=True)
    _copies(tmp_path, "horizon_adaptive_lr2", adaptive=True)
    _copies(tmp_path, "horizon_losses_lr", only=(64, 256))
    paths = losses.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])
    got = json.loads((tmp_path / "out" / "losses.json").read_text())
    one, two = got["setting1"], got["setting2"]
    assert one["seeds"] == two["seeds"] == [0, 1, 2] and one["on_policy"] is not None
    for v, xs in ((one, {"4", "16", "64", "256", "1024"}), (two, {"4", "16", "64", "256"})):
        for by_x in v["rows"].values():
            assert set(k for k, r in by_x.items() if r) == xs
            assert all(r["seeds"] == 3 and r["minus"] == [0.0, 0.0, 0.0] for r in by_x.values())
        assert len(set(v["best"].values())) == 1  # every copy has grpo's best x
    # identical arms cannot sit 0.03 below grpo, so P3 and Q3 fail; G1 is the same for every
    # loss; every loss's best cell ties grpo's (G2)
    assert one["claims"]["P3"] is False and two["claims"]["Q3"] is False
    assert len(set(one["claims"]["G1"].values())) == 1
    assert all(d == [0.0, 0.0, 0.0] for d in one["claims"]["G2"].values())
    # the adaptive copies are x = 64 itself: A1 holds, A2 (less staleness) fails
    adaptive = got["adaptive"]
    assert adaptive["claims"]["A1"] is True and adaptive["claims"]["A2"] is False
    assert adaptive["rows"]["grpo"]["0.2"]["minus"] == [0.0, 0.0, 0.0]
    # on setting 2 the same copies tie x = 64: B1 (a gain) fails, B2 (within 0.02) holds
    assert got["adaptive2"]["claims"]["B1"] is False and got["adaptive2"]["claims"]["B2"] is True
    # the second learning rate copies lr 1e-4: no gain over itself (L1 fails), and every
    # loss is grpo at x = 64
    second = got["second_lr"]
    assert second["claims"]["L1"] is False and second["claims"]["L2"] is False
    assert all(by["64.0"]["minus"] == [0.0, 0.0, 0.0] == by["grpo_64"]["minus"]
               for by in second["rows"].values())
    assert len(paths) == 6


def _x64_runs():
    """cpu_sweep_v3's compacted x = 64 runs at lr 1e-4, y = 2, seeds 0-2."""
    with gzip.open(RESULTS / "cpu_sweep_v3" / "curves.jsonl.gz", "rt") as src:
        for line in src:
            rec = json.loads(line)
            s = rec["settings"]
            if (s.get("run.seed") in (0, 1, 2) and s.get("trainer.lr") == 1e-4
                    and s.get("schedule.replay_ratio") == 2.0 and s.get("buffer.horizon") == 64):
                yield rec


def _transfer(folder: Path, gains: dict, grid: str = "adaptive_transfer"):
    """A transfer grid of cpu_sweep_v3's x = 64 runs (lr 1e-4, y = 2, seeds 0-2), one setting
    per key of ``gains`` (task.digits), each with an adaptive arm that is the same run plus
    the setting's gain in every evaluation, dropping 16 of 32 rollouts per update and
    holding 5,000."""
    (folder / grid).mkdir()
    with gzip.open(folder / grid / "curves.jsonl.gz", "wt") as out:
        for rec in _x64_runs():
            s = rec["settings"]
            summary = {**rec["summary"], "rollouts_per_step": 32.0}
            n = len(rec["train"]["step"])
            for digits, gain in gains.items():
                s2 = {**s, "task.digits": digits}
                out.write(json.dumps({**rec, "settings": s2, "summary": summary}) + "\n")
                ev = {**rec["eval"], "eval_accuracy": [a + gain for a in
                                                       rec["eval"]["eval_accuracy"]]}
                tr = {**rec["train"], "dropped": [16] * n, "buffer_occupancy": [5000] * n}
                out.write(json.dumps({**rec, "eval": ev, "train": tr, "summary": summary,
                                      "settings": {**s2, "buffer.horizon": 1024,
                                                   "buffer.drop_logr2": 0.05}}) + "\n")


def test_the_transfer_claims_follow_the_paired_gains(tmp_path):
    """C1-C3 read each setting's paired gain, drop share and what it holds; C4 stays as
    predicted (not named) while fewer settings than the rule needs are in."""
    from figures.losses.transfer import judge_transfer, transfer_table
    _transfer(tmp_path, {2: 0.02, 3: 0.03, 4: 0.01, 5: 0.02})
    v = judge_transfer(tmp_path)
    assert len(v["rows"]) == 4 and v["seeds"]["adaptive_transfer"] == 3
    row = v["rows"]["adaptive_transfer: task.digits=3"]
    assert row["minus"][0] == pytest.approx(0.03) and row["drop_share"] == pytest.approx(0.5)
    assert row["held"] == (5000.0, 2048.0)
    c = v["claims"]
    assert c["C1"] and c["C2"] and c["C3"] and c["C4"] and c["pooled"][0] == pytest.approx(0.02)
    assert "4 of the 6" in c["rule"] and "INTERIM" in transfer_table(v)
    assert v["replicate"] == {} and "Second replicate" not in transfer_table(v)
    # a second replicate is judged on its own: it neither moves C1 nor enters the rule
    _transfer(tmp_path, {2: -0.03, 3: 0.02}, grid="adaptive_transfer_b")
    v = judge_transfer(tmp_path)
    assert v["claims"] == c and v["replicate_tests"] == {"C1": False, "C3": True}
    assert v["replicate"]["adaptive_transfer_b: task.digits=2"]["minus"][0] == \
        pytest.approx(-0.03)
    assert "Second replicate" in transfer_table(v)
    worse = tmp_path / "worse"
    worse.mkdir()
    _transfer(worse, {2: 0.02, 3: -0.03, 4: 0.01, 5: 0.02})
    assert judge_transfer(worse)["claims"]["C1"] is False


def _long_arms(folder: Path, grid: str, arms: dict):
    """cpu_sweep_v3's x = 64 runs (lr 1e-4, y = 2, seeds 0-2) as arms of ``grid``:
    {drop_logr2: (gain in every evaluation, rollouts dropped per update, mean staleness)}."""
    (folder / grid).mkdir()
    with gzip.open(folder / grid / "curves.jsonl.gz", "wt") as out:
        for rec in _x64_runs():
            s = rec["settings"]
            n = len(rec["train"]["step"])
            for tau, (gain, dropped, age) in arms.items():
                ev = {**rec["eval"], "eval_accuracy": [a + gain for a in
                                                       rec["eval"]["eval_accuracy"]]}
                tr = {**rec["train"], "dropped": [dropped] * n, "staleness_mean": [age] * n,
                      "buffer_occupancy": [3000] * n}
                out.write(json.dumps({**rec, "eval": ev, "train": tr,
                                      "summary": {**rec["summary"], "rollouts_per_step": 32.0},
                                      "settings": {**s, "buffer.horizon": 1024 if tau else 64,
                                                   **({"buffer.drop_logr2": tau} if tau else {})}
                                      }) + "\n")


def test_the_scaled_threshold_claims_read_both_grids(tmp_path):
    """S1-S3: the drift-scaled arm paired by seed with cpu_long's x = 64 and tau = 0.05."""
    from figures.losses.transfer import judge_scaled, scaled_table
    assert judge_scaled(tmp_path) == {} and scaled_table({}) == ""
    _long_arms(tmp_path, "adaptive_long", {0.0: (0.0, 0, 28.0), 0.05: (-0.02, 2, 72.0)})
    _long_arms(tmp_path, "adaptive_scaled_long", {0.004: (0.01, 12, 40.0)})
    v = judge_scaled(tmp_path)
    assert v["seeds"] == 3 and v["drop_share"] == pytest.approx(12 / 32)
    assert v["minus_x64"][0] == pytest.approx(0.01) and v["minus_tau"][0] == pytest.approx(0.03)
    assert v["claims"] == {"S1": True, "S2": True, "S3": True}
    assert "S3 (beats tau = 0.05, on younger rollouts): holds" in scaled_table(v)
    worse = tmp_path / "worse"
    worse.mkdir()
    _long_arms(worse, "adaptive_long", {0.0: (0.0, 0, 28.0), 0.05: (-0.02, 2, 72.0)})
    _long_arms(worse, "adaptive_scaled_long", {0.004: (-0.03, 1, 80.0)})
    assert judge_scaled(worse)["claims"] == {"S1": False, "S2": False, "S3": False}


def test_the_uncertain_token_claims_pair_with_x64_and_the_arm_over_every_token(tmp_path):
    """U1, U2 on cpu_long's pairs: the arm over uncertain tokens against x = 64 and against
    tau = 0.05 over every token on the same seeds; U4 waits for the five settings."""
    from figures.losses.uncertain import judge_uncertain, uncertain_table
    assert judge_uncertain(tmp_path) == {} and uncertain_table({}) == ""
    _long_arms(tmp_path, "adaptive_long", {0.0: (0.0, 0, 28.0), 0.05: (-0.02, 2, 72.0)})
    (tmp_path / "arm").mkdir()
    _long_arms(tmp_path / "arm", "g", {0.1: (0.01, 12, 40.0)})
    (tmp_path / "adaptive_uncertain_long").mkdir()
    with gzip.open(tmp_path / "arm" / "g" / "curves.jsonl.gz", "rt") as src, \
            gzip.open(tmp_path / "adaptive_uncertain_long" / "curves.jsonl.gz", "wt") as out:
        for line in src:
            rec = json.loads(line)
            n = len(rec["train"]["step"])
            out.write(json.dumps({**rec, "train": {**rec["train"], "uncertain_share": [0.02] * n},
                                  "settings": {**rec["settings"],
                                               "buffer.drop_tokens_below_p": 0.5}}) + "\n")
    v = judge_uncertain(tmp_path)
    (row,) = v["rows"].values()
    assert row["seeds"] == 3 and row["drop_share"] == pytest.approx(12 / 32)
    assert row["minus_x64"][0] == pytest.approx(0.01)
    assert row["minus_every_token"][0] == pytest.approx(0.03)
    assert row["uncertain_share"] == pytest.approx(0.02) and row["staleness"] == 40.0
    assert v["claims"]["U1"] and v["claims"]["U2"] and not v["claims"]["U4"]
    assert "1 of the 5" in v["claims"]["rule"] and not v["complete"]
    assert "U1 (on cpu_long it drops 20-60%" in uncertain_table(v)
