import math

import numpy as np
import pytest
import torch

from llm_experiments.rl.buffer import Rollout
from llm_experiments.rl.losses import (TokenBatch, collate, group_advantages, loss_stats,
                                       policy_loss)


def test_group_advantages_hand_values_and_zero_std():
    adv = group_advantages([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1])
    assert np.all(adv[1:] == 0) and np.all(np.isfinite(adv))
    asym = group_advantages([[1, 0, 0, 0]], loss="asymre", dv=-0.1)
    np.testing.assert_allclose(asym, [[0.85, -0.15, -0.15, -0.15]])
    with pytest.raises(ValueError, match="rewards must be"):
        group_advantages([1, 0])


def _batch(logp_old, adv, mask):
    n, length = np.shape(logp_old)
    t = torch.tensor
    return TokenBatch(torch.zeros((n, length), dtype=torch.long), t(mask),
                      t(logp_old, dtype=torch.float32), t(adv, dtype=torch.float32),
                      input_ids=torch.zeros((n, length + 1), dtype=torch.long),
                      index=torch.zeros((n, length), dtype=torch.long))


def test_grpo_clip_hand_computed():
    old = [[math.log(0.5), math.log(0.5), 0.0]]
    new = torch.tensor([[math.log(0.8), math.log(0.25), -5.0]])  # ratios 1.6, 0.5
    b = _batch(old, [1.0], [[True, True, False]])
    # A > 0: token 1 clipped to 1.2, token 2 unclipped min(0.5, 0.8) = 0.5; third masked.
    loss = policy_loss(new, b, loss="grpo")
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2, rel=1e-6)
    b_neg = _batch(old, [-1.0], [[True, True, False]])
    # A < 0: -min(-1.6, -1.2) = 1.6; -min(-0.5, -0.8) = 0.8.
    assert policy_loss(new, b_neg, loss="grpo").item() == pytest.approx((1.6 + 0.8) / 2,
                                                                        rel=1e-6)
    assert policy_loss(new, b, loss="grpo_unclipped").item() == pytest.approx(-(1.6 + 0.5) / 2,
                                                                              rel=1e-6)
    stats = loss_stats(new, torch.zeros_like(new), b)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    w = np.array([1.6, 0.5])
    assert stats["is_ess"] == pytest.approx(w.sum() ** 2 / (2 * (w ** 2).sum()))
    assert stats["approx_kl"] == pytest.approx(np.mean(w - 1 - np.log(w)), rel=1e-5)


def test_truncated_and_asymre_gradients():
    old = [[math.log(0.5), math.log(0.5)]]
    new = torch.tensor([[math.log(0.8), math.log(0.25)]], requires_grad=True)
    b = _batch(old, [2.0], [[True, True]])
    policy_loss(new, b, loss="grpo_truncated", is_cap=1.0).backward()
    # d/dlogp of -sg(min(r, 1)) A logp / 2 = -min(r, 1) A / 2.
    np.testing.assert_allclose(new.grad.numpy(), [[-1.0, -0.5]], rtol=1e-6)
    new.grad = None
    policy_loss(new, b, loss="asymre", max_new_tokens=4).backward()
    np.testing.assert_allclose(new.grad.numpy(), [[-0.5, -0.5]], rtol=1e-6)


def test_masking_after_eos_ignores_padding():
    old = [[-1.0, -1.0, 0.0, 0.0]]
    mask = [[True, True, False, False]]
    a = torch.tensor([[-0.5, -2.0, 3.0, -7.0]])
    b = torch.tensor([[-0.5, -2.0, -9.0, 5.0]])
    bt = _batch(old, [1.0], mask)
    assert policy_loss(a, bt).item() == policy_loss(b, bt).item()


def test_collate_positions():
    r = Rollout(0, 0, 0, 0, np.array([5, 6, 7], np.int32), np.array([8, 1], np.int32),
                np.array([-0.1, -0.2], np.float32), 1.0, 0.5)
    r2 = Rollout(1, 0, 1, 0, np.array([5], np.int32), np.array([9, 9, 1], np.int32),
                 np.array([-0.3, -0.4, -0.5], np.float32), 0.0, -0.5)
    b = collate([r, r2], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 1], [5, 9, 9, 1, 0]]
    # logits at position p + k - 1 predict completion token k
    assert b.index[0, :2].tolist() == [2, 3] and b.index[1].tolist() == [0, 1, 2]
    assert b.mask.tolist() == [[True, True, False], [True, True, True]]
