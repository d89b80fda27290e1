"""The Ray engine (``llm_experiments/engines/ray_engine.py``) on one local Ray cluster shared
by these tests (``ray.init(num_cpus=2)``, started once)."""

import os
import secrets
import threading
import time

import numpy as np
import pytest

from llm_helpers import CACHE, import_extra, killed_and_resumed, small_config

ray = import_extra("ray", "ray")

RAY = ["schedule.engine=ray", "schedule.mode=async", "probe.every=0"]
# The shipped cpu_tiny model (cached warm start, greedy accuracy ~0.3) learns within 60 steps;
# the small model of the other tests does not.
LEARN = ["run.steps=60", "eval.every=20", "eval.pass_k_problems=0", "run.checkpoint_every=10",
         "probe.every=0", "run.progress=false", f"run.cache_dir={CACHE}"]


@pytest.fixture(scope="session")
def cluster():
    """One local Ray cluster for the session (a token of its own: no file in the home)."""
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def actors(cluster):
    """Actors a test starts: killed when it ends, passed or not (they hold cluster CPUs)."""
    started = []
    yield started
    for actor in started:
        ray.kill(actor)


def _rollouts(n, first, tokens=(3, 4, 5)):
    from llm_experiments.rl.buffer import Rollout
    rng = np.random.default_rng(first)
    return [Rollout(first + i, (first + i) // 4, i, first // 8, np.array([1, 2], np.int32),
                    np.array(tokens, np.int32), np.full(len(tokens), -1.0, np.float32),
                    float(rng.random() < 0.5), float(rng.normal())) for i in range(n)]


def test_buffer_actor_draws_as_the_in_process_buffer(actors):
    """Same stream in, same draws out: two shards, without replacement, positive bias."""
    from llm_experiments.rl.buffer import RolloutBuffer
    from llm_experiments.engines.ray_actors import BufferHolder
    from llm_experiments.engines.seeds import BUFFER_STREAM, derived_seed
    cfg = small_config(*RAY, "schedule.trainers=2", "schedule.batch_size=8", "buffer.capacity=24",
                       "buffer.sampling=without_replacement", "buffer.delta=0.25")
    actor = ray.remote(BufferHolder).options(num_cpus=0).remote(cfg)
    actors.append(actor)
    local = RolloutBuffer.for_config(cfg)
    rng = np.random.default_rng(derived_seed(cfg.run.seed, 0, BUFFER_STREAM))
    for step in range(6):
        batch = _rollouts(24, 24 * step)
        ray.get(actor.add.remote(batch, step))
        local.add(batch, insert_step=step)
        for shard in range(2):
            got = ray.get(actor.sample.remote(4, step, shard))
            want = local.sample_shard(4, step, rng, shard)
            assert [r.item_id for r in got] == [r.item_id for r in want]
        assert ray.get(actor.pop_stats.remote(step)) == local.step_stats()
    assert ray.get(actor.histograms.remote()) == local.index.histograms()


