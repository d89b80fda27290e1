"""Weight snapshots in one process (``schedule.WeightStore``, ``Production.publishes``): kept
only where the schedule reads them later, and on the model's device."""

import os

import pytest
import torch

from llm_helpers import run_small
from llm_experiments.engines import checkpoint
from llm_experiments.config import load_config
from llm_experiments.rl.schedule import Production, WeightStore

ASYNC = ["schedule.mode=async", "schedule.mu_accounting=2.0", "probe.every=0", "run.steps=4",
         "run.checkpoint_every=4"]


@pytest.mark.parametrize("overrides, published", [
    (["schedule.mode=on_policy"], []),
    (["schedule.mode=sync"], []),
    (["schedule.mode=async", "schedule.mu_accounting=2.0", "schedule.latency_steps=0"], []),
    (["schedule.mode=async", "schedule.mu_accounting=2.0"], [0, 1, 2, 3, 4, 5]),
    (["schedule.mode=async", "schedule.mu_accounting=2.0", "schedule.latency_steps=0",
      "schedule.refresh_every=2"], [0, 2, 4]),
])
def test_publishes_only_versions_read_after_their_step(overrides, published):
    sc = load_config("cpu_tiny", overrides).schedule
    prod = Production(sc, sc.mu_accounting or None)
    assert [t for t in range(6) if prod.publishes(t)] == published
    # every version a producer uses after its own step was published
    assert {prod.version(t) for t in range(6) if prod.version(t) < t} <= set(published)


def test_async_run_without_latency_keeps_no_snapshot(tmp_path):
    """Latency 0, refresh 1: the sampler always takes the current weights, so the run keeps
    no copy (before, one per step); with latency 2 it keeps the versions still to be used."""
    kept = {}
    for latency in (0, 2):
        out = tmp_path / f"latency{latency}"
        run_small(out, *ASYNC, f"schedule.latency_steps={latency}")
        kept[latency] = checkpoint.load(os.path.join(out, "checkpoint"))["weights"]
    assert kept[0] == {}
    assert sorted(kept[2]) == [2, 3]


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="no CUDA device"))])
def test_snapshots_stay_on_the_model_device(device):
    model = torch.nn.Linear(3, 2).to(device)
    store = WeightStore()
    store.publish(0, model)
    with torch.no_grad():
        model.weight.add_(1.0)
    snap = store.update(0).state
    assert all(t.device == model.weight.device for t in snap.values())
    assert torch.equal(snap["weight"] + 1.0, model.weight)  # a copy, not a view
