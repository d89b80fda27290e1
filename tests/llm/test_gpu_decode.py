"""Decoding without per-token host syncs (issue 28, item 3): completion checked every k
tokens, a float32 inverse CDF for GPUs, vLLM's memory share and eager mode from the config."""

import numpy as np
import pytest
import torch

from llm_experiments.samplers import hf
from llm_helpers import tiny_policy


def test_checking_every_k_tokens_gives_the_same_generation(monkeypatch):
    """Rows that end between checks decode on but write pad and log-prob 0: the result is
    the per-token check's, with (here) fewer host syncs than tokens."""
    model, tok = tiny_policy(32, 2, 64)
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]] * 4
    runs = {}
    for k in (1, 5):
        monkeypatch.setitem(hf.CHECK_EVERY, "cpu", k)
        s = hf.HFSampler(model, tok.eos_token_id, tok.pad_token_id)
        # Make end-of-sequence likely so rows finish at different steps.
        with torch.no_grad():
            s.model.lm_head.weight[tok.eos_token_id] += 0.05 * s.model.lm_head.weight.norm(
                dim=1).mean()
        runs[k] = s.generate(prompts, max_new_tokens=12, temperature=1.0, seed=3)
    a, b = runs[1], runs[5]
    assert len(set(a.lengths.tolist())) > 1 and a.finished.any()
    for field in ("tokens", "logprobs", "lengths", "finished"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_float32_inverse_cdf_picks_the_float64_token():
    """Over a 151,936-token vocabulary the float32 cumulative sum picks the float64 sum's
    token for all but a tiny share of uniforms (those within float32 error of a bin edge)."""
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(3 * torch.randn(64, 151_936, generator=g), -1)
    u = torch.rand(64, generator=g, dtype=torch.float64)
    same = []
    for shift in torch.linspace(0, 0.99, 32, dtype=torch.float64):
        uu = (u + shift) % 1
        same.append(hf.inverse_cdf(logp, uu, torch.float32) == hf.inverse_cdf(logp, uu))
    assert float(torch.stack(same).float().mean()) > 0.99


def test_vllm_settings_come_from_the_config(monkeypatch):
    """sampler.vllm_gpu_memory and sampler.vllm_eager reach the engine (the memory share
    only on a GPU run)."""
    from llm_experiments.config import load_config
    from llm_experiments.samplers import make_sampler
    from llm_experiments.samplers import vllm as vllm_module
    seen = {}
    monkeypatch.setattr(vllm_module, "VLLMSampler", lambda *a, **kw: seen.update(kw))
    model, tok = tiny_policy(32, 2, 64)
    make_sampler(load_config("cpu_tiny", ["sampler.backend=vllm", "run.device=cuda",
                                          "sampler.vllm_gpu_memory=0.3",
                                          "sampler.vllm_eager=false"]), model, tok)
    assert seen["gpu_memory"] == 0.3 and seen["eager"] is False
    make_sampler(load_config("cpu_tiny", ["sampler.backend=vllm"]), model, tok)
    assert seen["gpu_memory"] is None and seen["eager"] is True
    with pytest.raises(ValueError, match="sampler.vllm_gpu_memory"):
        load_config("cpu_tiny", ["sampler.vllm_gpu_memory=0"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sampler_matches_cpu_lengths_and_logprobs():
    """On a GPU (float32 inverse CDF, checks every 16 tokens) a float32 model samples with
    log-probs that match a recomputation."""
    from llm_helpers import recomputed_logprobs
    model, tok = tiny_policy(32, 2, 64)
    s = hf.HFSampler(model.cuda(), tok.eos_token_id, tok.pad_token_id)
    gen = s.generate([[3, 4, 5]] * 8, max_new_tokens=10, temperature=1.0, seed=0)
    for i in range(8):
        want = recomputed_logprobs(model.cpu(), [3, 4, 5], gen.completion(i))
        np.testing.assert_allclose(gen.logprobs[i, :gen.lengths[i]], want, atol=1e-4)