@pytest.mark.parametrize("loss", ["grpo", "neg_clip"])
def test_two_trainer_ranks_hold_identical_weights(actors, loss):
    """Gloo all-reduce: after a step both ranks hold the same weights, and the averaged
    gradient is the whole batch's (its norm equals one process's on the union of shards),
    for a loss averaged per rollout (m2po's mask and the token losses' denominator are each
    rank's shard's, as in AReaL)."""
    import torch

    from llm_experiments.engines.ray_actors import BufferHolder, TrainerRank
    cfg = small_config(*RAY, "schedule.trainers=2", "buffer.capacity=32", f"trainer.loss={loss}")
    reference = TrainerRank(small_config(*RAY, "buffer.capacity=32", f"trainer.loss={loss}"),
                            0, None, None, None)
    initial = {k: v.clone() for k, v in reference.model.state_dict().items()}
    vocab = reference.model.config.vocab_size
    batch = _rollouts(32, 0)
    rng = np.random.default_rng(0)
    for r in batch:
        r.completion = rng.integers(3, vocab, size=3).astype(np.int32)
        r.logprobs = np.full(3, -2.0, np.float32)
    buffer = ray.remote(BufferHolder).options(num_cpus=0).remote(cfg)
    ray.get(buffer.add.remote(batch, 0))
    ranks = [ray.remote(TrainerRank).options(num_cpus=0.5).remote(cfg, k, buffer, None, None)
             for k in range(2)]
    actors.extend([buffer, *ranks])
    host, port = ray.get(ranks[0].address.remote())
    ray.get([t.join.remote(host, port) for t in ranks])
    rep0, w0, rep1, w1 = ray.get([ref for t in ranks
                                  for ref in t.step.options(num_returns=2).remote(0, True)])
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not all(torch.equal(w0[k], initial[k]) for k in w0)
    assert rep0.stats["grad_norm"] == rep1.stats["grad_norm"]
    # The same 16 draws (8 from each shard) in one process with the whole batch.
    drawn = ray.get(buffer.state_dict.remote())["buffer"]["index"]["uses"]["item_id"]
    assert len(drawn) == 16
    stats = reference.train_step([batch[i] for i in drawn], keep_grad=False)
    assert rep0.stats["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-4)
    assert {"acted_neg", "logr2", "ratio_max", "head_grad_norm"} <= set(rep0.stats)


def _kill_when(path, lines, suffix):
    """Kill the actor whose name ends with ``suffix`` once ``path`` has ``lines`` lines."""
    def watch():
        deadline = time.time() + 600
        while time.time() < deadline:
            if os.path.exists(path) and sum(1 for _ in open(path)) >= lines:
                names = [n for n in ray.util.list_named_actors() if n.endswith(suffix)]
                if names:
                    ray.kill(ray.get_actor(names[0]))
                    return
            time.sleep(0.05)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_killed_sampler_stops_the_run_and_resume_learns(cluster, tmp_path):
    """W = T = 1: a sampler killed mid-run ends the run with an error naming it (no hang);
    --resume continues from the checkpoint with every step logged once, and the run learns."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import REQUIRED_KEYS, read_jsonl
    cfg = load_config("cpu_tiny", RAY + LEARN)
    out = str(tmp_path / "run")
    watcher = _kill_when(os.path.join(out, "metrics.jsonl"), 25, "/sampler0")
    with pytest.raises(RuntimeError, match="sampler0 actor died"):
        run_experiment(cfg, out)
    watcher.join()
    summary = run_experiment(cfg, out, resume=True)
    records = read_jsonl(os.path.join(out, "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(cfg.run.steps + 1))
    assert all(set(REQUIRED_KEYS) <= set(r) for r in records)
    step = records[5]
    assert step["buffer_occupancy"] > 0 and step["staleness_mean"] is not None
    assert set(step["busy_seconds"]) == {"sampler0", "trainer0"}
    assert step["train_seconds"] > 0 and step["gen_seconds"] > 0
    assert summary["samples_consumed"] == cfg.run.steps * cfg.schedule.batch_size
    assert sum(summary["histograms"]["replay_ratio"].values()) == summary["samples_generated"]
    assert summary["best_eval_accuracy"] >= summary["warm_start_accuracy"] + 0.1


def test_sweep_on_ray_writes_the_usual_files(cluster, tmp_path):
    """``sweep --engine ray``: each run a Ray task on the shared cluster; a rerun skips the
    finished run (resumable), the results table is the usual one."""
    import yaml

    from llm_helpers import SMALL
    from llm_experiments.study.sweep import SweepCounts, load_spec, run_sweep
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "config": "cpu_tiny",
        "set": {**dict(kv.split("=", 1) for kv in SMALL), "run.steps": 2, "eval.every": 2},
        "grid": {"run.seed": [0]}}))
    out = tmp_path / "sweep"
    counts = run_sweep(load_spec(str(spec_path)), str(out), engine="ray", progress=False)
    assert counts == SweepCounts(total=1, skipped=0, compacted=0, finished=1, failed=0)
    rows = [line for line in (out / "results.jsonl").read_text().splitlines() if line]
    assert len(rows) == 1 and (out / "results.csv").exists()
    again = run_sweep(load_spec(str(spec_path)), str(out), engine="ray", progress=False)
    assert again.skipped == 1 and again.finished == 0


def test_a_signal_cancels_a_ray_sweep_and_stops_its_runs(cluster, tmp_path):
    """``sweep --engine ray`` signalled: its tasks are cancelled, each stops its run (here one
    ignoring SIGTERM, so SIGKILL after ``stop_grace``) with the run's subprocess; a rerun
    resumes and finishes every run."""
    import json
    import signal
    import sys
    from pathlib import Path

    import yaml

    from sweep_processes import kill_recorded, runs_under_way, survivors
    from llm_experiments.study.sweep import SweepCounts, SweepInterrupted, load_spec, run_sweep
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "config": "cpu_tiny", "grid": {"seed": [0, 1, 2]},
        "command": [sys.executable, str(Path(__file__).parent.parent / "fake_run.py")]}))
    out, pid_dir = tmp_path / "sweep", tmp_path / "pids"
    pid_dir.mkdir()
    signalled = []

    def signal_when_under_way():
        runs_under_way(out / "runs", finished=0, deadline=time.time() + 60)
        signalled.append(time.time())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_when_under_way, daemon=True).start()
    try:
        with pytest.raises(SweepInterrupted) as stopped:
            run_sweep(load_spec(str(spec_path)), str(out), engine="ray", progress=False,
                      stop_grace=0.5, env={"FAKE_SLEEP": "0.2", "FAKE_STEPS": "50",
                                           "FAKE_HELPER": "1", "FAKE_IGNORE_TERM": "1",
                                           "FAKE_PID_DIR": str(pid_dir)})
        assert stopped.value.code == 143 and time.time() - signalled[0] < 10
        # Ray delivers a cancel to a busy worker late on a loaded machine (the sweep waits
        # grace + 5 s for it), so the runs get that long again to be gone.
        assert survivors(pid_dir, within=10.0) == []
    finally:
        kill_recorded(pid_dir)
    assert not list((out / "runs").glob("*/summary.json"))
    counts = run_sweep(load_spec(str(spec_path)), str(out), engine="ray", progress=False,
                       env={"FAKE_SLEEP": "0", "FAKE_STEPS": "50"})
    assert counts == SweepCounts(total=3, skipped=0, compacted=0, finished=3, failed=0)
    for run_dir in (out / "runs").iterdir():
        steps = [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")]
        assert steps == list(range(1, 51))


def test_injected_delay_is_slept_counted_and_reproducible():
    """schedule.injected_gen_delay: each sampler call sleeps the drawn delay, reported as part
    of its generation time; 0 sleeps nothing; the lognormal draws are reproducible per
    (seed, sampler) and spread around the median."""
    from llm_experiments.engines.ray_actors import InjectedDelay, SamplerWorker
    chunks = []
    for delay in (0.0, 0.05):
        worker = SamplerWorker(small_config(*RAY, f"schedule.injected_gen_delay={delay}"))
        rng = np.random.default_rng(0)
        for i in range(3):
            chunks.append((delay, worker.produce(worker.task.sample_train(2, rng), 0, None, i,
                                                 8 * i, 2 * i)[0]))
    for delay, report in chunks:
        assert report.injected_seconds == delay
        assert report.gen_seconds >= delay
    on = [r for d, r in chunks if d > 0]
    assert sum(r.injected_seconds for r in on) == pytest.approx(0.15)
    draws = [InjectedDelay(0.2, 0.5, 7, 1).draw() for _ in range(2)]
    assert draws[0] == draws[1] != InjectedDelay(0.2, 0.5, 7, 0).draw()
    many = InjectedDelay(0.2, 0.5, 7, 1)
    logs = np.log([many.draw() for _ in range(2000)])
    assert np.median(logs) == pytest.approx(np.log(0.2), abs=0.05)
    assert np.std(logs) == pytest.approx(0.5, rel=0.1)


# Probes every 3 steps, with the optional reuse and contribution tables; a buffer of 32 groups
# so that probed rollouts survive one probe interval.
PROBED = ["run.steps=12", "probe.every=3", "probe.reuse_gaps=[1]", "probe.contribution=true",
          "buffer.capacity=128", "run.checkpoint_every=6"]


def test_probes_on_ray_write_the_emulated_layout(cluster, tmp_path):
    """probe.every > 0 on the Ray engine (trainer rank 0 probes while the samplers pause):
    probes.npz holds the tables and columns of an emulated run with the same probe settings,
    the rows whose number the settings fix, finite noise and one rate R per run; the
    calibration reads it; the probe seconds are reported."""
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    from llm_experiments.study.validation import load_probes
    from replaytheory.fit.calibrate import calibrate
    from replaytheory.fit.probes import ProbeSet
    configs = {"ray": small_config(*RAY, *PROBED),
               "emulated": small_config("schedule.mode=async", "schedule.mu_accounting=2.0",
                                        *PROBED)}
    sets, summaries = {}, {}
    for name, cfg in configs.items():
        summaries[name] = run_experiment(cfg, str(tmp_path / name))
        path = str(tmp_path / name / "probes.npz")
        with np.load(path) as z:
            sets[name] = (sorted(z.files), ProbeSet.load(path))
    (ray_keys, ray_ps), (emu_keys, emu_ps) = sets["ray"], sets["emulated"]
    assert ray_keys == emu_keys and any(k.startswith("reuse/") for k in ray_keys)
    fresh = ray_ps.tables["noise"]["source"] == 1
    for ps in (ray_ps, emu_ps):
        assert list(ps.tables["minibatch"]["probe_step"]) == [0, 3, 6, 9]
        assert np.sum(ps.tables["noise"]["source"] == 1) == fresh.sum() == 4 * 2 * 5
    for name, table in ray_ps.tables.items():
        # panels (emulated engine only) are off here, and so are all their tables
        if name in ("panel", "diversity") or name.startswith("align"):
            assert ray_ps.n_rows(name) == emu_ps.n_rows(name) == 0
            continue
        assert ray_ps.n_rows(name) > 0, name
        assert set(table) == set(emu_ps.tables[name]), name
    noise = ray_ps.tables["noise"]
    assert np.all(np.isfinite(noise["sq_noise"])) and np.all(noise["sq_noise"] > 0)
    assert (noise["staleness"][~fresh] > 0).any()
    rate = np.unique(ray_ps.tables["minibatch"]["rollouts_per_step"])
    assert rate.size == 1 and rate[0] == summaries["ray"]["rollouts_per_step"]
    assert ray_ps.counts["steps"] == 12 and ray_ps.counts["workers"] == 1
    probes = load_probes([str(tmp_path / "ray" / "probes.npz")])
    cal = calibrate(probes, probes.counts, n_boot=20)
    assert 0 <= cal.rho() <= 1 and cal.mu == ray_ps.counts["mu_measured"]
    # The smoothness inputs are there and finite; whether a 12-step run's bias-corrected
    # gradient changes come out positive (so that L is estimable) depends on the machine's
    # numerics, and is not what this test is about.
    mb = probes.tables["minibatch"]
    assert np.all(np.isfinite(mb["grad_change_sq"])) and (mb["drift_prev"] > 0).any()
    summary = summaries["ray"]
    assert summary["probe_seconds"] > 0 and summary["busy_seconds"]["trainer0"] > 0
    assert summary["probe_fraction_of_wall_time"] > 0
    assert read_jsonl(str(tmp_path / "ray" / "metrics.jsonl"))[-1]["probe_seconds"] > 0


# ---- issue 26: placement, LIFO, lost inserts, evaluation off the driver's path -------------
# A short run: its 2 steps fit well within these tests' bound on any wait.
SHORT = ["run.steps=3", "eval.every=2", "eval.pass_k_problems=0", "run.checkpoint_every=3"]
BOUND = 90.0  # seconds any wait of these tests may take (the engine's default is 900)


@pytest.fixture
def bounded(monkeypatch):
    """No wait of the engine longer than BOUND seconds in the test."""
    from llm_experiments.engines import ray_engine
    monkeypatch.setattr(ray_engine, "STALL_SECONDS", BOUND)
    return ray_engine


def test_three_actors_are_placed_on_two_cpus(cluster):
    """W = 2, T = 1 on the 2-CPU cluster: round(2/3, 4) asked 3 x 0.6667 = 2.0001 CPUs and the
    placement group never became ready; the exact shares are placed at once."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from llm_experiments.engines.ray_engine import bundles
    cfg = small_config(*RAY, "schedule.workers=2")
    pg = placement_group(bundles(cfg, ray.cluster_resources()), strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=20)
    finally:
        remove_placement_group(pg)


def test_placement_that_cannot_be_made_fails_fast_naming_what_is_free(bounded, actors,
                                                                       monkeypatch, tmp_path):
    """Another actor holds both CPUs: the run stops after PLACE_SECONDS (not the 900 s stall)
    with an error giving the bundles, the cluster's CPUs and what is free."""
    monkeypatch.setattr(bounded, "PLACE_SECONDS", 2.0)

    @ray.remote(num_cpus=2)
    class Holder:
        def ready(self):
            return True

    holder = Holder.remote()
    actors.append(holder)
    ray.get(holder.ready.remote(), timeout=BOUND)
    run = bounded.RayRun(small_config(*RAY, *SHORT), str(tmp_path))
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"cannot place 1 sampler and 1 trainer actors "
                                           r"\(bundles \[\{'CPU': 1.0\}, \{'CPU': 1.0\}\]\) "
                                           r"within 2 s .*\{'CPU': 2.0\} in all and "
                                           r"\{'CPU': 0.0\} free"):
        run.run()
    assert time.perf_counter() - t0 < 20


