"""The Ray engine's actors (``ray_engine``'s module docstring): ``SamplerWorker`` (a policy
copy making chunks of prompt groups), ``BufferHolder`` (the run's one replay buffer) and
``TrainerRank`` (one rank of the torch.distributed trainer group, rank 0 also probing), with
the reports they send the driver. The driver that places and schedules them is
``ray_engine.RayRun``.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import ray
import torch

from ..config import Config
from ..policy.direct import supports
from ..policy.kernels import use_fast_linear
from ..policy.models import encode_prompt, load_policy, param_count
from ..probing.probes import Prober, RunCounts
from ..rl.buffer import HeldRollouts, RolloutBuffer
from ..rl.schedule import ComputeClock, WeightStore
from ..rl.trainer import PolicyTrainer, grade_rollouts
from ..samplers import WeightUpdate
from ..samplers.make import make_sampler
from ..tasks.make import make_task
from .seeds import BUFFER_STREAM, DELAY_STREAM, derived_seed

# Seconds without any actor finishing its work before the run stops with an error naming what
# it waited for (a hang is never silent); one chunk or step of a large model must fit in it.
STALL_SECONDS = float(os.environ.get("LLM_EXPERIMENTS_RAY_STALL_SECONDS", 900))


def _policy(cfg: Config):
    """(task, model, tokenizer, direct) as ``Experiment`` builds them, in this process."""
    torch.set_num_threads(cfg.run.threads)
    task = make_task(cfg.task)
    model, tokenizer = load_policy(cfg, task)
    if cfg.run.fast_kernels:
        use_fast_linear(model)
    return task, model, tokenizer, cfg.run.direct_forward and supports(model)


def cpu_state(model) -> dict:
    """A CPU copy of the model's weights (what is published to the object store)."""
    return {k: t.detach().to("cpu", copy=True) for k, t in model.state_dict().items()}


@dataclass
class ChunkReport:
    """Sampler -> driver, for one chunk: rollouts made, seconds generating (``gen_seconds``,
    the injected delay included) and in the whole call (``busy_seconds``), tokens, the
    rollouts' rewards, and the seconds of injected delay (``injected_seconds``, part of
    ``gen_seconds``)."""

    rollouts: int
    gen_seconds: float
    busy_seconds: float
    tokens: int
    rewards: list[float]
    injected_seconds: float = 0.0


class InjectedDelay:
    """The artificial generation stall of ``schedule.injected_gen_delay`` /
    ``injected_gen_sigma`` (seconds, lognormal around the median): a stand-in for a dearer
    sampler or a straggling one, to measure wall-clock effects (claim 8, theory.md section 7)
    on a machine where generation is cheap. Drawn from its own stream (run.seed, sampler
    index, ``DELAY_STREAM``), so the delays of a run are reproducible and the sampling
    streams untouched."""

    def __init__(self, median: float, sigma: float, seed: int, index: int):
        self.median, self.sigma = float(median), float(sigma)
        self.rng = np.random.default_rng(derived_seed(seed, index, DELAY_STREAM))

    def draw(self) -> float:
        """The next delay in seconds (0 when off)."""
        if self.median == 0:
            return 0.0
        if self.sigma == 0:
            return self.median
        return self.median * float(np.exp(self.sigma * self.rng.standard_normal()))

    def wait(self) -> float:
        """Sleep the next delay; returns the seconds slept as drawn."""
        seconds = self.draw()
        if seconds > 0:
            time.sleep(seconds)
        return seconds


@dataclass
class StepReport:
    """Trainer rank -> driver, for one step: loss statistics of its shard, mean reward of its
    draw, seconds training (``train_seconds``) and in the whole call less the probes
    (``busy_seconds``), tokens trained, and seconds spent on the gradient probes' books
    (``probe_seconds``: weight snapshots and the probed step's gradient; rank 0 only)."""

    stats: dict
    batch_reward: float
    train_seconds: float
    busy_seconds: float
    tokens: int
    probe_seconds: float = 0.0


