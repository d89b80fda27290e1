import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replaytheory.buffer import NEW, ReplayIndex, growing_window


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


# ---- a horizon that grows (theory.md section 11.13) ---------------------------------------

def _feed_and_draw(b, steps, per_step, batch, seed):
    """Insert ``per_step`` ids at each step t (generation step t) and draw ``batch``; returns
    (use records, window of each step, insert steps held after each draw)."""
    rng, windows, held = np.random.default_rng(seed), [], []
    for t in range(steps):
        b.add(np.arange(t * per_step, (t + 1) * per_step), generation_step=t, insert_step=t)
        b.sample(batch, t, rng)
        held.append(b.metadata(b.items())["insert_step"])
    return b.use_records(), held


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(1, 30), x=st.integers(1, 8), g=st.sampled_from([1, 2]),
       groups=st.integers(1, 3), batch_groups=st.integers(1, 4), seed=st.integers(0, 99),
       grouped=st.booleans())
def test_growth_that_never_binds_draws_as_the_fixed_fifo(steps, x, g, groups, batch_groups,
                                                         seed, grouped):
    """g = 1 and x_max = x over a FIFO of exactly x steps: the window k(t) = min(x, t + 1)
    holds everything held, so draws, use records and evictions are bitwise those of the
    plain buffer (the random stream is used identically)."""
    mode = "groups_with_replacement" if grouped else "with_replacement"
    r = groups * g
    plain = ReplayIndex(x * r, sampling=mode, group_size=g)
    grown = ReplayIndex(x * r, sampling=mode, group_size=g, horizon_growth=1.0, max_horizon=x)
    a, held_a = _feed_and_draw(plain, steps, r, batch_groups * g, seed)
    b, held_b = _feed_and_draw(grown, steps, r, batch_groups * g, seed)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert all(np.array_equal(u, v) for u, v in zip(held_a, held_b))
    assert plain.histograms() == grown.histograms()


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 60), growth=st.floats(0.01, 1.0), x_max=st.floats(1.0, 40.0),
       per_step=st.integers(1, 6), batch=st.integers(1, 12), seed=st.integers(0, 99))
def test_growth_draws_nothing_older_than_the_window(steps, growth, x_max, per_step, batch,
                                                    seed):
    """Every rollout drawn at step t is at most floor(x(t)) - 1 <= x(t) - 1 steps old,
    x(t) = min(x_max, max(1, g (t + 1))); what is held after the draw is the window exactly
    (the FIFO is large enough never to evict), and the window's oldest step never moves back."""
    b = ReplayIndex(1000, horizon_growth=growth, max_horizon=x_max)
    rec, held = _feed_and_draw(b, steps, per_step, batch, seed)
    x = np.minimum(x_max, np.maximum(1.0, growth * (rec["step"] + 1)))
    assert np.all(rec["staleness"] <= x - 1 + 1e-9)
    oldest = []
    for t, ins in enumerate(held):
        k = growing_window(t, growth, x_max)
        assert 1 <= k <= x_max + 1e-9
        assert sorted(set(ins.tolist())) == list(range(max(0, t - k + 1), t + 1))
        oldest.append(t - k + 1)
    assert np.all(np.diff(oldest) >= 0)


def test_full_growth_keeps_every_rollout_drawable():
    """g = 1 with x_max and N large: at step t the window is t + 1 steps, every rollout
    inserted so far is held (and so drawable), and a long run of draws reaches them all."""
    b = ReplayIndex(10_000, horizon_growth=1.0, max_horizon=500)
    rng = np.random.default_rng(0)
    for t in range(40):
        b.add(np.arange(t * 5, t * 5 + 5), generation_step=t, insert_step=t)
        assert sorted(b.items().tolist()) == list(range(t * 5 + 5))
        b.sample(64, t, rng)
    assert set(b.use_records()["item_id"][b.use_records()["step"] == 39].tolist()) <= \
        set(range(200))
    assert b.expire(40).size == 0


