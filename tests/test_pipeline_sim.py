"""Checks of the asynchronous pipeline simulator against theory.md sections 1-3."""

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from replaytheory import estimate_mu, simulate_pipeline
from replaytheory.buffer import ReplayIndex

BASE = dict(workers=6, trainers=2, mu=6.84, batch_size=60, buffer_size=252)


# Each example is a simulation: generate, but do not spend minutes shrinking a failure.
SLOW = dict(deadline=None, phases=(Phase.explicit, Phase.generate))


@settings(max_examples=12, **SLOW)
@given(w=st.integers(1, 8), t=st.integers(1, 4), mu=st.floats(0.5, 12.0))
def test_average_replay_ratio_tends_to_mu_t_over_w(w, t, mu):
    b = 12 * t
    res = simulate_pipeline(workers=w, trainers=t, mu=mu, batch_size=b, buffer_size=4 * b,
                            rollouts=30_000, seed=1)
    expected = mu * t / w
    assert res.expected_replay_ratio == pytest.approx(expected)
    assert res.mean_replay_ratio == pytest.approx(expected, rel=0.03)
    # every use is counted once, every rollout once
    assert res.replay_ratios.sum() == res.samples_consumed
    assert res.replay_ratios.size == res.unique_rollouts
    # with a buffer nothing waits: cost per update 1 + W/T, and mu is recovered from counts
    assert res.trainer_idle_fraction < 1e-6 and res.worker_idle_fraction == 0
    assert res.compute_per_update == pytest.approx(1 + w / t, rel=0.01)
    c = res.counts
    mu_hat = estimate_mu(c["unique_rollouts"], c["samples_consumed"], c["workers"], c["trainers"])
    assert mu_hat == pytest.approx(mu, rel=0.03)


@settings(max_examples=10, **SLOW)
@given(t=st.integers(1, 3), ratio=st.integers(1, 5))
def test_no_buffer_with_w_over_t_equal_mu_nothing_idles(t, ratio):
    w = ratio * t
    b = 6 * t
    res = simulate_pipeline(workers=w, trainers=t, mu=w / t, batch_size=b, buffer_size=4 * b,
                            rollouts=20_000, lifo=True, seed=2)
    assert res.trainer_idle_fraction < 1e-6
    assert res.worker_idle_fraction < 1e-6
    assert res.compute_per_update == pytest.approx(1 + w / t, rel=0.01)
    assert set(np.unique(res.replay_ratios)) <= {0, 1}  # each rollout used at most once


def test_no_buffer_unbalanced_split_idles_the_slow_side():
    # W/T = 3 < mu = 6.84: trainers wait for W B / mu rollouts per unit time
    res = simulate_pipeline(**BASE, rollouts=30_000, lifo=True)
    assert res.trainer_idle_fraction == pytest.approx(1 - (6 / 6.84) / 2, abs=0.01)
    assert res.worker_idle_fraction < 1e-6
    # W/T = 6 > mu = 2: workers wait for room in the queue
    res = simulate_pipeline(workers=6, trainers=1, mu=2.0, batch_size=60, buffer_size=120,
                            rollouts=20_000, lifo=True)
    assert res.trainer_idle_fraction < 1e-6
    assert res.worker_idle_fraction == pytest.approx(1 - 2 / 6, abs=0.02)


def _positive_bias_reference(positive, n, delta):
    """Ids kept by the definition: freshest (1 - delta) N, plus the freshest delta N
    positive rollouts not among them."""
    recent_n = n - int(round(delta * n))
    ids = np.arange(len(positive))
    recent = set(ids[-recent_n:])
    pos = [i for i in ids[::-1] if positive[i] and i not in recent][: n - recent_n]
    return recent | set(pos)


def test_positive_bias_example_n8_delta075():
    # theory.md section 1: N = 8, delta = 0.75 keeps the 2 freshest + the 6 freshest positives
    positive = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 0]
    buf = ReplayIndex(8, delta=0.75)
    for i, p in enumerate(positive):
        buf.add([i], i, i, positive=[bool(p)])
    held = set(buf.items().tolist())
    assert held == {15, 16} | {14, 11, 9, 8, 6, 3}
    assert held == _positive_bias_reference(positive, 8, 0.75)


@settings(max_examples=25, deadline=None)
@given(positive=st.lists(st.booleans(), min_size=1, max_size=60),
       delta=st.sampled_from([0.0, 0.25, 0.5, 0.75]))
