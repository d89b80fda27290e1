"""Decoding without per-token host syncs (issue 28, item 3): completion checked every k
tokens, finished rows compacted out of the cache, inverse CDFs without a float64 sum over the
vocabulary, vLLM's memory share and eager mode from the config."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

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


def eos_prone_sampler(model, tok, **kw):
    """A sampler whose end-of-sequence logit is raised, so rows finish at different steps."""
    s = hf.HFSampler(model, tok.eos_token_id, tok.pad_token_id, **kw)
    with torch.no_grad():
        s.model.lm_head.weight[tok.eos_token_id] += 0.05 * s.model.lm_head.weight.norm(
            dim=1).mean()
    return s


class CountingDecoder(hf.StaticDecoder):
    """A static decoder that counts the row-steps it decodes (rows x steps) and checks that
    every compaction drops a row (a copy of the cache that drops none is waste)."""

    row_steps = 0

    def step(self, tok, pos, t):
        CountingDecoder.row_steps += tok.shape[0]
        return super().step(tok, pos, t)

    def keep(self, rows):
        assert 0 < len(rows) < self.valid.shape[0]
        return super().keep(rows)


def test_compacting_finished_rows_keeps_every_sample_and_saves_row_steps(monkeypatch):
    """Dropping finished rows from the cache changes no token, log-prob, length or finished
    flag (bitwise; each row keeps its own uniforms), for several check intervals k and
    thresholds, with the seed's draws or given uniforms; it decodes fewer row-steps."""
    monkeypatch.setattr(hf, "StaticDecoder", CountingDecoder)
    model, tok = tiny_policy(32, 2, 64)
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]] * 8
    given = np.random.default_rng(1).random((len(prompts), 16))
    for k in (1, 3, 5):
        monkeypatch.setitem(hf.CHECK_EVERY, "cpu", k)
        for uniforms in (None, given):
            runs, steps = {}, {}
            for below in (0.0, 0.5, 0.75, 1.0):
                CountingDecoder.row_steps = 0
                runs[below] = eos_prone_sampler(model, tok, compact_below=below).generate(
                    prompts, max_new_tokens=16, temperature=1.0, seed=3, uniforms=uniforms)
                steps[below] = CountingDecoder.row_steps
            ref = runs[0.0]
            assert ref.lengths.min() <= 4 and ref.lengths.max() >= 12
            for below, gen in runs.items():
                for field in ("tokens", "logprobs", "lengths", "finished"):
                    np.testing.assert_array_equal(getattr(gen, field), getattr(ref, field))
            assert max(steps[0.5], steps[0.75], steps[1.0]) < steps[0.0]
            # compact_below=1 drops rows at every check: exactly the live rows' steps, plus
            # those that ended between checks.
            assert steps[1.0] <= int(ref.lengths.sum()) + len(prompts) * (k - 1)


def test_compaction_through_the_generic_forward_keeps_every_sample():
    """The generic decoder (any architecture) drops rows from the model's own cache object
    with the same result."""
    model, tok = tiny_policy(32, 2, 64)
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]] * 4
    gens = [eos_prone_sampler(model, tok, direct=False, compact_below=below).generate(
        prompts, max_new_tokens=12, temperature=1.0, seed=5) for below in (0.0, 1.0)]
    assert len(set(gens[0].lengths.tolist())) > 1
    for field in ("tokens", "logprobs", "lengths", "finished"):
        np.testing.assert_array_equal(getattr(gens[1], field), getattr(gens[0], field))


def test_compaction_and_cdf_settings_come_from_the_config():
    """sampler.compact_below and sampler.cdf_dtype reach the HF sampler; bad values name the
    key."""
    from llm_experiments.config import load_config
    from llm_experiments.samplers.make import make_sampler
    model, tok = tiny_policy(32, 2, 64)
    s = make_sampler(load_config("cpu_tiny", ["sampler.compact_below=0.5",
                                              "sampler.cdf_dtype=blocked"]), model, tok)
    assert s.compact_below == 0.5 and s.cdf == "blocked"
    with pytest.raises(ValueError, match="sampler.compact_below"):
        load_config("cpu_tiny", ["sampler.compact_below=1.5"])
    with pytest.raises(ValueError, match="sampler.cdf_dtype"):
        load_config("cpu_tiny", ["sampler.cdf_dtype=float16"])
    with pytest.raises(ValueError, match="compact_below"):
        hf.HFSampler(model, 0, 0, compact_below=-0.1)


