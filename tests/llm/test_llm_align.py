"""Align panels (probe.align_groups; theory.md section 11.15) on a small run: the rows of each
measurement, their inner products against per-sequence gradients, the fit's check at gap 0,
the run left unchanged, a resumed run bitwise equal, and the config's ranges."""

import os

import numpy as np
import pytest
import torch

from llm_helpers import small_config
from llm_experiments.engines.experiment import run_experiment
from llm_experiments.engines.metrics import TIMING_KEYS, read_jsonl
from replaytheory.fit.align_fit import fit_align
from replaytheory.fit.probes import SCHEMA, ProbeSet

ALIGN = ["probe.align_groups=4", "probe.align_chunks=2", "probe.align_ref_groups=6",
         "probe.panel_births=[0, 2]", "probe.panel_gaps=[1, 3]"]
ARGS = ["run.steps=6", "schedule.mu_accounting=2.0"]


@pytest.fixture(scope="module")
def align_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("runs") / "align")
    run_experiment(small_config(*ARGS, *ALIGN), out)
    return out, ProbeSet.load(os.path.join(out, "probes.npz"))


def test_align_rows_of_each_measurement(align_run):
    """Births 0 and 2, each measured at gaps 0, 1 and 3: per measurement 2 x 2 panel-by-
    reference inner products and the one pair of the 2 reference chunks (3 groups each)."""
    _, ps = align_run
    t = ps.tables["align"]
    pairs = set(zip(t["birth_step"].astype(int), t["gap"].astype(int)))
    assert pairs == {(0, 0), (0, 1), (0, 3), (2, 0), (2, 1), (2, 3)}
    assert np.all(t["probe_step"] == t["birth_step"] + t["gap"])
    for b, g in pairs:
        here = (t["birth_step"] == b) & (t["gap"] == g)
        assert (here & (t["part"] == 0)).sum() == 2 * 2 and (here & (t["part"] == 1)).sum() == 1
        ref = here & (t["part"] == 1)
        assert np.all(t["chunk"][ref] < t["other"][ref])
    assert set(t["n_seq"][t["part"] == 0]) == {4 * 4} and set(t["n_seq"][t["part"] == 1]) == {24}
    fit = fit_align(ps, n_boot=50)
    assert fit.pooled.gaps == (0.0, 1.0, 3.0) and set(fit.by_birth) == {0, 2}
    assert fit.n_seq == 16 and np.isfinite(fit.pooled.value).all()


def test_a_chunk_mean_gradient_is_the_mean_of_its_sequences_gradients(tmp_path):
    """What the estimator rests on: the gradient of a chunk's mean loss is the mean of its
    per-sequence gradients (the panels' per-sample gradients, ``per_sample_grads``).

    Both sides are float32 sums of the same terms in different orders, so they agree to a
    few float32 roundings of the largest term, not elementwise: an element near 0 can be off
    by ~eps x the largest per-sequence gradient (issue 38: 5.8e-7 on another CPU). The
    tolerance is 32 eps of that scale (here ~6e-5 against a largest term of ~16; a wrong
    mean or normalisation would be off by the gradients' own size, ~1)."""
    from llm_experiments.engines.experiment import Experiment
    from llm_experiments.probing.align import AlignProbe
    exp = Experiment(small_config(*ARGS, *ALIGN), str(tmp_path))
    probe = AlignProbe(exp.prober)
    rollouts = probe._fresh(4, np.random.default_rng(0))
    per = exp.prober.seq_grads(rollouts).double()
    eps = torch.finfo(torch.float32).eps
    for k, (grads, _) in enumerate(probe._chunk_means(rollouts)):  # 2 chunks of 2 groups
        chunk = per[8 * k:8 * (k + 1)]
        torch.testing.assert_close(grads[0], chunk.mean(0), rtol=0,
                                   atol=32 * eps * float(chunk.abs().max()))


def test_align_panels_leave_the_run_unchanged(align_run, tmp_path):
    out, _ = align_run
    plain = str(tmp_path / "plain")
    run_experiment(small_config(*ARGS), plain)

    def strip(path):
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS}
                for r in read_jsonl(os.path.join(path, "metrics.jsonl"))]
    assert strip(out) == strip(plain)