class SamplerWorker:
    """A sampler actor: its own policy copy, refreshed between chunks (module docstring)."""

    def __init__(self, cfg: Config, index: int = 0):
        self.cfg = cfg
        self.task, model, self.tokenizer, _ = _policy(cfg)
        self.sampler = make_sampler(cfg, model, self.tokenizer)
        self._prompts: dict[int, list[int]] = {}
        self.delay = InjectedDelay(cfg.schedule.injected_gen_delay,
                                   cfg.schedule.injected_gen_sigma, cfg.run.seed, index)

    def encode(self, problem) -> list[int]:
        """Prompt token ids of a problem (cached per problem id)."""
        if problem.pid not in self._prompts:
            self._prompts[problem.pid] = encode_prompt(self.tokenizer, problem.prompt,
                                                       self.cfg.task.chat_template)
        return self._prompts[problem.pid]

    def produce(self, problems, version: int, weights: dict | None, seed: int,
                first_item: int, first_group: int):
        """Rollouts of ``problems`` (G each) with weights ``version`` (``weights``: that
        version's state, None if this sampler holds it already); returns (ChunkReport,
        rollouts)."""
        t0 = time.perf_counter()
        if weights is not None:
            self.sampler.load_weights(WeightUpdate(version, weights))
        s, g = self.cfg.sampler, self.cfg.schedule.group_size
        prompts = [self.encode(p) for p in problems for _ in range(g)]
        t1 = time.perf_counter()
        gen = self.sampler.generate(prompts, max_new_tokens=s.max_new_tokens,
                                    temperature=s.temperature, top_p=s.top_p, seed=seed)
        injected = self.delay.wait()
        gen_seconds = time.perf_counter() - t1
        rollouts = grade_rollouts(self.cfg, self.task, self.tokenizer, self.encode, problems,
                                  gen, version, first_item, first_group)
        report = ChunkReport(rollouts=len(rollouts), gen_seconds=gen_seconds,
                             busy_seconds=time.perf_counter() - t0,
                             tokens=int(sum(len(p) for p in prompts) + gen.lengths.sum()),
                             rewards=[r.reward for r in rollouts], injected_seconds=injected)
        return report, rollouts


class BufferHolder:
    """The buffer actor: the run's only ``RolloutBuffer``, its batch draws, and the three axes
    of each step (``RolloutBuffer.step_stats``) once every shard has given its part."""

    def __init__(self, cfg: Config, state: dict | None = None):
        self.batch_size = cfg.schedule.batch_size
        self.rng = np.random.default_rng(derived_seed(cfg.run.seed, 0, BUFFER_STREAM))
        if state is None:
            self.buffer = RolloutBuffer.for_config(cfg)
        else:
            self.buffer = RolloutBuffer.from_state_dict(state["buffer"])
            self.rng.bit_generator.state = state["rng"]
        self.draws: dict[int, int] = {}
        self.stats: dict[int, dict] = {}

    def add(self, rollouts: list, insert_step: int) -> int:
        """Insert rollouts at trainer step ``insert_step``; returns the rollouts held."""
        self.buffer.add(rollouts, insert_step=insert_step)
        return len(self.buffer)

    def ready(self) -> bool:
        """Whether every shard can give its part of a batch."""
        return self.buffer.can_sample(self.batch_size)

    def size(self) -> int:
        """Rollouts held."""
        return len(self.buffer)

    def sample(self, n: int, step: int, shard: int) -> list:
        """Trainer ``shard``'s ``n`` rollouts for step ``step``."""
        batch = self.buffer.sample_shard(n, step, self.rng, shard)
        self.draws[step] = self.draws.get(step, 0) + 1
        if self.draws[step] == self.buffer.index.shards:
            self.stats[step] = self.buffer.step_stats()
            del self.draws[step]
        return batch

    def versions(self) -> np.ndarray:
        """The distinct weight versions of the rollouts held (for the probes' snapshots)."""
        return np.unique(self.buffer.versions())

    def probe_groups(self, group_size: int, versions: set[int], limit: int) -> HeldRollouts:
        """The groups the probes of trainer rank 0 read, as one message
        (``RolloutBuffer.probe_groups``: a few groups, not the whole buffer)."""
        return self.buffer.probe_groups(group_size, versions, limit)

    def pop_stats(self, step: int) -> dict:
        """The staleness / reuse statistics of step ``step`` (once)."""
        return self.stats.pop(step)

    def histograms(self) -> dict:
        """The three histograms of section 2 over the run."""
        return self.buffer.index.histograms()

    def state_dict(self) -> dict:
        """Buffer and generator state (for checkpoints)."""
        return {"buffer": self.buffer.state_dict(), "rng": self.rng.bit_generator.state}


