"""The asynchronous system of theory.md sections 1-3 with real concurrency, on Ray.

Processes (Ray actors, ``ray_actors.py``; one placement group sized from the config, one bundle
per sampler and per trainer, PACK strategy):

* W ``SamplerWorker`` actors, each with its own copy of the policy (the HF sampler on CPU or
  GPU, or vLLM, ``samplers.make.make_sampler``): a call makes ``chunk_groups`` prompt groups with
  the newest published weights, graded, advantages computed once per group (section 6); every
  rollout carries the version (trainer step) of the weights that made it, so staleness is
  exact. With ``schedule.injected_gen_delay`` > 0 it also sleeps a seeded, optionally
  lognormal delay per call (``InjectedDelay``: a labelled stand-in for a dearer or straggling
  sampler, counted as generation time and logged as ``injected_gen_delay_seconds``).
* one ``BufferHolder`` actor holding the existing ``RolloutBuffer`` (FIFO capacity N, every
  sampling mode, one shard per trainer, delta, the LIFO queue): the only copy of the replay
  index, so its histograms are those of the run.
* T ``TrainerRank`` actors in one torch.distributed group (gloo on CPU, NCCL on GPU): rank k
  draws B/T rollouts from shard k and the gradients are averaged by one all-reduce before the
  norm clip, which is what DDP computes (DDP itself would need every forward to go through
  its wrapper, and the direct forward of ``direct.py`` drives the layers itself). With
  ``probe.every`` > 0, rank 0 takes the gradient probes of ``probes.py`` (theory.md section 4)
  before the draw of every ``probe.every``-th step: it keeps the weight snapshots they need,
  reads the buffer actor's rollouts as one message and generates the fresh groups with its
  own weights (no sampler actor needs its current version). No sampler starts a chunk while
  it probes, so the probes change neither the rate nor the staleness of the run; their
  seconds are reported as ``probe_seconds``, outside every actor's busy and idle time. The
  driver writes ``probes.npz`` at each checkpoint, with the run's counts and its rate R
  measured so far (rollouts made / trainer steps).

The driver (``RayRun``, the ``run`` process) hands out the work and keeps the books: it
draws the prompts (the run's generator), gives each sampler the object-store reference of the
newest weights when it starts a chunk (a sampler never changes weights inside a chunk),
passes each finished chunk to the buffer by reference (the rollouts never go through the
driver) and counts it once the buffer holds it, starts a trainer step as soon as every shard
can give its part, evaluates the weights theta_t in its own thread while step t runs and
chunks keep being handed on, logs and checkpoints. The steps, records, checkpoints' timing,
counters and summary are those of every engine (``engines.loop``: ``run_loop`` calls
``RayRun``'s hooks, ``RunBooks`` counts); only the scheduling of chunks is the driver's own.
A record's ``train_reward`` and ``new_rollouts`` are those of the chunks that reached the
buffer during its step. Trainer rank 0 publishes its weights to
the object store every ``schedule.refresh_every`` steps. With the LIFO queue a sampler waits
while the queue could not take its chunk (nothing is made only to be evicted); the config
check refuses a queue so small that every sampler could wait with less than a batch held
(``ray_plan.lifo_min_capacity``). The actors' resource shares are exact
(``ray_plan.shares``), so the placement group fits the cluster.

Not bitwise: which rollouts a step draws depends on the clock. A checkpoint holds weights,
optimizer, buffer, counters, the driver's generator and the probes' rows and snapshots;
``--resume`` continues from it with new actors (chunks in flight at the kill are lost, their
item ids skipped) and the metrics log cut back to the checkpoint, so no line is lost or
repeated.
"""

from __future__ import annotations

import os
import secrets
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import checkpoint
from ..config import Config
from .metrics import evaluate
from ..policy.models import encode_prompt, param_count, weights_sha256
from ..probing.probes import RunCounts
from ..samplers import WeightUpdate
from ..samplers.make import make_sampler
from ..rl.schedule import ComputeClock
from .seeds import EVAL_STREAM, derived_seed
from .loop import RunBooks, StepResult, run_loop
from .timing import actors_breakdown
from .ray_actors import STALL_SECONDS, BufferHolder, SamplerWorker, TrainerRank, _policy, cpu_state
from .ray_plan import RESOLUTION, chunk_groups, packed_shares