def test_lifo_at_its_least_capacity_runs_to_completion(bounded, tmp_path):
    """The issue's LIFO run (B = 20, G = 4, W = 2) with the least capacity the config check
    allows (24; 20 deadlocked with 16 held): every step is trained, every rollout made is
    trained on once or still queued, and three actors share the two CPUs."""
    cfg = small_config(*RAY, *SHORT, "schedule.workers=2", "schedule.batch_size=20",
                       "buffer.lifo=true", "buffer.capacity=24")
    summary = bounded.RayRun(cfg, str(tmp_path)).run()
    assert summary["steps"] == 3 and summary["samples_consumed"] == 60
    assert set(summary["busy_seconds"]) == {"sampler0", "sampler1", "trainer0"}
    uses = summary["histograms"]["replay_ratio"]
    assert set(uses) <= {0, 1, "0", "1"}, uses  # each rollout used at most once
    assert 60 <= summary["samples_generated"] <= 60 + 24


def test_a_failed_buffer_insert_stops_the_run_and_is_not_counted(bounded, tmp_path):
    """The buffer actor's second insert fails: the run stops at once with an error naming the
    insert and its cause, and the rollouts counted as made are those the buffer took."""
    from llm_experiments.engines.ray_actors import BufferHolder

    class FailingHolder(BufferHolder):
        calls = 0

        def add(self, rollouts, insert_step):
            self.calls += 1
            if self.calls == 2:
                raise OSError("no space left for the test's rollouts")
            return super().add(rollouts, insert_step)

    cfg = small_config(*RAY, *SHORT, "run.steps=20")
    run = bounded.RayRun(cfg, str(tmp_path))
    run.holder = FailingHolder
    with pytest.raises(RuntimeError, match=r"buffer actor failed to insert sampler0's chunk "
                                           r"of 16 rollouts \(OSError\(.no space left"):
        run.run()
    assert run.books.clock.generated == 16  # the first chunk, the one the buffer holds
    assert run.step < cfg.run.steps