def test_float32_inverse_cdfs_pick_the_float64_token():
    """Over a 151,936-token vocabulary a float32 cumulative sum picks the float64 sum's
    token for all but a small share of uniforms (those within float32 error of a bin edge);
    the blocked sum for all but a far smaller one."""
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(3 * torch.randn(64, 151_936, generator=g), -1)
    u = torch.rand(64, generator=g, dtype=torch.float64)
    same32, same_blocked = [], []
    for shift in torch.linspace(0, 0.99, 32, dtype=torch.float64):
        uu = (u + shift) % 1
        ref = hf.inverse_cdf(logp, uu)
        same32.append(hf.inverse_cdf(logp, uu, torch.float32) == ref)
        same_blocked.append(hf.blocked_inverse_cdf(logp, uu) == ref)
    assert float(torch.stack(same32).float().mean()) > 0.99
    assert bool(torch.stack(same_blocked).all())


def edge_shift(cdf_ref: torch.Tensor, cdf: torch.Tensor) -> float:
    """Sum over bin edges of |normalised edge - reference edge|: a bound on the chance that
    one uniform picks different tokens under the two cdfs."""
    return float((cdf / cdf[-1] - cdf_ref / cdf_ref[-1]).abs().sum())


def test_blocked_sum_moves_bin_edges_far_less_than_a_float32_sum():
    """The error stated in ``blocked_inverse_cdf``: over 151,936 tokens the edges of the
    blocked cdf move by < 2e-4 in all, over 10x less than a float32 sum's (> 1e-3)."""
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(3 * torch.randn(151_936, generator=g), -1)
    ref = torch.cumsum(p.double(), 0)
    block = 1024
    inner = torch.cumsum(torch.nn.functional.pad(p, (0, -len(p) % block)).view(-1, block), 1)
    starts = torch.cumsum(inner[:, -1].double(), 0) - inner[:, -1].double()
    blocked = (starts[:, None] + inner.double()).flatten()[:len(p)]
    flat32 = edge_shift(ref, torch.cumsum(p, 0).double())
    assert edge_shift(ref, blocked) < min(2e-4, flat32 / 10) and flat32 > 1e-3


def fast_draw(method, logp, u):
    """Tokens drawn by a float32 sum over the vocabulary or by 16-token blocks."""
    if method == "float32":
        return hf.inverse_cdf(logp, u, torch.float32)
    return hf.blocked_inverse_cdf(logp, u, block=16)


@pytest.mark.parametrize("method", ["float32", "blocked"])
def test_fast_inverse_cdfs_draw_the_exact_distribution(method):
    """Chi-square goodness of fit of 100,000 seeded draws from a fixed categorical over 300
    tokens (blocks of 16: many blocks; some tokens of probability 0) against the exact
    probabilities; a zero-probability token is never drawn."""
    g = torch.Generator().manual_seed(2)
    logits = 2 * torch.randn(300, generator=g)
    logits[::7] = float("-inf")
    logp = torch.log_softmax(logits, -1)
    u = torch.rand(100_000, generator=g, dtype=torch.float64)
    tok = fast_draw(method, logp.expand(len(u), -1), u)
    counts = torch.bincount(tok, minlength=300).double()
    p = logp.exp().double()
    assert counts[p == 0].sum() == 0
    expected = p * len(u)
    big = expected >= 5  # chi-square needs >= 5 expected per cell; the rest is one cell
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    assert stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()
                           ).pvalue > 1e-3


@pytest.mark.parametrize("method", ["float32", "blocked"])
def test_uniforms_at_the_ends_never_pick_a_zero_probability_token(method):
    """u = 0 with leading zero-probability tokens, and u just below 1 (1.0 in float32) with
    trailing ones, land on tokens of positive probability."""
    logits = torch.full((2, 300), float("-inf"))
    logits[:, 100:200] = torch.randn(100)
    logp = torch.log_softmax(logits, -1)
    u = torch.tensor([0.0, 1 - 1e-12], dtype=torch.float64)
    tok = fast_draw(method, logp, u)
    assert tok.tolist() == [100, 199]


