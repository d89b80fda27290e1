import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replaytheory.buffer import NEW, ReplayIndex


def rng():
    return np.random.default_rng(0)


def test_steps_since_last_use_worked_example():
    # theory.md section 2: used once in batch 3 and three times in batch 5 -> new, 2, 0, 0
    b = ReplayIndex(4)
    b.add([7], generation_step=0, insert_step=0)
    r = rng()
    b.sample(1, 3, r)
    b.sample(3, 5, r)
    rec = b.use_records()
    assert rec["since_last_use"].tolist() == [NEW, 2, 0, 0]
    assert rec["staleness"].tolist() == [3, 5, 5, 5]
    h = b.histograms()
    assert h["steps_since_last_use"] == {"new": 1, 2: 1, 0: 2}
    assert h["replay_ratio"] == {4: 1}


def test_fifo_keeps_the_n_most_recent():
    b = ReplayIndex(5)
    ev = b.add(np.arange(8), 0, 0)
    assert sorted(b.items().tolist()) == [3, 4, 5, 6, 7]
    assert ev.tolist() == [0, 1, 2]
    assert b.replay_ratios(include_live=False).tolist() == [0, 0, 0]


def test_positive_bias_example():
    b = ReplayIndex(8, delta=0.75)
    pos = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0], bool)
    b.add(np.arange(20), 0, 0, positive=pos)
    # freshest (1 - 0.75) * 8 = 2 rollouts, plus the freshest 6 correct ones not among them
    assert sorted(b.items().tolist()) == [6, 8, 9, 11, 13, 14, 18, 19]


def test_sampling_modes():
    r = rng()
    b = ReplayIndex(10, sampling="without_replacement")
    b.add(np.arange(10), 0, 0)
    batch = b.sample(10, 1, r)
    assert sorted(batch.tolist()) == list(range(10))
    b = ReplayIndex(10, sampling="never_used_first")
    b.add(np.arange(10), 0, 0)
    first = b.sample(6, 1, r)
    second = b.sample(6, 2, r)
    assert set(first) | set(second[:4]) == set(range(10))  # the 4 unused come first
    with pytest.raises(ValueError, match="batch_size"):
        ReplayIndex(4, sampling="without_replacement").sample(2, 0, r)


def test_sharding_routes_and_samples_per_shard():
    b = ReplayIndex(8, shards=2)
    b.add(np.arange(8), 0, 0)
    assert b.size(0) == b.size(1) == 4
    assert set(b.items(0)) == {0, 2, 4, 6}
    drawn = b.sample(20, 1, rng(), shard=1)
    assert set(drawn.tolist()) <= {1, 3, 5, 7}


def test_lifo_serves_freshest_once():
    b = ReplayIndex(100, lifo=True)
    b.add([1, 2, 3], 0, 0)
    b.add([4, 5], 1, 1)
    assert b.sample(2, 2, rng()).tolist() == [5, 4]
    assert b.sample(2, 3, rng()).tolist() == [3, 2]
    assert b.histograms()["steps_since_last_use"] == {"new": 4}
    assert len(b) == 1


@settings(max_examples=30, deadline=None)
@given(n=st.integers(8, 200), r=st.integers(1, 16), bsz=st.integers(1, 32),
       steps=st.integers(50, 150))
