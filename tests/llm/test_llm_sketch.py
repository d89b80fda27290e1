"""The probes' gradient sketch (probe.sketch_dim; theory.md section 8.1.1): the count sketch is
unbiased with the stated variance, a sketched probe run agrees with the exact one within the
bound z sqrt(2/k) x scale, and what the probes keep has k, not P, entries per gradient."""

import os

import numpy as np
import pytest
import torch

from llm_helpers import small_config, tiny_policy
from llm_experiments.engines import checkpoint
from llm_experiments.rl.gradients import per_sample_grads
from llm_experiments.rl.losses import TokenBatch
from llm_experiments.engines.metrics import TIMING_KEYS, read_jsonl
from llm_experiments.engines.experiment import run_experiment
from llm_experiments.probing.sketch import CountSketch, Exact, projection
from replaytheory.fit.probes import ProbeSet

K = 1024
Z = 5.0  # per row: P(|error| > Z sd) <= 1/Z^2 = 4% by Chebyshev; far less for a near-normal error
ARGS = ["run.steps=7", "probe.every=3", "probe.buffer_groups=16", "probe.reuse_gaps=[1]",
        "probe.panel_groups=2", "probe.panel_births=[0]", "probe.panel_gaps=[3]",
        "schedule.mu_accounting=2.0"]


def test_blocks_passes_and_cache_do_not_change_the_sketch():
    gen = torch.Generator().manual_seed(0)
    blocks = [torch.randn(3, 10, 7, generator=gen), torch.randn(3, 33, generator=gen)]
    flat = torch.cat([b.reshape(3, -1) for b in blocks], 1)
    whole = CountSketch(16, 2).rows([flat])
    assert whole.shape == (3, 16)
    assert torch.equal(CountSketch(16, 2, coords_per_pass=5, cache_coords=0).rows(blocks), whole)
    assert torch.allclose(CountSketch(16, 2).vector(flat[0] + flat[1]), whole[0] + whole[1],
                          atol=1e-5)  # linear
    assert not torch.equal(CountSketch(16, 3).rows([flat]), whole)  # the seed picks S
    assert torch.equal(Exact().vector(flat[0]), flat[0]) and torch.equal(Exact.rows(blocks), flat)