def test_positive_bias_matches_definition(positive, delta):
    buf = ReplayIndex(8, delta=delta)
    for i, p in enumerate(positive):
        buf.add([i], i, i, positive=[p])
    assert set(buf.items().tolist()) == _positive_bias_reference(positive, 8, delta)


def test_positive_bias_in_pipeline_oversamples_positives():
    res = simulate_pipeline(**BASE, rollouts=20_000, delta=0.5, positive_rate=0.3, seed=3)
    plain = simulate_pipeline(**BASE, rollouts=20_000, delta=0.0, seed=3)
    # positives stay longer in the buffer, so they are used more than average
    assert res.mean_replay_ratio == pytest.approx(plain.mean_replay_ratio, rel=0.02)
    assert max(res.histograms["off_policiness"]) > max(plain.histograms["off_policiness"])


def test_refresh_interval_adds_off_policiness():
    k1 = simulate_pipeline(**BASE, rollouts=20_000, refresh_every=1)
    k5 = simulate_pipeline(**BASE, rollouts=20_000, refresh_every=5)
    m1, m5 = k1.uses["staleness"].mean(), k5.uses["staleness"].mean()
    assert m5 - m1 == pytest.approx(2.0, abs=0.5)  # weights are (k - 1)/2 steps older
    assert k1.uses["staleness"].min() >= 0


def test_sampling_without_replacement_has_no_repeat_within_a_batch():
    res = simulate_pipeline(**BASE, sharded=False, rollouts=5_000,
                            sampling="without_replacement")
    uses = res.uses
    for step in np.unique(uses["step"])[:200]:
        ids = uses["item_id"][uses["step"] == step]
        assert ids.size == 60 and np.unique(ids).size == 60


def test_never_used_first_consumes_fresh_rollouts_first():
    res = simulate_pipeline(**BASE, rollouts=10_000, sampling="never_used_first")
    # production (W B / mu per unit time) is below consumption: every rollout gets used
    assert np.mean(res.replay_ratios[:-252] > 0) == 1.0


def test_histograms_fig2_setting_shapes():
    res = simulate_pipeline(**BASE, rollouts=5_000)
    h = res.histograms
    assert set(h) == {"off_policiness", "replay_ratio", "steps_since_last_use"}
    assert sum(h["off_policiness"].values()) == res.samples_consumed
    assert h["steps_since_last_use"]["new"] <= res.unique_rollouts
    assert sum(k * c for k, c in h["replay_ratio"].items()) == res.samples_consumed


def test_seeded_runs_repeat():
    a = simulate_pipeline(**BASE, rollouts=3_000, gen_jitter=0.3, seed=5)
    b = simulate_pipeline(**BASE, rollouts=3_000, gen_jitter=0.3, seed=5)
    assert a.summary() == b.summary()
    assert np.array_equal(a.uses["item_id"], b.uses["item_id"])


@pytest.mark.parametrize("kw, name", [
    (dict(workers=0), "workers"), (dict(trainers=0), "trainers"), (dict(mu=0.0), "mu"),
    (dict(mu=-1.0), "mu"), (dict(buffer_size=30), "buffer_size"), (dict(delta=1.0), "delta"),
    (dict(delta=-0.1), "delta"), (dict(batch_size=61), "batch_size"),
    (dict(chunk=1000), "chunk"), (dict(refresh_every=0), "refresh_every"),
    (dict(sampling="lifo"), "sampling"), (dict(positive_rate=1.5), "positive_rate"),
    (dict(rollouts=0), "rollouts"), (dict(buffer_size=253), "buffer_size"),
])
def test_bad_input_names_the_parameter(kw, name):
    with pytest.raises(ValueError, match=name):
        simulate_pipeline(**{**BASE, "rollouts": 100, **kw})


