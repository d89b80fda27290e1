"""The stale bias and noise of align panels (theory.md 11.16, ``align_fit.fit_align_moments``)
on synthetic chunk gradients whose moments are known: bias, its part off grad F and the
per-sequence noise are recovered, fresh panels read bias 0 and noise 1, and missing pair rows
are a clear error."""

import numpy as np
import pytest

from replaytheory.fit.align_fit import fit_align, fit_align_moments
from replaytheory.fit.probes import ProbeSet


def moment_tables(truth: dict, rng, *, dim=400, chunks=16, ref_noise=2.0, run=0) -> dict:
    """``align`` and ``align_pairs`` tables of measurements (birth, gap) -> (align, off,
    scale): panel chunks m_k = align grad F + off ||grad F|| u + scale ref_noise e_k (u a
    unit vector orthogonal to grad F), reference chunks r_a = grad F + ref_noise e_a; every
    chunk of 4 sequences. So bias = (1 - align)^2 + off^2, orthogonal = off^2, and noise =
    scale^2."""
    cols = ("probe_step", "birth_step", "gap", "part", "chunk", "other", "value", "n_seq",
            "run")
    align, pairs = ({c: [] for c in cols} for _ in range(2))
    for (birth, gap), (a, off, scale) in truth.items():
        grad = rng.normal(size=dim)
        u = rng.normal(size=dim)
        u -= (u @ grad) / (grad @ grad) * grad
        u *= np.linalg.norm(grad) / np.linalg.norm(u)
        ref = grad + ref_noise * rng.normal(size=(chunks, dim))
        panel = a * grad + off * u + scale * ref_noise * rng.normal(size=(chunks, dim))
        base = dict(probe_step=birth + gap, birth_step=birth, gap=gap, run=run,
                    n_seq=4 * chunks)
        rows = [(align, 0, k, j, panel[k] @ ref[j]) for k in range(chunks)
                for j in range(chunks)]
        rows += [(align, 1, i, j, ref[i] @ ref[j]) for i in range(chunks)
                 for j in range(i + 1, chunks)]
        rows += [(pairs, 0, k, j, panel[k] @ panel[j]) for k in range(chunks)
                 for j in range(k, chunks)]
        rows += [(pairs, 1, i, i, ref[i] @ ref[i]) for i in range(chunks)]
        for table, part, chunk, other, value in rows:
            for c, v in dict(base, part=part, chunk=chunk, other=other, value=value).items():
                table[c].append(v)
    return {name: {c: np.array(v, float) for c, v in t.items()}
            for name, t in (("align", align), ("align_pairs", pairs))}


def test_known_moments_are_recovered_per_birth_and_pooled():
    truth = {(0, 0): (1.0, 0.0, 1.0), (0, 8): (0.6, 0.5, 1.5),
             (100, 0): (1.0, 0.0, 1.0), (100, 8): (1.2, 0.3, 0.8)}
    probes = ProbeSet(tables=moment_tables(truth, np.random.default_rng(0), ref_noise=0.3))
    m = fit_align_moments(probes, n_boot=200)
    assert m.bias.gaps == (0.0, 8.0)
    for birth, (a, off, scale) in ((0, truth[(0, 8)]), (100, truth[(100, 8)])):
        got = m.by_birth[birth]
        assert got["bias"].value == pytest.approx((0.0, (1 - a) ** 2 + off ** 2), abs=0.03)
        assert got["orthogonal"].value[1] == pytest.approx(off ** 2, abs=0.03)
        assert got["noise"].value == pytest.approx((1.0, scale ** 2), rel=0.15)
    assert m.bias.low[0] <= 0 <= m.bias.high[0]
    assert m.noise.low[0] <= 1 <= m.noise.high[0]
    # align from the same tables is unchanged by the pair rows
    assert fit_align(probes, n_boot=200).by_birth[0].value[1] == pytest.approx(0.6, abs=0.03)
    # pooled over one birth, the estimate is that birth's
    late = fit_align_moments(probes, births=[100], n_boot=50)
    assert late.noise.value == m.by_birth[100]["noise"].value
    assert fit_align(probes, births=[100]).pooled.value == \
        fit_align(probes).by_birth[100].value
    with pytest.raises(ValueError, match="births"):
        fit_align_moments(probes, births=[7])


def test_the_noise_interval_covers_the_truth_at_about_its_level():
    """Over 40 noisy synthetic measurements the noise ratio's 95% interval covers the true
    2.25 in at least 34."""
    covered = 0
    for seed in range(40):
        tables = moment_tables({(0, 4): (0.8, 0.2, 1.5)}, np.random.default_rng(seed),
                               dim=60)
        n = fit_align_moments(ProbeSet(tables=tables), n_boot=200, seed=seed).noise
        covered += n.low[0] <= 2.25 <= n.high[0]
    assert covered >= 34


def test_moments_without_pair_rows_are_a_clear_error():
    tables = moment_tables({(0, 0): (1.0, 0.0, 1.0)}, np.random.default_rng(0), dim=20)
    with pytest.raises(ValueError, match="probe.align_moments"):
        fit_align_moments(ProbeSet(tables={"align": tables["align"]}))
    with pytest.raises(ValueError, match="n_boot"):
        fit_align_moments(ProbeSet(tables=tables), n_boot=0)
