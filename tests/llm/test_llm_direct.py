"""The direct (layer-by-layer) forward and the oneDNN linear layers agree with the model's
generic forward and torch's default kernel to float32 rounding."""

import copy

import numpy as np
import pytest
import torch

from llm_helpers import tiny_policy
from llm_experiments.rl.buffer import Rollout
from llm_experiments.policy import decode_step
from llm_experiments.policy.direct import supports
from llm_experiments.policy.kernels import default_linear, onednn_available, use_onednn_linear
from llm_experiments.rl.losses import (PromptBatch, SequenceBatch, batch_logprobs, choose_layout,
                                       collate, collate_direct, collate_prompts, collate_sequences,
                                       layout_tokens, policy_loss, token_logprobs)
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


def distinct_rollouts(tok, rng, n=12):
    """``n`` rollouts, each with its own prompt (a batch drawn from a wide buffer)."""
    return rollouts(tok, rng, groups=n, g=1)


def test_sequence_layout_loss_and_gradient_match_full_forward(policy):
    model, tok = policy
    rs = distinct_rollouts(tok, np.random.default_rng(2))
    full, seq = collate(rs, tok.pad_token_id), collate_sequences(rs, tok.pad_token_id)
    out = {}
    for name, batch in (("full", full), ("seq", seq)):
        model.zero_grad()
        logp, ent = batch_logprobs(model, batch, 0.8)
        policy_loss(logp, batch).mean().backward()
        out[name] = (logp.detach() * batch.mask, ent.detach()[batch.mask],
                     torch.cat([p.grad.flatten() for p in model.parameters()]))
    for a, b in zip(out["seq"], out["full"]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    # micro-batches slice the rows; the chunked head (batch_hidden) gives the same log-probs
    part = seq.rows(slice(3, 7))
    assert part.first == seq.first and part.input_ids.shape[0] == 4
    torch.testing.assert_close(batch_logprobs(model, part, 0.8)[0] * part.mask,
                               out["seq"][0][3:7], atol=1e-6, rtol=0)
    torch.testing.assert_close(batch_logprobs(model, seq, 0.8, chunk=5)[0] * seq.mask,
                               out["seq"][0], atol=1e-6, rtol=0)


def test_layout_choice_keeps_grouped_batches_and_takes_sequences_for_distinct_prompts(policy):
    model, tok = policy
    grouped = rollouts(tok, np.random.default_rng(3), groups=2, g=8)
    distinct = distinct_rollouts(tok, np.random.default_rng(3), n=16)
    assert choose_layout(grouped, "auto") == "shared_prompts"
    assert choose_layout(distinct, "auto") == "sequences"
    assert choose_layout(distinct, "shared_prompts") == "shared_prompts"
    tokens = layout_tokens(distinct)
    assert tokens["sequences"] <= tokens["shared_prompts"]
    # "auto" on a grouped batch is the shared layout, bitwise
    auto, shared = (collate_direct(grouped, layout, tok.pad_token_id)
                    for layout in ("auto", "shared_prompts"))
    assert isinstance(auto, PromptBatch) and isinstance(
        collate_direct(distinct, "auto", tok.pad_token_id), SequenceBatch)
    assert torch.equal(batch_logprobs(model, auto, 1.0)[0], batch_logprobs(model, shared, 1.0)[0])
    with pytest.raises(ValueError, match="run.train_layout must be one of"):
        choose_layout(grouped, "packed")


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


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN linear kernel")
@pytest.mark.parametrize("hidden, choice, fast_kernels, on_onednn", [
    (64, "auto", True, False), (128, "auto", True, True), (128, "auto", False, False),
    (128, "default", True, False), (64, "onednn", False, True)])
def test_the_samplers_linear_kernel_follows_its_setting_and_the_hidden_size(
        hidden, choice, fast_kernels, on_onednn):
    """"auto" keeps the run's oneDNN layers from hidden size 128 on and takes torch's kernel
    below it (where oneDNN decodes slower, ``kernels.ONEDNN_MIN_HIDDEN``), in the sampler's
    own copy only: the trainer's model keeps its kernel."""
    from llm_experiments.config import Config
    from llm_experiments.samplers.make import hf_sampler
    model, tok = tiny_policy(hidden, 2, 2 * hidden)
    if fast_kernels:
        use_onednn_linear(model)
    cfg = Config()
    cfg.sampler.linear_kernel = choice
    sampler = hf_sampler(cfg, model, tok)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    on = sum(type(m).__name__ == "OneDNNLinear" for m in sampler.model.modules())
    assert on == (linears if on_onednn else 0)
    assert sum(type(m).__name__ == "OneDNNLinear" for m in model.modules()) == \
        (linears if fast_kernels else 0)
    out = sampler.generate([[3, 4, 5]] * 4, max_new_tokens=5, temperature=1.0, seed=0)
    assert out.tokens.shape == (4, 5)


def test_a_bad_sampler_kernel_is_a_one_line_error():
    from llm_experiments.config import from_dict
    with pytest.raises(ValueError, match="sampler.linear_kernel"):
        from_dict({"sampler": {"linear_kernel": "mkl"}})


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN linear kernel")
def test_a_switched_model_cast_to_bfloat16_takes_the_default_kernel(policy, monkeypatch):
    """CI's CPU has no bfloat16 inner product in oneDNN: the sampler's bfloat16 copy of a
    switched model must never reach the oneDNN op (it failed there before)."""
    from llm_experiments.policy import kernels
    model, tok = policy
    fast = copy.deepcopy(model)
    use_onednn_linear(fast)
    low = copy.deepcopy(fast).to(torch.bfloat16)
    batch = collate(rollouts(tok, np.random.default_rng(1)), tok.pad_token_id)

    def unsupported(*args):
        raise RuntimeError("could not create a primitive descriptor")
    monkeypatch.setattr(kernels, "onednn_linear", unsupported)
    with torch.no_grad():
        got = low(input_ids=batch.input_ids).logits
        want = copy.deepcopy(model).to(torch.bfloat16)(input_ids=batch.input_ids).logits
        torch.testing.assert_close(got, want)
        with pytest.raises(RuntimeError, match="primitive"):
            fast(input_ids=batch.input_ids)  # the float32 layers still take oneDNN


def _family(name: str, vocab: int):
    """A random tiny model of each family ``supports`` drives (issue 29: a transformers
    upgrade that changes one of them must fail here, not silently)."""
    import transformers
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "llama": transformers.LlamaConfig}[name](**common)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-5), (torch.bfloat16, 0.1)])
def test_direct_forward_equals_the_models_own_forward(policy, family, dtype, atol):
    """Log-probs and entropies of the shared-prompt and sequence layouts (direct.py) against
    the model's own forward, per supported family, in float32 and bfloat16."""
    _, tok = policy
    model = _family(family, len(tok)).to(dtype)
    assert supports(model)
    rs = rollouts(tok, np.random.default_rng(3))
    full = collate(rs, tok.pad_token_id)
    with torch.no_grad():
        own = token_logprobs(model(input_ids=full.input_ids).logits.float(), full, 0.9)
        for direct in (collate_prompts(rs, tok.pad_token_id),
                       collate_sequences(rs, tok.pad_token_id)):
            logp, ent = batch_logprobs(model, direct, 0.9)
            torch.testing.assert_close(logp.float() * direct.mask, own[0] * full.mask,
                                       atol=atol, rtol=0)
            torch.testing.assert_close(ent.float()[direct.mask], own[1][full.mask],
                                       atol=atol * 5, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_static_shape_decoding_equals_the_generic_forward_per_family(policy, family):
    """The static-shape decode step (``samplers.graphs``, what CUDA graphs replay) samples
    the model's own generic forward's tokens, per supported family."""
    _, tok = policy
    model = _family(family, len(tok))
    prompts = [tok.encode(t, add_special_tokens=False)
               for t in ["12+34=", "1+2=", "12+34=", "99+9="] * 2]
    gens = [HFSampler(model, tok.eos_token_id, tok.pad_token_id, direct=direct,
                      graphs=graphs).generate(prompts, max_new_tokens=9, temperature=1.0,
                                              seed=2)
            for direct, graphs in ((True, "on"), (False, "off"))]
    np.testing.assert_array_equal(gens[0].tokens, gens[1].tokens)
    np.testing.assert_allclose(gens[0].logprobs, gens[1].logprobs, atol=2e-5)


@pytest.mark.parametrize("family, fused", [("qwen2", True), ("llama", True), ("qwen3", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_decode_step_samples_what_the_layer_by_layer_step_does(
        policy, family, fused, dtype, monkeypatch):
    """``decode_step.fused_step`` (stacked q/k/v and gate/up products, a rotary table,
    attention with an additive mask over the cache seen as rows x kv heads) gives the
    tokens and log-probs of ``StaticDecoder``'s layer-by-layer step, through compaction
    (rows dropped, the mask bias remade) and per family; Qwen3's per-head q/k norms are
    not its layout, so there the decoder keeps its own step."""
    from llm_experiments.policy import direct
    _, tok = policy
    model = _family(family, len(tok)).to(dtype)
    assert (decode_step.fusable(model) is not None) == fused
    prompts = [tok.encode(t, add_special_tokens=False)
               for t in ["12+34=", "1+2=", "12+34=", "99+9=", "7+7=", "1+2="]]
    own_init = direct.StaticDecoder.__init__
    steps = []

    def init(self, *args, off=False, **kwargs):
        own_init(self, *args, **kwargs)
        steps.append(self.fused is not None)
        if off:
            self.fused = None

    def sample(off: bool):
        monkeypatch.setattr(direct.StaticDecoder, "__init__",
                            lambda self, *a, **k: init(self, *a, off=off, **k))
        sampler = HFSampler(model, eos_id=tok.encode("5", add_special_tokens=False)[0],
                            pad_id=tok.pad_token_id, compact_below=1.0, graphs="off")
        return sampler.generate(prompts, max_new_tokens=12, temperature=1.0, seed=3)
    got, want = sample(off=False), sample(off=True)
    assert steps == [fused, fused]
    assert (got.lengths < 12).any() and (got.lengths == 12).any()  # some rows were dropped
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs,
                               atol=1e-6 if dtype == torch.float32 else 2e-2)


@pytest.mark.skipif(decode_step.cxx_compiler() is None, reason="inductor needs a C++ compiler")
@pytest.mark.parametrize("kernel", ["default", "onednn"])
def test_the_compiled_decode_step_samples_what_the_eager_one_does(policy, kernel):
    """``sampler.compile_step`` (``decode_step.compiled_step``): the eager fused step's
    tokens, its log-probs to float32 rounding, through compaction and over calls of other
    row counts and lengths. Once the first call has compiled, neither a compaction nor a
    call of another row count (one row included) compiles again; a new length compiles
    once more, and not at the next one. With oneDNN's linear layers (the sampler's kernel on
    AVX-512 CPUs) too, which inductor cannot lower."""
    if kernel == "onednn" and not onednn_available():
        pytest.skip("oneDNN's linear kernel does not run here")
    torch._dynamo.reset()  # the compile counts below start from nothing, in any test order
    _, tok = policy
    model = _family("qwen2", len(tok))
    if kernel == "onednn":
        assert use_onednn_linear(model) > 0
    prompts = [tok.encode(t, add_special_tokens=False)
               for t in ["12+34=", "1+2=", "12+34=", "99+9=", "7+7=", "1+2="]]
    eos = tok.encode("5", add_special_tokens=False)[0]
    samplers = [HFSampler(model, eos_id=eos, pad_id=tok.pad_token_id, graphs="off",
                          compile_step=on) for on in (True, False)]
    calls = [(prompts, 12, True), (prompts[:1], 12, False), (prompts[:3] * 3, 12, False),
             (prompts[1:], 15, True), (prompts[2:], 18, False)]  # rows, length, may compile
    for call, (rows, new, compiles) in enumerate(calls):
        with torch._dynamo.config.patch(error_on_recompile=not compiles):
            got, want = (s.generate(rows, max_new_tokens=new, temperature=1.0, seed=call)
                         for s in samplers)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
        assert len(rows) == 1 or len(set(got.lengths)) > 1  # later calls drop the finished
        for s in samplers:  # (the first call keeps its rows)
            s.compact_below = 1.0


def test_compile_step_without_a_cxx_compiler_is_refused_in_one_line(policy, monkeypatch):
    """Inductor would fail deep inside the first step; the sampler says why at once."""
    from llm_experiments.samplers import hf
    monkeypatch.setattr(hf, "cxx_compiler", lambda: None)
    with pytest.raises(ValueError, match=r"^compile_step=True needs a C\+\+ compiler"):
        HFSampler(policy[0], eos_id=0, pad_id=0, compile_step=True)
    HFSampler(policy[0], eos_id=0, pad_id=0)  # off: no compiler needed


@pytest.mark.parametrize("capability, switched", [("AVX512", True), ("AVX2", False),
                                                  ("DEFAULT", False)])
def test_fast_kernels_take_onednn_only_on_a_cpu_where_it_was_measured_faster(
        policy, monkeypatch, capability, switched):
    """``run.fast_kernels`` (``kernels.use_fast_linear``) switches a model's linear layers to
    oneDNN on AVX-512 CPUs (1.5-1.8x there) and leaves torch's kernel on AVX2 ones (0.92-0.97x
    there, ``benchmarks/results/machine_limit*.json``)."""
    from llm_experiments.policy import kernels
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(kernels, "onednn_available", lambda: True)
    model = copy.deepcopy(policy[0])
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert kernels.use_fast_linear(model) == (linears if switched else 0)
    assert any(type(m) is kernels.OneDNNLinear for m in model.modules()) == switched
