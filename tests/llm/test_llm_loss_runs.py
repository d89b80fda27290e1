"""Every stale-rollout loss trains end to end in the harness and logs its staleness
diagnostics; a batch split into micro-batches trains as the whole batch (m2po's mask and the
token denominators are the batch's, ``PolicyTrainer.split_terms``)."""

import numpy as np
import pytest
from llm_helpers import run_small

from llm_experiments.rl.choices import RATIO_LOSSES

DIAGNOSTICS = ("is_ess", "logr2", "logr2_kept", "ratio_max", "acted_pos", "acted_neg",
               "grad_norm", "head_grad_norm", "staleness_mean", "staleness_max")
REPLAY = ["run.steps=6", "schedule.mode=sync", "schedule.replay_ratio=2", "buffer.horizon=4",
          "probe.every=0", "eval.every=6"]


@pytest.mark.parametrize("loss", [x for x in RATIO_LOSSES if x != "grpo"])
def test_each_loss_trains_and_logs_its_diagnostics(tmp_path, loss):
    _, records = run_small(tmp_path, *REPLAY, f"trainer.loss={loss}")
    trained = [r for r in records if r.get("loss") is not None]
    assert len(trained) == 6
    last = trained[-1]
    for key in DIAGNOSTICS:
        assert key in last, key
    assert last["staleness_max"] >= 1 and 0 < last["is_ess"] <= 1
    assert all(np.isfinite(r["loss"]) for r in trained)


def test_micro_batches_train_as_the_whole_batch_under_m2po(tmp_path):
    common = [*REPLAY, "trainer.loss=m2po", "trainer.m2_threshold=0.001"]
    _, whole = run_small(tmp_path / "whole", *common)
    _, split = run_small(tmp_path / "split", *common, "trainer.micro_batch=5")
    acted = [r["acted_pos"] + r["acted_neg"] for r in whole if r.get("acted_pos") is not None
             and r.get("acted_neg") is not None]
    assert max(acted) > 0  # the mask acts
    for a, b in zip(whole, split):
        if a.get("loss") is not None:
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
            assert b["acted_pos"] == a["acted_pos"] and b["logr2_kept"] == pytest.approx(
                a["logr2_kept"], rel=1e-4)


def test_the_adaptive_horizon_drops_rollouts_past_its_threshold(tmp_path):
    """buffer.drop_logr2 (theory.md 12.4): a threshold below every stale rollout's mean
    (log r)^2 drops what was trained on, so the buffer holds fewer rollouts than the fixed
    horizon's, and the run logs how many left."""
    common = ["run.steps=6", "schedule.mode=sync", "schedule.replay_ratio=2",
              "buffer.horizon=16", "probe.every=0", "eval.every=6"]
    _, fixed = run_small(tmp_path / "fixed", *common)
    _, adaptive = run_small(tmp_path / "adaptive", *common, "buffer.drop_logr2=1e-9")
    trained = [r for r in adaptive if r.get("dropped") is not None]
    assert len(trained) == 6 and sum(r["dropped"] for r in trained) > 0
    held = [[r["buffer_occupancy"] for r in run if r.get("buffer_occupancy") is not None][-1]
            for run in (adaptive, fixed)]
    assert held[0] < held[1]
    assert all("dropped" not in r for r in fixed)


@pytest.mark.parametrize("overrides, match", [
    (["schedule.mode=on_policy"], "schedule.mode=sync on schedule.engine=emulated"),
    (["schedule.mode=sync", "trainer.loss=asymre"], "importance ratio"),
    (["schedule.mode=sync", "buffer.sampling=without_replacement"], "with_replacement"),
    (["buffer.drop_logr2=-1"], "buffer.drop_logr2 must be")])
def test_the_adaptive_horizon_refuses_what_it_cannot_do(overrides, match):
    from llm_helpers import small_config
    with pytest.raises(ValueError, match=match) as err:
        small_config("buffer.drop_logr2=0.1", *overrides)
    assert "\n" not in str(err.value)