def test_a_resumed_run_measures_the_same_align_rows(align_run, tmp_path):
    """Stopped after step 3 (panel 0 measured at gaps 0 and 1, panel 2 born) and resumed:
    the align rows equal the uninterrupted run's."""
    import dataclasses

    from llm_experiments.config import save_config
    from llm_experiments.engines.experiment import Experiment
    _, whole = align_run
    cfg, part = small_config(*ARGS, *ALIGN), str(tmp_path / "part")
    os.makedirs(part)
    save_config(cfg, os.path.join(part, "config.yaml"))
    Experiment(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, steps=3)), part).run()
    run_experiment(cfg, part, resume=True)
    resumed = ProbeSet.load(os.path.join(part, "probes.npz")).tables["align"]
    for col, values in whole.tables["align"].items():
        np.testing.assert_array_equal(resumed[col], values, err_msg=col)


def test_align_config_ranges():
    with pytest.raises(ValueError, match="probe.align_groups"):
        small_config("probe.align_groups=3", "probe.align_chunks=2")
    with pytest.raises(ValueError, match="probe.align_ref_groups"):
        small_config("probe.align_groups=4", "probe.align_chunks=2", "probe.align_ref_groups=5")
    with pytest.raises(ValueError, match="probe.align_groups"):
        small_config("probe.align_groups=4", "probe.align_chunks=2", "trainer.loss=asymre")
    with pytest.raises(ValueError, match="probe.align_chunks"):
        small_config("probe.align_chunks=1")


def test_sketched_chunk_means_keep_their_inner_products(tmp_path):
    """Under probe.sketch_dim the chunk means are count sketches whose inner products match
    the exact ones within the sketch's error (theory.md 8.1.1)."""
    from llm_experiments.engines.experiment import Experiment
    from llm_experiments.probing.align import AlignProbe
    exact, sketched = (Experiment(small_config(*ARGS, *ALIGN, *extra), str(tmp_path / name))
                       for name, extra in (("e", []), ("s", ["probe.sketch_dim=4096"])))
    rollouts = AlignProbe(exact.prober)._fresh(4, np.random.default_rng(0))
    a, b = [g[0] for g, _ in AlignProbe(exact.prober)._chunk_means(rollouts)]
    sa, sb = [g[0] for g, _ in AlignProbe(sketched.prober)._chunk_means(rollouts)]
    assert sa.shape == (4096,) and a.shape[0] > 4096
    rel = np.sqrt(2 / 4096) * float(a.norm() * b.norm())
    assert abs(float(sa @ sb) - float(a @ b)) < 4 * rel
    assert float(sa @ sa) == pytest.approx(float(a @ a), rel=4 * np.sqrt(2 / 4096))


def test_variant_rows_beside_the_training_loss(align_run, tmp_path):
    """With probe.align_variants both variants' panel rows sit beside the training loss's
    (parts 2 and 3, as many rows as part 0 at every measurement), which stay bitwise those of
    the run without variants; align_stats has one row per panel chunk measured; at gap 0
    (fresh rollouts: ratio 1) the variants' inner products equal the training loss's, and
    after updates "ratio_one" moves away from them."""
    out = str(tmp_path / "variants")
    run_experiment(small_config(*ARGS, *ALIGN, "probe.align_variants=[unclipped, ratio_one]",
                                "probe.align_moments=true"), out)
    got = ProbeSet.load(os.path.join(out, "probes.npz")).tables
    t, plain = got["align"], align_run[1].tables["align"]
    for part in (0, 1):
        for col in plain:
            np.testing.assert_array_equal(t[col][t["part"] == part],
                                          plain[col][plain["part"] == part], err_msg=col)
    base = t["value"][t["part"] == 0]
    for part in (2, 3):
        rows = t["part"] == part
        assert rows.sum() == base.size
        gap0 = (t["gap"][rows] == 0)
        np.testing.assert_allclose(t["value"][rows][gap0], base[gap0], rtol=1e-3,
                                   atol=1e-6 * np.abs(base).max())
    late = t["gap"][t["part"] == 3] > 0
    assert not np.allclose(t["value"][t["part"] == 3][late], base[late], rtol=1e-3)
    s = got["align_stats"]
    assert set(s) == set(SCHEMA["align_stats"])
    assert set(got["align_pairs"]) == set(SCHEMA["align_pairs"])
    assert len(s["chunk"]) == 6 * 2 and set(s["n_seq"]) == {8}
    assert np.all((s["clip_fraction"] >= 0) & (s["clip_fraction"] <= 1))
    fresh = s["gap"] == 0
    np.testing.assert_allclose(s["mean_ratio"][fresh], 1.0, atol=1e-4)
    assert np.all(s["clip_fraction"][fresh] == 0)
    for variant in ("unclipped", "ratio_one"):
        assert fit_align(ProbeSet(tables=got), variant=variant, n_boot=20).pooled.gaps == \
            (0.0, 1.0, 3.0)
    _check_pairs(got)