# Seconds to wait for the placement group of shares that fit the cluster: long enough for other
# work to free what it holds, short enough that a run that cannot start says so.
PLACE_SECONDS = float(os.environ.get("LLM_EXPERIMENTS_RAY_PLACE_SECONDS", 60))
# Seconds between looks at a running evaluation while the driver keeps handing on chunks.
EVAL_POLL_SECONDS = 0.05
# Environment the actors need that a remote node would not inherit.
PASSED_ENV = ("LLM_EXPERIMENTS_CACHE", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_OFFLINE",
              "TRANSFORMERS_OFFLINE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")


def connect(address: str | None) -> bool:
    """Join the Ray cluster at ``address`` (or ``$RAY_ADDRESS``), else start a local one;
    nothing if this process is connected already. Returns whether this call connected (then
    ``ray.shutdown`` is ours to call)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None and "RAY_AUTH_TOKEN" not in os.environ \
            and "RAY_AUTH_MODE" not in os.environ:
        # A local cluster of our own: a token for this process tree only, instead of the
        # token file Ray would write into the home directory.
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    ray.init(address=address, include_dashboard=False if address is None else None,
             log_to_driver=True)
    return True


def bundles(cfg: Config, total: dict, node_cpus: list[float] | None = None) -> list[dict]:
    """Placement-group bundles: one per sampler, then one per trainer, for a cluster holding
    ``total`` resources (``ray.cluster_resources()``) with ``node_cpus`` CPUs on each node
    (None: one node). Each asks ``run.threads`` CPUs, or a share of the cluster's if it has
    fewer, and on a GPU device a GPU or a share of one (NCCL needs a whole GPU per trainer
    when T > 1); ``ray_plan.packed_shares``: a bundle never spans nodes or GPUs, so the
    shares are such that whole bundles fill each node and each GPU, and the group can be
    placed."""
    sc = cfg.schedule
    n = sc.workers + sc.trainers
    cpus = packed_shares(node_cpus or [total.get("CPU", 0.0)], n, cfg.run.threads)
    if min(cpus) <= 0:
        raise ValueError(f"the Ray cluster has {total.get('CPU', 0.0):g} CPUs, too few for "
                         f"schedule.engine=ray with {n} actors (schedule.workers + "
                         f"schedule.trainers), {RESOLUTION:g} CPU each at least")
    out = [{"CPU": c} for c in cpus]
    if cfg.run.device.startswith("cuda"):
        gpu_total = total.get("GPU", 0.0)
        # Each GPU is a bin of 1.0; a fractional total (a share of one GPU) is one bin.
        gpus = packed_shares([1.0] * int(gpu_total) if gpu_total >= 2 else [gpu_total], n, 1.0)
        if min(gpus) <= 0:
            raise ValueError(f"run.device={cfg.run.device} but the Ray cluster has "
                             f"{gpu_total:g} GPUs for {n} actors")
        if sc.trainers > 1 and gpu_total < n:
            raise ValueError(f"schedule.trainers={sc.trainers} on run.device={cfg.run.device}"
                             f" needs a whole GPU per actor (NCCL), {n} in all; the cluster"
                             f" has {gpu_total:g}")
        for bundle, g in zip(out, gpus):
            bundle["GPU"] = g
    return out


def _cpu_gpu(resources: dict) -> dict:
    """The CPU and GPU amounts of a Ray resource dict (for messages)."""
    return {k: round(resources[k], 4) for k in ("CPU", "GPU") if k in resources}


@dataclass
class ActorBooks:
    """What the driver accounts beyond the run's ``RunBooks`` (checkpointed): busy seconds
    per actor and per driver phase, seconds of the gradient probes (the pauses while trainer
    rank 0 probes, and its snapshot keeping in the steps), injected delay."""

    busy: dict = field(default_factory=dict)
    phases: dict = field(default_factory=lambda: {"startup_seconds": 0.0, "eval_seconds": 0.0,
                                                  "checkpoint_seconds": 0.0,
                                                  "data_wait_seconds": 0.0})
    actors_up_seconds: float = 0.0  # actors' lifetime before this session
    probe_pause_seconds: float = 0.0  # outside every actor's busy and idle seconds
    probe_books_seconds: float = 0.0  # trainer0's, outside its busy seconds
    injected_gen_delay_seconds: float = 0.0  # schedule.injected_gen_delay slept, in gen_seconds

    def add_busy(self, actor: str, seconds: float) -> None:
        """Count ``seconds`` (>= 0) of work of ``actor`` (sampler{i} or trainer{k})."""
        self.busy[actor] = self.busy.get(actor, 0.0) + seconds

    def state_dict(self) -> dict:
        """Plain-object state."""
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output."""
        vars(self).update(state)