def test_average_replay_ratio_is_b_over_r(n, r, bsz, steps):
    b = ReplayIndex(n)
    g = np.random.default_rng(1)
    for t in range(steps):
        b.add(np.arange(t * r, (t + 1) * r), t, t)
        b.sample(bsz, t, g)
    # every use of the run over unique rollouts made
    uses = b.use_records()["item_id"].size
    assert uses == bsz * steps
    assert b.mean_replay_ratio() == pytest.approx(bsz / r)
    # staleness never exceeds the horizon: ceil(N/R) - 1 steps
    assert b.use_records()["staleness"].max() <= -(-n // r) - 1


def test_state_dict_round_trip():
    b = ReplayIndex(6, delta=0.5)
    g = np.random.default_rng(3)
    for t in range(5):
        b.add(np.arange(3 * t, 3 * t + 3), t, t, positive=np.arange(3) % 2 == 0)
        b.sample(4, t, g)
    c = ReplayIndex.from_state_dict(b.state_dict())
    g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
    assert b.sample(4, 9, g1).tolist() == c.sample(4, 9, g2).tolist()
    assert b.histograms() == c.histograms()


@pytest.mark.parametrize("kwargs, name", [
    (dict(capacity=0), "capacity"),
    (dict(capacity=10, sampling="fifo"), "sampling"),
    (dict(capacity=10, delta=1.0), "delta"),
    (dict(capacity=10, delta=-0.1), "delta"),
    (dict(capacity=10, shards=3), "shards"),
    (dict(capacity=10, lifo=True, delta=0.5), "delta"),
])
def test_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ReplayIndex(**kwargs)


def test_duplicate_ids_and_missing_positive():
    b = ReplayIndex(4)
    b.add([1], 0, 0)
    with pytest.raises(ValueError, match="already"):
        b.add([1], 0, 0)
    with pytest.raises(ValueError, match="positive"):
        ReplayIndex(4, delta=0.5).add([1], 0, 0)


@given(capacity=st.integers(1, 12), adds=st.integers(1, 6), draws=st.integers(0, 8),
       batch=st.integers(1, 4), seed=st.integers(0, 99),
       qs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_replay_ratio_quantiles_match_numpy(capacity, adds, draws, batch, seed, qs):
    rng = np.random.default_rng(seed)
    b = ReplayIndex(capacity)
    next_id = 0
    for step in range(adds):
        b.add(list(range(next_id, next_id + 3)), [step] * 3, step)
        next_id += 3
        for _ in range(draws):
            if b.can_sample(batch):
                b.sample(batch, step, rng)
    for live in (True, False):
        ratios = b.replay_ratios(include_live=live)
        got = b.replay_ratio_quantiles(qs, include_live=live)
        if ratios.size:
            np.testing.assert_allclose(got, np.quantile(ratios, qs), atol=1e-12)
        else:
            assert np.all(np.isnan(got))


@settings(max_examples=60, deadline=None)
@given(g=st.integers(1, 4), shards=st.integers(1, 3), per_shard=st.integers(1, 4),
       delta=st.sampled_from([0.0, 0.5]), replace=st.booleans(), seed=st.integers(0, 99),
       adds=st.lists(st.integers(1, 3), min_size=1, max_size=8))
def test_group_draws_are_whole_groups(g, shards, per_shard, delta, replace, seed, adds):
    # section 11.9: B / (T G) whole groups per shard; groups evicted and moved whole
    mode = "groups_with_replacement" if replace else "groups_without_replacement"
    b = ReplayIndex(shards * per_shard * g, sampling=mode, group_size=g, shards=shards,
                    delta=delta)
    rng = np.random.default_rng(seed)
    made = drawn = 0
    for step, n_groups in enumerate(adds):
        ids = np.arange(made, made + n_groups * g)
        b.add(ids, step, step, positive=rng.random(ids.size) < 0.3, group=ids // g)
        made += ids.size
        for s in range(shards):
            held = b.items(s).reshape(-1, g)
            assert np.all(held // g == held[:, :1] // g) and np.all(held[:, 0] % g == 0)
            k = int(rng.integers(1, per_shard + 1))
            if not b.can_sample(k * g, s):
                assert held.shape[0] < (1 if replace else k)
                continue
            batch = b.sample(k * g, step, rng, shard=s).reshape(-1, g)
            drawn += batch.size
            assert np.all(batch // g == batch[:, :1] // g)  # whole groups
            assert set(batch[:, 0].tolist()) <= set(held[:, 0].tolist())  # from this shard
            if not replace:
                assert np.unique(batch[:, 0]).size == k
    rec = b.use_records()
    assert rec["item_id"].size == drawn == b.replay_ratios().sum()
    live = b.items()
    counted = np.array([np.sum(rec["item_id"] == i) for i in live])
    np.testing.assert_array_equal(b.metadata(live)["uses"], counted)
    assert b.replay_ratios().size == made


def test_group_draw_errors():
    b = ReplayIndex(8, sampling="groups_without_replacement", group_size=4)
    b.add(np.arange(4), 0, 0, group=[0] * 4)
    with pytest.raises(ValueError, match=r"batch_size \(6\) must be a multiple of group_size"):
        b.sample(6, 1, rng())
    with pytest.raises(ValueError, match=r"batch_size \(8\) exceeds .* groups of 4"):
        b.sample(8, 1, rng())
    assert b.sample(4, 1, rng()).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="multiple of group_size"):
        b.add(np.arange(10, 13), 0, 0)
    with pytest.raises(ValueError, match="consecutive ids of one key"):
        b.add(np.arange(10, 18), 0, 0, group=[1, 2] * 4)
    with pytest.raises(ValueError, match=r"capacity must be a multiple of shards x group_size"):
        ReplayIndex(12, sampling="groups_with_replacement", group_size=4, shards=2)
    with pytest.raises(ValueError, match="group_size"):
        ReplayIndex(8, sampling="groups_with_replacement", group_size=0)
    # the rollout modes and the LIFO queue ignore group_size
    ReplayIndex(12, group_size=8).add(np.arange(3), 0, 0)
    ReplayIndex(12, sampling="groups_with_replacement", group_size=8, lifo=True)


def test_group_draws_with_replacement_and_round_trip():
    b = ReplayIndex(8, sampling="groups_with_replacement", group_size=2, shards=2, delta=0.5)
    b.add(np.arange(8), 0, 0, positive=[1, 0, 0, 0, 0, 0, 0, 1])
    # round robin by group; (0, 1) holds a positive and moves to the positive part whole,
    # (2, 3) does not and leaves
    assert b.items(0).tolist() == [4, 5, 0, 1] and b.items(1).tolist() == [6, 7]
    b.add(np.arange(8, 12), 1, 1, positive=False)
    assert b.items(0).tolist() == [8, 9, 0, 1] and b.items(1).tolist() == [10, 11, 6, 7]
    g = np.random.default_rng(5)
    batch = b.sample(6, 2, g, shard=0)  # 3 groups from 2: one comes twice
    pairs = batch.reshape(-1, 2)
    assert np.all(pairs[:, 1] - pairs[:, 0] == 1) and np.unique(pairs[:, 0]).size < 3
    c = ReplayIndex.from_state_dict(b.state_dict())
    assert c.group_size == 2 and c.unit == 2
    g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
    assert b.sample(4, 3, g1, shard=1).tolist() == c.sample(4, 3, g2, shard=1).tolist()
