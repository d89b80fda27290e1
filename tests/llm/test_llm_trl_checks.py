"""What ``ReplayGRPOTrainer`` checks and computes, by behaviour: sampling options that would
change the behaviour distribution are refused (each named, with its allowed value), the
temperature is supported end to end, the TRL version is checked where the trainer is built
(the mapping imports under any TRL), and the loss TRL computes on the batch our
``_prepare_inputs`` builds reads only keys we provide and equals ``losses.policy_loss``."""

import importlib
import sys

import numpy as np
import pytest

from llm_helpers import import_extra, recomputed_logprobs, small_config

import_extra("trl", "trl")

import torch  # noqa: E402
import trl  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from llm_experiments.rl import losses  # noqa: E402
from llm_experiments.integrations import trl as rt  # noqa: E402
from replaytheory.calculator import optimal_config  # noqa: E402

G = 4
MODULE = "llm_experiments.integrations.trl"


def _parts():
    """(model, tokenizer, task, dataset, reward) of the small warm-started policy."""
    from datasets import Dataset

    from llm_experiments.policy.models import load_policy
    from llm_experiments.tasks.make import make_task
    torch.set_num_threads(1)
    cfg = small_config()
    task = make_task(cfg.task)
    model, tok = load_policy(cfg, task)
    problems = task.sample_train(16, np.random.default_rng(0))
    by_id = {p.pid: p for p in problems}
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems],
                              "pid": [p.pid for p in problems]})

    def reward(completions, pid, **_):
        return [task.reward(by_id[int(i)], c) for c, i in zip(completions, pid)]
    return model, tok, data, reward


def _trainer(tmp_path, model_edit=None, **grpo):
    """A ``ReplayGRPOTrainer`` (R = 8, B = 8, N = 16) of the small policy with GRPOConfig
    fields ``grpo`` (over defaults that TRL and the trainer accept)."""
    model, tok, data, reward = _parts()
    if model_edit is not None:
        model_edit(model)
    fields = {"per_device_train_batch_size": 8, "num_generations": G, "beta": 0.0,
              "steps_per_generation": 1, "max_completion_length": 4, "max_steps": 2,
              "learning_rate": 1e-3, "logging_steps": 1, "seed": 0, **grpo}
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      disable_tqdm=True, save_strategy="no", **fields)
    return rt.ReplayGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                                processing_class=tok, replay=rt.ReplaySettings(16, 8))


def _model_min_p(model):
    model.generation_config.min_p = 0.05


# ---- 1. sampling options that change the behaviour distribution ----------------------------

@pytest.mark.parametrize("grpo, model_edit, message", [
    ({"top_p": 0.9}, None, "top_p=1.0"),
    ({"top_k": 5}, None, "top_k=0"),
    ({"top_k": None}, None, "top_k=0, got 50"),  # transformers' default fills it in
    ({"min_p": 0.1}, None, "min_p=None"),
    ({"repetition_penalty": 1.2}, None, "repetition_penalty=1.0"),
    ({"generation_kwargs": {"top_k": 5}}, None, "top_k=0"),
    ({"generation_kwargs": {"typical_p": 0.9}}, None, "typical_p=1.0"),
    ({"generation_kwargs": {"no_repeat_ngram_size": 2}}, None, "no_repeat_ngram_size=0"),
    ({"generation_kwargs": {"do_sample": False}}, None, "do_sample=True"),
    ({"generation_kwargs": {"temperature": 0.5}}, None,
     r"temperature=1.0 in generation \(GRPOConfig.temperature\), got 0.5"),
    ({}, _model_min_p, "min_p=None, got 0.05"),  # the model's own generation_config
], ids=["top_p", "top_k", "top_k_none", "min_p", "repetition_penalty", "kwargs_top_k",
        "kwargs_typical_p", "kwargs_no_repeat_ngram", "kwargs_greedy", "kwargs_temperature",
        "model_generation_config_min_p"])
def test_sampling_options_that_change_the_behaviour_distribution_are_refused(
        tmp_path, grpo, model_edit, message):
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path, model_edit, **grpo)


def test_temperature_is_supported_end_to_end(tmp_path):
    """GRPOConfig.temperature = 0.7 is allowed: the stored behaviour log-probs are those of the
    distribution generate samples from, softmax(logits / 0.7), recomputed independently."""
    trainer = _trainer(tmp_path, temperature=0.7)
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]
    out = trainer._generate_and_score_completions(rows)
    pmask, cmask = out["prompt_mask"].bool(), out["completion_mask"].bool()
    for i in range(out["completion_ids"].size(0)):
        prompt = out["prompt_ids"][i][pmask[i]].tolist()
        completion = out["completion_ids"][i][cmask[i]].tolist()
        want = recomputed_logprobs(trainer.model, prompt, completion, temperature=0.7)
        got = out["old_per_token_logps"][i][cmask[i]].numpy()
        np.testing.assert_allclose(got, want, atol=1e-4)
        full = recomputed_logprobs(trainer.model, prompt, completion)
        assert not np.allclose(got, full, atol=1e-3)  # the temperature really acts


# ---- 3. the version is checked where the trainer is built ----------------------------------

