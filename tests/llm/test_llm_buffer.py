import numpy as np
import pytest

from llm_experiments.rl.buffer import Rollout, RolloutBuffer


def rollouts(start, n, version=0, reward=0.0, group=0):
    return [Rollout(i, group, i, version, np.array([1, 2], np.int32), np.array([3, 1], np.int32),
                    np.array([-0.5, -0.1], np.float32), reward, 0.0)
            for i in range(start, start + n)]


def held(buf):
    return sorted(r.item_id for r in buf.rollouts())


def test_fifo_eviction_drops_payloads():
    buf = RolloutBuffer(4)
    buf.add(rollouts(0, 3), insert_step=0)
    evicted = buf.add(rollouts(3, 3, version=1), insert_step=1)
    assert evicted.tolist() == [0, 1]
    assert held(buf) == [2, 3, 4, 5] and len(buf) == 4


@pytest.mark.parametrize("mode", ["with_replacement", "without_replacement",
                                  "never_used_first"])
def test_sampling_modes_return_payloads(mode):
    buf = RolloutBuffer(8, sampling=mode)
    buf.add(rollouts(0, 8), insert_step=0)
    rng = np.random.default_rng(0)
    batch = buf.sample(6, step=2, rng=rng)
    ids = [r.item_id for r in batch]
    assert len(ids) == 6 and all(isinstance(r, Rollout) for r in batch)
    if mode != "with_replacement":
        assert len(set(ids)) == 6
    if mode == "never_used_first":
        second = [r.item_id for r in buf.sample(6, step=3, rng=rng)]
        assert set(range(8)) - set(ids) <= set(second)
    assert len(buf) == 8  # a replay buffer never removes what it hands out


def test_lifo_queue_consumes_freshest_once():
    buf = RolloutBuffer(8, lifo=True)
    buf.add(rollouts(0, 4), insert_step=0)
    buf.add(rollouts(4, 4, version=1), insert_step=1)
    batch = buf.sample(4, step=1, rng=np.random.default_rng(0))
    assert sorted(r.item_id for r in batch) == [4, 5, 6, 7]
    assert held(buf) == [0, 1, 2, 3] and len(buf) == 4


def test_positive_bias_keeps_correct_rollouts():
    # theory.md section 1, N = 8, delta = 0.75: 2 freshest + the 6 freshest correct.
    buf = RolloutBuffer(8, delta=0.75)
    buf.add(rollouts(0, 6, reward=1.0), insert_step=0)
    buf.add(rollouts(6, 10, reward=0.0), insert_step=1)
    assert held(buf) == [0, 1, 2, 3, 4, 5, 14, 15]


def test_shards_split_the_batch():
    buf = RolloutBuffer(8, shards=2)
    buf.add(rollouts(0, 8), insert_step=0)
    assert buf.can_sample(4)
    batch = buf.sample(4, step=0, rng=np.random.default_rng(1))
    shard_of = {int(i): k for k in range(2) for i in buf.index.items(k)}
    assert sorted(shard_of[r.item_id] for r in batch) == [0, 0, 1, 1]


def test_step_stats_and_histograms():
    buf = RolloutBuffer(16, sampling="without_replacement")
    rng = np.random.default_rng(0)
    buf.add(rollouts(0, 4, version=0), insert_step=0)
    buf.sample(4, step=0, rng=rng)
    buf.add(rollouts(4, 4, version=2), insert_step=2)
    buf.sample(8, step=3, rng=rng)
    s = buf.step_stats()
    # the last call used 4 rollouts of version 0 (staleness 3, last used at 0) and 4 of 2
    assert s["staleness_mean"] == pytest.approx(2.0)
    assert s["steps_since_last_use_mean"] == pytest.approx(3.0)
    assert s["first_use_fraction"] == pytest.approx(0.5)
    assert s["buffer_occupancy"] == 8
    h = buf.index.histograms()
    assert h["off_policiness"] == {0: 4, 1: 4, 3: 4}
    assert h["steps_since_last_use"] == {"new": 8, 3: 4}
    assert h["replay_ratio"] == {1: 4, 2: 4}


def test_state_round_trip():
    buf = RolloutBuffer(6, sampling="never_used_first")
    buf.add(rollouts(0, 6), insert_step=0)
    buf.sample(3, step=0, rng=np.random.default_rng(0))
    back = RolloutBuffer.from_state_dict(buf.state_dict())
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    assert [r.item_id for r in buf.sample(3, 1, r1)] == [r.item_id for r in back.sample(3, 1, r2)]
    for a, b in zip(back.rollouts(), buf.rollouts()):
        assert a.item_id == b.item_id and a.advantage == b.advantage
        np.testing.assert_array_equal(a.prompt, b.prompt)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)