# Regression values computed by the code before simulate_pipeline was split into functions
# (commit 162c60d, `git show 162c60d:replaytheory/sim/pipeline_sim.py`): the refactoring must not
# change one bit. Checksums weight the i-th use record (1-based) by i, so order matters.
REGRESSION = [
    (dict(rollouts=4000, lifo=True, gen_jitter=0.3, train_jitter=0.2, seed=4),
     dict(steps=65, samples_consumed=3960, compute_per_update=9.181803940259446,
          trainer_idle_fraction=0.5668114773190785, worker_idle_fraction=0.0,
          warmup_time=1.323013198700724, wall_time=75.92517021330872),
     dict(item_id=20697959370, step=341119350, staleness=10365930, since_last_use=-7842780),
     7842780),
    (dict(rollouts=5000, delta=0.5, positive_rate=0.3, seed=3),
     dict(steps=189, samples_consumed=11400, compute_per_update=4.005079365079366,
          trainer_idle_fraction=0.0, worker_idle_fraction=0.0,
          warmup_time=1.1400000000000001, wall_time=95.76000000000003),
     dict(item_id=204469859164, step=8198791650, staleness=680831446,
          since_last_use=98423086),
     41934763),
    (dict(rollouts=3000, sampling="without_replacement", gen_jitter=0.3, seed=5),
     dict(steps=111, samples_consumed=6720, compute_per_update=4.023903728867303,
          trainer_idle_fraction=0.0, worker_idle_fraction=0.0,
          warmup_time=1.5342912964278848, wall_time=57.36595553446172),
     dict(item_id=42587398320, step=1674776880, staleness=170282770, since_last_use=24761347),
     12518676),
    (dict(trainers=1, mu=2.0, buffer_size=120, rollouts=3000, lifo=True, chunk=13),
     dict(steps=48, samples_consumed=2940, compute_per_update=7.063194444444445,
          trainer_idle_fraction=0.0, worker_idle_fraction=0.6585225969258982,
          warmup_time=0.43333333333333335, wall_time=48.86666666666667),
     dict(item_id=8674595780, step=139038480, staleness=4771740, since_last_use=-4323270),
     4323270),
]


@pytest.mark.parametrize("kw, scalars, use_sums, ratio_sum", REGRESSION)
def test_bitwise_equal_to_the_code_before_the_refactoring(kw, scalars, use_sums, ratio_sum):
    res = simulate_pipeline(**{**BASE, **kw})
    for name, value in scalars.items():
        assert getattr(res, name) == value, name  # exact: same operations in the same order
    weight = np.arange(1, res.samples_consumed + 1)
    assert {k: int(np.sum(weight * res.uses[k])) for k in use_sums} == use_sums
    assert int(np.sum(np.arange(1, res.replay_ratios.size + 1) * res.replay_ratios)) == ratio_sum


def test_config_is_a_keyword_record_with_the_public_names():
    from replaytheory.sim.pipeline_sim import _Config
    args = dict(workers=3, trainers=2, mu=2.0, batch_size=8, buffer_size=16, rollouts=40,
                refresh_every=1, sharded=True, lifo=False, sampling="with_replacement",
                delta=0.0, positive_rate=0.5, chunk=None, min_fill=None, gen_jitter=0.0,
                train_jitter=0.0)
    cfg = _Config.checked(**args)
    assert (cfg.w, cfg.t, cfg.b, cfg.n, cfg.shards, cfg.per_draw) == (3, 2, 8, 16, 2, 4)
    with pytest.raises(TypeError):
        _Config.checked(*args.values())  # no positional plumbing
    with pytest.raises(ValueError, match="positive_rate"):
        _Config.checked(**{**args, "positive_rate": 1.5})


@pytest.mark.parametrize("mode", ["groups_with_replacement", "groups_without_replacement"])
def test_group_draws_use_whole_groups(mode):
    # theory.md section 11.9: B / (T G) whole groups per shard; a group's rollouts share
    # every draw, so they share their use count; the mean replay ratio is still mu T / W
    res = simulate_pipeline(workers=3, trainers=2, mu=3.0, batch_size=32, buffer_size=128,
                            rollouts=8_000, chunk=8, sampling=mode, group_size=4, seed=2)
    by_id = np.bincount(res.uses["item_id"], minlength=res.unique_rollouts).reshape(-1, 4)
    assert np.all(by_id == by_id[:, :1]) and by_id.sum() == res.samples_consumed
    assert np.unique(by_id[:, 0]).size > 2  # groups differ in their use counts
    assert res.mean_replay_ratio == pytest.approx(3.0 * 2 / 3, rel=0.05)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=36), r"batch_size must be a multiple of group_size \(4\) x shards \(2\)"),
    (dict(chunk=6), r"chunk must be a multiple of group_size \(4\)"),
    (dict(rollouts=1002), r"rollouts must be a multiple of group_size \(4\)"),
    (dict(buffer_size=132), r"buffer_size must be a multiple of group_size \(4\) x shards"),
])
def test_group_draws_refuse_partial_groups(kwargs, message):
    args = dict(workers=3, trainers=2, mu=3.0, batch_size=32, buffer_size=128, rollouts=1000,
                chunk=8, sampling="groups_with_replacement", group_size=4)
    with pytest.raises(ValueError, match=message):
        simulate_pipeline(**{**args, **kwargs})