class RayRun:
    """The driver of a run on the Ray engine (module docstring). ``address``: see
    ``connect``. ``holder``, ``sampler_class``, ``trainer_class``: the actors' classes
    (``BufferHolder``, ``SamplerWorker``, ``TrainerRank``; a test or ``ray_pull.RayPullRun``
    gives subclasses)."""

    holder = BufferHolder
    sampler_class = SamplerWorker
    trainer_class = TrainerRank

    def __init__(self, cfg: Config, out_dir: str, address: str | None = None):
        self.cfg, self.out, self.address = cfg, out_dir, address
        sc = cfg.schedule
        # The driver's own copy of the policy: evaluation, and the warm start cached once
        # before the actors load it.
        self.task, model, self.tokenizer, _ = _policy(cfg)
        self.evaluator = make_sampler(cfg, model, self.tokenizer)
        self.initial = cpu_state(model)
        self.eval_prompts = [encode_prompt(self.tokenizer, p.prompt, cfg.task.chat_template)
                             for p in self.task.eval_problems]
        self.warm_start_sha256 = weights_sha256(model)
        self.books = RunBooks(ComputeClock(param_count(model), sc.batch_size),
                              sc.mu_accounting if sc.mu_accounting > 0 else None)
        self.actor_books = ActorBooks()
        self.rng = np.random.default_rng(cfg.run.seed)
        self.chunk_groups = chunk_groups(sc.batch_size, sc.workers, sc.group_size)
        self.step = 0
        self.tag = uuid.uuid4().hex[:8]

    # ---- actors ---------------------------------------------------------------------------

    def _start(self, state: dict | None) -> None:
        """Placement group, buffer, samplers, trainers (from ``state`` if resuming)."""
        cfg, sc = self.cfg, self.cfg.schedule
        b = self._place()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {"PYTHONPATH": os.pathsep.join(
                   [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
               "OMP_NUM_THREADS": str(cfg.run.threads), "MKL_NUM_THREADS": str(cfg.run.threads),
               **{k: os.environ[k] for k in PASSED_ENV if k in os.environ}}

        def place(i: int, bundle: dict, name: str) -> dict:
            return {"num_cpus": bundle["CPU"], "num_gpus": bundle.get("GPU", 0),
                    "name": f"{self.tag}/{name}", "max_restarts": 0,
                    "runtime_env": {"env_vars": env},
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=i)}

        self.buffer = ray.remote(self.holder).options(
            num_cpus=0, name=f"{self.tag}/buffer", runtime_env={"env_vars": env}).remote(
            cfg, state["buffer"] if state else None)
        self.samplers = [ray.remote(self.sampler_class).options(**place(i, b[i], f"sampler{i}"))
                         .remote(cfg, i) for i in range(sc.workers)]
        model_ref = ray.put(state["model"]) if state else None
        opt_ref = ray.put(state["optimizer"]) if state else None
        probe_ref = ray.put(state.get("probes")) if state else None
        self.trainers = [ray.remote(self.trainer_class).options(
            **place(sc.workers + k, b[sc.workers + k], f"trainer{k}")).remote(
            cfg, k, self.buffer, model_ref, opt_ref, probe_ref if k == 0 else None, self.out)
            for k in range(sc.trainers)]
        host, port = self._get(self.trainers[0].address.remote(), "trainer0")
        self._get([t.join.remote(host, port) for t in self.trainers], "trainers")
        self.weights = {self.step: ray.put(state["model"] if state else self.initial)}
        self.latest = self.step
        self.sampler_version = [None] * sc.workers
        self.in_flight: dict = {}  # ChunkReport ref -> (sampler, rollouts ref, groups)
        self.blocked: set[int] = set()
        self.probing = False
        self.start_time = time.perf_counter()
        self.actor_books.phases["startup_seconds"] += self.start_time - self.books.t_start

    def _place(self) -> list[dict]:
        """Create the placement group of ``bundles`` and wait for it, at most
        ``PLACE_SECONDS``; returns the bundles. RuntimeError names what the cluster holds and
        what is free if it cannot place them in time."""
        sc = self.cfg.schedule
        total = ray.cluster_resources()
        nodes = [node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node["Alive"]]
        b = bundles(self.cfg, total, nodes)
        self.pg = placement_group(b, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=PLACE_SECONDS)
        except GetTimeoutError:
            free = {k: ray.available_resources().get(k, 0.0) for k in total}  # 0 is left out
            raise RuntimeError(
                f"Ray engine: the cluster cannot place {sc.workers} sampler and {sc.trainers} "
                f"trainer actors (bundles {[_cpu_gpu(x) for x in b]}) within "
                f"{PLACE_SECONDS:g} s (LLM_EXPERIMENTS_RAY_PLACE_SECONDS): it has "
                f"{_cpu_gpu(total)} in all and {_cpu_gpu(free)} free; other work holds the "
                f"rest, or no node fits a bundle") from None
        return b

    def _stop(self) -> None:
        """Kill the actors and free the placement group."""
        for actor in [*getattr(self, "samplers", []), *getattr(self, "trainers", []),
                      *([self.buffer] if hasattr(self, "buffer") else [])]:
            ray.kill(actor)
        if hasattr(self, "pg"):
            remove_placement_group(self.pg)

    @staticmethod
    def _get(refs, who: str):
        """``ray.get`` that turns a dead actor into an error naming it."""
        try:
            return ray.get(refs, timeout=STALL_SECONDS)
        except (ActorDiedError, ActorUnavailableError) as exc:
            raise RuntimeError(f"Ray engine: {who} actor died ({type(exc).__name__}); the "
                               f"run stops, continue it with --resume from its last "
                               f"checkpoint") from exc
        except GetTimeoutError:
            raise RuntimeError(f"Ray engine: {who} gave no result in {STALL_SECONDS:g} s "
                               f"(LLM_EXPERIMENTS_RAY_STALL_SECONDS)") from None

    # ---- samplers -------------------------------------------------------------------------

    def _dispatch(self, i: int, held: int | None = None) -> None:
        """Start sampler ``i``'s next chunk with the newest weights (with the LIFO queue, only
        if the queue can take it: ``held`` rollouts plus those in flight)."""
        cfg, sc = self.cfg, self.cfg.schedule
        n = self.chunk_groups * sc.group_size
        if self.probing:  # no chunk starts while trainer rank 0 probes (``_probe``)
            self.blocked.add(i)
            return
        if cfg.buffer.lifo:
            flying = sum(g for _, _, g in self.in_flight.values()) * sc.group_size
            if held + flying + n > cfg.buffer.capacity:
                self.blocked.add(i)
                return
        self.blocked.discard(i)
        problems = self.task.sample_train(self.chunk_groups, self.rng)
        seed = int(self.rng.integers(2**62))
        version = self.latest
        weights = self.weights[version] if self.sampler_version[i] != version else None
        report, rollouts = self.samplers[i].produce.options(num_returns=2).remote(
            problems, version, weights, seed, *self.books.new_ids(self.chunk_groups,
                                                                  sc.group_size))
        self.sampler_version[i] = version
        self.in_flight[report] = (i, rollouts, self.chunk_groups)

    def _held(self) -> int | None:
        return self._get(self.buffer.size.remote(), "buffer") if self.cfg.buffer.lifo else None

    def _restart_blocked(self) -> None:
        if self.blocked:
            held = self._held()
            for i in sorted(self.blocked):
                self._dispatch(i, held)

    def _wait(self, step_refs: list, poll: bool = False) -> None:
        """Wait until a sampler chunk or a call of ``step_refs`` (a trainer step) finishes; a
        finished chunk goes to the buffer (by reference) and its sampler starts the next.
        ``poll``: wait at most ``EVAL_POLL_SECONDS`` (an evaluation runs meanwhile, which is
        progress, so nothing finishing is no stall)."""
        pending = list(self.in_flight) + step_refs
        if poll:
            if not pending:
                time.sleep(EVAL_POLL_SECONDS)
                return
            done, _ = ray.wait(pending, num_returns=1, timeout=EVAL_POLL_SECONDS)
            if not done:
                return
        else:
            done, _ = ray.wait(pending, num_returns=1, timeout=STALL_SECONDS)
        if not done:
            raise RuntimeError(f"Ray engine: no sampler or trainer finished in "
                               f"{STALL_SECONDS:g} s (LLM_EXPERIMENTS_RAY_STALL_SECONDS)")
        ref = done[0]
        if ref not in self.in_flight:
            return
        i, rollouts, _ = self.in_flight.pop(ref)
        rep = self._get(ref, f"sampler{i}")
        held = self._add(i, rollouts, rep.rollouts)
        self.books.count_made(rep.rewards, rep.gen_seconds, rep.tokens)
        self.actor_books.add_busy(f"sampler{i}", rep.busy_seconds)
        self.actor_books.injected_gen_delay_seconds += rep.injected_seconds
        self._dispatch(i, held)

    def _add(self, i: int, rollouts, n: int) -> int:
        """Insert sampler ``i``'s finished chunk (``rollouts``: the reference to its ``n``
        rollouts) into the buffer actor and wait for it, so that a chunk is counted only once
        the buffer holds it; returns the rollouts held. A failed insert stops the run with an
        error naming it (the chunk's rollouts are then neither held nor counted)."""
        try:
            return self._get(self.buffer.add.remote(rollouts, self.step), "buffer")
        except RayTaskError as exc:
            raise RuntimeError(f"Ray engine: the buffer actor failed to insert sampler{i}'s "
                               f"chunk of {n} rollouts ({exc.cause!r}); the run stops (that "
                               f"chunk is not counted as made), continue it with --resume "
                               f"from its last checkpoint") from exc

    # ---- trainers -------------------------------------------------------------------------

    def train(self, t: int, evaluate: bool) -> StepResult:
        """Step t of ``engines.loop.run_loop``: trainer step ``t`` (waiting for data first),
        evaluating theta_t meanwhile if ``evaluate``, chunks handed on throughout."""
        evaluation, reports = self._train(t, evaluate)
        self.step = t + 1
        result = self._account(t, reports, evaluation)
        self._restart_blocked()
        return result

    def _train(self, t: int, evaluate: bool) -> tuple[dict | None, list]:
        """Run trainer step ``t`` (waiting for data first), evaluating theta_t meanwhile if
        ``evaluate``; returns (the evaluation or None, the trainers' StepReports)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        while not self._get(self.buffer.ready.remote(), "buffer"):
            self._wait([])
        self.actor_books.phases["data_wait_seconds"] += time.perf_counter() - t0
        if cfg.probe.every and t % cfg.probe.every == 0:
            self._probe(t)
        publish = (t + 1) % cfg.schedule.refresh_every == 0 or \
            (t + 1) % cfg.eval.every == 0 or t + 1 == cfg.run.steps
        in_use = tuple(sorted({self.latest, *(v for v in self.sampler_version
                                                if v is not None)}))
        calls = [tr.step.options(num_returns=2).remote(t, publish and k == 0, in_use)
                 for k, tr in enumerate(self.trainers)]
        evaluation = self.eval_thread.submit(self.evaluate, t) if evaluate else None
        reports = [c[0] for c in calls]
        self._serve(reports, evaluation)
        out = self._get(reports, "trainer")
        if publish:
            self.weights[t + 1] = calls[0][1]
            if (t + 1) % cfg.schedule.refresh_every == 0:
                self.latest = t + 1
        keep = {self.latest, t + 1, *self.sampler_version}
        self.weights = {v: r for v, r in self.weights.items() if v in keep}
        return (evaluation.result() if evaluation is not None else None), out

    def _serve(self, step_refs: list, evaluation: Future | None) -> None:
        """Hand on finished chunks and restart their samplers until the calls ``step_refs``
        have finished and ``evaluation`` (theta_t's, in the driver's evaluation thread) is
        done: the evaluation is off the driver's critical path, so the rate R and the
        staleness at evaluation steps are those of the others."""
        remaining = list(step_refs)
        while remaining or (evaluation is not None and not evaluation.done()):
            self._wait(remaining, poll=evaluation is not None and not evaluation.done())
            if remaining:
                remaining = ray.wait(remaining, num_returns=len(remaining), timeout=0)[1]

    def _probe(self, t: int) -> None:
        """Trainer rank 0 probes at theta_t while the samplers pause (no chunk starts; those
        in flight still land in the buffer), so the probes change neither the run's rate R
        nor its staleness; the pause counts as no actor's busy or idle time."""
        t0 = time.perf_counter()
        self.probing = True
        ref = self.trainers[0].probe.remote(t)
        while ray.wait([ref], timeout=0)[1]:
            self._wait([ref])
        self._get(ref, "trainer0")
        self.probing = False
        self._restart_blocked()
        self.actor_books.probe_pause_seconds += time.perf_counter() - t0

    def _account(self, t: int, reports: list, evaluation: dict | None) -> StepResult:
        """Count step t's update and return its statistics, averaged over the ranks."""
        c = self.books.clock
        c.train_seconds += reports[0].train_seconds
        c.train_tokens += sum(r.tokens for r in reports)
        c.steps += 1
        self.books.consumed += self.cfg.schedule.batch_size
        for k, rep in enumerate(reports):
            self.actor_books.add_busy(f"trainer{k}", rep.busy_seconds)
        self.actor_books.probe_books_seconds += reports[0].probe_seconds
        return StepResult(
            evaluation=evaluation,
            stats={key: float(np.mean([r.stats[key] for r in reports]))
                   for key in reports[0].stats},
            batch_reward=float(np.mean([r.batch_reward for r in reports])),
            buffer=self._get(self.buffer.pop_stats.remote(t), "buffer"))

    # ---- evaluation, books, checkpoints ---------------------------------------------------

    def evaluate(self, t: int) -> dict:
        """Held-out accuracy and pass@k of theta_t (own seed, as the emulated engine)."""
        t0 = time.perf_counter()
        self.evaluator.load_weights(WeightUpdate(t, self._get(self.weights[t], "trainer0")))
        out = evaluate(self.evaluator, self.tokenizer, self.task, self.eval_prompts, self.cfg,
                       seed=derived_seed(self.cfg.run.seed, t, EVAL_STREAM))
        self.actor_books.phases["eval_seconds"] += time.perf_counter() - t0
        return out

    def actors_up(self) -> float:
        """Seconds the actors have been up and ready, over every session of the run."""
        return self.actor_books.actors_up_seconds + time.perf_counter() - self.start_time

    def counters(self) -> dict:
        """``RunBooks.counters`` and the actors': seconds per phase, busy and idle seconds
        per actor (idle: up, less busy, less the probes' seconds), and the time breakdown
        per side (``timing.actors_breakdown``)."""
        a, up = self.actor_books, self.actors_up()
        pause, probe = a.probe_pause_seconds, self.probe_seconds()
        c = {**self.books.counters(probe),
             "injected_gen_delay_seconds": a.injected_gen_delay_seconds,
             **a.phases,
             "busy_seconds": dict(a.busy),
             "idle_seconds": {k: max(0.0, up - v - (probe if k == "trainer0" else pause))
                              for k, v in a.busy.items()}}
        c["time_breakdown"] = actors_breakdown(c)
        return c

    def probe_seconds(self) -> float:
        """Seconds of the gradient probes (>= 0): the pauses while trainer rank 0 probes and
        its snapshot keeping in the steps."""
        return self.actor_books.probe_pause_seconds + self.actor_books.probe_books_seconds

    def _save_probes(self) -> dict | None:
        """Write ``probes.npz`` (trainer rank 0's tables with the driver's counts and the
        rate R measured so far: rollouts made / trainer steps); returns the probes' state
        for the checkpoint (None without probes)."""
        if not self.cfg.probe.every:
            return None
        c = self.books.clock
        counts = RunCounts(unique_rollouts=c.generated, samples_consumed=self.books.consumed,
                           steps=c.steps, mu_measured=c.mu_time(),
                           mu_accounting=self.books.mu_accounting())
        probes, state = self._get([
            self.trainers[0].probes.remote(counts, c.generated / max(c.steps, 1)),
            self.trainers[0].probe_state.remote()], "trainer0")
        probes.save(os.path.join(self.out, "probes.npz"))
        return state

    def save(self, log_position: int) -> None:
        """Write the checkpoint after step ``self.step`` (and probes.npz with probes)."""
        t0 = time.perf_counter()
        model, opt = self._get([self.trainers[0].weights.remote(),
                                self.trainers[0].optimizer_state.remote()], "trainer0")
        buf = self._buffer_state()
        probes = self._save_probes()
        self.actor_books.phases["checkpoint_seconds"] += time.perf_counter() - t0
        actors = self.actor_books.state_dict()
        actors["actors_up_seconds"] = self.actors_up()
        checkpoint.save(os.path.join(self.out, "checkpoint"), {
            "engine": "ray", "step": self.step, "model": model, "optimizer": opt,
            "buffer": buf, **self.books.state_dict(), "actors": actors, "probes": probes,
            "rng": checkpoint.rng_state(self.rng), "log_position": log_position})

    def _buffer_state(self) -> dict:
        """The buffer actor's state for a checkpoint."""
        return self._get(self.buffer.state_dict.remote(), "buffer")

    def restore(self, state: dict) -> None:
        """Take the driver's part of a checkpoint (the actors take theirs in ``session``)."""
        if state.get("engine") != "ray" or "actors" not in state:
            raise ValueError("--resume: the checkpoint was not written by this version's "
                             "schedule.engine=ray")
        self.step = state["step"]
        self.books.load_state_dict(state)
        self.actor_books.load_state_dict(state["actors"])
        checkpoint.restore_rng(state["rng"], self.rng)

    # ---- the loop -------------------------------------------------------------------------

    def run(self, resume: bool = False) -> dict:
        """Train to ``run.steps`` (from the last checkpoint if ``resume``) with
        ``engines.loop.run_loop``; returns the summary (``summary.json``)."""
        return run_loop(self, resume)

    @contextmanager
    def session(self, state: dict | None):
        """Connect, start the actors (from ``state`` if resuming) and the first chunks; stop
        them at the end."""
        ours = connect(self.address)
        # Evaluations run here while the loop goes on (``_serve``); one at a time, in order.
        self.eval_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluation")
        try:
            self._start(state)
            for i in range(self.cfg.schedule.workers):
                self._dispatch(i, self._held())
            yield
        finally:
            self.eval_thread.shutdown(wait=False, cancel_futures=True)
            self._stop()
            if ours:
                ray.shutdown()

    def summary_fields(self) -> dict:
        """Summary fields beyond the metrics (``RunBooks.summary``, plus the actors')."""
        c, sc = self.books.clock, self.cfg.schedule
        return self.books.summary(
            self.counters(), histograms=self._get(self.buffer.histograms.remote(), "buffer"),
            rollouts_per_step=c.generated / max(c.steps, 1),
            schedule={"mode": sc.mode, "engine": "ray", "ray_loop": sc.ray_loop,
                      "workers": sc.workers,
                      "trainers": sc.trainers, "refresh_every": sc.refresh_every,
                      "chunk_groups": self.chunk_groups, "latency": None,
                      "injected_gen_delay": sc.injected_gen_delay,
                      "injected_gen_sigma": sc.injected_gen_sigma},
            also=("busy_seconds", "idle_seconds", "injected_gen_delay_seconds",
                  "time_breakdown", *self.actor_books.phases),
            fields={"warm_start_sha256": self.warm_start_sha256})
