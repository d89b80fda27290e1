import os
from math import comb

import numpy as np
import pytest
import torch

from llm_experiments.rl.buffer import Rollout
from llm_experiments.rl.gradients import clipped_mean_grad, per_sample_grads
from llm_experiments.rl.losses import collate, policy_loss, token_logprobs, update_terms
from llm_experiments.engines.metrics import MetricsLog, pass_at_k, read_jsonl, summarize
from llm_helpers import tiny_policy


def test_pass_at_k():
    assert pass_at_k(16, 0, 4) == 0.0 and pass_at_k(16, 13, 4) == 1.0
    assert pass_at_k(16, 4, 1) == pytest.approx(0.25)
    assert pass_at_k(16, 4, 2) == pytest.approx(1 - comb(12, 2) / comb(16, 2))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 8)


def test_summary_compute_to_98pct_best():
    recs = [{"step": 0, "eval_accuracy": 0.3, "compute_units": 0.0},
            {"step": 1, "eval_accuracy": None, "compute_units": 5.0},
            {"step": 2, "eval_accuracy": 0.79, "compute_units": 10.0},
            {"step": 4, "eval_accuracy": 0.8, "compute_units": 20.0,
             "samples_generated": 7, "samples_consumed": 9}]
    s = summarize(recs, {"mu_accounting": 2.0})
    assert s["warm_start_accuracy"] == 0.3 and s["best_eval_accuracy"] == 0.8
    assert s["compute_to_98pct_best"] == 10.0 and s["step_to_98pct_best"] == 2
    assert s["final_eval_accuracy"] == 0.8 and s["samples_consumed"] == 9


def test_metrics_log_truncates_to_checkpoint(tmp_path):
    path = str(tmp_path / "m.jsonl")
    log = MetricsLog(path)
    log.write({"step": 0, "x": float("nan")})
    pos = log.position()
    log.write({"step": 1})
    log.fh.write('{"step": 2, "torn')  # a kill in the middle of a line
    log.close()
    MetricsLog.truncate(path, pos)
    assert read_jsonl(path) == [{"step": 0, "x": None}]


def _batch(tok, model):
    rng = np.random.default_rng(0)
    rs = []
    for i in range(6):
        p = np.array(tok.encode(f"{i}+{i + 3}=", add_special_tokens=False), np.int32)
        c = rng.integers(3, 14, 1 + i % 3).astype(np.int32)
        with torch.no_grad():
            ids = torch.tensor([list(p) + list(c)])
            lp = torch.log_softmax(model(input_ids=ids).logits[0], -1)
            old = lp[torch.arange(len(p) - 1, len(p) + len(c) - 1), torch.tensor(c)].numpy()
        rs.append(Rollout(i, 0, i, 0, p, c, old - 0.1 * (i % 2), 1.0, float(i % 3) - 0.5))
    return collate(rs, tok.pad_token_id)


def test_per_sample_gradients_average_to_the_batch_gradient():
    model, tok = tiny_policy(32, 2, 64)
    batch = _batch(tok, model)
    logp, _ = token_logprobs(model(input_ids=batch.input_ids).logits, batch, 1.0)
    policy_loss(logp, batch).mean().backward()
    full = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    per = torch.cat([g for _, g in per_sample_grads(model, batch, {}, 1.0, chunk=4)])
    assert per.shape == (6, full.numel())
    torch.testing.assert_close(per.mean(0), full, atol=1e-6, rtol=1e-4)
    assert model.config._attn_implementation == "sdpa"  # switched back after the probe
    torch.testing.assert_close(clipped_mean_grad(model, batch, {}, 1.0, clip=1e9), per.mean(0))
    norms = per.norm(dim=1)
    c = float(norms.min()) / 2
    clipped = clipped_mean_grad(model, batch, {}, 1.0, clip=c)
    torch.testing.assert_close(clipped, (per * (c / norms)[:, None]).mean(0))


def test_tensorboard_is_optional(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="tensorboard"):
            MetricsLog(str(tmp_path / "m.jsonl"), str(tmp_path / "tb"))
    else:
        log = MetricsLog(str(tmp_path / "m.jsonl"), str(tmp_path / "tb"))
        log.write({"step": 0, "loss": 1.0})
        log.close()
        assert os.listdir(tmp_path / "tb")


@pytest.mark.parametrize("loss", ["m2po", "cispo", "neg_clip"])
def test_per_sample_grads_of_batch_level_losses_average_to_the_batch_gradient(loss):
    """m2po's mask and the token denominators of m2po and cispo are the batch's: each
    per-sample gradient is taken with them, so their mean is the batch gradient."""
    model, tok = tiny_policy(32, 2, 64)
    batch = _batch(tok, model)
    kw = {"loss": loss, "m2_threshold": 0.002, "cispo_cap": 1.05}
    logp, _ = token_logprobs(model(input_ids=batch.input_ids).logits, batch, 1.0)
    ratio = torch.exp(logp.detach() - batch.old_logp)[batch.mask]
    assert (ratio > 1.05).any() and (ratio < 1.05).any()  # the cap acts on some tokens
    keep = update_terms(logp.detach(), batch, kw).keep
    assert loss != "m2po" or 0 < int((batch.mask & ~keep).sum()) < int(batch.mask.sum())
    params = [p for p in model.parameters() if p.requires_grad]
    full = torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        policy_loss(logp, batch, **kw).mean(), params)])
    per = torch.cat([g for _, g in per_sample_grads(model, batch, kw, 1.0, chunk=4)])
    torch.testing.assert_close(per.mean(0), full, atol=1e-6, rtol=1e-4)