def test_the_driver_hands_on_chunks_while_it_evaluates(bounded, tmp_path):
    """A slow evaluation (2 s more) at steps 0 and 2: meanwhile the driver still hands
    finished chunks on to the buffer and restarts their samplers (it used to wait for the
    evaluation, so no chunk moved), and the evaluation's results are logged at their step."""
    from llm_experiments.engines.metrics import read_jsonl
    cfg = small_config(*RAY, *SHORT)
    run = bounded.RayRun(cfg, str(tmp_path))
    fast, moved = run.evaluate, {}

    def slow(t):
        if t == cfg.run.steps:  # the final evaluation, after the loop
            return fast(t)
        before = run.books.clock.generated
        time.sleep(2.0)
        moved[t] = run.books.clock.generated - before
        return fast(t)

    run.evaluate = slow
    run.run()
    assert sorted(moved) == [0, 2] and all(n > 0 for n in moved.values()), moved
    records = read_jsonl(str(tmp_path / "metrics.jsonl"))
    evaluated = [r["step"] for r in records if r.get("eval_accuracy") is not None]
    assert evaluated == [0, 2, 3]


def test_the_actors_run_the_loop_without_the_driver(cluster, tmp_path, monkeypatch):
    """schedule.ray_loop=actors: the samplers loop on their own and the trainer runs blocks
    of steps up to each checkpoint, pulling from the buffer actor. The driver starts only
    those blocks (at steps 0, 5 and 10 of 12, and 5 again after the kill at step 7), yet
    every step is logged once with its staleness (>= 0), and the killed run resumes."""
    from llm_experiments.engines.ray_pull import RayPullRun
    cfg = small_config(*RAY, "schedule.ray_loop=actors", "run.steps=12", "eval.every=4",
                       "run.checkpoint_every=5")
    blocks = []

    def count_blocks(run, t):
        if run.block is None:
            blocks.append(t)
    summary, records = killed_and_resumed(monkeypatch, RayPullRun, cfg, tmp_path / "run", 7,
                                          before=count_blocks)
    assert blocks == [0, 5, 5, 10]  # the second block again after the kill
    assert [r["step"] for r in records] == list(range(13))
    assert [r["step"] for r in records if r.get("eval_accuracy") is not None] == [0, 4, 8, 12]
    stale = [r["staleness_mean"] for r in records[:-1]]
    assert all(s is not None and s >= 0 for s in stale)
    assert summary["samples_consumed"] == 12 * cfg.schedule.batch_size
    assert summary["schedule"]["ray_loop"] == "actors"
    assert records[-1]["gen_seconds"] > 0 and records[-1]["train_seconds"] > 0
    # the books count what the buffer holds, across the kill (chunks at a checkpoint included)
    assert sum(summary["histograms"]["replay_ratio"].values()) == summary["samples_generated"]


