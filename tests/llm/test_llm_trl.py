"""The TRL replay trainer (llm_experiments.integrations.trl): TRL's extension points, the
calculator -> GRPOConfig mapping, realised replay ratio, real importance ratios of replayed
rows, the harness's FIFO order, and the ``trl`` command (records, probes, learning)."""

import inspect
import json
import os

import numpy as np
import pytest

from llm_helpers import CACHE, SMALL, import_extra, small_config

import_extra("trl", "trl")

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from llm_experiments.rl.buffer import RolloutBuffer  # noqa: E402
from llm_experiments.cli import main  # noqa: E402
from llm_experiments.integrations import trl as rt  # noqa: E402
from llm_experiments.rl.schedule import Production  # noqa: E402
from replaytheory.calculator import optimal_config  # noqa: E402
from replaytheory.fit.probes import ProbeSet  # noqa: E402

G = 4
# A replay design of the calculator small enough for a CPU test: B = 16, R = 3 -> 4, N = 21
# (section 5's model: the mapping, not the model, is under test).
REC = optimal_config(mu=6.84, alpha=0.2, batch_size=16, max_buffer_size=64, reuse=None,
                     horizon_source="model")


class Spy(rt.ReplayGRPOTrainer):
    """Records, per step, the largest |log pi_theta - log pi_old| the loss sees (TRL falls
    back to the current log-probs when no old ones are given: ratio 1)."""

    def _compute_loss(self, model, inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with torch.no_grad():
            now, _, _ = self._get_per_token_logps_and_entropies(
                model, ids, mask, inputs["completion_ids"].size(1))
        old = inputs.get("old_per_token_logps", now)
        gap = ((now - old).abs() * inputs["completion_mask"]).max()
        self.log_ratio_max.append(float(gap))
        return super()._compute_loss(model, inputs)


def _train(tmp_path, replay: "rt.ReplaySettings", r: int, steps: int, lr: float = 1e-3,
           steps_per_generation: int = 1):
    """A ``Spy`` trainer of the small warm-started model, trained ``steps`` steps."""
    from datasets import Dataset

    from llm_experiments.policy.models import load_policy
    from llm_experiments.tasks.make import make_task
    torch.set_num_threads(1)
    cfg = small_config()
    task = make_task(cfg.task)
    model, tok = load_policy(cfg, task)
    problems = task.sample_train(steps * r // G, np.random.default_rng(0))
    assert steps % steps_per_generation == 0
    by_id = {p.pid: p for p in problems}
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems],
                              "pid": [p.pid for p in problems]})

    def reward(completions, pid, **_):
        return [task.reward(by_id[int(i)], c) for c, i in zip(completions, pid)]

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                      gradient_checkpointing=False, per_device_train_batch_size=r,
                      num_generations=G, steps_per_generation=steps_per_generation,
                      max_completion_length=4,
                      top_k=0, learning_rate=lr, beta=0.0, max_steps=steps, report_to="none",
                      disable_tqdm=True, logging_steps=1, save_strategy="no", seed=0)
    trainer = Spy(model=model, reward_funcs=reward, args=args, train_dataset=data,
                  processing_class=tok, replay=replay, keep_steps=True)
    trainer.log_ratio_max = []
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def mapped_run(tmp_path_factory):
    """The calculator's recommendation, mapped to TRL and trained 8 steps."""
    mapped = rt.trl_config(REC, G)
    return mapped, _train(tmp_path_factory.mktemp("mapped"), mapped.replay,
                          mapped.per_device_train_batch_size, steps=8)


# ---- TRL's extension points: an upgrade must fail here, not in a user's run --------------

def test_trl_extension_points_present():
    assert rt.missing_extension_points() == []
    rt.check_trl_version()
    # The pitfall this trainer fixes: TRL's loss takes old log-probs from the inputs, else
    # the current ones (ratio 1).
    assert 'inputs.get("old_per_token_logps")' in inspect.getsource(GRPOTrainer._compute_loss)


def test_trl_version_and_changed_api_are_refused(monkeypatch):
    with pytest.raises(ImportError, match="trl"):
        rt.check_trl_version("1.17.0")
    monkeypatch.setitem(rt.EXTENSION_POINTS, "_prepare_inputs", ("no_such_parameter",))
    assert rt.missing_extension_points() == [
        "GRPOTrainer._prepare_inputs lost parameters ['no_such_parameter']"]
    with pytest.raises(RuntimeError, match="no_such_parameter"):
        rt.ReplayGRPOTrainer(model=None, replay=rt.ReplaySettings(8, 8))