@pytest.mark.parametrize("cdf", ["float32", "blocked"])
def test_fast_cdfs_record_the_exact_logprob_of_the_chosen_token(cdf):
    """Whatever token a float32 path picks, its recorded log-prob is that token's under the
    exact sampling distribution (a full forward's recomputation)."""
    from llm_helpers import recomputed_logprobs
    model, tok = tiny_policy(32, 2, 64)
    s = hf.HFSampler(model, tok.eos_token_id, tok.pad_token_id, cdf=cdf)
    gen = s.generate([[3, 4, 5], [6, 7]] * 4, max_new_tokens=10, temperature=1.0, seed=0)
    for i, prompt in enumerate([[3, 4, 5], [6, 7]] * 4):
        want = recomputed_logprobs(model, prompt, gen.completion(i))
        np.testing.assert_allclose(gen.logprobs[i, :gen.lengths[i]], want, atol=1e-5)


def test_vllm_settings_come_from_the_config(monkeypatch):
    """sampler.vllm_gpu_memory and sampler.vllm_eager reach the engine (the memory share
    only on a GPU run)."""
    from llm_experiments.config import load_config
    from llm_experiments.samplers.make import make_sampler
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


# Static-shape steps kept across calls (samplers.graphs): what the CUDA graphs replay.
GRAPH_PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11]] * 4


