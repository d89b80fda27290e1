"""align(g) from the ``align`` table (theory.md section 11.15, ``align_fit.fit_align``) on
synthetic panels whose align is known: the estimate is consistent and its bootstrap interval
covers the truth at about its level; a variant loss's align and its paired change."""

import numpy as np
import pytest

from replaytheory.fit.align_fit import align_change, fit_align
from replaytheory.fit.probes import ProbeSet, align_part


def synthetic_rows(truth: dict, rng, *, dim=40, chunks=16, noise=2.0, run=0,
                   variants: dict | None = None, pairs: dict | None = None) -> dict:
    """Align rows of measurements (birth, gap) -> true align: reference chunks r_a = grad F +
    noise, panel chunks m_k = align x grad F + noise, grad F drawn per measurement; with
    ``variants`` (name -> shift), each variant's rows of chunks (align + shift) x grad F +
    the same noise (the same chunks under another loss) + a tenth of it again. ``pairs``
    (column -> list), if given, gets the matching ``align_pairs`` rows."""
    rows = {c: [] for c in ("probe_step", "birth_step", "gap", "part", "chunk", "other",
                            "value", "n_seq", "run")}

    def add(**kw):
        for c, v in kw.items():
            rows[c].append(v)
    for (birth, gap), align in truth.items():
        grad = rng.normal(size=dim)
        ref = grad + noise * rng.normal(size=(chunks, dim))
        panel = align * grad + noise * rng.normal(size=(chunks, dim))
        base = dict(probe_step=birth + gap, birth_step=birth, gap=gap, run=run)
        for k in range(chunks):
            for a in range(chunks):
                add(**base, part=0, chunk=k, other=a, value=panel[k] @ ref[a], n_seq=64)
        chunk_grads = {0: panel}
        for name, shift in (variants or {}).items():
            other = panel + shift * grad + 0.1 * noise * rng.normal(size=(chunks, dim))
            chunk_grads[align_part(name)] = other
            for k in range(chunks):
                for a in range(chunks):
                    add(**base, part=align_part(name), chunk=k, other=a,
                        value=other[k] @ ref[a], n_seq=64)
        if pairs is not None:
            found = [(p, k, j, m[k] @ m[j]) for p, m in chunk_grads.items()
                     for k in range(chunks) for j in range(k, chunks)]
            found += [(1, a, a, ref[a] @ ref[a]) for a in range(chunks)]
            for p, k, j, v in found:
                for c, x in dict(base, part=p, chunk=k, other=j, value=v, n_seq=64).items():
                    pairs.setdefault(c, []).append(x)
        for a in range(chunks):
            for b in range(a + 1, chunks):
                add(**base, part=1, chunk=a, other=b, value=ref[a] @ ref[b], n_seq=64)
    return rows


def probe_set(rows: dict) -> ProbeSet:
    return ProbeSet(tables={"align": {c: np.array(v, float) for c, v in rows.items()}})


def test_the_estimate_is_consistent_per_birth_and_pooled():
    """With little noise, align per birth and pooled over births is the truth."""
    truth = {(0, 0): 1.0, (0, 4): 0.6, (50, 0): 1.0, (50, 4): 0.9}
    fit = fit_align(probe_set(synthetic_rows(truth, np.random.default_rng(0), noise=0.05)),
                    n_boot=100)
    assert fit.pooled.gaps == (0.0, 4.0)
    assert fit.by_birth[0].value == pytest.approx((1.0, 0.6), abs=0.02)
    assert fit.by_birth[50].value == pytest.approx((1.0, 0.9), abs=0.02)
    assert fit.pooled.value[0] == pytest.approx(1.0, abs=0.02)
    assert 0.6 < fit.pooled.value[1] < 0.9


def test_the_interval_covers_the_truth_at_about_its_level():
    """Over 60 noisy synthetic calibrations (two runs, two births each) the 95% interval of
    align at gap 4 covers the true 0.7 in at least 85% of them, and it is not uselessly wide."""
    covered, widths = 0, []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        rows = synthetic_rows({(0, 4): 0.7, (50, 4): 0.7}, rng, run=0)
        more = synthetic_rows({(0, 4): 0.7, (50, 4): 0.7}, rng, run=1)
        fit = fit_align(probe_set({c: rows[c] + more[c] for c in rows}), n_boot=200,
                        seed=seed)
        lo, hi = fit.pooled.low[0], fit.pooled.high[0]
        covered += lo <= 0.7 <= hi
        widths.append(hi - lo)
    assert covered >= 51 and np.median(widths) < 0.5


def test_no_align_rows_is_a_clear_error():
    with pytest.raises(ValueError, match="probe.align_groups"):
        fit_align(ProbeSet())


def test_a_bad_bootstrap_count_names_it():
    rows = synthetic_rows({(0, 0): 1.0}, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_boot"):
        fit_align(probe_set(rows), n_boot=0)


def test_a_variant_and_its_paired_change():
    """The ratio_one rows' align is the truth plus the variant's shift; the paired change
    covers the shift with an interval much narrower than the two curves' own, and a birth
    filter keeps only its births."""
    truth = {(0, 4): 0.7, (50, 4): 0.7, (0, 0): 1.0, (50, 0): 1.0}
    fits, changes = [], []
    for seed in range(20):
        rows = synthetic_rows(truth, np.random.default_rng(seed), variants={"ratio_one": -0.3})
        probes = probe_set(rows)
        fits.append((fit_align(probes, n_boot=200, seed=seed),
                     fit_align(probes, variant="ratio_one", n_boot=200, seed=seed)))
        changes.append(align_change(probes, "ratio_one", n_boot=200, seed=seed))
    plain, varied = fits[0]
    assert plain.pooled.gaps == varied.pooled.gaps == (0.0, 4.0)
    assert np.mean([v.pooled.value[1] for _, v in fits]) == pytest.approx(0.4, abs=0.05)
    assert sum(c.low[1] <= -0.3 <= c.high[1] for c in changes) >= 17
    paired = np.median([c.high[1] - c.low[1] for c in changes])
    alone = np.median([v.pooled.high[1] - v.pooled.low[1] for _, v in fits])
    assert paired < 0.5 * alone
    some = probe_set(synthetic_rows({(0, 0): 1.0, (0, 4): 0.7, (50, 0): 1.0},
                                    np.random.default_rng(0), variants={"ratio_one": -0.3}))
    assert align_change(some, "ratio_one").gaps == (0.0, 4.0)
    assert align_change(some, "ratio_one", births=[50]).gaps == (0.0,)
    with pytest.raises(ValueError, match="births"):
        align_change(probes, "ratio_one", births=[7])


def test_variant_rows_that_were_not_measured_are_a_clear_error():
    probes = probe_set(synthetic_rows({(0, 0): 1.0}, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="probe.align_variants"):
        fit_align(probes, variant="unclipped")
    with pytest.raises(ValueError, match="variant must be one of"):
        align_part("clipped")