def test_mapping_imports_under_another_trl_and_the_trainer_refuses_it(monkeypatch):
    import llm_experiments.integrations as package
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    # A fresh import of the module; the original is restored (module table and package
    # attribute) after the test.
    monkeypatch.delitem(sys.modules, MODULE)
    monkeypatch.setattr(package, "trl", rt)
    fresh = importlib.import_module(MODULE)
    assert fresh is not rt
    rec = optimal_config(mu=6.84, alpha=0.2, batch_size=16, max_buffer_size=64, reuse=None,
                         horizon_source="measured")
    mapped = fresh.trl_config(rec, G)
    assert mapped.per_device_train_batch_size == 4 and mapped.replay.batch_size == 16
    with pytest.raises(ImportError, match=r"trl 1\.17\.0"):
        fresh.ReplayGRPOTrainer(model=None, replay=fresh.ReplaySettings(8, 8))


# ---- 4. the loss, by behaviour -------------------------------------------------------------

class KeyRecorder(dict):
    """A dict that records every key read (``[]``, ``get``, ``in``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


# Keys TRL's _compute_loss may read that this trainer leaves out on purpose: multimodal
# inputs (text prompts only), tool_mask (no tools), ref_per_token_logps (beta = 0),
# importance_sampling_ratio / sampling_per_token_logps (no vLLM).
ABSENT_BY_DESIGN = {"pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                    "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids",
                    "mm_token_type_ids", "image_position_ids", "tool_mask",
                    "ref_per_token_logps", "importance_sampling_ratio",
                    "sampling_per_token_logps"}


def _clip_share(trainer, batch) -> float:
    """Share of the batch's completion tokens whose ratio to the behaviour log-prob lies
    outside the clip [0.8, 1.28], under the trainer's current weights."""
    tb = losses.collate(batch, trainer.processing_class.pad_token_id)
    with torch.no_grad():
        logp, _ = losses.batch_logprobs(trainer.model, tb, trainer.temperature)
    ratio = torch.exp(logp - tb.old_logp)[tb.mask]
    return float(((ratio < 0.8) | (ratio > 1.28)).float().mean())


# The share of clipped tokens the loss comparison needs, so that it tests the clip too.
CLIP_SHARE = 0.05


@pytest.fixture(scope="module", params=[("grpo", 1), ("dapo", 1), ("dapo", 2)],
                ids=["grpo", "dapo", "dapo-k2"])
def loss_case(request, tmp_path_factory):
    """A trainer (loss_type grpo, or dapo: TRL's default; ``steps_per_generation`` k = 1 or
    2) after 2 steps, the batch of a third ``_prepare_inputs`` (B = 8 drawn from a buffer of
    16), and the policy then moved so that replayed ratios reach both clip sides.

    The move is sized from the measured ratios, not fixed: how far a given noise moves the
    ratios depends on the warm start, which differs from machine to machine (``models.
    cached_warm_start``). The noise doubles from 5% of each tensor's mean magnitude until at
    least ``CLIP_SHARE`` of the batch's tokens are clipped."""
    loss_type, k = request.param
    trainer = _trainer(tmp_path_factory.mktemp("loss"), loss_type=loss_type, epsilon=0.2,
                       epsilon_high=0.28, steps_per_generation=k)
    trainer.train()
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(2 * k) for _ in range(G)]
    inputs = trainer._prepare_inputs(rows)
    batch = trainer.steps[-1].batch
    start = [p.detach().clone() for p in trainer.model.parameters()]
    gen = torch.Generator().manual_seed(0)
    noise = [p.abs().mean() * torch.randn(p.shape, generator=gen) for p in start]
    scale = 0.05
    while True:
        with torch.no_grad():
            for p, p0, z in zip(trainer.model.parameters(), start, noise):
                p.copy_(p0 + scale * z)
        if _clip_share(trainer, batch) >= CLIP_SHARE or scale >= 3.2:
            break
        scale *= 2
    return trainer, inputs, batch


def test_compute_loss_reads_only_keys_our_batch_provides(loss_case):
    trainer, inputs, _ = loss_case
    recorder = KeyRecorder(inputs)
    trainer._compute_loss(trainer.model, recorder)
    assert {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
            "old_per_token_logps"} <= recorder.read
    missing = recorder.read - set(inputs)
    assert missing <= ABSENT_BY_DESIGN, f"_compute_loss reads keys we do not build: {missing}"


def test_compute_loss_equals_policy_loss_on_the_same_rollouts(loss_case):
    """TRL's loss and gradient on our batch equal the harness's GRPO loss computed from the
    drawn rollouts with our own collation and forward pass: per-sequence token means clipped
    at epsilon / epsilon_high, averaged over sequences (grpo) or weighted by their token
    counts (dapo: a mean over all tokens of the batch), whatever ``steps_per_generation``
    (issue 38 N6: at k = 2 TRL's dapo loss and gradient were twice ours)."""
    trainer, inputs, batch = loss_case
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    trl_loss = trainer._compute_loss(model, inputs)
    trl_grad = torch.autograd.grad(trl_loss, params)

    tb = losses.collate(batch, trainer.processing_class.pad_token_id)
    logp, _ = losses.batch_logprobs(model, tb, trainer.temperature)
    per_seq = losses.policy_loss(logp, tb, loss="grpo", clip_low=0.2, clip_high=0.28)
    tokens = tb.mask.sum(-1).float()
    ours = per_seq.mean() if trainer.loss_type == "grpo" else (
        (per_seq * tokens).sum() / tokens.sum())
    our_grad = torch.autograd.grad(ours, params)

    assert _clip_share(trainer, batch) >= CLIP_SHARE  # the clip acts on the batch
    assert torch.equal(inputs["old_per_token_logps"][inputs["completion_mask"].bool()],
                       tb.old_logp[tb.mask])
    assert trl_loss.item() == pytest.approx(ours.item(), rel=1e-5, abs=1e-6)
    for a, b in zip(trl_grad, our_grad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