def test_the_actors_loop_refuses_what_needs_the_driver():
    for bad, name in (("probe.every=5", "probe.every"), ("buffer.lifo=true", "buffer.lifo")):
        with pytest.raises(ValueError, match=name) as err:
            small_config(*RAY, "schedule.ray_loop=actors", bad, "buffer.capacity=64")
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="schedule.ray_loop=actors needs schedule.engine=ray"):
        small_config("schedule.ray_loop=actors")


def test_the_actors_loop_runs_the_serial_quotas_in_mode_sync(cluster, tmp_path):
    """Mode sync on Ray (ray_loop=actors): the serial schedule's rollouts per step exactly
    (B / y = 8 a step at y = 2, none made past the last step's chunk), every step waiting
    for its chunk, the consumption lag logged, and the time breakdown per side."""
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = small_config("schedule.engine=ray", "schedule.mode=sync", "probe.every=0",
                       "schedule.ray_loop=actors", "run.steps=8", "eval.every=100",
                       "run.checkpoint_every=4")
    summary = run_experiment(cfg, str(tmp_path))
    records = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(9))
    assert summary["samples_generated"] == 8 * 8
    assert summary["samples_consumed"] == 8 * 16
    assert all(r["staleness_mean"] >= 0 for r in records[:-1])
    assert sum(summary["histograms"]["replay_ratio"].values()) == summary["samples_generated"]
    tb = summary["time_breakdown"]  # per side, each the mean over its actors
    assert tb["schedule"] == "ray" and tb["wall_seconds"] == pytest.approx(summary["wall_time"])
    for side in ("sampler", "trainer"):
        assert sum(tb[side].values()) == pytest.approx(tb["wall_seconds"])
        assert all(v >= 0 for k, v in tb[side].items() if k != "other"), tb[side]
    assert tb["sampler"]["generate"] > 0 and tb["trainer"]["update"] > 0


