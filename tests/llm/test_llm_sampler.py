import numpy as np
import pytest
import torch

from llm_helpers import recomputed_logprobs, tiny_policy
from llm_experiments.samplers import WeightUpdate
from llm_experiments.samplers.hf import HFSampler, inverse_cdf, step_distribution


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(32, 2, 64)


def prompts(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_recomputed(policy, temperature):
    model, tok = policy
    s = HFSampler(model, tok.eos_token_id, tok.pad_token_id)
    ps = prompts(tok, ["12+34=", "1+2=", "99+9=", "7+70="] * 4)  # different lengths
    gen = s.generate(ps, max_new_tokens=8, temperature=temperature, seed=3)
    assert gen.tokens.dtype == np.int32 and gen.logprobs.dtype == np.float32
    for i, p in enumerate(ps):
        c = gen.completion(i)
        assert len(c) == gen.lengths[i] >= 1
        if gen.finished[i]:
            assert c[-1] == tok.eos_token_id and tok.eos_token_id not in c[:-1]
        np.testing.assert_allclose(gen.logprobs[i, :len(c)],
                                   recomputed_logprobs(model, p, c, temperature), atol=2e-5)
        assert np.all(gen.logprobs[i, len(c):] == 0)


def test_seeds_and_common_random_numbers(policy):
    model, tok = policy
    s = HFSampler(model, tok.eos_token_id, tok.pad_token_id)
    ps = prompts(tok, ["5+5="] * 32)
    a = s.generate(ps, max_new_tokens=5, temperature=1.0, seed=1)
    b = s.generate(ps, max_new_tokens=5, temperature=1.0, seed=1)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    u = np.random.default_rng(0).random((32, 5))
    c = s.generate(ps, max_new_tokens=5, temperature=1.0, uniforms=u)
    # slightly perturbed weights with the same uniforms give mostly the same tokens
    state = {k: v + 1e-3 * torch.randn_like(v) for k, v in model.state_dict().items()}
    s.load_weights(WeightUpdate(7, state))
    assert s.version == 7
    d = s.generate(ps, max_new_tokens=5, temperature=1.0, uniforms=u)
    assert (c.tokens == d.tokens).mean() > 0.9
    with pytest.raises(ValueError, match="uniforms must have shape"):
        s.generate(ps, max_new_tokens=4, temperature=1.0, uniforms=u)


def test_inverse_cdf_and_nucleus_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    logp = step_distribution(logits, 1.0, 0.8)
    # nucleus 0.8 keeps {0.5, 0.3} renormalised; the rest has probability 0
    np.testing.assert_allclose(logp.exp().numpy(), [[0.625, 0.375, 0, 0]], atol=1e-6)
    u = torch.linspace(0, 0.999, 2000)
    toks = inverse_cdf(logp.expand(2000, -1), u)
    assert set(toks.tolist()) == {0, 1}
    assert (toks == 0).float().mean().item() == pytest.approx(0.625, abs=0.01)


def test_greedy_matches_argmax(policy):
    model, tok = policy
    s = HFSampler(model, tok.eos_token_id, tok.pad_token_id)
    p = prompts(tok, ["3+4="])[0]
    gen = s.generate([p], max_new_tokens=3, temperature=0.0)
    ids = list(p)
    for k in range(gen.lengths[0]):
        with torch.no_grad():
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        assert nxt == gen.tokens[0, k]
        ids.append(nxt)


@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_fresh_sample_ratio_under_the_trainers_logprobs(policy, top_p):
    """With top_p = 1 the trainer's log-probs (``losses.batch_logprobs``) give a fresh sample
    a ratio of 1; with top_p < 1 the behaviour log-probs include the nucleus renormalisation
    and the ratio falls below 1, which is why the config refuses top_p < 1 for ratio-based
    losses (``config.check_resolved``)."""
    from llm_experiments.rl.buffer import Rollout
    from llm_experiments.rl.losses import batch_logprobs, collate
    model, tok = policy
    s = HFSampler(model, tok.eos_token_id, tok.pad_token_id, direct=False)
    ps = prompts(tok, ["12+34=", "1+2="] * 4)
    gen = s.generate(ps, max_new_tokens=6, temperature=1.0, top_p=top_p, seed=5)
    batch = collate([Rollout(i, 0, 0, 0, np.array(p, np.int32), gen.completion(i),
                             gen.logprobs[i, :gen.lengths[i]], 0.0, 0.0)
                     for i, p in enumerate(ps)], tok.pad_token_id)
    with torch.no_grad():
        logp, _ = batch_logprobs(model, batch, 1.0)
    log_ratio = ((logp - batch.old_logp) * batch.mask).sum(1).numpy()
    if top_p == 1.0:
        np.testing.assert_allclose(log_ratio, 0.0, atol=1e-4)
    else:
        assert np.all(log_ratio <= 1e-5) and log_ratio.min() < -1e-3


def test_max_concurrent_decodes_in_waves_with_the_same_samples(policy):
    """sampler.max_concurrent splits a call into waves; each row keeps its own uniforms, so
    the samples are those of one full-width call (float rounding of the batch shape aside)."""
    model, tok = policy
    ps = prompts(tok, ["12+34=", "1+2=", "99+9=", "7+70=", "5+5="] * 3)  # 15 rows, uneven
    full = HFSampler(model, tok.eos_token_id, tok.pad_token_id).generate(
        ps, max_new_tokens=6, temperature=1.0, seed=4)
    waves = HFSampler(model, tok.eos_token_id, tok.pad_token_id, max_concurrent=4)
    calls = []
    decode = waves._decode
    waves._decode = lambda p, *a: calls.append(len(p)) or decode(p, *a)
    part = waves.generate(ps, max_new_tokens=6, temperature=1.0, seed=4)
    assert calls == [4, 4, 4, 3]
    np.testing.assert_array_equal(part.tokens, full.tokens)
    np.testing.assert_array_equal(part.lengths, full.lengths)
    np.testing.assert_allclose(part.logprobs, full.logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="max_concurrent must be an integer >= 0"):
        HFSampler(model, tok.eos_token_id, tok.pad_token_id, max_concurrent=-1)


def test_max_concurrent_setting_reaches_the_sampler(policy):
    from llm_experiments.config import load_config
    from llm_experiments.samplers.make import make_sampler
    model, tok = policy
    s = make_sampler(load_config("cpu_tiny", ["sampler.max_concurrent=16"]), model, tok)
    assert s.max_concurrent == 16
    with pytest.raises(ValueError, match="sampler.max_concurrent"):
        load_config("cpu_tiny", ["sampler.max_concurrent=-2"])
    with pytest.raises(ValueError, match="sampler.max_concurrent > 0 needs sampler.backend=hf"):
        load_config("cpu_tiny", ["sampler.max_concurrent=8", "sampler.backend=vllm"])
