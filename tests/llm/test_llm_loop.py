"""The run loop's shared pieces (``engines.loop``): the counters and the synchronous step."""

import numpy as np
import pytest

from llm_experiments.rl.buffer import Rollout, RolloutBuffer
from llm_experiments.config import load_config
from llm_experiments.engines.loop import RunBooks, fill_and_draw
from llm_experiments.rl.schedule import ComputeClock, Production


def test_books_ids_counters_and_checkpoint_round_trip():
    books = RunBooks(ComputeClock(n_params=1000, batch_size=8), mu_fixed=2.0)
    assert books.new_ids(3, 4) == (0, 0) and books.new_ids(1, 4) == (12, 3)
    assert (books.next_item, books.next_group) == (16, 4)
    books.start_step()
    books.count_made([1.0, 0.0, 0.5, 0.5], gen_seconds=0.25, tokens=40)
    books.consumed += 8
    assert books.train_reward() == 0.5 and books.replay_ratio() == 2.0
    books.clock.steps = 1
    c = books.counters(probe_seconds=0.1)
    # compute in units of one update: steps + mu * generated / B (theory.md section 3)
    assert c["compute_units"] == pytest.approx(1 + 2.0 * 4 / 8)
    assert c["samples_generated"] == 4 and c["samples_consumed"] == 8
    assert c["mu_accounting"] == 2.0 and c["probe_seconds"] == 0.1
    books.start_step()
    assert books.train_reward() is None
    # the emulated engine's checkpoint layout: clock, counters, elapsed, and the seconds per
    # phase (time_breakdown); a checkpoint from before the phases still loads
    state = books.state_dict()
    assert set(state) == {"clock", "counters", "elapsed", "phases"}
    older = RunBooks(ComputeClock(1, 1))
    older.load_state_dict({k: v for k, v in state.items() if k != "phases"})
    assert set(older.phases.values()) == {0.0}
    back = RunBooks(ComputeClock(1, 1))
    back.load_state_dict(state)
    assert (back.next_item, back.next_group, back.consumed) == (16, 4, 8)
    assert back.clock.gen_tokens == 40 and back.elapsed_before == state["elapsed"] > 0


def test_fill_and_draw_probes_between_the_insert_and_the_draw():
    cfg = load_config("cpu_tiny", ["schedule.batch_size=8", "schedule.group_size=4",
                                   "schedule.replay_ratio=2", "buffer.capacity=16"])
    production, buffer = Production(cfg.schedule), RolloutBuffer.for_config(cfg)
    books = RunBooks(ComputeClock(1, 8))

    def produce(n_groups, version):
        first, group = books.new_ids(n_groups, 4)
        out = [Rollout(item_id=first + i, group_id=group + i // 4, problem_id=0,
                       version=version, prompt=np.zeros(2, np.int32),
                       completion=np.ones(3, np.int32), logprobs=np.zeros(3, np.float32),
                       reward=1.0, advantage=0.0) for i in range(4 * n_groups)]
        books.count_made([r.reward for r in out], 0.0, 0)
        return out

    seen = []
    for step in range(3):
        drawn = fill_and_draw(production, buffer, step, produce, np.random.default_rng(step),
                              books, before_draw=lambda: seen.append((len(buffer), books.consumed)))
        assert len(drawn.batch) == 8 and len(drawn.new) == 4
    # each step adds B/y = 4 rollouts before the hook runs, and draws B = 8 after it
    assert seen == [(4, 0), (8, 8), (12, 16)]
    assert books.consumed == 24 and books.clock.generated == 12


def test_the_probes_never_see_what_the_steps_draw_expires():
    """Issue 38: with buffer.horizon_growth the probes read the buffer before the draw
    expired the groups outside the step's window, so they measured rollouts no draw could
    give. At step t (g = 0.5) the window holds the rollouts of the last max(1, 0.5 (t + 1))
    steps; the probe hook sees exactly those."""
    cfg = load_config("cpu_tiny", ["schedule.batch_size=8", "schedule.group_size=4",
                                   "schedule.replay_ratio=2", "buffer.capacity=64",
                                   "buffer.horizon_growth=0.5"])
    production, buffer = Production(cfg.schedule), RolloutBuffer.for_config(cfg)
    books = RunBooks(ComputeClock(1, 8))

    def produce(n_groups, version):
        first, group = books.new_ids(n_groups, 4)
        return [Rollout(item_id=first + i, group_id=group + i // 4, problem_id=0,
                        version=version, prompt=np.zeros(2, np.int32),
                        completion=np.ones(3, np.int32), logprobs=np.zeros(3, np.float32),
                        reward=1.0, advantage=0.0) for i in range(4 * n_groups)]

    seen = []
    for step in range(6):
        fill_and_draw(production, buffer, step, produce, np.random.default_rng(step), books,
                      before_draw=lambda: seen.append(sorted(set(buffer.versions()))))
    window = [max(1, int(0.5 * (t + 1))) for t in range(6)]
    assert seen == [list(range(t - k + 1, t + 1)) for t, k in enumerate(window)]