# ---- calculator -> TRL -------------------------------------------------------------------

def test_trl_config_keeps_the_horizon_and_rounds_r_to_whole_groups(tmp_path):
    mapped = rt.trl_config(REC, G, sampling="never_used_first", seed=3)
    r = mapped.per_device_train_batch_size
    assert r % G == 0 and r == 4 and mapped.replay.batch_size == REC.batch_size
    assert mapped.replay.buffer_size == round(REC.horizon * r)
    assert mapped.horizon == pytest.approx(REC.horizon, rel=0.05)
    assert mapped.replay_ratio == REC.batch_size / r and mapped.notes
    assert (mapped.replay.sampling, mapped.replay.seed) == ("never_used_first", 3)
    conf = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      **mapped.grpo_config_kwargs())
    assert conf.generation_batch_size == r and conf.steps_per_generation == 1


def test_trl_config_on_policy_and_async():
    on = optimal_config(mu=2.0, alpha=2.0, batch_size=18, horizon_source="measured")
    mapped = rt.trl_config(on, G)
    assert on.on_policy and mapped.replay.on_policy
    assert mapped.per_device_train_batch_size == mapped.replay.batch_size == 16
    with pytest.raises(ValueError, match="gpus=None"):
        rt.trl_config(optimal_config(mu=6.84, alpha=0.1, gpus=4, batch_size=16), G)
    with pytest.raises(ValueError, match="num_generations"):
        rt.trl_config(REC, 1)


# ---- the trainer ---------------------------------------------------------------------------

def test_realised_replay_ratio_is_the_configured_one(mapped_run):
    mapped, trainer = mapped_run
    realised = trainer.consumed / trainer.clock.generated
    assert realised == pytest.approx(mapped.replay_ratio, rel=0.05)
    history = [h for h in trainer.state.log_history if "replay/replay_ratio" in h]
    assert history[-1]["replay/replay_ratio"] == pytest.approx(realised)
    assert history[-1]["replay/staleness_mean"] > 0
    assert trainer.calibration.mu() > 0 and history[-1]["replay/mu_measured"] > 0


def test_replayed_rows_have_real_importance_ratios(mapped_run):
    """Step 0 trains on fresh rows only (the stored log-probs are the behaviour ones: ratio
    1); after updates, replayed rows' ratios differ from 1 (the pitfall's regression)."""
    _, trainer = mapped_run
    gaps = trainer.log_ratio_max
    assert gaps[0] < 1e-4
    assert max(gaps[1:]) > 1e-3
    assert any(h.get("clip_ratio/region_mean", 0) > 0 for h in trainer.state.log_history)


def test_fifo_order_and_draws_equal_the_harness(tmp_path):
    """The same stream of rollouts gives the harness buffer (``Production.fill`` then one
    draw per step from a generator seeded alike) the same contents and draws."""
    replay = rt.ReplaySettings(24, 16, sampling="without_replacement", delta=0.25, seed=5)
    trainer = _train(tmp_path, replay, r=8, steps=5)
    cfg = trainer.harness
    buf, prod = RolloutBuffer.for_config(cfg), Production(cfg.schedule)
    rng = np.random.default_rng(5)
    assert len(trainer.steps[0].new) > 8  # step 0 needed extra groups (B > R)
    for rec in trainer.steps:
        stream = list(rec.new)

        def produce(n_groups, version, stream=stream):
            out = stream[:n_groups * G]
            del stream[:n_groups * G]
            assert all(r.version == version for r in out)
            return out
        prod.fill(buf, rec.step, produce)
        drawn = buf.sample(16, rec.step, rng)
        assert [r.item_id for r in drawn] == [r.item_id for r in rec.batch]
    assert buf.index.items().tolist() == trainer.buffer.index.items().tolist()


def test_generation_batches_make_k_r_rollouts_every_k_steps(tmp_path):
    """steps_per_generation = k: one generation of k R rollouts at every k-th step (none
    between, no extra groups once the buffer holds a batch), the same average rate R, and
    replayed rows still scored against their stored behaviour log-probs."""
    replay = rt.ReplaySettings(32, 16, seed=1)
    trainer = _train(tmp_path, replay, r=8, steps=6, steps_per_generation=2)
    made = [len(rec.new) for rec in trainer.steps]
    assert made == [16, 0, 16, 0, 16, 0]
    assert [rec.new[0].version for rec in trainer.steps if rec.new] == [0, 2, 4]
    assert trainer.books.clock.generated == 6 * 8
    assert max(trainer.log_ratio_max[1:]) > 1e-3