def test_payloads_survive_repacking_and_stay_compact():
    """Many insertions (arena repacks, table reallocations): every held payload is intact,
    and the storage stays within ~2x the raw bytes (4 per id and log-prob, 8 per scalar)."""
    rng = np.random.default_rng(0)
    buf, made = RolloutBuffer(64, delta=0.25), {}
    for step in range(40):
        new = []
        for i in range(step * 16, step * 16 + 16):
            c = rng.integers(3, 15, int(rng.integers(1, 9))).astype(np.int32)
            new.append(Rollout(i, i // 4, i, step, rng.integers(3, 15, 6).astype(np.int32), c,
                               -rng.random(len(c)).astype(np.float32), float(i % 3 == 0),
                               float(rng.standard_normal())))
        made.update((r.item_id, r) for r in new)
        buf.add(new, insert_step=step)
    held = buf.rollouts()
    assert len(held) == 64
    for r in held:
        m = made[r.item_id]
        assert (r.group_id, r.problem_id, r.version, r.reward, r.advantage) == \
            (m.group_id, m.problem_id, m.version, m.reward, m.advantage)
        for f in ("prompt", "completion", "logprobs"):
            np.testing.assert_array_equal(getattr(r, f), getattr(m, f))
    raw = sum(4 * (len(r.prompt) + 2 * len(r.completion)) + 8 * 6 for r in held)
    assert buf.nbytes() < 3 * raw


def test_probe_groups_picks_complete_kept_groups_spread_over_insertion():
    # Groups of 4; the FIFO (N = 30) has evicted group 0 and cut group 1 to 2 rollouts;
    # versions 1 and 3 are not kept. The probes read complete groups of kept versions, evenly
    # spread by insertion step.
    buf = RolloutBuffer(30)
    for g in range(9):
        buf.add(rollouts(4 * g, 4, version=g, group=g), insert_step=g)
    got = buf.probe_groups(4, {0, 2, 4, 5, 6, 7, 8}, limit=3)
    complete = [2, 4, 5, 6, 7, 8]  # insert steps equal group ids here
    chosen = [complete[i] for i in np.unique(np.round(np.linspace(0, 5, 3))).astype(int)]
    assert [r.group_id for r in got.rollouts] == [g for g in chosen for _ in range(4)]
    assert [r.item_id for r in got.rollouts] == [4 * g + k for g in chosen for k in range(4)]
    assert got.insert_step.tolist() == [g for g in chosen for _ in range(4)]
    assert got.uses.tolist() == [0] * 12
    assert buf.probe_groups(4, {0, 1}, limit=3).rollouts == []
    assert buf.probe_groups(4, {2}, limit=0).rollouts == []
    assert len(buf.probe_groups(4, set(range(9)), limit=50).rollouts) == 4 * 7


def test_group_draws_hand_out_whole_groups_per_shard():
    """``buffer.sampling`` group modes (theory.md section 11.9): B / (T G) whole groups per
    shard, each group on one shard."""
    from llm_experiments.config import load_config
    cfg = load_config("cpu_tiny", ["schedule.mode=async", "schedule.mu_accounting=2",
                                   "schedule.trainers=2", "schedule.batch_size=16",
                                   "schedule.group_size=4", "buffer.capacity=32",
                                   "buffer.sampling=groups_without_replacement"])
    buf = RolloutBuffer.for_config(cfg)
    for g in range(8):
        buf.add(rollouts(4 * g, 4, version=g, group=100 + g), insert_step=g)
    assert buf.can_sample(16)
    batch = buf.sample(16, step=8, rng=np.random.default_rng(0))
    shard_of = {int(i): k for k in range(2) for i in buf.index.items(k)}
    by_group = {}
    for r in batch:
        by_group.setdefault(r.group_id, []).append(r.item_id)
    assert len(by_group) == 4 and all(len(v) == 4 for v in by_group.values())
    assert all(len({shard_of[i] for i in v}) == 1 for v in by_group.values())
    assert sorted(shard_of[r.item_id] for r in batch) == [0] * 8 + [1] * 8
    with pytest.raises(ValueError, match="consecutive ids of one key"):
        buf.add(rollouts(100, 2, group=7) + rollouts(102, 2, group=8), insert_step=9)
