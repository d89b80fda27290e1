"""Experience replay for TRL's ``GRPOTrainer``, from the calculator's N, B, R to GRPOConfig.

TRL (1.16) reuses rollouts only within one generation batch (``num_iterations`` x
``steps_per_generation``: a horizon x = 1 design) and, when generation and updates are
aligned, scores a reused sample against its own current log-probs, so its importance ratio is
1 and the clip never acts. This module adds what the theory needs (theory.md sections 1-3):

* ``ReplayGRPOTrainer``: a ``GRPOTrainer`` whose every optimizer step generates R rollouts
  (the GRPOConfig's ``per_device_train_batch_size``, R / G prompts x ``num_generations`` G;
  or k R every k steps with ``steps_per_generation`` = k, TRL's generation batch),
  stores them with their behaviour log-probs in our FIFO replay buffer
  (``llm_experiments.rl.buffer.RolloutBuffer`` over ``replaytheory.buffer.ReplayIndex``: capacity
  N, every sampling mode, delta), and trains on B rollouts drawn from it. A replayed
  sample's ratio pi_theta / pi_behaviour is then real and the clip acts on it. Production and
  draws follow the harness exactly (``schedule.Production`` and the harness buffer, same
  order of insertion and draws, one numpy generator seeded with ``ReplaySettings.seed``).
  Staleness, steps since last use, replay ratio and the measured mu go through TRL's logging
  (keys ``replay/...``).
* ``trl_config``: a ``ReplayRecommendation`` of ``replaytheory.calculator.optimal_config`` as
  the trainer's and GRPOConfig's arguments (``TRLReplayConfig``).
* ``CalibrationCallback``: measures mu (production seconds of B rollouts over the seconds of
  one update, section 3) and optionally probes the gradient noise (``probes.Prober``), writing
  ``probes.npz`` in the ``replaytheory.fit.probes`` layout for ``replaytheory.fit.calibrate``.

Supported: TRL ``SUPPORTED_TRL``, one process, text prompts, no vLLM, beta = 0 (no reference
model), ``mask_truncated_completions=False``, no tools or environments, and sampling from the
full softmax at GRPOConfig's ``temperature`` (``FULL_SOFTMAX``: no top-k, top-p, min-p,
repetition penalty or other logits processor, whether set in GRPOConfig, its
``generation_kwargs`` or the model's ``generation_config``), because the stored behaviour
log-probs are the full softmax at that temperature. The TRL version and the extension points
of ``GRPOTrainer`` it overrides or calls (``EXTENSION_POINTS``) are checked when a trainer is
built, so a TRL upgrade fails loudly there; the mapping (``trl_config``, ``ReplaySettings``)
imports under any TRL.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers import TrainerCallback
from trl import GRPOTrainer

from replaytheory import checks
from replaytheory.buffer import SAMPLING_MODES

from ..rl.buffer import HeldRollouts, Rollout, RolloutBuffer
from ..config import from_dict
from ..engines.loop import RunBooks, fill_and_draw
from ..rl.gradients import flat_grad
from ..rl.losses import TokenBatch, loss_stats, policy_loss
from ..policy.models import param_count
from ..probing.probes import Prober, RunCounts
from ..samplers import WeightUpdate
from ..rl.schedule import ComputeClock, Production, WeightStore
from ..rl.trainer import row_logr2

SUPPORTED_TRL = ">=1.16,<1.17"
# GRPOTrainer methods this module overrides or calls, with the parameters it relies on.
EXTENSION_POINTS = {
    "_prepare_inputs": ("generation_batch",),
    "_generate_and_score_completions": ("inputs",),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask",
                                           "logits_to_keep", "batch_size", "compute_entropy"),
    "_compute_loss": ("model", "inputs"),
    "_clip_grad_norm": ("model",),
}
REPLAY_PREFIX = "replay/"  # TRL log keys of this module
# loss_type values this module adds to TRL's: the harness's stale-rollout losses
# (``rl.objectives``), computed by ``losses.policy_loss``; TRL's own (grpo, dapo, cispo, ...)
# stay TRL's.
HARNESS_LOSS_TYPES = ("m2po", "neg_clip", "neg_cap", "neg_veto")


def check_trl_version(version: str | None = None) -> None:
    """Raise ``ImportError`` unless ``version`` (default: the installed TRL) is in
    ``SUPPORTED_TRL``."""
    version = trl.__version__ if version is None else version
    if Version(version) not in SpecifierSet(SUPPORTED_TRL):
        raise ImportError(f"llm_experiments.integrations.trl supports trl{SUPPORTED_TRL}, found "
                          f"trl {version}; install a supported one (pip install "
                          f"'trl{SUPPORTED_TRL}') or check EXTENSION_POINTS against it")


@dataclass(frozen=True)
class FullSoftmaxField:
    """A ``transformers.GenerationConfig`` field and the values under which ``generate`` still
    samples from the full softmax at the temperature. field: its name; allowed: the value the
    error asks for; keeps(value) -> bool: True for a value that adds no logits processor (the
    condition ``GenerationMixin._get_logits_processor`` tests)."""

    field: str
    allowed: object
    keeps: Callable[[object], bool]


def _unset(x) -> bool:
    return x is None


def _off(x) -> bool:  # None or 0
    return not x


def _at_most_one(x) -> bool:  # None, or a mass / penalty that leaves every token
    return x is None or x >= 1.0


def _cutoff_off(x) -> bool:  # transformers applies a cutoff only inside (0, 1)
    return x is None or not 0.0 < x < 1.0


# The sampler must draw from the distribution whose log-probs the trainer stores as the
# behaviour policy and TRL's loss recomputes: the full softmax at GRPOConfig.temperature.
# Every field here would otherwise change it (truncate, penalise, force or forbid tokens).
FULL_SOFTMAX = (
    FullSoftmaxField(field="do_sample", allowed=True, keeps=lambda x: x is True),
    FullSoftmaxField(field="num_beams", allowed=1, keeps=lambda x: x is None or x == 1),
    FullSoftmaxField(field="top_k", allowed=0, keeps=_off),
    FullSoftmaxField(field="top_p", allowed=1.0, keeps=_at_most_one),
    FullSoftmaxField(field="min_p", allowed=None, keeps=_unset),
    FullSoftmaxField(field="repetition_penalty", allowed=1.0,
                     keeps=lambda x: x is None or x == 1.0),
    FullSoftmaxField(field="typical_p", allowed=1.0, keeps=_at_most_one),
    FullSoftmaxField(field="epsilon_cutoff", allowed=0.0, keeps=_cutoff_off),
    FullSoftmaxField(field="eta_cutoff", allowed=0.0, keeps=_cutoff_off),
    FullSoftmaxField(field="top_h", allowed=None, keeps=_unset),
    FullSoftmaxField(field="no_repeat_ngram_size", allowed=0, keeps=_off),
    FullSoftmaxField(field="bad_words_ids", allowed=None, keeps=_unset),
    FullSoftmaxField(field="sequence_bias", allowed=None, keeps=_unset),
    FullSoftmaxField(field="suppress_tokens", allowed=None, keeps=_unset),
    FullSoftmaxField(field="begin_suppress_tokens", allowed=None, keeps=_unset),
    FullSoftmaxField(field="min_length", allowed=0, keeps=_off),
    FullSoftmaxField(field="min_new_tokens", allowed=None, keeps=_off),
    FullSoftmaxField(field="forced_bos_token_id", allowed=None, keeps=_unset),
    FullSoftmaxField(field="forced_eos_token_id", allowed=None, keeps=_unset),
    FullSoftmaxField(field="exponential_decay_length_penalty", allowed=None, keeps=_unset),
    FullSoftmaxField(field="guidance_scale", allowed=None, keeps=lambda x: x is None or x == 1),
    FullSoftmaxField(field="watermarking_config", allowed=None, keeps=_unset),
)


def check_full_softmax(generation_config, temperature: float) -> None:
    """Raise ValueError naming the first field of ``generation_config`` (the effective
    ``GenerationConfig`` of generation, model defaults merged in) that makes ``generate``
    sample from anything but the full softmax at ``temperature`` (GRPOConfig.temperature,
    > 0), with the value it needs (``FULL_SOFTMAX``)."""
    why = ("ReplayGRPOTrainer stores the full-softmax log-probs at GRPOConfig.temperature as "
           "the behaviour policy, so any other sampling distribution gives wrong importance "
           "ratios and clipping")
    for rule in FULL_SOFTMAX:
        got = getattr(generation_config, rule.field, None)
        if not rule.keeps(got):
            raise ValueError(f"ReplayGRPOTrainer needs {rule.field}={rule.allowed!r}, got "
                             f"{got!r} (from GRPOConfig, its generation_kwargs or the model's "
                             f"generation_config): {why}")
    got = generation_config.temperature
    if got != temperature:
        raise ValueError(f"ReplayGRPOTrainer needs temperature={temperature!r} in generation "
                         f"(GRPOConfig.temperature), got {got!r} (from GRPOConfig."
                         f"generation_kwargs or the model's generation_config): {why}")


def model_dropout(model) -> list[str]:
    """Where ``model`` drops out in training mode: its config's ``*dropout`` fields and its
    ``torch.nn.Dropout`` modules with p > 0 (names), empty when it never does."""
    config = getattr(model, "config", None)
    fields = [f"config.{k}={v:g}" for k, v in sorted(vars(config).items())
              if k.endswith("dropout") and isinstance(v, (int, float)) and v > 0] \
        if config is not None else []
    modules = [name or type(m).__name__ for name, m in model.named_modules()
               if isinstance(m, torch.nn.Dropout) and m.p > 0]
    return fields + modules[:3]


def missing_extension_points(cls=GRPOTrainer) -> list[str]:
    """The ``EXTENSION_POINTS`` that ``cls`` lacks or whose parameters changed (empty: ok)."""
    problems = []
    for name, params in EXTENSION_POINTS.items():
        fn = getattr(cls, name, None)
        if fn is None:
            problems.append(f"{cls.__name__}.{name} is missing")
            continue
        have = inspect.signature(fn).parameters
        lost = [p for p in params if p not in have]
        if lost:
            problems.append(f"{cls.__name__}.{name} lost parameters {lost}")
    return problems


@dataclass(frozen=True)
class ReplaySettings:
    """The replay buffer of a ``ReplayGRPOTrainer`` (theory.md section 1).

    buffer_size: N, rollouts kept (FIFO, integer >= 1). batch_size: B, rollouts per optimizer
    step (integer >= 1). sampling: one of ``replaytheory.buffer.SAMPLING_MODES``. delta:
    positive-bias share in [0, 1) (reward > 0 counts as positive). on_policy: no buffer, each
    rollout used once (then B must equal the rollouts per step R). seed: the draws' numpy
    generator seed (>= 0). drop_logr2: the adaptive horizon (theory.md 12.4), in nats^2, >= 0
    (0 = off): after each optimizer step, drop from the buffer the rollouts of its batch whose
    mean (log r)^2 over their completion tokens at the step's weights passed it (the harness's
    ``buffer.drop_logr2``; needs sampling="with_replacement"). drop_tokens_below_p: with
    drop_logr2, average over the completion tokens whose sampling probability was below it,
    in (0, 1]; 1 = every token (the harness's ``buffer.drop_tokens_below_p``, theory.md 12.7).
    """

    buffer_size: int
    batch_size: int
    sampling: str = "with_replacement"
    delta: float = 0.0
    on_policy: bool = False
    seed: int = 0
    drop_logr2: float = 0.0
    drop_tokens_below_p: float = 1.0

    def __post_init__(self):
        checks.integer("buffer_size", self.buffer_size, 1)
        checks.integer("batch_size", self.batch_size, 1)
        checks.choice("sampling", self.sampling, SAMPLING_MODES)
        checks.real("delta", self.delta, 0.0, 1.0, hi_open=True)
        checks.integer("seed", self.seed, 0)
        checks.real("drop_logr2", self.drop_logr2, 0.0)
        checks.real("drop_tokens_below_p", self.drop_tokens_below_p, 0.0, 1.0, lo_open=True)

    def harness_config(self, rollouts_per_step: int, group_size: int):
        """The harness ``Config`` of these settings at R rollouts per step and group size G
        (its checks apply: e.g. a buffer that could never give a batch is refused)."""
        mode = "on_policy" if self.on_policy else "sync"
        if self.on_policy and rollouts_per_step != self.batch_size:
            raise ValueError(f"on_policy needs batch_size ({self.batch_size}) equal to the "
                             f"rollouts per step, per_device_train_batch_size "
                             f"({rollouts_per_step})")
        return from_dict({
            "schedule": {"mode": mode, "batch_size": self.batch_size, "group_size": group_size,
                         "replay_ratio": self.batch_size / rollouts_per_step},
            "buffer": {"capacity": self.buffer_size, "sampling": self.sampling,
                       "delta": self.delta, "drop_logr2": self.drop_logr2,
                       "drop_tokens_below_p": self.drop_tokens_below_p}})


@dataclass(frozen=True)
class TRLReplayConfig:
    """A replay design in TRL's terms (see ``trl_config``).

    per_device_train_batch_size: R, new rollouts per optimizer step (R / G prompts), the
    GRPOConfig field that sets TRL's generation batch. num_generations: G. replay: the
    trainer's ``ReplaySettings`` (N, B, ...). horizon x = N/R and replay_ratio y = B/R as
    realised after rounding R to a multiple of G (sections 1-2). notes: what rounding changed.
    """

    per_device_train_batch_size: int
    num_generations: int
    replay: ReplaySettings
    horizon: float
    replay_ratio: float
    notes: tuple[str, ...] = field(default=())

    def grpo_config_kwargs(self) -> dict:
        """Keyword arguments for ``trl.GRPOConfig``: one generation batch of R per optimizer
        step, no within-batch reuse (the buffer replaces ``num_iterations`` and
        ``steps_per_generation``)."""
        return {"per_device_train_batch_size": self.per_device_train_batch_size,
                "num_generations": self.num_generations, "steps_per_generation": 1,
                "num_iterations": 1, "gradient_accumulation_steps": 1}


def trl_config(rec, num_generations: int, *, sampling: str = "with_replacement",
               delta: float = 0.0, seed: int = 0) -> TRLReplayConfig:
    """A ``ReplayRecommendation`` (``optimal_config``, synchronous: ``gpus=None``) as TRL
    arguments (theory.md sections 1-3, 5).

    Mapping: B -> ``ReplaySettings.batch_size`` (rollouts per optimizer step);
    R -> GRPOConfig ``per_device_train_batch_size`` (TRL's generation batch, rounded to the
    nearest multiple of G = ``num_generations`` >= 2, at least G, because TRL generates whole
    groups); N -> ``ReplaySettings.buffer_size`` = round(x R) for the rounded R, so the horizon
    x = N/R is kept (N >= B is kept too); ``steps_per_generation = num_iterations =
    gradient_accumulation_steps = 1``. An on-policy recommendation maps to R = B (rounded to
    a multiple of G) with ``on_policy=True``. The replay ratio y = B/R changes when R is
    rounded: ``TRLReplayConfig.replay_ratio`` is the realised one; ask ``optimal_config`` for
    a ``batch_size`` that is a multiple of G to keep rounding small.
    Raises ValueError for an asynchronous recommendation (W/T split): ``GRPOTrainer`` is
    synchronous.
    """
    g = checks.integer("num_generations", num_generations, 2)
    if rec.workers is not None:
        raise ValueError("trl_config needs a synchronous recommendation (optimal_config with "
                         "gpus=None): GRPOTrainer generates and trains in turn, it has no "
                         f"W/T split (got workers={rec.workers}, trainers={rec.trainers})")
    notes = []
    if rec.on_policy:
        r = max(g, int(round(rec.batch_size / g)) * g)
        if r != rec.batch_size:
            notes.append(f"batch size {rec.batch_size} rounded to {r}, a multiple of G = {g}")
        replay = ReplaySettings(r, r, on_policy=True, seed=seed)
        return TRLReplayConfig(r, g, replay, 1.0, 1.0, tuple(notes))
    r = max(g, int(round(rec.rollouts_per_step / g)) * g)
    b = rec.batch_size
    n = max(b, r, int(round(rec.horizon * r)))
    if r != rec.rollouts_per_step:
        notes.append(f"rollouts per step R = {rec.rollouts_per_step:g} rounded to {r}, a "
                     f"multiple of G = {g}: replay ratio {rec.replay_ratio:.3g} -> {b / r:.3g},"
                     f" buffer {rec.buffer_size} -> {n} (horizon {rec.horizon:.3g} -> "
                     f"{n / r:.3g})")
    replay = ReplaySettings(n, b, sampling=sampling, delta=delta, seed=seed)
    return TRLReplayConfig(r, g, replay, n / r, b / r, tuple(notes))


class GenerationBatches(Production):
    """The harness's ``Production`` in TRL's generation batches: every ``every``-th step
    (k = GRPOConfig ``steps_per_generation``) makes the groups due over its k steps in one
    generation call (k R rollouts, TRL's ``generation_batch_size``) with its current weights,
    and the k - 1 steps between make none (extra groups while the buffer cannot give a
    batch aside). The average rate R per step, so x = N/R and y = B/R, are those of k = 1,
    which is ``Production`` itself; a larger generation batch costs staleness (up to k - 1
    steps more) and buys batched generation (theory.md section 3: mu per rollout)."""

    def __init__(self, cfg_schedule, every: int):
        super().__init__(cfg_schedule)
        self.every = checks.integer("steps_per_generation", every, 1)

    def groups_due(self, step: int) -> int:
        """Groups to generate before step ``step``: those of steps step .. step + k - 1 at a
        step that is a multiple of k, else 0."""
        if step % self.every:
            return 0
        per_step = super().groups_due
        return sum(per_step(s) for s in range(step, step + self.every))


@dataclass
class ReplayStep:
    """What one optimizer step of a ``ReplayGRPOTrainer`` made and drew.

    step: the optimizer step (weights version of its new rollouts). new: rollouts generated
    for it (extra groups included). batch: the B rollouts trained on. buffer: the harness's
    ``RolloutBuffer.step_stats`` of the draw (staleness, steps since last use, ...).
    """

    step: int
    new: list[Rollout]
    batch: list[Rollout]
    buffer: dict


class ReplayGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with a FIFO replay buffer across generations (see the module docstring).

    Args: those of ``GRPOTrainer``, plus ``replay`` (``ReplaySettings``: N, B, sampling, delta)
    and ``probes`` (``ProbeSource`` or None: gradient-noise probes, written to
    ``probe_dir``). GRPOConfig's ``per_device_train_batch_size`` is R, the rollouts generated
    per optimizer step on average; ``steps_per_generation`` k >= 1 makes them in generation
    batches of k R every k steps (``GenerationBatches``); it needs ``num_iterations =
    gradient_accumulation_steps = 1``. A ``CalibrationCallback`` is added (``calibration``).
    Attributes after training: ``buffer``, ``books`` (the harness's ``engines.loop.RunBooks``:
    ``clock``, a ``schedule.ComputeClock`` of rollouts generated, production and update
    seconds; ``consumed``), ``steps`` (one ``ReplayStep`` per step when ``keep_steps``, else
    the last only).

    ``loss_type`` may also name a loss of the harness that TRL lacks (``HARNESS_LOSS_TYPES``:
    m2po, with its mask bound ``m2_threshold`` (> 0, nats^2); neg_clip, neg_cap, neg_veto,
    clipped at GRPOConfig's ``epsilon`` / ``epsilon_high``); ``losses.policy_loss`` computes
    it on TRL's log-probs, as the harness trains. TRL's cispo, dapo, grpo stay TRL's.
    ``ReplaySettings.drop_logr2`` > 0 turns on the adaptive horizon under any loss type
    (``_drop_stale``).
    """

    def __init__(self, *args, replay: ReplaySettings, probes=None, probe_dir: str | None = None,
                 keep_steps: bool = False, m2_threshold: float = 0.04, **kwargs):
        check_trl_version()
        missing = missing_extension_points()
        if missing:
            raise RuntimeError(f"TRL {trl.__version__}: GRPOTrainer changed ({'; '.join(missing)})"
                               f"; ReplayGRPOTrainer supports trl{SUPPORTED_TRL}")
        super().__init__(*args, **kwargs)
        self._check_supported()
        self.m2_threshold = checks.positive("m2_threshold", m2_threshold)
        if not isinstance(replay, ReplaySettings):
            raise ValueError(f"replay must be a ReplaySettings, got {type(replay).__name__}")
        self.replay = replay
        r = self.args.per_device_train_batch_size
        self.harness = replay.harness_config(r, self.num_generations)
        self.buffer = RolloutBuffer.for_config(self.harness)
        self.production = GenerationBatches(self.harness.schedule,
                                            self.args.steps_per_generation)
        self.replay_rng = np.random.default_rng(replay.seed)
        self.books = RunBooks(ComputeClock(param_count(self.model), replay.batch_size))
        self.keep_steps = bool(keep_steps)
        self.steps: list[ReplayStep] = []
        self.keep_grad = False
        self.kept_grad: torch.Tensor | None = None
        self._rewards: torch.Tensor | None = None
        self._capture_logps = False
        self._step_logps: torch.Tensor | None = None
        self.calibration = CalibrationCallback(self, probes, probe_dir)
        self.add_callback(self.calibration)

    @property
    def clock(self) -> ComputeClock:
        """Generation and update costs so far (``books.clock``)."""
        return self.books.clock

    @property
    def consumed(self) -> int:
        """Rollouts drawn for training so far."""
        return self.books.consumed

    def _check_supported(self) -> None:
        """Refuse the GRPOConfig settings this trainer does not implement (named)."""
        a = self.args
        wrong = {"num_iterations": (self.num_iterations, 1),
                 "gradient_accumulation_steps": (a.gradient_accumulation_steps, 1),
                 "use_vllm": (a.use_vllm, False), "beta": (a.beta, 0.0),
                 "mask_truncated_completions": (a.mask_truncated_completions, False),
                 "num_processes": (self.accelerator.num_processes, 1)}
        for name, (got, allowed) in wrong.items():
            if got != allowed:
                raise ValueError(f"ReplayGRPOTrainer needs {name}={allowed!r}, got {got!r} "
                                 f"(the replay buffer replaces TRL's within-batch reuse)")
        if self.tools or self.environment_factories is not None:
            raise ValueError("ReplayGRPOTrainer does not support tools or environments")
        dropout = model_dropout(self.model)
        if not a.disable_dropout and dropout:
            raise ValueError(f"ReplayGRPOTrainer needs disable_dropout=True with a model that "
                             f"drops out ({', '.join(dropout)}): the behaviour log-probs of a "
                             f"replayed rollout would be noisy draws, not pi_behaviour")
        # What generate() will use: TRL's generation config, None fields filled from the
        # model's generation_config and transformers' defaults (e.g. top_k=None becomes 50).
        effective, _ = self.model._prepare_generation_config(self.generation_config)
        check_full_softmax(effective, self.temperature)

    # ---- production: TRL generates and scores, we keep behaviour log-probs -----------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, with the weighted total kept for the buffer (delta, train reward)."""
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        total = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        self._rewards = total.detach().cpu()
        return per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's generation, plus the behaviour log-probs of every completion when TRL skipped
        them (the pitfall: without them a replayed sample's ratio would be 1)."""
        out = super()._generate_and_score_completions(inputs)
        if self.model.training and "old_per_token_logps" not in out:
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                out["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, mask, out["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size)
        return out

    def _rollouts(self, out: dict, version: int) -> list[Rollout]:
        """TRL's scored generation as harness ``Rollout`` records (unpadded, numpy)."""
        g, n = self.num_generations, out["completion_ids"].size(0)
        pmask, cmask = out["prompt_mask"].bool().cpu(), out["completion_mask"].bool().cpu()
        pids, cids = out["prompt_ids"].cpu(), out["completion_ids"].cpu()
        logps, adv = out["old_per_token_logps"].float().cpu(), out["advantages"].float().cpu()
        first_item, first_group = self.books.new_ids(n // g, g)
        rollouts = []
        for i in range(n):
            group = first_group + i // g
            rollouts.append(Rollout(
                item_id=first_item + i, group_id=group, problem_id=group, version=version,
                prompt=pids[i][pmask[i]].numpy().astype(np.int32),
                completion=cids[i][cmask[i]].numpy().astype(np.int32),
                logprobs=logps[i][cmask[i]].numpy().astype(np.float32),
                reward=float(self._rewards[i]), advantage=float(adv[i])))
        return rollouts

    def _producer(self, generation_batch: list[dict]):
        """``produce(n_groups, version)`` for ``Production.fill``: the next ``n_groups``
        prompt groups of TRL's generation batch, cyclically (extra groups, needed only while
        the buffer cannot give a batch, reuse the step's prompts with new samples)."""
        g = self.num_generations
        n_groups_avail = len(generation_batch) // g
        cursor = [0]

        def produce(n_groups: int, version: int) -> list[Rollout]:
            if n_groups == 0:
                return []
            picks = [(cursor[0] + k) % n_groups_avail for k in range(n_groups)]
            cursor[0] += n_groups
            rows = [generation_batch[p * g + j] for p in picks for j in range(g)]
            t0 = time.perf_counter()
            out = self._generate_and_score_completions(rows)
            seconds = time.perf_counter() - t0
            rollouts = self._rollouts(out, version)
            self.books.count_made([r.reward for r in rollouts], seconds,
                                  int(out["prompt_mask"].sum() + out["completion_mask"].sum()))
            return rollouts
        return produce

    # ---- the step: fill the buffer, draw B, hand TRL a batch with stored log-probs ----------

    def _prepare_inputs(self, generation_batch):
        """Train: generate R rollouts into the buffer and return B drawn from it, in TRL's
        batch format with the behaviour log-probs as ``old_per_token_logps``. Eval: TRL's."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        step = self.state.global_step
        self.books.start_step()
        drawn = fill_and_draw(self.production, self.buffer, step,
                              self._producer(generation_batch), self.replay_rng, self.books)
        batch = drawn.batch
        self.clock.train_tokens += int(sum(len(r.prompt) + len(r.completion) for r in batch))
        record = ReplayStep(step=step, new=drawn.new, batch=batch,
                            buffer=self.buffer.step_stats())
        self.steps = self.steps + [record] if self.keep_steps else [record]
        self._log_replay(record)
        return self._collate(batch)

    def _collate(self, batch: list[Rollout]) -> dict:
        """TRL's input dict of rollouts: prompts left-padded, completions right-padded."""
        pad, dev = self._tokenizer.pad_token_id, self.accelerator.device
        n = len(batch)
        p_len = max(len(r.prompt) for r in batch)
        c_len = max(1, max(len(r.completion) for r in batch))
        prompt_ids = torch.full((n, p_len), pad, dtype=torch.long)
        prompt_mask = torch.zeros((n, p_len), dtype=torch.long)
        completion_ids = torch.full((n, c_len), pad, dtype=torch.long)
        completion_mask = torch.zeros((n, c_len), dtype=torch.long)
        old = torch.zeros((n, c_len), dtype=torch.float32)
        for i, r in enumerate(batch):
            p, c = len(r.prompt), len(r.completion)
            prompt_ids[i, p_len - p:] = torch.from_numpy(r.prompt.astype(np.int64))
            prompt_mask[i, p_len - p:] = 1
            completion_ids[i, :c] = torch.from_numpy(r.completion.astype(np.int64))
            completion_mask[i, :c] = 1
            old[i, :c] = torch.from_numpy(r.logprobs)
        return {"prompt_ids": prompt_ids.to(dev), "prompt_mask": prompt_mask.to(dev),
                "completion_ids": completion_ids.to(dev),
                "completion_mask": completion_mask.to(dev),
                "old_per_token_logps": old.to(dev),
                "advantages": torch.tensor([r.advantage for r in batch], dtype=torch.float32,
                                           device=dev),
                # TRL's token-normalised losses (dapo, cispo, vespo) take num_items_in_batch as
                # the tokens of a whole generation batch and divide it by steps_per_generation
                # k; this batch is one step's own draw, so its count is scaled by k to leave
                # the loss a mean over this batch's tokens (not k times it).
                "num_items_in_batch": (completion_mask.sum()
                                       * self.args.steps_per_generation).to(dev)}

    def _compute_loss(self, model, inputs):
        """TRL's loss, or for a ``HARNESS_LOSS_TYPES`` loss the harness's mean per-rollout
        loss on TRL's per-token log-probs (staleness diagnostics under ``replay/``); with
        ``replay.drop_logr2`` > 0 the batch's rollouts past it leave the buffer."""
        training = model.training
        self._step_logps = None
        if self.loss_type not in HARNESS_LOSS_TYPES:
            self._capture_logps = training and self.replay.drop_logr2 > 0
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                self._capture_logps = False
            logp = self._step_logps
        else:
            loss, logp = self._harness_loss(model, inputs)
        if training and self.replay.drop_logr2 > 0:
            self._drop_stale(logp, inputs)
        return loss

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's log-probs, kept for the adaptive horizon while ``_compute_loss`` asks."""
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if getattr(self, "_capture_logps", False):
            self._step_logps = out[0].detach()
        return out

    def _harness_loss(self, model, inputs):
        """(The harness loss ``self.loss_type`` on TRL's log-probs, the log-probs)."""
        completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            completion_ids.size(1), compute_entropy=True)
        rows = TokenBatch(completion_ids, mask, inputs["old_per_token_logps"],
                          inputs["advantages"])
        kw = {"loss": self.loss_type, "clip_low": self.epsilon_low,
              "clip_high": self.epsilon_high, "m2_threshold": self.m2_threshold}
        loss = policy_loss(logp, rows, **kw).mean()
        mode = "train" if model.training else "eval"
        for key, val in loss_stats(logp.detach(), entropy.detach(), rows, self.epsilon_low,
                                   self.epsilon_high, loss_kwargs=kw).items():
            self._metrics[mode][REPLAY_PREFIX + key].append(math.nan if val is None else val)
        return loss, logp.detach()

    def _drop_stale(self, logp, inputs) -> None:
        """The adaptive horizon (theory.md 12.4): evict the step's rollouts whose mean
        (log r)^2 at the step's weights passed ``replay.drop_logr2``, as the harness does
        after its update; logs ``replay/dropped``."""
        if logp is None:
            raise RuntimeError("drop_logr2: TRL's _compute_loss no longer computes the "
                               "per-token log-probs through _get_per_token_logps_and_entropies")
        rows = TokenBatch(inputs["completion_ids"], inputs["completion_mask"].bool(),
                          inputs["old_per_token_logps"], inputs["advantages"])
        over = row_logr2(logp, rows, self.replay.drop_tokens_below_p) > self.replay.drop_logr2
        batch = self.steps[-1].batch
        dropped = self.buffer.drop([r.item_id for r, o in zip(batch, over) if o])
        self._metrics["train"][REPLAY_PREFIX + "dropped"].append(float(dropped))

    def _log_replay(self, record: ReplayStep) -> None:
        """Replay statistics of the step into TRL's metrics (averaged per logging window)."""
        values = {"staleness_mean": record.buffer["staleness_mean"],
                  "steps_since_last_use_mean": record.buffer["steps_since_last_use_mean"],
                  "first_use_fraction": record.buffer["first_use_fraction"],
                  "buffer_occupancy": record.buffer["buffer_occupancy"],
                  "replay_ratio": self.books.replay_ratio(),
                  "new_rollouts": len(self.books.made_rewards),
                  "new_reward": self.books.train_reward()}
        for key, val in values.items():
            self._metrics["train"][REPLAY_PREFIX + key].append(
                math.nan if val is None else float(val))

    def _clip_grad_norm(self, model):
        """Keep the unclipped gradient when a probe asks for it (minibatch noise), then clip."""
        if self.keep_grad:
            self.kept_grad = flat_grad(model)
        return super()._clip_grad_norm(model)


@dataclass(frozen=True)
class ProbeSource:
    """What gradient-noise probes need beyond the trainer (the task part of ``TrainerRun``).

    cfg: a harness ``Config`` whose ``probe``, ``sampler``, ``schedule.group_size`` and
    ``run.seed`` sections set the probes (theory.md section 4). loss_kwargs: keyword
    arguments of ``losses.policy_loss`` matching the trainer's loss. sample_problems(n, rng),
    encode(problem), make_rollouts(problems, gen, version, first_item, first_group): as in
    ``probes.RunView`` (for a harness task: ``task.sample_train``, ``models.encode_prompt``,
    ``trainer.grade_rollouts``).
    """

    cfg: object
    loss_kwargs: dict
    sample_problems: object
    encode: object
    make_rollouts: object


class TrainerRun:
    """A ``ReplayGRPOTrainer`` run as the probes read it (``probes.RunView``): its policy,
    tokenizer, device and buffer, the task part from a ``ProbeSource`` (``source``), the weight
    snapshots the ``CalibrationCallback`` keeps (``weights``, a ``schedule.WeightStore``), and
    ``probe_dir``, the folder ``probes.npz`` goes in."""

    def __init__(self, trainer: ReplayGRPOTrainer, source: ProbeSource, weights: WeightStore,
                 probe_dir: str):
        self.trainer, self.source, self.weights = trainer, source, weights
        self.model, self.tokenizer = trainer.model, trainer.processing_class
        self.device, self.loss_kwargs = trainer.accelerator.device, source.loss_kwargs
        self.probe_dir, self.buffer_capacity = probe_dir, trainer.buffer.index.capacity

    def rollouts_per_step(self) -> float:
        """R > 0, the trainer's new rollouts per step."""
        return self.trainer.production.rollouts_per_step

    def sample_problems(self, n: int, rng: np.random.Generator) -> list:
        """``n`` training problems drawn with ``rng`` (``ProbeSource.sample_problems``)."""
        return self.source.sample_problems(n, rng)

    def encode(self, problem) -> list[int]:
        """A problem's prompt token ids (``ProbeSource.encode``)."""
        return self.source.encode(problem)

    def make_rollouts(self, problems, gen, version: int, first_item: int,
                      first_group: int) -> list[Rollout]:
        """Graded rollouts of a probe's generation (``ProbeSource.make_rollouts``)."""
        return self.source.make_rollouts(problems, gen, version, first_item, first_group)

    def current_weights(self) -> WeightUpdate:
        """The trainer's weights, version = its global step."""
        return WeightUpdate(self.trainer.state.global_step, self.trainer.model.state_dict())

    def snapshot_versions(self) -> set[int]:
        """The weight versions the callback keeps."""
        return set(self.weights.snapshots)

    def snapshot(self, version: int) -> WeightUpdate:
        """A kept version's weights."""
        return self.weights.update(version)

    def buffer_versions(self) -> np.ndarray:
        """The weight version of every rollout in the trainer's buffer."""
        return self.trainer.buffer.versions()

    def probe_groups(self, group_size: int, versions: set[int], limit: int) -> HeldRollouts:
        """``RolloutBuffer.probe_groups`` of the trainer's buffer."""
        return self.trainer.buffer.probe_groups(group_size, versions, limit)

    def run_counts(self) -> RunCounts:
        """Rollouts made and drawn, steps taken and the measured mu (no accounting mu)."""
        c = self.trainer.clock
        return RunCounts(unique_rollouts=c.generated, samples_consumed=self.trainer.consumed,
                         steps=c.steps, mu_measured=c.mu_time(), mu_accounting=None)


class CalibrationCallback(TrainerCallback):
    """Measures mu inside a ``ReplayGRPOTrainer`` run, and optionally probes gradient noise.

    mu (theory.md section 3) = seconds to produce B rollouts (TRL's generation, scoring and
    the behaviour log-probs) / seconds of one update (the rest of the optimizer step), from the
    trainer's ``clock``; logged as ``replay/mu_measured``. With a ``ProbeSource``, every
    ``probe.every`` steps (before the step's generation: the buffer then holds rollouts at
    least one step old, fresh ones come from the probe's own groups) it runs
    ``probes.Prober`` at the current weights, keeps weight snapshots for the buffer's
    versions, records the step's minibatch gradient, and writes ``probes.npz`` to ``out_dir``
    at the end (``replaytheory.fit.probes`` layout, with the run counts and mu).
    """

    def __init__(self, trainer: ReplayGRPOTrainer, probes: ProbeSource | None = None,
                 out_dir: str | None = None):
        self.trainer = trainer
        self._t0 = self._gen0 = 0.0
        self.prober = self.weights = None
        self.every = 0
        if probes is not None:
            if out_dir is None:
                raise ValueError("probes need probe_dir (the folder of probes.npz)")
            os.makedirs(out_dir, exist_ok=True)
            self.weights = WeightStore()
            self.every = probes.cfg.probe.every
            if self.every < 1:
                raise ValueError(f"probe.every must be >= 1 with probes, got {self.every}")
            self.prober = Prober(probes.cfg, TrainerRun(trainer, probes, self.weights, out_dir))

    def mu(self) -> float | None:
        """The measured mu so far (None before the first step)."""
        return self.trainer.clock.mu_time()

    def on_step_begin(self, args, state, control, **kwargs):
        t = self.trainer
        step = state.global_step
        if self.prober is not None:
            self.weights.publish(step, t.model)
            keep = self.prober.versions_needed(step) | {step}
            self.weights.keep_only(keep)
            if step % self.every == 0:
                self.prober.probe(step)
                t.keep_grad, t.kept_grad = True, None
        # After the probe: its seconds are neither production nor update.
        self._t0, self._gen0 = time.perf_counter(), t.clock.gen_seconds

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        t = self.trainer
        if t.keep_grad and t.kept_grad is None:  # max_grad_norm = 0: no clip hook ran
            t.kept_grad = flat_grad(model)

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        wall = time.perf_counter() - self._t0
        t.clock.train_seconds += max(wall - (t.clock.gen_seconds - self._gen0), 0.0)
        t.clock.steps += 1
        if t.keep_grad:
            self.prober.add_minibatch(state.global_step - 1, t.kept_grad)
            t.keep_grad, t.kept_grad = False, None
        mu = self.mu()
        if mu is not None:  # the latest estimate (cumulative), not a window average
            t._metrics["train"][REPLAY_PREFIX + "mu_measured"] = [mu]

    def on_train_end(self, args, state, control, **kwargs):
        if self.prober is not None:
            self.prober.save()
