"""The harness's stale-rollout losses under TRL's ``loss_type`` (``ReplayGRPOTrainer``): the
loss and gradient TRL's trainer computes on a replayed batch equal ``losses.policy_loss`` on
the same rollouts with our own collation and forward pass, and the staleness diagnostics
reach TRL's logs."""

import math

import numpy as np
import pytest

pytest.importorskip("trl", reason="needs the trl extra: pip install -e '.[trl]'")

import torch  # noqa: E402
from llm_helpers import small_config  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from llm_experiments.integrations import trl as rt  # noqa: E402
from llm_experiments.rl import losses  # noqa: E402

G = 4


def _trainer(tmp_path, loss_type: str, m2_threshold: float = 0.04, dropout: float = 0.0,
             replay=None, **grpo):
    from datasets import Dataset

    from llm_experiments.policy.models import load_policy
    from llm_experiments.tasks.make import make_task
    torch.set_num_threads(1)
    cfg = small_config()
    task = make_task(cfg.task)
    model, tok = load_policy(cfg, task)
    model.config.attention_dropout = dropout
    problems = task.sample_train(16, np.random.default_rng(0))
    by_id = {p.pid: p for p in problems}
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems],
                              "pid": [p.pid for p in problems]})

    def reward(completions, pid, **_):
        return [task.reward(by_id[int(i)], c) for c, i in zip(completions, pid)]
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      disable_tqdm=True, save_strategy="no", per_device_train_batch_size=8,
                      num_generations=G, beta=0.0, steps_per_generation=1,
                      max_completion_length=4, max_steps=2, learning_rate=1e-3,
                      logging_steps=1, seed=0, loss_type=loss_type, epsilon=0.2,
                      epsilon_high=0.28, **grpo)
    return rt.ReplayGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                                processing_class=tok, replay=replay or rt.ReplaySettings(16, 8),
                                m2_threshold=m2_threshold)


@pytest.mark.parametrize("loss_type", rt.HARNESS_LOSS_TYPES)
def test_harness_loss_types_train_and_equal_policy_loss(tmp_path, loss_type):
    trainer = _trainer(tmp_path, loss_type, m2_threshold=0.01)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert np.isfinite(logged["replay/is_ess"]) and "replay/acted_neg" in logged
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]
    inputs = trainer._prepare_inputs(rows)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move the policy so that replayed ratios leave 1
        for p in trainer.model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_grad = torch.autograd.grad(trl_loss, params)
    tb = losses.collate(trainer.steps[-1].batch, trainer.processing_class.pad_token_id)
    logp, _ = losses.batch_logprobs(trainer.model, tb, trainer.temperature)
    ours = losses.policy_loss(logp, tb, loss=loss_type, clip_low=0.2, clip_high=0.28,
                              m2_threshold=0.01).mean()
    our_grad = torch.autograd.grad(ours, params)
    assert trl_loss.item() == pytest.approx(ours.item(), rel=1e-5, abs=1e-6)
    for a, b in zip(trl_grad, our_grad):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bad_m2_threshold_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="m2_threshold"):
        _trainer(tmp_path, "m2po", m2_threshold=0.0)


def test_a_model_that_drops_out_needs_disable_dropout(tmp_path):
    """With dropout in training mode a replayed rollout's stored log-probs would be one noisy
    draw, not the behaviour policy's: refused unless TRL disables dropout (issue 38)."""
    with pytest.raises(ValueError, match="disable_dropout=True") as err:
        _trainer(tmp_path, "grpo", dropout=0.1, disable_dropout=False)
    assert "config.attention_dropout=0.1" in str(err.value) and "\n" not in str(err.value)
    _trainer(tmp_path, "grpo", dropout=0.1, disable_dropout=True)


@pytest.mark.parametrize("loss_type, below_p", [("grpo", 1.0), ("neg_clip", 1.0), ("grpo", 0.9)])
def test_drop_logr2_evicts_exactly_the_rows_past_it(tmp_path, loss_type, below_p):
    """The adaptive horizon in TRL (theory.md 12.4): after a step, the rollouts of its batch
    whose mean (log r)^2 at the step's weights passed drop_logr2 leave the buffer, the others
    stay; for TRL's own loss (grpo) and a harness loss alike, and over the tokens sampled
    below ``drop_tokens_below_p`` (12.7)."""
    import dataclasses
    trainer = _trainer(tmp_path, loss_type, replay=rt.ReplaySettings(
        32, 8, drop_logr2=1e-3, drop_tokens_below_p=below_p))
    trainer.train()
    assert "replay/dropped" in trainer.state.log_history[0]
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(2) for _ in range(G)]
    inputs = trainer._prepare_inputs(rows)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    batch = trainer.steps[-1].batch
    tb = losses.collate(batch, trainer.processing_class.pad_token_id)
    with torch.no_grad():
        logp, _ = losses.batch_logprobs(trainer.model, tb, trainer.temperature)
    mask = tb.mask & (tb.old_logp < math.log(below_p)) if below_p < 1 else tb.mask
    stat = ((logp - tb.old_logp) ** 2 * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    tau = float(stat.median())
    trainer.replay = dataclasses.replace(trainer.replay, drop_logr2=tau)
    trainer._compute_loss(trainer.model, inputs)
    held = {r.item_id for r in trainer.buffer.rollouts()}
    far = {r.item_id for r, v in zip(batch, stat) if v > tau * (1 + 1e-4)}
    near = {r.item_id for r, v in zip(batch, stat) if v < tau * (1 - 1e-4)}
    assert far and near and not far & held and near <= held


def test_bad_drop_logr2_is_one_line():
    with pytest.raises(ValueError, match="drop_logr2 must be in"):
        rt.ReplaySettings(16, 8, drop_logr2=-0.1)
    with pytest.raises(ValueError, match="buffer.drop_logr2") as err:
        rt.ReplaySettings(16, 8, sampling="groups_with_replacement",
                          drop_logr2=0.05).harness_config(8, G)
    assert "\n" not in str(err.value)