def same_samples(a, b):
    """Two generations with the same tokens, lengths and finished flags, and log-probs equal
    to float32 rounding (a step over a longer, masked span sums in another order)."""
    for field in ("tokens", "lengths", "finished"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.parametrize("blocks", [(64, 128), (4, 8)])
@pytest.mark.parametrize("k,below", [(1, 0.0), (3, 1.0), (16, 0.5)])
def test_static_shape_steps_sample_what_the_static_cache_samples(monkeypatch, k, below, blocks):
    """With the shipped width and span blocks, and with small ones (rows then cross up to five
    spans of a 4 + 40-column cache), with and without compaction to halvings of the rows,
    the static-shape step samples the growing-slice decoder's tokens."""
    from llm_experiments.samplers import graphs
    monkeypatch.setitem(hf.CHECK_EVERY, "cpu", k)
    monkeypatch.setattr(graphs, "WIDTH_BLOCK", blocks[0])
    monkeypatch.setattr(graphs, "SPAN_BLOCK", blocks[1])
    model, tok = tiny_policy(32, 2, 64)
    ref = eos_prone_sampler(model, tok, graphs="off").generate(
        GRAPH_PROMPTS, max_new_tokens=40, temperature=1.0, seed=3)
    assert ref.lengths.min() <= 4 and ref.lengths.max() >= 25
    graphed = eos_prone_sampler(model, tok, graphs="on", compact_below=below)
    same_samples(graphed.generate(GRAPH_PROMPTS, max_new_tokens=40, temperature=1.0, seed=3),
                 ref)
    assert graphed._graphed.shape == (16, blocks[0], 40)  # 12 rows run as a bucket of 16


def test_graphed_decoder_keeps_its_cache_across_calls_and_weight_versions(monkeypatch):
    """Calls of other sizes share one cache (issue 38 N3: each new row count or max_new
    reallocated it, 12 times in 8 steps of a small run): other prompts, fewer rows, fewer
    new tokens reuse it; only a call larger than every earlier one (a longer prompt, more
    rows) replaces it, with the old cache freed before the new one is allocated; a call
    pads its prompts to its own width. Every call samples what a fresh decoder does, also
    after the weights change in place."""
    import gc
    import weakref

    from llm_experiments.samplers import WeightUpdate, graphs
    model, tok = tiny_policy(32, 2, 64)
    graphed = eos_prone_sampler(model, tok, graphs="on", compact_below=0.5)
    allocations, alive_at_allocation = [], []
    allocate = graphs.DecodeCache.allocate

    def watched(*args, **kwargs):
        gc.collect()
        alive_at_allocation.extend(ref() is not None for ref in allocations)
        cache = allocate(*args, **kwargs)
        allocations.append(weakref.ref(cache.keys[0]))
        return cache

    def check(prompts, seed, max_new=40):
        want = eos_prone_sampler(model, tok, graphs="off").generate(
            prompts, max_new_tokens=max_new, temperature=1.0, seed=seed)
        # Only the graphed decoder's allocations are watched (the reference's own cache
        # is allocated above).
        monkeypatch.setattr(graphs.DecodeCache, "allocate", watched)
        try:
            got = graphed.generate(prompts, max_new_tokens=max_new, temperature=1.0, seed=seed)
        finally:
            monkeypatch.setattr(graphs.DecodeCache, "allocate", allocate)
        same_samples(got, want)
        return len(allocations), graphed._graphed.shape
    assert check(GRAPH_PROMPTS, 0) == (1, (16, 64, 40))  # 12 rows: a bucket of 16
    assert check([p[::-1] + [5] for p in GRAPH_PROMPTS], 1) == (1, (16, 64, 40))
    assert check(GRAPH_PROMPTS[:5], 2) == (1, (16, 64, 40))  # fewer rows: the first 8
    assert check(GRAPH_PROMPTS[:3], 3, max_new=12) == (1, (16, 64, 40))  # fewer new tokens
    assert check([[3] * 70] + GRAPH_PROMPTS[1:], 4) == (2, (16, 128, 40))  # a longer prompt
    assert check(GRAPH_PROMPTS * 2, 5) == (3, (32, 128, 40))  # 24 rows: a bucket of 32
    # Short prompts after a long one: their own width, not the widest call's.
    assert check(GRAPH_PROMPTS, 7) == (3, (32, 128, 40)) and graphed._graphed.width == 64
    assert alive_at_allocation == [False, False, False]  # each old cache freed first
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    graphed.load_weights(WeightUpdate(version=1, state=state))
    with torch.no_grad():  # eos_prone_sampler raises the copy's eos logit again
        graphed.model.lm_head.weight[tok.eos_token_id] += 0.05 * graphed.model.lm_head.weight.norm(
            dim=1).mean()
    assert check(GRAPH_PROMPTS[:5], 6) == (3, (32, 128, 40))


class FakeCuda:
    """Stand-ins for the torch.cuda calls of ``GraphedDecoder`` that record on which device
    each stream is made, and which device is current (``torch.cuda.device``) when a graph
    is captured or replayed; a captured step runs eagerly, a replay does nothing."""

    def __init__(self):
        self.current = [None]  # stack of devices entered; None: the process's current one
        self.streams, self.captures, self.replays = [], [], []

    def install(self, monkeypatch):
        from contextlib import contextmanager
        fake = self

        class Stream:
            def __init__(self, device=None):
                self.device = device
                fake.streams.append(device)

            def wait_stream(self, other):
                pass

        class Graph:
            def replay(self):
                fake.replays.append(fake.current[-1])

        @contextmanager
        def device(d):
            fake.current.append(d)
            try:
                yield
            finally:
                fake.current.pop()

        @contextmanager
        def graph(g, pool=None, stream=None, capture_error_mode="global"):
            fake.captures.append((fake.current[-1], stream.device if stream else None))
            yield

        for name, value in {"Stream": Stream, "CUDAGraph": Graph, "device": device,
                            "graph": graph, "graph_pool_handle": lambda: None,
                            "current_stream": lambda d=None: Stream(d),
                            "stream": lambda st: device(fake.current[-1])}.items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_graphs_are_captured_and_replayed_on_the_caches_device(monkeypatch):
    """Issue 38 N2: capture and replay run under the decoder's device (``run.device``, e.g.
    cuda:1) with streams made on it, not on the current device (cuda:0 by default), where a
    capture fails or records an empty graph. Without a GPU: recorded by stand-ins, with the
    CPU standing for the run's device."""
    from llm_experiments.samplers.graphs import GraphedDecoder
    fake = FakeCuda()
    fake.install(monkeypatch)
    model, tok = tiny_policy(32, 2, 64)
    decoder = GraphedDecoder(model, capture=True).start(GRAPH_PROMPTS, 5, tok.pad_token_id,
                                                        "cpu")
    with torch.no_grad():
        logits, pos = decoder.prefill(), decoder.next_positions()
        for t in range(3):
            decoder.step(logits.argmax(-1, keepdim=True), pos + t, t)
    here = torch.device("cpu")
    assert fake.captures and all(c == (here, here) for c in fake.captures)
    assert len(fake.replays) == 3 and set(fake.replays) == {here}
    assert set(fake.streams) == {here}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_graphs_on_the_second_gpu_sample_what_eager_steps_sample():
    """On cuda:1, while cuda:0 is the current device, the captured steps sample the eager
    static-shape steps' tokens (issue 38 N2: every token after the first came from stale
    logits)."""
    model, tok = tiny_policy(32, 2, 64)
    model = model.to("cuda:1")
    eager = eos_prone_sampler(model, tok, graphs="off", cdf="float64")
    graphed = eos_prone_sampler(model, tok, graphs="on", cdf="float64", compact_below=0.5)
    torch.cuda.set_device(0)
    same_samples(graphed.generate(GRAPH_PROMPTS, max_new_tokens=150, temperature=1.0, seed=0),
                 eager.generate(GRAPH_PROMPTS, max_new_tokens=150, temperature=1.0, seed=0))


def test_row_buckets_are_powers_of_two():
    from llm_experiments.samplers.graphs import row_bucket
    assert [row_bucket(n) for n in (1, 2, 3, 5, 8, 9, 256, 257)] == [1, 2, 4, 8, 8, 16, 256, 512]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=300))
