"""The stale-rollout losses against one hand-computed batch (rl/objectives.py).

Two rollouts, behaviour probability 0.5 on every token. Row 0 (A = +1, three tokens) has
ratios 1.6, 0.5, 3.0; row 1 (A = -2, two tokens and one padding) has ratios 0.7, 1.1. The
gradient of a rollout's loss with respect to a token's log-prob is written out per loss.
"""

import math

import numpy as np
import pytest
import torch

from llm_experiments.rl.losses import TokenBatch, loss_stats, policy_loss, update_terms
from llm_experiments.rl.objectives import m2_keep

RATIOS = [[1.6, 0.5, 3.0], [0.7, 1.1, 1.0]]
MASK = [[True, True, True], [True, True, False]]


def _batch():
    t = torch.tensor
    n, length = 2, 3
    return TokenBatch(torch.zeros((n, length), dtype=torch.long), t(MASK),
                      torch.full((n, length), math.log(0.5)), t([1.0, -2.0]),
                      input_ids=torch.zeros((n, length + 1), dtype=torch.long),
                      index=torch.zeros((n, length), dtype=torch.long))


def _logp():
    return torch.tensor(np.log(0.5 * np.array(RATIOS)), dtype=torch.float32,
                        requires_grad=True)


def _grad(loss: str, **kw):
    """(per-rollout losses, d(sum of rollout losses)/d logp) on the hand batch."""
    logp = _logp()
    out = policy_loss(logp, _batch(), loss=loss, **kw)
    out.sum().backward()
    return out.detach().numpy(), logp.grad.numpy()


def test_neg_clip_unclipped_positives_ppo_clipped_negatives():
    losses, grad = _grad("neg_clip")
    # Row 0 unclipped: -r A per token, mean of 3. Row 1: r = 0.7 < 0.8 clipped (constant
    # 1.6, no gradient); r = 1.1 inside: -r A = 2.2.
    np.testing.assert_allclose(losses, [-(1.6 + 0.5 + 3.0) / 3, (1.6 + 2.2) / 2], rtol=1e-6)
    np.testing.assert_allclose(grad, [[-1.6 / 3, -0.5 / 3, -3.0 / 3], [0.0, 2.2 / 2, 0.0]],
                               rtol=1e-6, atol=1e-7)


