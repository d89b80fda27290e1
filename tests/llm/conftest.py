"""Shared helpers of the harness tests: small configs and a persistent warm-start cache."""

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("LLM_EXPERIMENTS_CACHE") or os.path.join(REPO, ".cache")
os.environ.setdefault("MPLCONFIGDIR", os.path.join(CACHE, "mpl"))

# A model small enough that a run of a few dozen steps takes seconds.
SMALL = ["model.hidden_size=32", "model.layers=2", "model.heads=2", "model.kv_heads=1",
         "model.intermediate_size=64", "model.warm_start_steps=200",
         "model.warm_start_lr=3e-3", "task.digits=1", "task.eval_size=30",
         "eval.pass_k_problems=8", "eval.pass_k=[1,2,4]", "eval.every=10",
         "schedule.batch_size=16", "schedule.group_size=4", "buffer.capacity=64",
         "run.progress=false", "run.checkpoint_every=5", "probe.fresh_groups=8",
         "probe.fresh_noise_groups=2", "probe.buffer_groups=4", "probe.crn_groups=3",
         "probe.crn_staleness=[1,3]", f"run.cache_dir={CACHE}"]


def small_config(*overrides):
    from llm_experiments.config import load_config
    return load_config("cpu_tiny", SMALL + list(overrides))