def test_kept_rows_are_the_live_ones_padded_to_a_halving(alive):
    """Every unfinished row is kept; the count is the smallest ceil(n / 2^k) that holds
    them, so a run's compactions meet at most log2(n) + 1 row counts."""
    from llm_experiments.samplers.graphs import kept_rows
    mask = torch.tensor(alive)
    n, live = len(alive), sum(alive)
    kept = kept_rows(mask, n)
    halvings = [n]
    while halvings[-1] > 1:
        halvings.append(-(-halvings[-1] // 2))
    fits = [h for h in halvings if h >= live]
    assert len(kept) == min(fits) and kept.tolist() == sorted(set(kept.tolist()))
    assert set(mask.nonzero().squeeze(-1).tolist()) <= set(kept.tolist())


def test_decode_graphs_come_from_the_config():
    """sampler.decode_graphs reaches the HF sampler; a bad value names the key."""
    from llm_experiments.config import load_config
    from llm_experiments.samplers.make import make_sampler
    model, tok = tiny_policy(32, 2, 64)
    for value, want in (("on", "on"), ("off", "off"), ("auto", "auto")):
        assert make_sampler(load_config("cpu_tiny", [f"sampler.decode_graphs={value}"]), model,
                            tok).graphs == want
    with pytest.raises(ValueError, match="sampler.decode_graphs"):
        load_config("cpu_tiny", ["sampler.decode_graphs=sometimes"])
    with pytest.raises(ValueError, match="graphs"):
        hf.HFSampler(model, 0, 0, graphs="always")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_sample_what_eager_steps_sample():
    """On a GPU the captured steps sample the eager static-shape steps' tokens, and a second
    call replays the graphs of the first (none captured anew)."""
    model, tok = tiny_policy(32, 2, 64)
    model = model.cuda()
    eager = eos_prone_sampler(model, tok, graphs="off", cdf="float64")
    graphed = eos_prone_sampler(model, tok, graphs="on", cdf="float64", compact_below=0.5)
    for seed in (0, 1):
        same_samples(graphed.generate(GRAPH_PROMPTS, max_new_tokens=150, temperature=1.0,
                                      seed=seed),
                     eager.generate(GRAPH_PROMPTS, max_new_tokens=150, temperature=1.0,
                                    seed=seed))
        if seed == 0:
            captured = set(graphed._graphed.graphs)
    assert captured and set(graphed._graphed.graphs) >= captured


def test_a_static_step_runs_the_same_kernels_on_the_same_shapes_without_host_syncs():
    """What a CUDA graph needs, checked on CPU: two steps in one span dispatch the same ops
    on the same shapes (the column moves in a tensor, not in a shape), and none reads a
    value back to the host or has a data-dependent shape."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from llm_experiments.samplers.graphs import GraphedDecoder

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            self.calls.append((str(func), shapes))
            return func(*args, **(kwargs or {}))

    def trace(decoder):
        with torch.no_grad():
            logits = decoder.prefill()
            pos = decoder.next_positions()
            traces = []
            for t in (0, 1, 2):
                with Record() as rec:
                    logits = decoder.step(logits.argmax(-1, keepdim=True), pos + t, t)
                traces.append(rec.calls)
        return traces

    model, tok = tiny_policy(32, 2, 64)
    cpu = torch.device("cpu")
    traces = trace(GraphedDecoder(model, capture=False).start(GRAPH_PROMPTS, 40,
                                                              tok.pad_token_id, cpu))
    assert traces[0] == traces[1] == traces[2] and len(traces[1]) > 20
    # The growing-slice decoder fails the check: its attention widens every step.
    sliced = trace(hf.StaticDecoder(model, GRAPH_PROMPTS, 40, tok.pad_token_id, cpu))
    assert sliced[1] != sliced[2]
    ops = {name for name, _ in traces[1]}
    syncing = {"aten._local_scalar_dense.default", "aten.nonzero.default",
               "aten.masked_select.default", "aten.item.default"}
    assert not ops & syncing, ops & syncing
