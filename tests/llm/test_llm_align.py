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
from replaytheory.fit.panel_fit import fit_align
from replaytheory.fit.probes import ProbeSet

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
    per-sequence gradients (the panels' per-sample gradients, ``per_sample_grads``)."""
    from llm_experiments.engines.experiment import Experiment
    from llm_experiments.probing.align import AlignProbe
    exp = Experiment(small_config(*ARGS, *ALIGN), str(tmp_path))
    probe = AlignProbe(exp.prober)
    rollouts = probe._fresh(4, np.random.default_rng(0))
    per = exp.prober.seq_grads(rollouts).double()
    for k, mean in enumerate(probe._chunk_means(rollouts)):  # 2 chunks of 2 groups
        torch.testing.assert_close(mean, per[8 * k:8 * (k + 1)].mean(0), rtol=1e-4,
                                   atol=1e-7)


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
    a, b = list(AlignProbe(exact.prober)._chunk_means(rollouts))
    sa, sb = list(AlignProbe(sketched.prober)._chunk_means(rollouts))
    assert sa.shape == (4096,) and a.shape[0] > 4096
    rel = np.sqrt(2 / 4096) * float(a.norm() * b.norm())
    assert abs(float(sa @ sb) - float(a @ b)) < 4 * rel
    assert float(sa @ sa) == pytest.approx(float(a @ a), rel=4 * np.sqrt(2 / 4096))
