"""The direct (layer-by-layer) forward and the oneDNN linear layers agree with the model's
generic forward and torch's default kernel to float32 rounding."""

import copy

import numpy as np
import pytest
import torch

from llm_helpers import tiny_policy
from llm_experiments.buffer import Rollout
from llm_experiments.direct import supports
from llm_experiments.kernels import default_linear, onednn_available, use_onednn_linear
from llm_experiments.losses import (batch_logprobs, collate, collate_prompts, policy_loss,
                                    token_logprobs)
from llm_experiments.samplers.hf import HFSampler


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(32, 2, 64)


def rollouts(tok, rng, groups=3, g=4):
    out = []
    for k in range(groups):
        prompt = np.array(tok.encode(f"{k * 37}+{k + 5}=", add_special_tokens=False), np.int32)
        for j in range(g):
            c = rng.integers(3, 15, int(rng.integers(1, 6))).astype(np.int32)
            out.append(Rollout(len(out), k, k, 0, prompt, c, -rng.random(len(c)).astype(
                np.float32), float(j % 2), float(rng.standard_normal())))
    return out


def test_shared_prompt_loss_and_gradient_match_full_forward(policy):
    model, tok = policy
    assert supports(model)
    rs = rollouts(tok, np.random.default_rng(0))
    full, shared = collate(rs, tok.pad_token_id), collate_prompts(rs, tok.pad_token_id)
    assert shared.prompt_ids.shape[0] == 3 and len(shared) == 12
    grads = []
    for batch in (full, shared):
        model.zero_grad()
        logp, ent = batch_logprobs(model, batch, 0.8)
        policy_loss(logp, batch).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        if batch is full:
            ref = (logp.detach(), ent.detach())
    torch.testing.assert_close(logp.detach() * shared.mask, ref[0] * full.mask, atol=2e-5,
                               rtol=0)
    torch.testing.assert_close(ent.detach()[shared.mask], ref[1][full.mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-4)
    # micro-batches keep every prompt and slice the rows
    part = shared.rows(slice(5, 9))
    torch.testing.assert_close(batch_logprobs(model, part, 0.8)[0], logp[5:9], atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_static_decoder_matches_generic_forward(policy, temperature):
    model, tok = policy
    prompts = [tok.encode(t, add_special_tokens=False)
               for t in ["12+34=", "1+2=", "12+34=", "99+9=", "1+2="] * 3]
    a = HFSampler(model, tok.eos_token_id, tok.pad_token_id, direct=True)
    b = HFSampler(model, tok.eos_token_id, tok.pad_token_id, direct=False)
    assert a.direct and not b.direct
    ga, gb = (s.generate(prompts, max_new_tokens=7, temperature=temperature, seed=4)
              for s in (a, b))
    np.testing.assert_array_equal(ga.tokens, gb.tokens)
    np.testing.assert_array_equal(ga.lengths, gb.lengths)
    np.testing.assert_allclose(ga.logprobs, gb.logprobs, atol=2e-5)


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN linear kernel")
def test_onednn_linear_forward_and_gradients(policy):
    model, tok = policy
    fast = copy.deepcopy(model)
    assert use_onednn_linear(fast) == sum(isinstance(m, torch.nn.Linear)
                                          for m in model.modules())
    batch = collate(rollouts(tok, np.random.default_rng(1)), tok.pad_token_id)
    grads = []
    for m in (model, fast):
        m.zero_grad()
        logp, _ = token_logprobs(m(input_ids=batch.input_ids).logits, batch, 1.0)
        policy_loss(logp, batch).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-4)
    assert set(fast.state_dict()) == set(model.state_dict())
    with default_linear(fast):
        assert not any(type(m).__name__ == "OneDNNLinear" for m in fast.modules())
    assert any(type(m).__name__ == "OneDNNLinear" for m in fast.modules())
