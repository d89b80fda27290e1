"""The overlapped engine (schedule.engine=overlap, issue 37 part 2): it trains, its staleness
counts the time a chunk waits, it resumes, it refuses what it cannot run with one-line errors,
and every schedule's time breakdown adds up to its wall time. No absolute time is asserted."""

import math
import os

import pytest

from llm_helpers import SMALL_WARM_START, killed_and_resumed, run_small, small_config

WARM = [f"{k}={v}" for k, v in SMALL_WARM_START.items()]
OVERLAP = ["schedule.engine=overlap", "probe.every=0", *WARM]


def _slow_updates(monkeypatch, seconds: float) -> None:
    """Make every update take ``seconds`` more: the trainer becomes the slower side."""
    import time

    from llm_experiments.rl.trainer import PolicyTrainer
    real = PolicyTrainer.train_step

    def slow(self, rollouts, keep_grad):
        time.sleep(seconds)
        return real(self, rollouts, keep_grad)
    monkeypatch.setattr(PolicyTrainer, "train_step", slow)


def test_the_overlapped_run_trains_and_logs(tmp_path):
    summary, records = run_small(tmp_path / "run", "run.steps=12", *OVERLAP)
    steps = [r for r in records if r.get("loss") is not None]
    assert [r["step"] for r in steps] == list(range(12))
    assert all(math.isfinite(r["loss"]) for r in steps)
    evals = [r["step"] for r in records if r["eval_accuracy"] is not None]
    assert evals == [0, 10, 12]
    # The serial schedule's quotas: sync, replay ratio 2, B = 16 -> 8 new rollouts a step.
    assert summary["samples_generated"] == 12 * 8
    assert summary["samples_consumed"] == 12 * 16
    assert summary["schedule"]["engine"] == "overlap"
    assert all(r["staleness_mean"] >= 0 for r in steps)


def test_the_lag_counts_the_steps_a_chunk_waits(tmp_path, monkeypatch):
    """On-policy, each rollout is used once, so a step's staleness is its chunk's lag. The
    serial engine's is 0. Overlapped with a slow trainer, the sampler fills the handoff and
    a chunk waits there: made with theta_{t-2} and consumed at step t when
    overlap_ahead = 2 (ordered right after step t-3's update)."""
    args = ("run.steps=8", "schedule.mode=on_policy", "eval.every=100")
    _, serial = run_small(tmp_path / "serial", *args, "probe.every=0", *WARM)
    assert {r["staleness_mean"] for r in serial if r["step"] < 8} == {0.0}
    _slow_updates(monkeypatch, 0.25)
    _, records = run_small(tmp_path / "overlap", *args, *OVERLAP, "schedule.overlap_ahead=2")
    lags = [r["staleness_mean"] for r in records if r["step"] < 8]
    assert lags[0] == 0.0  # chunk 0 is made with the first weights
    assert lags[3:] == [2.0] * 5


def test_a_killed_overlapped_run_resumes(tmp_path, monkeypatch):
    from llm_experiments.engines.overlap import OverlapRun
    cfg = small_config("run.steps=10", "run.checkpoint_every=4", *OVERLAP)
    summary, records = killed_and_resumed(monkeypatch, OverlapRun, cfg, tmp_path / "run", 6)
    assert [r["step"] for r in records] == list(range(11))  # no line lost or repeated
    assert summary["samples_consumed"] == 10 * 16
    assert summary["samples_generated"] == 10 * 8
    assert summary["time_breakdown"]["wall_seconds"] == pytest.approx(summary["wall_time"])


def test_a_checkpoint_of_another_engine_is_refused(tmp_path):
    from llm_experiments.engines.overlap import OverlapRun
    run = OverlapRun(small_config("run.steps=2", *OVERLAP), str(tmp_path))
    with pytest.raises(ValueError, match="not written by schedule.engine=overlap"):
        run.restore({"engine": "ray"})


@pytest.mark.parametrize("overrides, names", [
    (["schedule.mode=async", "schedule.mu_accounting=2"], "schedule.mode"),
    (["schedule.workers=2"], "schedule.workers"),
    (["schedule.overlap_ahead=0"], "schedule.overlap_ahead"),
    (["schedule.overlap_ahead=65"], "schedule.overlap_ahead"),
    (["schedule.overlap_sampler=gpu"], "schedule.overlap_sampler"),
    (["probe.every=5"], "probe.every"),
    (["schedule.latency_steps=2"], "schedule.latency_steps"),
])
def test_bad_overlap_settings_get_one_line_errors(overrides, names):
    with pytest.raises(ValueError) as err:
        small_config("schedule.engine=overlap", "probe.every=0", *overrides)
    assert names in str(err.value) and "\n" not in str(err.value)


def test_overlap_settings_need_the_overlapped_engine():
    for setting in ("schedule.overlap_ahead=2", "schedule.overlap_sampler=process"):
        with pytest.raises(ValueError, match="need schedule.engine=overlap") as err:
            small_config(setting)
        assert "\n" not in str(err.value)