def test_neg_cap_weights_negatives_at_most_one():
    losses, grad = _grad("neg_cap")
    # Row 1: r = 0.7 keeps -r A (gradient 1.4); r = 1.1 > 1: -sg(1) A log pi, gradient 2.
    np.testing.assert_allclose(grad[1], [1.4 / 2, 2.0 / 2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(grad[0], [-1.6 / 3, -0.5 / 3, -3.0 / 3], rtol=1e-6)
    assert losses[1] == pytest.approx((1.4 + 2.0 * math.log(0.55)) / 2, rel=1e-5)


def test_neg_veto_drops_negatives_outside_the_band():
    losses, grad = _grad("neg_veto")
    np.testing.assert_allclose(grad[1], [0.0, 2.2 / 2, 0.0], rtol=1e-6, atol=1e-7)
    assert losses[1] == pytest.approx(2.2 / 2, rel=1e-6)


def test_cispo_truncates_weights_over_the_batch_tokens():
    losses, grad = _grad("cispo", cispo_cap=2.0)
    # -sg(min(r, 2)) A log pi summed over tokens / mean length 2.5 (5 tokens, 2 rows).
    np.testing.assert_allclose(grad, [[-1.6 / 2.5, -0.5 / 2.5, -2.0 / 2.5],
                                      [1.4 / 2.5, 2.2 / 2.5, 0.0]], rtol=1e-6, atol=1e-7)
    logp = np.log(0.5 * np.array(RATIOS))
    tok = -np.minimum(RATIOS, 2.0) * np.array([[1.0], [-2.0]]) * logp * np.array(MASK)
    assert losses.mean() == pytest.approx(tok.sum() / 5, rel=1e-5)


def test_m2po_masks_the_largest_second_moments_until_the_mean_is_below_threshold():
    sq = np.log(np.array(RATIOS)) ** 2 * np.array(MASK)
    # Dropping 3.0 leaves a mean of 0.209 >= 0.2; dropping 0.5 too leaves 0.119 < 0.2.
    assert (sq.sum() - sq[0, 2]) / 4 >= 0.2 > (sq.sum() - sq[0, 2] - sq[0, 1]) / 3
    losses, grad = _grad("m2po", m2_threshold=0.2)
    np.testing.assert_allclose(grad, [[-1.6 / 2.5, 0.0, 0.0], [1.4 / 2.5, 2.2 / 2.5, 0.0]],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(losses, [-1.6 / 2.5, (1.4 + 2.2) / 2.5], rtol=1e-6)
    logp = _logp().detach()
    stats = loss_stats(logp, torch.zeros_like(logp), _batch(),
                       loss_kwargs={"loss": "m2po", "m2_threshold": 0.2})
    assert stats["acted_pos"] == pytest.approx(2 / 3) and stats["acted_neg"] == 0.0
    assert stats["logr2"] == pytest.approx(sq.sum() / 5, rel=1e-5)
    assert stats["logr2_kept"] == pytest.approx((sq.sum() - sq[0, 1] - sq[0, 2]) / 3,
                                                rel=1e-5)
    assert stats["ratio_max"] == pytest.approx(3.0, rel=1e-5)


def test_m2po_rows_of_a_batch_use_the_batch_mask():
    """A row scored alone masks by its own second moments; with the batch's terms it gets
    the batch's mask (what micro-batches and per-sample gradients rely on)."""
    batch, logp = _batch(), _logp().detach()
    kw = {"loss": "m2po", "m2_threshold": 0.2}
    terms = update_terms(logp, batch, kw)
    whole = policy_loss(logp, batch, **kw)
    parts = torch.cat([policy_loss(logp[i:i + 1], batch.rows(slice(i, i + 1)), **kw,
                                   terms=terms.rows(slice(i, i + 1))) for i in range(2)])
    assert torch.equal(whole, parts)
    alone = policy_loss(logp[:1], batch.rows(slice(0, 1)), **kw)
    assert alone.item() != pytest.approx(whole[0].item())


def test_m2_keep_keeps_at_least_one_token_and_ignores_padding():
    log_ratio = torch.tensor([[2.0, -3.0, 9.0]])
    keep = m2_keep(log_ratio, torch.tensor([[True, True, False]]), 0.01)
    assert keep.tolist() == [[True, False, False]]
    assert m2_keep(log_ratio, torch.tensor([[True, True, True]]), 100.0).all()


def test_staleness_stats_split_by_advantage_sign():
    logp = _logp().detach()
    stats = loss_stats(logp, torch.zeros_like(logp), _batch(), loss_kwargs={"loss": "grpo"})
    # grpo clips 1.6 and 3.0 of the positives, 0.7 of the negatives.
    assert stats["acted_pos"] == pytest.approx(2 / 3) and stats["acted_neg"] == 0.5
    unclipped = loss_stats(logp, torch.zeros_like(logp), _batch(),
                           loss_kwargs={"loss": "grpo_unclipped"})
    assert unclipped["acted_pos"] == 0.0 and unclipped["acted_neg"] == 0.0
    assert unclipped["logr2_kept"] == pytest.approx(unclipped["logr2"])


def test_every_ratio_loss_has_its_rule_and_a_bad_name_is_one_line():
    from llm_experiments.rl.choices import RATIO_LOSSES
    from llm_experiments.rl.objectives import LossParams, token_terms
    logp = _logp().detach()
    log_ratio = logp - _batch().old_logp
    for loss in RATIO_LOSSES:
        terms = token_terms(loss, logp, log_ratio, _batch().adv[:, None], LossParams())
        assert terms.tok.shape == logp.shape and not (terms.dropped & ~terms.acted).any()
    with pytest.raises(ValueError, match="trainer.loss must be one of") as err:
        token_terms("ppo", logp, log_ratio, _batch().adv[:, None], LossParams())
    assert "\n" not in str(err.value) and "asymre" in str(err.value)