class TrainerRank(PolicyTrainer):
    """One of T data-parallel trainer actors (module docstring): ``PolicyTrainer``'s update on
    its shard, gradients averaged over the group. Rank 0 also takes the gradient probes
    (``probes.Prober``, ``probe``) when ``probe.every`` > 0: it holds the current weights,
    keeps the weight snapshots the probes need, reads the buffer groups it probes as one
    message (``BufferHolder.probe_groups``) and generates the probes' fresh groups itself, so
    the probes need no sampler actor. ``probe_state``: ``probe_state()``'s output, on resume.
    ``out_dir``: the run folder (the driver writes ``probes.npz`` there from ``probes()``)."""

    def __init__(self, cfg: Config, rank: int, buffer, model_state: dict | None,
                 opt_state: dict | None, probe_state: dict | None = None, out_dir: str = ""):
        self.cfg, self.rank, self.world, self.buffer = cfg, rank, cfg.schedule.trainers, buffer
        self.device = torch.device(cfg.run.device)
        self.task, self.model, self.tokenizer, self.direct = _policy(cfg)
        if model_state is not None:
            self.model.load_state_dict(model_state)
        self.setup_update()
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)
        self.clock = ComputeClock(param_count(self.model), cfg.schedule.batch_size)
        self.prober = None
        if rank == 0 and cfg.probe.every:
            self._start_probes(out_dir, probe_state)

    # ---- probes (rank 0) ------------------------------------------------------------------

    def _start_probes(self, out_dir: str, state: dict | None) -> None:
        self.snapshots = WeightStore()
        self._prompt_ids: dict[int, list[int]] = {}
        self._version, self._probed = 0, None
        # What only the driver knows, given with ``probes()`` before the tables are built.
        self._counts = RunCounts(unique_rollouts=0, samples_consumed=0, steps=0,
                                 mu_measured=None, mu_accounting=None)
        self._rate = float("nan")
        self.probe_dir, self.buffer_capacity = out_dir, self.cfg.buffer.capacity
        self.prober = Prober(self.cfg, self)
        if state is not None:
            self.prober.load_state_dict(state["prober"])
            self.snapshots.snapshots = state["weights"]

    # What the probes read besides the model, tokenizer, device and loss (``probes.RunView``).

    def rollouts_per_step(self) -> float:
        """The run's measured R, given by the driver with ``probes()``."""
        return self._rate

    def sample_problems(self, n: int, rng: np.random.Generator) -> list:
        """``n`` training problems drawn with ``rng``."""
        return self.task.sample_train(n, rng)

    def current_weights(self) -> WeightUpdate:
        """The weights now, as version ``_version`` (the step last kept)."""
        return WeightUpdate(self._version, self.model.state_dict())

    def snapshot_versions(self) -> set[int]:
        """The weight versions kept on this rank."""
        return set(self.snapshots.snapshots)

    def snapshot(self, version: int) -> WeightUpdate:
        """A kept version's weights."""
        return self.snapshots.update(version)

    def buffer_versions(self) -> np.ndarray:
        """The weight version of every rollout in the buffer actor (one message)."""
        return ray.get(self.buffer.versions.remote())

    def probe_groups(self, group_size: int, versions: set[int], limit: int) -> HeldRollouts:
        """``BufferHolder.probe_groups`` of the buffer actor (one message)."""
        return ray.get(self.buffer.probe_groups.remote(group_size, versions, limit))

    def run_counts(self) -> RunCounts:
        """The driver's counts, given with ``probes()``."""
        return self._counts

    def encode(self, problem) -> list[int]:
        """Prompt token ids of a problem (cached per problem id)."""
        if problem.pid not in self._prompt_ids:
            self._prompt_ids[problem.pid] = encode_prompt(self.tokenizer, problem.prompt,
                                                          self.cfg.task.chat_template)
        return self._prompt_ids[problem.pid]

    def make_rollouts(self, problems, gen, version: int, first_item: int,
                      first_group: int) -> list:
        """Graded rollouts of a probe's generation (``trainer.grade_rollouts``)."""
        return grade_rollouts(self.cfg, self.task, self.tokenizer, self.encode, problems, gen,
                              version, first_item, first_group)

    def _keep_current(self, step: int) -> None:
        """Keep theta_step (the weights before step ``step``) as a snapshot."""
        self._version = step
        self.snapshots.publish(step, self.model)

    def probe(self, step: int) -> None:
        """Probe at theta_step, before step ``step`` draws its batch (as the emulated engine
        does); the step then records its minibatch gradient."""
        self._keep_current(step)
        self.prober.probe(step)
        self._probed = step

    def _probe_books(self, step: int, stats: dict, in_use) -> None:
        """After step ``step``'s update: its minibatch gradient if it was probed, then only the
        snapshots the probes or the samplers (versions ``in_use``) may still need."""
        if self._probed == step:
            self.prober.add_minibatch(step, stats.pop("grad"))
        self.snapshots.keep_only(self.prober.versions_needed(step + 1) | set(in_use))

    def probes(self, counts: RunCounts, rollouts_per_step: float):
        """The probe tables so far (a ``replaytheory.fit.probes.ProbeSet``) with the driver's
        ``counts`` and the run's measured rate R (rollouts made per trainer step, > 0)."""
        self._counts, self._rate = counts, float(rollouts_per_step)
        return self.prober.probe_set()

    def probe_state(self) -> dict | None:
        """The probes' rows and references and the kept snapshots (for checkpoints); None
        without probes."""
        if self.prober is None:
            return None
        return {"prober": self.prober.state_dict(), "weights": self.snapshots.snapshots}

    # ---- the update -----------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        """(IP, free port) where rank 0 hosts the process group's rendezvous."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join(self, host: str, port: int) -> None:
        """Join the trainers' process group (gloo on CPU, NCCL on GPU)."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend, init_method=f"tcp://{host}:{port}",
                                             rank=self.rank, world_size=self.world,
                                             timeout=timedelta(seconds=STALL_SECONDS))

    def reduce_gradients(self) -> None:
        """Average the gradient over the T ranks in place, bucket by bucket
        (``grad_reduce.all_reduce_mean``), so every rank applies the same update (what DDP
        computes)."""
        from .grad_reduce import all_reduce_mean
        if self.world == 1:
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # every rank reduces the same tensors
                p.grad = torch.zeros_like(p)
        all_reduce_mean([p.grad for p in params], self.world)

    def step(self, step: int, publish: bool, in_use: tuple = ()):
        """Draw this rank's B/T rollouts for ``step`` from the buffer actor and update;
        returns (StepReport, the new weights if ``publish`` else None). ``in_use``: weight
        versions the samplers generate with (rank 0 with probes keeps their snapshots)."""
        t0 = time.perf_counter()
        probe_seconds = 0.0
        if self.prober is not None:
            self._keep_current(step)
            probe_seconds = time.perf_counter() - t0
        per = self.cfg.schedule.batch_size // self.world
        rollouts = ray.get(self.buffer.sample.remote(per, step, self.rank))
        before = self.clock.train_seconds
        stats = self.train_step(rollouts, keep_grad=self.prober is not None and
                                self._probed == step)
        if self.prober is not None:
            t1 = time.perf_counter()
            self._probe_books(step, stats, in_use)
            probe_seconds += time.perf_counter() - t1
        report = StepReport({k: v for k, v in stats.items() if isinstance(v, (int, float))},
                            float(np.mean([r.reward for r in rollouts])),
                            self.clock.train_seconds - before, 0.0,
                            int(sum(len(r.prompt) + len(r.completion) for r in rollouts)),
                            probe_seconds)
        weights = cpu_state(self.model) if publish else None
        report.busy_seconds = time.perf_counter() - t0 - probe_seconds
        return report, weights

    def weights(self) -> dict:
        """The current weights (CPU copy)."""
        return cpu_state(self.model)

    def optimizer_state(self) -> dict:
        """The optimizer state (for checkpoints; identical on every rank)."""
        return self.opt.state_dict()
