"""Shared helpers of the harness tests: small configs and a persistent warm-start cache."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("LLM_EXPERIMENTS_CACHE") or os.path.join(REPO, ".cache")
os.environ.setdefault("MPLCONFIGDIR", os.path.join(CACHE, "mpl"))

# A model small enough that a run of a few dozen steps takes seconds.
SMALL = ["model.hidden_size=32", "model.layers=2", "model.heads=2", "model.kv_heads=1",
         "model.intermediate_size=64", "model.warm_start_steps=200", "model.warm_start_target=0",
         "model.warm_start_lr=3e-3", "task.digits=1", "task.eval_size=30",
         "eval.pass_k_problems=8", "eval.pass_k=[1,2,4]", "eval.every=10",
         "schedule.batch_size=16", "schedule.group_size=4", "buffer.capacity=64",
         "run.progress=false", "run.checkpoint_every=5", "probe.fresh_groups=8",
         "probe.fresh_noise_groups=2", "probe.buffer_groups=4", "probe.crn_groups=3",
         "probe.crn_staleness=[1,3]", f"run.cache_dir={CACHE}"]
# The SMALL model's warm start saved once (``python -m llm_experiments.policy.models`` with
# SMALL's model and task settings), for tests whose outcome depends on the initial policy: a
# warm start trained on the machine running the tests differs from CPU to CPU.
SMALL_WARM_START = {
    "model.warm_start_path": os.path.join(REPO, "tests", "fixtures", "small_warm_start"),
    "model.warm_start_sha256": "72b88fccc9b67e947d84f9d4ecb3f25c72fbb5dd7c665a6f7744e9fd17c19296"}


def import_extra(module: str, extra: str):
    """``module`` imported, else the test skipped with a one-line reason naming the extra of
    pyproject.toml that installs it (``pip install -e ".[test]"`` alone carries neither Ray
    nor TRL, and a bare module name does not say how to get it)."""
    import pytest
    return pytest.importorskip(module, reason=f"{module} is not installed: "
                                              f"pip install -e \".[{extra}]\"")


def small_config(*overrides):
    from llm_experiments.config import load_config
    return load_config("cpu_tiny", SMALL + list(overrides))


def tiny_policy(hidden: int, layers: int, intermediate: int):
    """A randomly initialised tiny model and the addition char tokenizer (threads = 1)."""
    import torch

    from llm_experiments.config import Config
    from llm_experiments.policy.models import char_tokenizer, tiny_model
    torch.set_num_threads(1)
    cfg = Config()
    cfg.model.hidden_size, cfg.model.layers, cfg.model.intermediate_size = \
        hidden, layers, intermediate
    tok = char_tokenizer("0123456789+=")
    return tiny_model(cfg, len(tok)), tok


def recomputed_logprobs(model, prompt, completion, temperature=1.0):
    """Log-probs of ``completion`` after ``prompt`` from one full forward pass."""
    import torch
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logp[pos, torch.tensor(completion)].numpy()


def run_small(out_dir, *overrides):
    """Run the small config with ``overrides`` into ``out_dir``: (summary, metrics records)."""
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    summary = run_experiment(small_config(*overrides), str(out_dir))
    return summary, read_jsonl(os.path.join(str(out_dir), "metrics.jsonl"))


def killed_and_resumed(monkeypatch, engine_class, cfg, out_dir, kill_at: int, before=None):
    """Run ``cfg`` into ``out_dir`` with ``engine_class.train`` interrupted (KeyboardInterrupt,
    once) at step ``kill_at``, then ``--resume`` it; ``before(engine, t)`` is called before
    every step of both sessions. Returns (summary, metrics records)."""
    import pytest

    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    real, killed = engine_class.train, []

    def train(self, t, evaluate):
        if before is not None:
            before(self, t)
        if t == kill_at and not killed:
            killed.append(t)
            raise KeyboardInterrupt
        return real(self, t, evaluate)
    monkeypatch.setattr(engine_class, "train", train)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, str(out_dir))
    summary = run_experiment(cfg, str(out_dir), resume=True)
    return summary, read_jsonl(os.path.join(str(out_dir), "metrics.jsonl"))