def test_the_pull_buffers_waits_wake_at_a_change_and_end_at_their_timeout():
    """The actors' loop polls nothing: a trainer waiting for step 0's batch returns as soon
    as its chunk is inserted (well before its 30 s timeout), a sampler's order waits while
    mode sync's quota is ahead and returns at once when a step is done, and a wait with
    nothing to wake it ends at its timeout with "not yet"."""
    import asyncio
    from llm_experiments.engines.ray_pull import PullBuffer
    cfg = small_config("schedule.engine=ray", "schedule.mode=sync", "probe.every=0",
                       "schedule.ray_loop=actors", "run.steps=8", "schedule.overlap_ahead=1")
    buf = PullBuffer(cfg)
    rollouts = _rollouts(cfg.schedule.batch_size, 0)

    async def scenario():
        t0 = time.monotonic()
        assert await buf.await_ready(0, 0.05) is False  # nothing in: the timeout ends it
        assert await buf.await_step(0, 1, 0.05) is None
        waiting = asyncio.ensure_future(buf.await_ready(0, 30.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        order = buf.order()
        buf.add_chunk(rollouts, 0, "report", order[0])
        assert await waiting is True
        orders = [buf.order()]  # one chunk ahead of the steps done, then "wait"
        later = asyncio.ensure_future(buf.await_order(30.0))
        await asyncio.sleep(0.05)
        assert not later.done()
        buf.step_done(0, 0, "step 0")
        orders.append(await later)
        assert await buf.await_step(0, 1, 30.0) == (["step 0"], [(0, "report")])
        return time.monotonic() - t0, orders

    seconds, orders = asyncio.run(scenario())
    assert seconds < 5
    assert [o[0] for o in orders] == [1, 2]