def test_growth_evicts_by_step_and_round_trips():
    """g = 0.25: windows 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3 steps over t = 0..11; the evicted
    rollouts leave with their use counts, and a restored index keeps the window."""
    assert [growing_window(t, 0.25, 64) for t in range(12)] == [1] * 7 + [2] * 4 + [3]
    assert growing_window(10**6, 0.25, 64) == 64 and growing_window(99, 0.29, 64) == 29
    b = ReplayIndex(64, horizon_growth=0.25, max_horizon=8)
    rng = np.random.default_rng(1)
    for t in range(10):
        b.add(np.arange(t * 4, t * 4 + 4), generation_step=t, insert_step=t)
        b.sample(4, t, rng)
    assert sorted(b.items().tolist()) == list(range(32, 40))  # steps 8 and 9
    assert b.replay_ratios(include_live=False).size == 32
    c = ReplayIndex.from_state_dict(b.state_dict())
    assert (c.horizon_growth, c.max_horizon) == (0.25, 8)
    for idx in (b, c):
        idx.add(np.arange(40, 44), generation_step=10, insert_step=10)
    g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
    assert b.sample(4, 11, g1).tolist() == c.sample(4, 11, g2).tolist()
    assert sorted(c.items().tolist()) == list(range(36, 44))  # k(11) = 3: steps 9, 10


@pytest.mark.parametrize("kwargs, message", [
    (dict(horizon_growth=-0.1), r"horizon_growth must be in \[0, 1\]"),
    (dict(horizon_growth=1.5), r"horizon_growth must be in \[0, 1\]"),
    (dict(horizon_growth=0.5, delta=0.25), "horizon_growth > 0 .* delta = 0"),
    (dict(horizon_growth=0.5, lifo=True), "horizon_growth > 0 .* lifo = false"),
    (dict(horizon_growth=0.5, sampling="without_replacement"), "horizon_growth > 0 .* sampling"),
    (dict(horizon_growth=0.5, sampling="groups_without_replacement", group_size=2),
     "horizon_growth > 0 .* sampling"),
    (dict(horizon_growth=0.5, max_horizon=0.5), r"max_horizon must be in \[1, inf\)"),
])
def test_growth_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReplayIndex(16, **kwargs)


def test_growth_needs_insertions_in_step_order():
    b = ReplayIndex(16, horizon_growth=0.5)
    b.add([0, 1], generation_step=3, insert_step=3)
    with pytest.raises(ValueError, match="insert_step must not decrease with horizon_growth"):
        b.add([2], generation_step=2, insert_step=2)


def test_drop_evicts_held_ids_now_and_keeps_the_rest_in_order():
    """The adaptive horizon's eviction (theory.md 12.4): dropped ids leave at once, with
    their use counts final; the FIFO order of the rest is kept, so the oldest still goes
    first; ids not held are ignored; a positive kept by delta can be dropped too."""
    idx = ReplayIndex(6)
    idx.add(np.arange(6), generation_step=0, insert_step=0)
    idx.sample(4, 1, np.random.default_rng(0))
    uses = dict(zip(idx.items().tolist(), idx.metadata(idx.items())["uses"].tolist()))
    gone = idx.drop([2, 3, 99])
    assert sorted(gone.tolist()) == [2, 3] and set(idx.items().tolist()) == {0, 1, 4, 5}
    assert sorted(idx.replay_ratios(include_live=False).tolist()) == \
        sorted([uses[2], uses[3]])
    assert idx.add([6, 7], generation_step=1, insert_step=1).size == 0  # room for both
    assert idx.add([8], generation_step=2, insert_step=2).tolist() == [0]  # the oldest
    assert idx.drop([]).size == 0
    biased = ReplayIndex(4, delta=0.5)
    biased.add(np.arange(6), 0, 0, positive=np.array([1, 0, 0, 0, 0, 0], bool))
    assert 0 in biased.items() and biased.drop([0]).tolist() == [0]
    assert 0 not in biased.items()
