"""A horizon that grows (buffer.horizon_growth, theory.md section 11.13): config checks, the
buffer of a config, and a small end-to-end run whose staleness stays inside the window."""

import os

import numpy as np
import pytest

from llm_helpers import run_small, small_config
from llm_experiments.config import load_config
from llm_experiments.engines import checkpoint
from llm_experiments.engines.metrics import TIMING_KEYS
from llm_experiments.rl.buffer import RolloutBuffer
from replaytheory.buffer import growing_window

DETERMINISTIC = ["schedule.mu_accounting=2.0", "run.log_every=1", "probe.every=0"]


@pytest.mark.parametrize("overrides, message", [
    (["buffer.horizon_growth=-0.1"], r"buffer.horizon_growth must be in \[0, 1\]"),
    (["buffer.horizon_growth=1.5"], r"buffer.horizon_growth must be in \[0, 1\]"),
    (["buffer.horizon_growth=0.5", "schedule.mode=on_policy"],
     "buffer.horizon_growth .* needs schedule.mode=sync"),
    (["buffer.horizon_growth=0.5", "schedule.mode=async", "schedule.mu_accounting=2"],
     "buffer.horizon_growth .* needs schedule.mode=sync"),
    (["buffer.horizon_growth=0.5", "buffer.delta=0.25"],
     "buffer.horizon_growth > 0 .* buffer.delta = 0"),
    (["buffer.horizon_growth=0.5", "buffer.lifo=true", "buffer.capacity=64"],
     "buffer.horizon_growth > 0 .* buffer.lifo = false"),
    (["buffer.horizon_growth=0.5", "buffer.sampling=without_replacement"],
     "buffer.horizon_growth > 0 .* buffer.sampling in"),
    (["buffer.horizon_growth=0.5", "schedule.replay_ratio=16"],
     "buffer.horizon_growth .* needs at least one group made per step"),
    (["buffer.horizon_growth=0.5", "buffer.capacity=16"],
     "buffer.horizon_growth .* needs a buffer of at least one step"),
])
def test_unsupported_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("cpu_tiny", overrides)


def test_the_config_sets_the_largest_window():
    """x_max = buffer.horizon when set, else capacity / R; off by default."""
    assert RolloutBuffer.for_config(load_config("cpu_tiny")).index.horizon_growth == 0
    by_horizon = load_config("cpu_tiny", ["buffer.horizon_growth=0.25", "buffer.horizon=16",
                                          "buffer.sampling=groups_with_replacement"])
    idx = RolloutBuffer.for_config(by_horizon).index
    assert (idx.horizon_growth, idx.max_horizon, idx.capacity) == (0.25, 16, 512)
    by_capacity = load_config("cpu_tiny", ["buffer.horizon_growth=1", "buffer.capacity=96"])
    assert RolloutBuffer.for_config(by_capacity).index.max_horizon == 3.0  # 96 / (64 / 2)


def test_small_run_keeps_staleness_inside_the_window(tmp_path):
    """g = 0.25, R = 8 (B 16, y 2), x_max = 64 / 8 = 8: at step t the buffer holds exactly the
    last k(t) = floor(max(1, (t + 1) / 4)) steps, and no use, logged or checkpointed, is
    older than k(t) - 1 <= x(t) - 1; the window does grow (a stale draw happens)."""
    steps = 14
    _, records = run_small(tmp_path, f"run.steps={steps}", "buffer.horizon_growth=0.25",
                           *DETERMINISTIC)
    train = [r for r in records if r["step"] < steps]
    assert [r["step"] for r in train] == list(range(steps))
    for r in train:
        t, x = r["step"], max(1.0, 0.25 * (r["step"] + 1))
        assert r["buffer_occupancy"] == 8 * min(t + 1, growing_window(t, 0.25, 8))
        assert r["staleness_q90"] <= x - 1
    uses = checkpoint.load(os.path.join(tmp_path, "checkpoint"))["buffer"]["index"]["uses"]
    k = np.array([growing_window(int(t), 0.25, 8) for t in uses["step"]])
    assert len(uses["step"]) == 16 * steps
    assert np.all(uses["staleness"] <= k - 1) and uses["staleness"].max() == 2


def test_growth_that_never_binds_trains_as_the_fixed_buffer(tmp_path):
    """g = 1 with buffer.horizon = 2 (N = 2 R): the window min(2, t + 1) covers the whole
    FIFO at every step, so the run is bitwise the run without the option."""
    common = ("run.steps=6", "buffer.horizon=2", *DETERMINISTIC)
    _, plain = run_small(tmp_path / "plain", *common)
    _, grown = run_small(tmp_path / "grown", *common, "buffer.horizon_growth=1")
    strip = [[{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rs]
             for rs in (plain, grown)]
    assert strip[0] == strip[1]


def test_resume_replays_a_growing_run_exactly(tmp_path):
    """The window is a function of the step alone: a run stopped at its step-5 checkpoint and
    resumed logs what the uninterrupted run logs."""
    import dataclasses

    from llm_experiments.config import save_config
    from llm_experiments.engines.experiment import Experiment, run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = small_config("run.steps=12", "buffer.horizon_growth=0.5", *DETERMINISTIC)
    full, cut = tmp_path / "full", tmp_path / "cut"
    run_experiment(cfg, str(full))
    os.makedirs(cut)
    save_config(cfg, str(cut / "config.yaml"))
    first = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, steps=5))
    Experiment(first, str(cut)).run()
    run_experiment(cfg, str(cut), resume=True)
    a, b = (read_jsonl(str(d / "metrics.jsonl")) for d in (full, cut))
    strip = [[{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rs] for rs in (a, b)]
    assert [r["step"] for r in b] == list(range(13)) and strip[0] == strip[1]