@pytest.mark.parametrize("extra, name", [({"num_iterations": 2}, "num_iterations"),
                                         ({"gradient_accumulation_steps": 2},
                                          "gradient_accumulation_steps"),
                                         ({"beta": 0.1}, "beta")])
def test_unsupported_trl_settings_are_refused(tmp_path, extra, name):
    from datasets import Dataset

    from llm_experiments.policy.models import load_policy
    from llm_experiments.tasks.make import make_task
    cfg = small_config()
    model, tok = load_policy(cfg, make_task(cfg.task))
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=8, num_generations=G,
                      **{"beta": 0.0, **extra})
    with pytest.raises(ValueError, match=name):
        rt.ReplayGRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(
            completions), args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="]}),
            processing_class=tok, replay=rt.ReplaySettings(16, 8))


# ---- the command ---------------------------------------------------------------------------

def test_trl_command_writes_harness_records_and_probes(tmp_path):
    out = tmp_path / "run"
    sets = [a for s in SMALL + ["run.steps=6", "probe.every=3", "eval.every=3"]
            for a in ("--set", s)]
    assert main(["trl", "--out", str(out), *sets]) == 0
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    keys = ("step", "samples_generated", "samples_consumed", "train_reward", "eval_accuracy",
            "staleness_mean", "replay_ratio_mean", "mu_measured")
    assert all(k in r for r in records for k in keys)
    assert [r["step"] for r in records] == list(range(7))
    assert [r["step"] for r in records if r["eval_accuracy"] is not None] == [0, 3, 6]
    assert records[-1]["replay_ratio_mean"] == pytest.approx(2.0)
    summary = json.loads(open(out / "summary.json").read())
    assert summary["samples_consumed"] == 6 * 16 and summary["mu_measured"] > 0
    probes = ProbeSet.load(os.path.join(out, "probes.npz"))
    assert probes.n_rows("noise") > 0 and probes.n_rows("minibatch") == 2
    assert probes.counts["samples_consumed"] == 6 * 16


def test_trl_command_refuses_what_it_cannot_map(tmp_path, capsys):
    assert main(["trl", "--out", str(tmp_path / "x"), "--set", "buffer.lifo=true",
                 "--set", "schedule.replay_ratio=1"]) == 2
    assert "buffer.lifo" in capsys.readouterr().err
    assert main(["trl", "--out", str(tmp_path / "y"), "--set", "schedule.replay_ratio=3"]) == 2
    assert "schedule.group_size" in capsys.readouterr().err


def test_plain_trl_trainer_refuses_replay_and_probes(tmp_path):
    from llm_experiments.integrations.trl_run import build_trainer
    with pytest.raises(ValueError, match="schedule.mode=on_policy"):
        build_trainer(small_config("probe.every=0"), str(tmp_path), plain=True)
    with pytest.raises(ValueError, match="probe.every=0"):
        build_trainer(small_config("schedule.mode=on_policy", "probe.every=5"), str(tmp_path),
                      plain=True)