def _check_pairs(got):
    """align_pairs with probe.align_moments: per measurement and loss the 3 pairs k <= l of
    2 panel chunks, and the 2 reference chunks' squared norms; Gram matrices (Cauchy-Schwarz
    holds); at gap 0 every loss's panel Gram equals the training loss's; the moments fit."""
    from replaytheory.fit.align_fit import fit_align_moments
    t = got["align_pairs"]
    keys = set(zip(t["birth_step"].astype(int), t["gap"].astype(int)))
    assert len(keys) == 6 and len(t["value"]) == 6 * (3 * 3 + 2)
    ref = t["part"] == 1
    assert np.all(t["chunk"][ref] == t["other"][ref])
    for b, g in keys:
        here = (t["birth_step"] == b) & (t["gap"] == g)
        for part in (0, 2, 3):
            rows = here & (t["part"] == part)
            v = {(int(i), int(j)): x for i, j, x in
                 zip(t["chunk"][rows], t["other"][rows], t["value"][rows])}
            assert set(v) == {(0, 0), (0, 1), (1, 1)}
            assert v[(0, 1)] ** 2 <= v[(0, 0)] * v[(1, 1)]
            if g == 0:
                base = t["value"][here & (t["part"] == 0)]
                np.testing.assert_allclose(t["value"][rows], base, rtol=1e-3)
    m = fit_align_moments(ProbeSet(tables=got), n_boot=20)
    assert m.noise.gaps == (0.0, 1.0, 3.0) and np.isfinite(m.bias.value).all()


def test_ratio_one_is_the_plain_policy_gradient():
    """"ratio_one" holds the importance ratio at 1 but keeps its gradient: per token
    -A grad log pi, averaged over each sequence's tokens like the training loss; "unclipped"
    is the ratio-weighted loss without its clip."""
    from llm_experiments.probing.align import variant_losses
    from llm_experiments.rl.losses import TokenBatch
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    batch = TokenBatch(targets=torch.zeros(3, 5, dtype=torch.long), mask=mask,
                       old_logp=logp.detach() + 0.5 * torch.randn(3, 5, generator=g,
                                                                  dtype=torch.float64),
                       adv=torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    kw = {"loss": "grpo", "clip_low": 0.2, "clip_high": 0.2}
    trained, unclipped, one = variant_losses(logp, batch, kw, ["unclipped", "ratio_one"])
    per_token = mask.sum(-1)
    want_one = -(batch.adv[:, None] * logp * mask).sum(-1) / per_token
    ratio = torch.exp((logp - batch.old_logp) * mask)
    want_unclipped = -(ratio * batch.adv[:, None] * mask).sum(-1) / per_token
    for got, want in ((one, want_one), (unclipped, want_unclipped)):
        a, = torch.autograd.grad(got.sum(), logp, retain_graph=True)
        b, = torch.autograd.grad(want.sum(), logp, retain_graph=True)
        torch.testing.assert_close(a, b)
    a, = torch.autograd.grad(trained.sum(), logp, retain_graph=True)
    b, = torch.autograd.grad(unclipped.sum(), logp, retain_graph=True)
    assert not torch.allclose(a, b)  # ratios up to e^1.5 apart: the clip binds somewhere


def test_align_variants_are_checked():
    with pytest.raises(ValueError, match=r"probe.align_variants\[0\] must be one of"):
        small_config("probe.align_variants=[clipped]")
    with pytest.raises(ValueError, match="probe.align_variants must be a list of distinct"):
        small_config("probe.align_variants=[ratio_one, ratio_one]")
    with pytest.raises(ValueError, match="probe.align_moments must be true or false"):
        small_config("probe.align_moments=sometimes")
    for option in ("probe.align_variants=[unclipped]", "probe.align_moments=true"):
        with pytest.raises(ValueError, match="set probe.align_groups > 0"):
            small_config(option)