def test_a_failing_sampler_stops_the_run_with_its_error(tmp_path, monkeypatch):
    from llm_experiments.engines.overlap_sampler import ChunkMaker

    def boom(self, order, weights, idle):
        raise ValueError("no more\nsecond line")
    monkeypatch.setattr(ChunkMaker, "make", boom)
    with pytest.raises(RuntimeError, match="sampler thread failed: ValueError: no more$"):
        run_small(tmp_path / "run", "run.steps=3", *OVERLAP)
    assert not os.path.exists(tmp_path / "run")  # failed before its first checkpoint


def _parts_sum(side: dict) -> float:
    return sum(v for k, v in side.items() if k != "other")


@pytest.mark.parametrize("engine", ["emulated", "overlap"])
def test_the_time_breakdown_adds_up_to_the_wall_time(tmp_path, engine):
    # 48 steps: the sampler's fixed costs outside its timers (start-up, the run's end) stay a
    # small share; at 16 steps (a 0.74 s run) they were 0.42 s in two full-suite CI runs
    summary, records = run_small(tmp_path / "run", "run.steps=48", f"schedule.engine={engine}",
                                 "probe.every=0", *WARM)
    tb = summary["time_breakdown"]
    wall = tb["wall_seconds"]
    assert tb["schedule"] == ("serial" if engine == "emulated" else "overlap")
    for side in ("sampler", "trainer"):
        row = tb[side]
        assert all(v >= 0 for k, v in row.items() if k != "other"), row
        assert sum(row.values()) == pytest.approx(wall)
        # What the timers cover is most of the wall time (the rest: buffer, logging).
        assert 0.5 * wall <= _parts_sum(row) <= wall * 1.001, row
    assert tb["sampler"]["generate"] > 0 and tb["trainer"]["update"] > 0
    assert tb["trainer"]["eval"] > 0 and tb["trainer"]["checkpoint"] > 0
    if engine == "emulated":  # one thread: each side idles while the other works
        assert tb["sampler"]["idle"] == pytest.approx(
            tb["trainer"]["update"] + tb["trainer"]["eval"] + tb["trainer"]["checkpoint"])
    logged = [r["time_breakdown"] for r in records]
    assert all(b["wall_seconds"] <= wall for b in logged)  # in every record, growing
    assert [b["wall_seconds"] for b in logged] == sorted(b["wall_seconds"] for b in logged)


def test_the_ray_breakdown_is_each_sides_mean_over_its_actors():
    """``timing.actors_breakdown``: two samplers' decoding split evenly, their chunk calls
    beyond decoding as grade, idle the mean over a side's actors, rank 0's update; each side
    sums to the wall time, the rest (start-up, step calls beyond the update) in other."""
    from llm_experiments.engines.timing import actors_breakdown
    c = {"wall_time": 100.0, "gen_seconds": 120.0, "train_seconds": 50.0,
         "probe_seconds": 2.0,
         "busy_seconds": {"sampler0": 70.0, "sampler1": 66.0, "trainer0": 55.0},
         "idle_seconds": {"sampler0": 25.0, "sampler1": 29.0, "trainer0": 40.0}}
    tb = actors_breakdown(c)
    assert tb["schedule"] == "ray" and tb["wall_seconds"] == 100.0
    s, t = tb["sampler"], tb["trainer"]
    assert (s["generate"], s["grade"], s["idle"]) == (60.0, 8.0, 27.0)
    assert (t["update"], t["probe"], t["idle"], t["eval"]) == (50.0, 2.0, 40.0, 0.0)
    assert sum(s.values()) == pytest.approx(100.0) and sum(t.values()) == pytest.approx(100.0)
    assert s["other"] == pytest.approx(5.0) and t["other"] == pytest.approx(8.0)


def test_the_sampler_can_run_in_a_child_process(tmp_path):
    summary, records = run_small(tmp_path / "run", "run.steps=4", "eval.every=100",
                                 *OVERLAP, "schedule.overlap_sampler=process")
    assert summary["samples_generated"] == 4 * 8
    assert all(math.isfinite(r["loss"]) for r in records if r.get("loss") is not None)
    assert summary["schedule"]["overlap_sampler"] == "process"


def test_the_benchmark_runs_in_quick_mode(tmp_path, capsys):
    from benchmarks.overlap import main
    from llm_helpers import SMALL
    out = tmp_path / "overlap.json"
    sets = [x for o in [*SMALL, *WARM, "probe.every=0"] for x in ("--set", o)]
    assert main(["--quick", "--config", "cpu_tiny", "--no-warm-start", "--arms", "thread",
                 "--out", str(out), *sets]) == 0
    import json
    result = json.loads(out.read_text())
    (row,) = result["runs"]
    assert row["efficiency"] > 0 and row["speedup"] > 0 and row["replay_ratio"] >= 1
    assert "efficiency" in capsys.readouterr().out