def test_trl_replay_benchmark_arms_and_equal_generation_batches(monkeypatch):
    """benchmarks/trl_replay: the plain arm trains TRL's ``GRPOTrainer`` itself (not our
    subclass), each replay arm ours at its design with plain's generation batch (64 rollouts
    in one generation every k = 64 / R steps), and one short run of
    each gives every number the report reads (rates, measured mu, evaluations whose counts are
    those of the weights evaluated, compute and seconds to the target, summary, ranking)."""
    from benchmarks import trl_replay as tr

    from llm_experiments.integrations import trl_run
    built = []
    real = trl_run.build_trainer

    def spy(*args, **kwargs):
        trainer, callback = real(*args, **kwargs)
        built.append(trainer)
        return trainer, callback

    monkeypatch.setattr(trl_run, "build_trainer", spy)
    settings = tr.parse(["--steps", "2", "--eval-every", "1", "--target", "0",
                         "--cache", CACHE])
    designs = {arm: tr.arm_design(arm, settings) for arm in tr.DESIGNS}
    # R 24.5 (rule), 9 (section 5) -> 32, 8; the calculator's for a 2-step run is the advice
    # measured at the shortest runs (T = 30: x = 16, y = 2 at mu 6.84), R = 32.
    assert {a: (d.rollouts_per_step, d.steps_per_generation) for a, d in designs.items()} == \
        {"calculator": (32, 2), "x64_sqrt_mu": (32, 2), "section5": (8, 8)}
    assert (designs["calculator"].horizon, designs["calculator"].replay_ratio) == (16.0, 2.0)
    assert designs["x64_sqrt_mu"].horizon == 64 and designs["x64_sqrt_mu"].buffer_size == 2048
    # The small model, with the benchmark's own B, G, buffer and evaluation interval.
    small = [s for s in SMALL if not s.startswith(("schedule.", "buffer.", "eval.every"))]
    runs = {arm: tr.one_run(settings, arm, 0, 1e-4, small) for arm in tr.ARMS}
    assert type(built[0]) is GRPOTrainer and not isinstance(built[0], rt.ReplayGRPOTrainer)
    assert all(type(t) is rt.ReplayGRPOTrainer for t in built[1:])
    assert [t.args.generation_batch_size for t in built] == [64] * 4
    assert runs["plain"].trainer == "trl.GRPOTrainer"
    assert runs["plain"].samples_generated == 2 * tr.B
    for arm in tr.DESIGNS:
        assert runs[arm].trainer == "trl.ReplayGRPOTrainer"
        k = designs[arm].steps_per_generation  # a generation batch at steps 0, k, ...
        assert runs[arm].samples_generated == tr.B * len(range(0, 2, k))
        assert runs[arm].rollouts_per_step == designs[arm].rollouts_per_step
    for r in runs.values():
        assert r.samples_per_s > 0 and r.updates_per_s > 0 and r.mu_measured > 0
        assert [e.step for e in r.evals] == [0, 1, 2]
        assert [e.samples_generated for e in r.evals][:2] == [0, tr.B]
        assert r.evals[0].seconds == 0 < r.evals[1].seconds < r.evals[2].seconds
        assert r.step_to_target == 0
        assert r.compute_to_target == r.seconds_to_target == 0
    summary = {arm: {k: tr.summary_of([r], k) for k in tr.SUMMARY_KEYS}
               for arm, r in runs.items()}
    assert summary["plain"]["samples_per_s"]["median"] == runs["plain"].samples_per_s
    assert set(tr.ranking(summary)["seconds_to_target"]) == set(tr.ARMS)


def test_trl_replay_summary_counts_a_missed_target_as_infinite():
    """A median over seeds where most runs missed the target is None, min/max keep the
    reached ones, and the arm ranks last."""
    from benchmarks import trl_replay as tr
    runs = [tr.ArmRun(arm="a", seed=s, lr=1e-4, trainer="t", samples_per_s=1.0,
                      updates_per_s=1.0, mu_measured=1.0, warm_start_accuracy=0.3,
                      final_eval_accuracy=0.4, best_eval_accuracy=0.4, step_to_target=None,
                      compute_to_target=c, compute_to_target_measured_mu=c,
                      seconds_to_target=c, train_seconds=1.0, run_seconds=2.0,
                      samples_generated=64,
                      rollouts_per_step=64) for s, c in enumerate([5.0, None, None])]
    stats = tr.summary_of(runs, "compute_to_target")
    assert stats == {"min": 5.0, "median": None, "max": None, "n": 1}
    fine = {k: {"median": 9.0} for k in tr.RANKED}
    missed = {k: {"median": None} for k in tr.RANKED}
    assert tr.ranking({"missed": missed, "fine": fine})["compute_to_target"] == \
        ["fine", "missed"]


@pytest.mark.slow
def test_trl_command_learns(tmp_path):
    """cpu_tiny through TRL with the replay buffer (y = 2, N = 512), 40 steps: held-out
    accuracy rises above the warm start."""
    out = tmp_path / "tiny"
    sets = ["run.steps=40", "eval.every=20", "probe.every=0", "eval.pass_k_problems=0",
            "run.progress=false", f"run.cache_dir={CACHE}"]
    assert main(["trl", "--out", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    s = json.loads(open(out / "summary.json").read())
    assert s["final_eval_accuracy"] >= s["warm_start_accuracy"] + 0.05