def test_unbiased_with_the_stated_variance():
    """Over seeds, <Sa, Sb> has mean <a, b> and variance
    (|a|^2 |b|^2 + <a, b>^2 - 2 sum a_i^2 b_i^2) / k (theory.md section 8.1.1)."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(3000, generator=gen).double()
    b = (0.5 * a + torch.randn(3000, generator=gen).double())
    k, seeds = 32, 1500
    est = np.array([float(CountSketch(k, s).vector(a.float()).double()
                          @ CountSketch(k, s).vector(b.float()).double()) for s in range(seeds)])
    exact = float(a @ b)
    var = float((a @ a) * (b @ b) + exact ** 2 - 2 * (a ** 2 @ b ** 2)) / k
    assert abs(est.mean() - exact) < 4 * np.sqrt(var / seeds)
    assert 0.85 < est.var() / var < 1.15  # sd of a sample variance of 1500 ~ 4%
    sq = np.array([float(CountSketch(k, s).vector(a.float()).double().square().sum())
                   for s in range(300)])
    assert abs(sq.mean() - float(a @ a)) < 4 * np.sqrt(2 * float(a @ a) ** 2 / k / 300)


def test_bad_dims_name_the_field():
    with pytest.raises(ValueError, match="probe.sketch_dim"):
        CountSketch(0, 1)
    with pytest.raises(ValueError, match="probe.sketch_dim"):
        small_config("probe.sketch_dim=-1")
    assert isinstance(projection(0, 1), Exact) and projection(8, 1).dim == 8


def test_per_sample_sketches_have_k_columns_at_any_size():
    """Per-sequence sketches are (n, k) whatever P; exact ones are (n, P)."""
    for hidden in (16, 48):
        model, tok = tiny_policy(hidden, 1, 2 * hidden)
        P = sum(p.numel() for p in model.parameters())
        ids = torch.randint(1, len(tok), (3, 6), generator=torch.Generator().manual_seed(0))
        batch = TokenBatch(ids[:, 1:], torch.ones(3, 5, dtype=torch.bool), torch.zeros(3, 5),
                           torch.tensor([1.0, -1.0, 0.5]), input_ids=ids[:, :-1],
                           index=torch.arange(5).expand(3, 5))
        exact = torch.cat([g for _, g in per_sample_grads(model, batch, {}, 1.0, chunk=2)])
        sk = CountSketch(64, 5)
        sketched = torch.cat([g for _, g in per_sample_grads(model, batch, {}, 1.0, chunk=2,
                                                             project=sk)])
        assert exact.shape == (3, P) and sketched.shape == (3, 64)
        assert torch.allclose(sketched, sk.rows([exact]), atol=1e-5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for k in (0, K):
        path = str(tmp_path_factory.mktemp("runs") / f"sketch{k}")
        run_experiment(small_config(*ARGS, f"probe.sketch_dim={k}"), path)
        out[k] = path
    return out


def _tables(path):
    return ProbeSet.load(os.path.join(path, "probes.npz")).tables


def _within(est, exact, scale):
    """|est - exact| <= Z sqrt(2/K) scale row by row, and the rms of the standardised errors is
    at most 1.5 (its expectation is at most 1)."""
    z = (est - exact) / (np.sqrt(2 / K) * scale)
    assert len(z) > 0
    assert np.all(np.abs(z) <= Z), np.abs(z).max()
    assert np.sqrt(np.mean(z ** 2)) <= 1.5


def test_sketched_tables_agree_with_exact_ones(runs):
    ex, sk = _tables(runs[0]), _tables(runs[K])
    for name in ex:
        assert len(ex[name]["probe_step"]) == len(sk[name]["probe_step"]), name
    n0, n1 = ex["noise"], sk["noise"]
    assert np.array_equal(n0["staleness"], n1["staleness"])
    assert not np.array_equal(n0["sq_noise"], n1["sq_noise"])  # the sketch is in use
    _within(n1["sq_noise"], n0["sq_noise"], n0["sq_noise"])
    c0, c1 = ex["coupling"], sk["coupling"]
    _within(c1["mean_inner"], c0["mean_inner"], c0["mean_sq"])
    _within(c1["mean_sq"], c0["mean_sq"], c0["mean_sq"])
    r0, r1 = ex["reuse"], sk["reuse"]
    _within(r1["inner"], r0["inner"], np.sqrt(r0["sq_now"] * r0["sq_then"]))
    p0, p1 = ex["panel"], sk["panel"]
    _within(p1["inner_birth"], p0["inner_birth"], np.sqrt(p0["sq_noise"] * p0["sq_birth"]))
    d0, d1 = ex["diversity"], sk["diversity"]
    _within(d1["within_inner"], d0["within_inner"], d0["mean_sq"])
    _within(d1["across_inner"], d0["across_inner"], d0["mean_sq"])
    b0, b1 = ex["bias"], sk["bias"]
    _within(b1["noise_sq"], b0["noise_sq"], b0["noise_sq"])
    m0, m1 = ex["minibatch"], sk["minibatch"]
    _within(m1["sq_error"], m0["sq_error"], m0["sq_error"])


def test_kept_gradients_scale_with_k_and_the_run_is_unchanged(runs):
    """The probes' checkpointed state keeps each gradient (previous and reuse references) as a
    k-vector in the sketched run and a P-vector in the exact one; only theta is P-long."""
    metrics = {}
    for k, path in runs.items():
        state = checkpoint.load(os.path.join(path, "checkpoint"))
        P = sum(v.numel() for v in state["model"].values())
        g_prev, _, theta = state["probes"]["prev"]
        kept = [g_prev, *state["probes"]["refs"].values()]
        assert len(kept) >= 2 and theta.numel() == P
        assert all(g.numel() == (k or P) for g in kept)
        metrics[k] = [{key: v for key, v in rec.items() if key not in TIMING_KEYS}
                      for rec in read_jsonl(os.path.join(path, "metrics.jsonl"))]
    assert K < P / 10
    assert metrics[0] == metrics[K]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_sketch_is_the_cpu_sketch():
    """Same seed, same S on a GPU: integer hashes agree exactly, sums to float32 rounding."""
    sk = CountSketch(256, 7)
    x = torch.randn(4, 50_000, generator=torch.Generator().manual_seed(3))
    for a, b in zip(sk._hash(0, 50_000, "cpu"), sk._hash(0, 50_000, "cuda")):
        assert torch.equal(a, b.cpu())
    assert torch.allclose(sk.rows([x.cuda()]).cpu(), sk.rows([x]), atol=1e-4)
