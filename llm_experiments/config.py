"""Typed run configuration: dataclasses, YAML files and ``--set section.key=value`` overrides.

A configuration is one ``Config`` with a section per concern (run, task, model, sampler,
schedule, buffer, trainer, eval, probe). Shipped configurations live in ``configs/*.yaml``
(``cpu_tiny`` is the default). Every field states its range where it is defined (``_int``,
``_real``, ...; choice lists come from the owning subsystem's leaf module, e.g.
``rl/choices.py``) and is checked when its section is built; relations between sections are
checked once the buffer capacity is resolved (``check_resolved``). An error names the
offending key and the allowed range, so that the command line can print it as one line.

Units: steps are trainer steps (one optimizer update on one global batch); batch sizes and
buffer sizes count rollouts (sequences), group sizes count sequences per prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import ClassVar

import yaml

from replaytheory import checks
from replaytheory.buffer import (GROUP_MODES, REPLACING, SAMPLING_MODES, check_growth,
                                 positive_part)
from replaytheory.cli_input import BadInput, file_label, kind_name, read_text
from replaytheory.fit.probes import ALIGN_VARIANTS

# Only leaves, modules that import nothing of ours: the subsystems import this module, so
# anything more would close a circle (tests/test_imports.py).
from .engines import ENGINES, OVERLAP_SAMPLERS, RAY_LOOPS
from .engines.ray_plan import chunk_groups, lifo_min_capacity
from .policy.choices import DTYPE_NAMES
from .rl.choices import LAYOUTS, LOSSES, MODES, RATIO_LOSSES
from .rl.rates import buffer_shards, rollouts_per_step
from .samplers import BACKENDS, CDF_DTYPES, DECODE_GRAPHS, LINEAR_KERNELS
from .tasks.long_shape import prompt_chars, solution_chars
from .tasks import TASKS

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")

# trainer.optimizer -> the torch.optim class that ``experiment.py`` builds.
OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam"}


# Field makers: a field's default and the check of its values, side by side. A check takes
# (key, value) and returns the value coerced to the field's type, or raises ValueError naming
# the key and the allowed range (the same range whatever is wrong with the value).

def _field(default, check):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"check": check})
    return field(default=default, metadata={"check": check})


def _int(default: int, lo: int | None = None, hi: int | None = None):
    return _field(default, lambda key, value: checks.integer(key, value, lo, hi))


def _real(default: float, lo: float = -math.inf, hi: float = math.inf, *,
          lo_open: bool = False, hi_open: bool = False, or_value: float | None = None):
    """A real in the interval, or exactly ``or_value`` (a code such as -1 = measured)."""
    def check(key, value):
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if or_value is not None and not isinstance(value, bool) and value == or_value:
            return float(value)
        name = key if or_value is None else f"{key} (or {or_value:g})"
        return checks.real(name, value, lo, hi, lo_open=lo_open, hi_open=hi_open)
    return _field(default, check)


def _positive(default: float):
    return _real(default, 0.0, lo_open=True)


def _choice(default: str, allowed):
    return _field(default, lambda key, value: checks.choice(key, value, allowed))


def _switch(default: str, allowed):
    """A choice among ``allowed`` (which holds "on" and "off"), where YAML's booleans (it
    reads a bare on/off as true/false) mean "on" and "off"."""
    def check(key, value):
        if isinstance(value, bool):
            value = "on" if value else "off"
        return checks.choice(key, value, allowed)
    return _field(default, check)


def _flag(default: bool):
    def check(key, value):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return _field(default, check)


def _text(default: str):
    def check(key, value):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{key} must be a string, got {value!r}")
    return _field(default, check)


def _int_list(default: list, lo: int):
    def check(key, value):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list of {checks.integer_range(lo)}, got "
                             f"{value!r}")
        return [checks.integer(f"{key}[{i}]", x, lo) for i, x in enumerate(value)]
    return _field(default, check)


def _choice_list(default: list, allowed):
    """A list of distinct members of ``allowed``."""
    def check(key, value):
        if isinstance(value, (list, tuple)):
            chosen = [checks.choice(f"{key}[{i}]", x, allowed) for i, x in enumerate(value)]
            if len(set(chosen)) == len(chosen):
                return chosen
        raise ValueError(f"{key} must be a list of distinct members of {list(allowed)}, got "
                         f"{value!r}")
    return _field(default, check)


def _mapping(default: dict):
    def check(key, value):
        if isinstance(value, dict):
            return dict(value)
        raise ValueError(f"{key} must be a mapping, got {value!r}")
    return _field(default, check)


def _device(default: str):
    def check(key, value):
        if isinstance(value, str) and (value in ("cpu", "cuda") or (
                value.startswith("cuda:") and value[5:].isdigit())):
            return value
        raise ValueError(f"{key} must be 'cpu', 'cuda' or 'cuda:N' (N >= 0), got {value!r}")
    return _field(default, check)


class _Section:
    """A config section: each field checks its values where it is defined (``_int`` ...),
    ``check`` what relates fields of the section; both run when the section is built."""

    SECTION: ClassVar[str]

    def __post_init__(self):
        for f in dataclasses.fields(self):
            key = f"{self.SECTION}.{f.name}"
            setattr(self, f.name, f.metadata["check"](key, getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Checks across this section's fields (none by default)."""


@dataclass
class RunConfig(_Section):
    """Run-level settings.

    steps: trainer steps (>= 1). seed: seed of the training randomness (>= 0).
    threads: torch CPU threads (>= 1; 1 is robust on a shared 2-core machine).
    device: "cpu", "cuda" or "cuda:N". log_every: steps between metrics records (>= 1).
    checkpoint_every: steps between checkpoints (>= 1). progress: terminal progress bar.
    tensorboard: also write TensorBoard events (needs the ``tensorboard`` package).
    cache_dir: where warm starts are cached; "" = ``$LLM_EXPERIMENTS_CACHE``, else
        ``$XDG_CACHE_HOME/llm_experiments``, else ``~/.cache/llm_experiments`` (per user, not
        per working folder; ``models.cache_dir``).
    fast_kernels: float32 CPU linear layers (training and sampling) through oneDNN on a CPU
        with AVX-512, where it measured about 2x faster than torch's default kernel, and
        torch's kernel elsewhere (``kernels.use_fast_linear``); and the fused Adam/AdamW
        step. Same math, float32 rounding differs. false: the default kernels.
    direct_forward: drive Llama/Qwen-style models layer by layer (``direct.py``): sampling
        with a static KV cache and each distinct prompt prefilled once, training with each
        distinct prompt of a batch computed once; same math, float32 rounding differs.
        false (with fast_kernels false): bitwise the computation of earlier versions.
    train_layout: how the direct forward lays out an update's batch (``rl.choices.LAYOUTS``):
        "shared_prompts" (each distinct prompt once, its completions attending to it; cheap
        for an on-policy batch of G rollouts a prompt, the earlier computation), "sequences"
        (each row's prompt and completion in one forward; its cost does not depend on how
        many distinct prompts the batch holds), "auto" (per batch, the one whose token count
        is smaller, ``losses.choose_layout``: an on-policy batch keeps "shared_prompts",
        bitwise; a batch drawn from a wide buffer takes "sequences", float32 rounding differs).
    """

    SECTION: ClassVar[str] = "run"
    steps: int = _int(300, 1)
    seed: int = _int(0, 0)
    threads: int = _int(1, 1)
    device: str = _device("cpu")
    log_every: int = _int(1, 1)
    checkpoint_every: int = _int(25, 1)
    progress: bool = _flag(True)
    tensorboard: bool = _flag(False)
    cache_dir: str = _text("")
    fast_kernels: bool = _flag(True)
    direct_forward: bool = _flag(True)
    train_layout: str = _choice("shared_prompts", LAYOUTS)


@dataclass
class TaskConfig(_Section):
    """The task with a verifiable reward.

    name: "addition" (built in), "long_addition" (built in, with a worked solution;
        ``tasks.long_addition``), "reasoning_gym" or "math".
    digits: addition difficulty, operand digits (1..9; both addition tasks). eval_size: held-out problems (>= 1).
    eval_seed: seed choosing the held-out set (never overlaps the training problems).
    rg_name, rg_config, rg_size: reasoning-gym generator, its keyword arguments, problems made.
    prompt_field: reasoning-gym entry field used as prompt ("question" or
        "metadata.<key>", e.g. "metadata.expression" for a char-level model).
    dataset: math task data, a local ``.jsonl`` path or a hub dataset name.
    eval_dataset: held-out data (path or name); "" = hold out ``eval_size`` rows of ``dataset``.
    split, eval_split: hub dataset splits. problem_key, answer_key: record fields.
    prompt_template: text in which ``{problem}`` is replaced (other braces are kept, e.g.
        ``\\boxed{}``). chat_template: wrap the prompt with the
        tokenizer's chat template (instruct models).
    """

    SECTION: ClassVar[str] = "task"
    name: str = _choice("addition", TASKS)
    digits: int = _int(2, 1, 9)
    eval_size: int = _int(200, 1)
    eval_seed: int = _int(1234)
    rg_name: str = _text("chain_sum")
    rg_config: dict = _mapping({})
    rg_size: int = _int(10000, 2)
    prompt_field: str = _text("question")
    dataset: str = _text("")
    eval_dataset: str = _text("")
    split: str = _text("train")
    eval_split: str = _text("test")
    problem_key: str = _text("problem")
    answer_key: str = _text("answer")
    prompt_template: str = _text("{problem}")
    chat_template: bool = _flag(False)

    def check(self) -> None:
        """The math task needs data; the template needs the problem's place."""
        if self.name == "math" and not self.dataset:
            raise ValueError("task.dataset must name a dataset or a .jsonl file for "
                             "task.name=math")
        if "{problem}" not in self.prompt_template:
            raise ValueError(f"task.prompt_template must contain {{problem}}, got "
                             f"{self.prompt_template!r}")


@dataclass
class ModelConfig(_Section):
    """The policy.

    name: "tiny" (a Qwen2-style model built from this section with a char tokenizer and a
        cached supervised warm start) or a pretrained model name / local path.
    hidden_size, layers, heads, kv_heads, intermediate_size, max_len: tiny model shape.
    dtype: "float32", "bfloat16" or "float16". attn_implementation: "sdpa" or "eager".
    warm_start_steps (>= 0), warm_start_lr (> 0), warm_start_batch (>= 1),
    warm_start_warmup (>= 0), warm_start_seed: supervised warm start of the tiny model.
    warm_start_target: stop the warm start as soon as greedy accuracy on a fixed sample of
    training problems reaches this value (in [0, 1); 0 = run all ``warm_start_steps``). The
    supervised curve is steep, so a step count alone lands anywhere between 0.1 and 0.8.
    warm_start_path: a folder holding a saved warm start of this shape (``python -m
        llm_experiments.policy.models --out DIR``), loaded instead of training one; "" = train it
        on this machine and cache it. The training is chaotic in floating point, so only a
        saved warm start is the same policy on every machine (``models.cached_warm_start``).
    warm_start_sha256: "" or the digest (``models.weights_sha256``, 64 hex digits) the warm
        start must have: a run on another policy stops with an error instead of joining a
        grid it does not belong to.
    """

    SECTION: ClassVar[str] = "model"
    name: str = _text("tiny")
    hidden_size: int = _int(128, 1)
    layers: int = _int(4, 1)
    heads: int = _int(4, 1)
    kv_heads: int = _int(2, 1)
    intermediate_size: int = _int(512, 1)
    max_len: int = _int(32, 1)
    dtype: str = _choice("float32", DTYPE_NAMES)
    attn_implementation: str = _choice("sdpa", ("sdpa", "eager"))  # transformers' names
    warm_start_steps: int = _int(550, 0)
    warm_start_lr: float = _positive(2e-3)
    warm_start_batch: int = _int(64, 1)
    warm_start_warmup: int = _int(50, 0)
    warm_start_seed: int = _int(0)
    warm_start_target: float = _real(0.0, 0.0, 1.0, hi_open=True)
    warm_start_path: str = _text("")
    warm_start_sha256: str = _text("")

    def check(self) -> None:
        """Attention heads split the hidden size and share key/value heads evenly; a pinned
        digest is a sha256."""
        if self.heads % self.kv_heads or self.hidden_size % self.heads:
            raise ValueError("model.heads must divide model.hidden_size and be a multiple of "
                             "model.kv_heads")
        if self.warm_start_sha256 and not re.fullmatch(r"[0-9a-f]{64}", self.warm_start_sha256):
            raise ValueError("model.warm_start_sha256 must be '' or 64 lower-case hex digits, "
                             f"got {self.warm_start_sha256!r}")


@dataclass
class SamplerConfig(_Section):
    """Rollout generation.

    backend: "hf" (torch, KV cache) or "vllm". temperature: training sampling temperature
    (> 0). top_p: nucleus mass in (0, 1] (1 = full distribution); < 1 only with
    trainer.loss=asymre: the behaviour log-probs include the nucleus renormalisation and
    the trainer scores the full softmax, so a ratio-based loss would see a fresh sample's
    ratio below 1. max_new_tokens (>= 1).
    vllm_kv_cache_gb: KV-cache size of the vLLM CPU backend, GiB (>= 1).
    vllm_gpu_memory: share of a GPU's memory the vLLM engine may take, in (0, 1] (its own
        default is 0.9, which leaves a trainer on the same GPU too little).
    vllm_eager: run vLLM eagerly (true) or let it capture CUDA graphs (false; faster
        decoding on a GPU, slower start).
    compact_below: HF sampler: when the share of its rows still decoding is at or below this,
        in [0, 1], finished rows leave the KV cache at a completion check (0 = never).
        The samples do not change (each row keeps its own uniforms; bitwise on CPU).
    cdf_dtype: HF sampler's inverse-CDF sum, one of ``samplers.CDF_DTYPES``: "float64"
        (the reference), "float32" (a float32 sum over the vocabulary), "blocked" (float32
        within 1,024-token blocks, float64 across them; <= ~2e-4 chance of another token
        than float64's at a 152k vocabulary, float32: ~4e-3), "auto" = float64 on CPU, blocked elsewhere.
    decode_graphs: HF sampler's decode steps, one of ``samplers.DECODE_GRAPHS``: "on" = of
        static shape over a cache kept across calls, captured as CUDA graphs on a GPU (run
        eagerly on CPU; ``samplers.graphs``), "off" = the growing-slice static cache, "auto" =
        on on a GPU, off on CPU. The samples are those of "off" up to float rounding.
    linear_kernel: HF sampler's linear layers, one of ``samplers.LINEAR_KERNELS``: "onednn",
        "default" (torch's), or "auto" = the run's kernel (``run.fast_kernels``) when the
        model's hidden size is at least ``kernels.ONEDNN_MIN_HIDDEN`` (128), else torch's:
        at hidden 64 oneDNN decodes at 0.65-0.75x its speed (``benchmarks.samplers``). The
        samples differ between kernels only by float32 rounding.
    max_concurrent: HF sampler: the most sequences decoded at once (>= 0; 0 = all of a
        call), the limit a serving engine's KV-cache memory sets on a GPU; more rows wait for
        later waves. It makes generation's share of the clock (the measured mu) a setting on
        a CPU, where decoding a small model at full width costs about what training does.
    compile_step: HF sampler on a CPU: its fused decode step through ``torch.compile``
        (``decode_step.compiled_step``; needs a C++ compiler). Fewer seconds per step
        (cpu_long: 1.4-1.5x the tokens/s at 64 rows, 2.3x at 8) after a compile of tens of
        seconds per process (once more at a new prompt width or completion length), so for
        runs that decode for minutes; the samples equal the eager step's up to float32
        rounding. Off by default: the registered grids ran eagerly, and a faster sampler
        lowers the measured mu.
    """

    SECTION: ClassVar[str] = "sampler"
    backend: str = _choice("hf", BACKENDS)
    temperature: float = _positive(1.0)
    top_p: float = _real(1.0, 0.0, 1.0, lo_open=True)
    max_new_tokens: int = _int(6, 1)
    vllm_kv_cache_gb: int = _int(1, 1)
    vllm_gpu_memory: float = _real(0.4, 0.0, 1.0, lo_open=True)
    vllm_eager: bool = _flag(True)
    compact_below: float = _real(0.0, 0.0, 1.0)
    cdf_dtype: str = _choice("auto", CDF_DTYPES)
    decode_graphs: str = _switch("auto", DECODE_GRAPHS)
    linear_kernel: str = _choice("auto", LINEAR_KERNELS)
    max_concurrent: int = _int(0, 0)
    compile_step: bool = _flag(False)

    def check(self) -> None:
        """The wave limit is the HF sampler's (vLLM has its own, ``max_num_seqs``)."""
        if self.max_concurrent and self.backend != "hf":
            raise ValueError(f"sampler.max_concurrent > 0 needs sampler.backend=hf, got "
                             f"sampler.backend={self.backend}")


@dataclass
class ScheduleConfig(_Section):
    """Who produces how much, with which weights (theory.md sections 1, 3 and 4).

    mode: "on_policy" (R = B fresh rollouts per step, each used once), "sync" (the theory's
        synchronous model: R = B / replay_ratio new rollouts per step with the current
        weights, B drawn from the buffer) or "async" (the paper's W workers / T trainers,
        emulated deterministically: B W / (T mu_accounting) new rollouts per step, made with
        weights published every ``refresh_every`` steps and ``latency_steps`` old).
    batch_size: B, rollouts per trainer step (>= 1; divisible by ``trainers``; a multiple
        of ``group_size`` where each rollout is used once: on_policy, or buffer.lifo).
    group_size: G, rollouts per prompt (>= 2; advantages are normalised within a group).
    replay_ratio: y = B / R for "sync" (> 0; non-integer values are exact on average).
    workers, trainers: W, T >= 1 ("async"; T is also the number of buffer shards there).
    refresh_every: k >= 1, steps between weight refreshes of the workers ("async").
    latency_steps: steps a worker needs to produce its batch (>= 0; -1 = round(mu T)).
    mu_accounting: mu used to account compute (and to set the async producer rate), > 0;
        -1 = the measured mu (then compute units depend on timing).
    engine: "emulated" (one process, deterministic, as described above) or "ray" (real
        concurrency on a Ray cluster, ``engines.ray_engine``: W sampler actors, one buffer
        actor, T trainer actors; mode "async", or "sync" with ``ray_loop`` "actors"; in
        async the production rate and the staleness come from the clock; ``latency_steps``
        must stay -1 and ``mu_accounting`` only accounts compute; -1 there = the measured
        mu).
    injected_gen_delay: an artificial stall, for measuring wall-clock effects only (claim 8,
        ``benchmarks/claim8_wallclock.py``): each Ray sampler actor sleeps this median number
        of seconds per generation call (one chunk), counted as generation time and reported
        as ``injected_gen_delay_seconds``; in [0, 600], 0 = off (the default). Ray engine
        only: the emulated engine has no clock to stall.
    injected_gen_sigma: spread of that delay: each call sleeps ``injected_gen_delay *
        exp(sigma * z)``, z standard normal from the actor's own seeded stream (a lognormal
        straggler distribution); in [0, 5], 0 = a fixed delay. Needs injected_gen_delay > 0.
    engine "overlap" (``engines.overlap``): sampler and trainer side by side, each on its own
        core (``overlap_sampler``; keep ``run.threads`` = 1 on a small machine, so that the
        sides do not share a thread pool). The sampler makes the quotas of mode
        "on_policy" or "sync" (chunk s = the groups due before trainer step s) with the newest
        weights the trainer published (every ``refresh_every`` steps, without waiting for the
        sampler); the trainer's step t waits until chunks 0..t are in the buffer. So the
        replay ratio is that of the serial schedule, and the staleness (consumption lag,
        trainer step minus the version that made a rollout) counts the time a chunk waits in
        the handoff queue. One sampler and one trainer (workers = trainers = 1), no probes.
        Not bitwise: which weights make a chunk depends on the clock.
    overlap_ahead: chunks the sampler may hold finished in the handoff queue, waiting for
        the trainer (engine "overlap", or "ray" in mode "sync"), in [1, 64]; the sampler
        then also has one chunk in the making, so it runs at most overlap_ahead + 1 steps
        ahead of the trainer. 1 (the default) keeps the staleness lowest; more absorbs
        jitter between the sides.
    overlap_sampler: where the overlapped sampler runs (engine "overlap" only): "thread" (a
        thread of the run's process; the Python between torch operators of both sides shares
        the GIL) or "process" (a child process, spawned, that loads the policy as the run
        does; weights through shared memory; a few seconds of start-up, no GIL sharing).
    ray_loop: who runs the Ray engine's step loop (engine "ray" only). "driver" (the default,
        ``engines.ray_engine``): the driver starts every trainer step and passes every chunk
        on. "actors" (``engines.ray_pull``): the samplers loop on their own, taking orders
        from the buffer actor and pushing their chunks to it; the trainers run the steps up
        to the next checkpoint, pulling their batches from it and publishing their weights
        to it; the driver only reads each step's reports, evaluates and checkpoints. Needs
        probe.every = 0 and buffer.lifo = false. It also runs mode "sync" (one trainer):
        the serial schedule's quotas, ordered at most ``overlap_ahead`` steps ahead.
    """

    SECTION: ClassVar[str] = "schedule"
    mode: str = _choice("sync", MODES)
    batch_size: int = _int(64, 1)
    group_size: int = _int(8, 2)
    replay_ratio: float = _positive(2.0)
    workers: int = _int(1, 1)
    trainers: int = _int(1, 1)
    refresh_every: int = _int(1, 1)
    latency_steps: int = _int(-1, -1)
    mu_accounting: float = _real(-1.0, 0.0, lo_open=True, or_value=-1.0)
    engine: str = _choice("emulated", ENGINES)
    injected_gen_delay: float = _real(0.0, 0.0, 600.0)
    injected_gen_sigma: float = _real(0.0, 0.0, 5.0)
    overlap_ahead: int = _int(1, 1, 64)
    overlap_sampler: str = _choice("thread", OVERLAP_SAMPLERS)
    ray_loop: str = _choice("driver", RAY_LOOPS)

    def check(self) -> None:
        """mu is given for emulated async; the Ray engine runs async only, at the real
        latency; trainers split the batch evenly; an injected stall needs the Ray engine."""
        if self.engine == "ray" and self.mode != "async" and not (
                self.mode == "sync" and self.ray_loop == "actors" and self.trainers == 1):
            raise ValueError(f"schedule.engine=ray needs schedule.mode=async, or sync with "
                             f"schedule.ray_loop=actors and schedule.trainers=1; got "
                             f"schedule.mode={self.mode}, schedule.ray_loop={self.ray_loop}, "
                             f"schedule.trainers={self.trainers}")
        if self.engine == "ray" and self.latency_steps != -1:
            raise ValueError(f"schedule.latency_steps must be -1 with schedule.engine=ray: "
                             f"the latency is the real one, got {self.latency_steps}")
        if self.mode == "async" and self.engine == "emulated" and self.mu_accounting == -1.0:
            raise ValueError("schedule.mode=async needs schedule.mu_accounting (> 0): it sets "
                             "the producer rate B W / (T mu), which must not depend on timing")
        if self.batch_size % self.trainers:
            raise ValueError(f"schedule.batch_size ({self.batch_size}) must be divisible by "
                             f"schedule.trainers ({self.trainers})")
        if self.injected_gen_delay > 0 and self.engine != "ray":
            raise ValueError(f"schedule.injected_gen_delay ({self.injected_gen_delay:g} s) needs "
                             f"schedule.engine=ray: the emulated engine's clock is fixed by "
                             f"schedule.mu_accounting, so a stall there would change nothing "
                             f"but the run time; got schedule.engine={self.engine}")
        if self.injected_gen_sigma > 0 and self.injected_gen_delay == 0:
            raise ValueError(f"schedule.injected_gen_sigma ({self.injected_gen_sigma:g}) needs "
                             f"schedule.injected_gen_delay > 0 (the median it spreads)")
        if self.ray_loop != "driver" and self.engine != "ray":
            raise ValueError(f"schedule.ray_loop={self.ray_loop} needs schedule.engine=ray, "
                             f"got schedule.engine={self.engine}")
        if self.engine == "overlap":
            self._check_overlap()
        elif self.overlap_sampler != "thread" or (self.overlap_ahead != 1 and not (
                self.engine == "ray" and self.mode == "sync")):
            raise ValueError(f"schedule.overlap_ahead ({self.overlap_ahead}) and "
                             f"schedule.overlap_sampler ({self.overlap_sampler}) need "
                             f"schedule.engine=overlap (overlap_ahead: or the Ray engine in "
                             f"mode sync), got schedule.engine={self.engine}")

    def _check_overlap(self) -> None:
        """engine "overlap": the serial quotas (on_policy, sync) with one sampler thread and
        one trainer; the latency comes from the clock."""
        if self.mode not in ("on_policy", "sync"):
            raise ValueError(f"schedule.engine=overlap needs schedule.mode in [on_policy, sync] "
                             f"(the serial quotas, overlapped), got schedule.mode={self.mode}")
        if self.workers != 1 or self.trainers != 1:
            raise ValueError(f"schedule.engine=overlap runs one sampler and one trainer: "
                             f"schedule.workers and schedule.trainers must be 1, got "
                             f"{self.workers} and {self.trainers}")
        if self.latency_steps != -1:
            raise ValueError(f"schedule.latency_steps must be -1 with schedule.engine=overlap: "
                             f"the latency is the real one, got {self.latency_steps}")


@dataclass
class BufferConfig(_Section):
    """The replay buffer (theory.md section 1; semantics in ``replaytheory.buffer``).

    capacity: N rollouts (>= 1; in "async" a multiple of the trainers, one shard each). A
    shard less its positive part must hold batch_size / trainers rollouts when sampling
    without replacement or with lifo, else >= 1 (``check_resolved``).
    sampling: rollout by rollout, "with_replacement", "without_replacement",
    "never_used_first"; or whole groups of schedule.group_size G (theory.md section 11.9),
    "groups_with_replacement", "groups_without_replacement": each trainer draws
    batch_size / (trainers G) groups, so batch_size and capacity must be multiples of
    trainers x G (``replaytheory.buffer.SAMPLING_MODES``).
    delta: positive-bias coefficient in [0, 1). lifo: the no-buffer queue (each rollout used
    once, freshest first) instead of a replay buffer; it needs whole groups per batch and at
    most B rollouts made per step (the surplus would be evicted unused); on the Ray engine a
    capacity >= B + n - gcd(n, B), n the rollouts of one sampler call, or the samplers can
    deadlock (``engines.ray_plan.lifo_min_capacity``).
    horizon: staleness horizon x = N/R in steps (theory.md section 4), >= 1 or 0. When > 0 it sets
    capacity = round(x R) (at least 1, rounded up to a multiple of the trainers, times G with
    a group sampling mode), with R the
    rollouts per step of the schedule (sync: B/y; async: B W / (T mu_accounting)); 0 = use
    capacity as given.
    horizon_growth: g, a horizon that grows during the run (theory.md section 11.13), in
    [0, 1] steps of window per trainer step; 0 = off (the default: the fixed FIFO). When
    0 < g <= 1, a batch at trainer step t is drawn only from rollouts inserted in the last
    floor(x(t)) steps, x(t) = min(x_max, max(1, g (t + 1))), x_max = ``max_horizon`` (the
    capacity above still bounds what is held); older rollouts are evicted. The window is a
    function of t alone, so checkpoints need nothing new. g > 0 needs the plain FIFO drawing
    with replacement (``replaytheory.buffer.check_growth``) and ``schedule.mode=sync`` with
    at least one group made per step (``check_resolved``).
    drop_logr2: the adaptive horizon (theory.md section 12.4), in nats^2, >= 0; 0 = off.
    After each update, every rollout of its batch whose mean (log r)^2 over its tokens at
    the update's weights exceeded it is evicted, whatever its age (``capacity`` still bounds
    what is held). Needs ``schedule.mode=sync`` on the emulated engine, a loss with an
    importance ratio, and drawing with replacement (``check_resolved``).
    drop_tokens_below_p: which tokens the adaptive horizon's statistic averages over
    (theory.md section 12.7), a probability in (0, 1]: the completion tokens whose sampling
    probability exp(old log-prob) was below it; 1 = every token (section 12.4's statistic). A
    rollout with no such token scores 0 and is never dropped. Read only with drop_logr2 > 0.
    """

    SECTION: ClassVar[str] = "buffer"
    capacity: int = _int(512, 1)
    sampling: str = _choice("with_replacement", SAMPLING_MODES)
    delta: float = _real(0.0, 0.0, 1.0, hi_open=True)
    lifo: bool = _flag(False)
    horizon: float = _real(0.0, 1.0, or_value=0.0)  # x < 1: less than one step's rollouts
    horizon_growth: float = _real(0.0, 0.0, 1.0)
    drop_logr2: float = _real(0.0, 0.0)
    drop_tokens_below_p: float = _real(1.0, 0.0, 1.0, lo_open=True)

    def check(self) -> None:
        """The LIFO queue replays nothing, so it has no positive part; a growing horizon
        needs the plain FIFO drawing with replacement."""
        if self.lifo and self.delta > 0:
            raise ValueError("buffer.delta must be 0 with buffer.lifo=true (no replay)")
        check_growth("buffer.horizon_growth", self.horizon_growth, sampling=self.sampling,
                     delta=self.delta, lifo=self.lifo)

    def max_horizon(self, rate: float) -> float:
        """x_max in trainer steps, the growing horizon's largest window: ``horizon`` when
        set, else capacity / R at ``rate`` R (> 0) rollouts per step."""
        return self.horizon if self.horizon > 0 else self.capacity / rate


@dataclass
class TrainerConfig(_Section):
    """Loss and optimizer (theory.md section 6).

    loss: "grpo" (clipped ratio), "grpo_unclipped" (plain importance weight),
        "grpo_truncated" (TIS: importance weight truncated at ``is_cap``, no gradient
        through it), "cispo" (weight truncated at ``cispo_cap``, token-level), "m2po"
        (unclipped, second-moment mask at ``m2_threshold``), "neg_clip" / "neg_cap" /
        "neg_veto" (positive-advantage tokens unclipped, negative ones under the PPO clip,
        the weight min(r, 1), or a veto outside the clip range), "asymre" (asymmetric
        REINFORCE, baseline shift ``dv``, no importance ratio); ``rl.objectives`` states
        each rule and its source (theory.md section 12).
    clip_low, clip_high: PPO clip range [1 - clip_low, 1 + clip_high], each in [0, 1].
    is_cap: truncation of importance weights (> 0). dv: AsymRE baseline shift (any real).
    cispo_cap: CISPO's eps_max (> 0; 5.0 as TRL recommends).
    m2_threshold: M2PO's bound on the batch mean of (log r)^2 (> 0, nats^2; 0.04 as in
        the source).
    optimizer: "adamw" or "adam" (``OPTIMIZERS``). lr (> 0), beta1, beta2 in [0, 1),
    weight_decay >= 0.
    grad_clip: global gradient-norm clip (0 = off). per_sample_clip: clip each rollout's
        gradient norm before averaging (0 = off; uses per-sample gradients, slower).
    micro_batch: rollouts per forward/backward pass; 0 = the largest whose predicted peak
        (``memory.predict_update_memory``) fits ``memory_gb``, the whole batch when it
        fits; the gradient is the same, only memory changes.
    memory_gb: the update's memory budget in GiB (> 0), or 0 = on a CUDA device what the
        driver reports free (other processes' and the sampler's tensors out) plus the
        trainer's own state, less 15% of the device as headroom; 16 GiB on CPU
        (``memory.budget_bytes``).
    logit_chunk: completion tokens whose vocabulary logits are computed at once (>= 1;
        recomputed in the backward pass, ``losses.chunked_logprobs``), or 0 = as many as
        fit 1 GiB (``memory.logit_chunk``); a chunk covering the micro-batch computes them
        in one piece (the earlier computation, bitwise).
    master_weights: with a bfloat16/float16 ``model.dtype``, keep the trainer's parameters
        and Adam state in float32 and run the forward under autocast to ``model.dtype``
        (the sampler holds a ``model.dtype`` copy); false: parameters in ``model.dtype``,
        where small updates round away. No effect with float32.
    """

    SECTION: ClassVar[str] = "trainer"
    loss: str = _choice("grpo", LOSSES)
    clip_low: float = _real(0.2, 0.0, 1.0)
    clip_high: float = _real(0.2, 0.0, 1.0)
    is_cap: float = _positive(1.0)
    cispo_cap: float = _positive(5.0)
    m2_threshold: float = _positive(0.04)
    dv: float = _real(-0.1)
    optimizer: str = _choice("adamw", OPTIMIZERS)
    lr: float = _positive(1e-4)
    beta1: float = _real(0.9, 0.0, 1.0, hi_open=True)
    beta2: float = _real(0.999, 0.0, 1.0, hi_open=True)
    weight_decay: float = _real(0.0, 0.0)
    grad_clip: float = _real(1.0, 0.0)
    per_sample_clip: float = _real(0.0, 0.0)
    micro_batch: int = _int(0, 0)
    memory_gb: float = _real(0.0, 0.0)
    logit_chunk: int = _int(0, 0)
    master_weights: bool = _flag(True)


@dataclass
class EvalConfig(_Section):
    """Held-out evaluation.

    every: steps between evaluations (>= 1; also at step 0 and at the end).
    temperature: 0 = greedy, else sampling temperature (e.g. 0.1) for accuracy.
    pass_k: k values of pass@k (each >= 1), estimated from max(pass_k) samples per problem
    at ``pass_k_temperature`` / ``pass_k_top_p`` on the first ``pass_k_problems`` problems
    (0 = no pass@k).
    """

    SECTION: ClassVar[str] = "eval"
    every: int = _int(25, 1)
    temperature: float = _real(0.0, 0.0)
    pass_k: list = _int_list([1, 2, 4, 8, 16], 1)
    pass_k_problems: int = _int(64, 0)
    pass_k_temperature: float = _positive(1.0)
    pass_k_top_p: float = _real(0.95, 0.0, 1.0, lo_open=True)


@dataclass
class ProbeConfig(_Section):
    """Gradient-noise probes (theory.md sections 4 and 8); ``every`` = 0 turns them off.

    every: steps between probes. fresh_groups: on-policy groups of the reference gradient
    (>= 4, even; split in two disjoint halves). fresh_noise_groups: fresh groups whose
    per-sample noise is recorded (staleness 0). buffer_groups: buffer groups probed per
    probe, spread over insertion steps. crn_groups: groups regenerated from old weights with
    common random numbers, per staleness in ``crn_staleness`` (steps). chunk: per-sample
    gradients computed at once (memory ~ chunk x parameters). max_snapshots: weight
    snapshots kept for drift and regeneration. The stale bias of buffer rows (method 0 of
    ``probes``) needs >= 2 probed groups per staleness: set buffer_groups to the buffer's
    group count (N / G) for all of them.
    reuse_gaps: the ``reuse`` table (theory.md section 8.9): for each k, the probed buffer
    rollouts' noise at the weights of step t - k * every against that probe's reference
    gradient (k in probe intervals, >= 1; empty = off). contribution: the ``contribution``
    table (clip fraction, kept share of the gradient, importance weight per probed buffer
    rollout; needs a loss with an importance ratio).
    panel_groups: groups of each long-range panel (0 = off; theory.md section 11.1): made at
    each step of panel_births, never trained on, measured again at birth + g for g in
    panel_gaps (steps); needs a loss with an importance ratio.
    align_groups: groups of each align panel (0 = off; theory.md section 11.15,
    ``probing.align``): made at panel_births and measured at birth and at panel_gaps like the
    panels, through the mean gradients of align_chunks chunks of whole groups against a
    reference of align_ref_groups fresh groups in as many chunks (align_groups and
    align_ref_groups multiples of align_chunks >= 2); needs a loss with an importance ratio.
    align_variants: losses besides the training loss whose panel gradients the align probe
    also measures, on the same chunks (``replaytheory.fit.probes.ALIGN_VARIANTS``: "unclipped"
    keeps the importance ratio without the clip, "ratio_one" drops both); non-empty also
    writes each panel chunk's clip fraction and importance ratios (``align_stats``).
    align_moments: also write the inner products of the panel's chunk gradients with each
    other and the reference chunks' squared norms (``align_pairs``), from which
    ``replaytheory.fit.align_fit.fit_align_moments`` estimates the stale bias and noise by
    gap (theory.md section 11.16); holds every panel chunk's gradient per loss at once
    (with probe.sketch_dim, its sketch).
    sketch_dim: 0 = exact gradients (the default); k >= 1 = the probes keep count sketches of
    k dimensions of every gradient instead (unbiased inner products and squared norms, relative
    standard deviation <= sqrt(2 / k); theory.md section 8.1.1).
    """

    SECTION: ClassVar[str] = "probe"
    every: int = _int(0, 0)
    fresh_groups: int = _int(32, 4)
    fresh_noise_groups: int = _int(4, 0)
    buffer_groups: int = _int(8, 0)
    crn_groups: int = _int(8, 0)
    crn_staleness: list = _int_list([1, 4, 16], 1)
    chunk: int = _int(16, 1)
    max_snapshots: int = _int(64, 1)
    reuse_gaps: list = _int_list([], 1)
    contribution: bool = _flag(False)
    panel_groups: int = _int(0, 0)
    panel_births: list = _int_list([0], 0)
    panel_gaps: list = _int_list([1, 2, 4, 8, 16, 32, 64, 128, 256], 1)
    align_groups: int = _int(0, 0)
    align_ref_groups: int = _int(1024, 2)
    align_chunks: int = _int(32, 2)
    align_variants: list = _choice_list([], ALIGN_VARIANTS)
    align_moments: bool = _flag(False)
    sketch_dim: int = _int(0, 0, 2**31 - 2)  # count-sketch hash modulus 2^31 - 1 (sketch.py)

    def check(self) -> None:
        """The reference gradient splits the fresh groups in two halves; the noise and
        common-random-number probes draw from one half."""
        if self.fresh_groups % 2:
            raise ValueError(f"probe.fresh_groups must be even (two disjoint halves), got "
                             f"{self.fresh_groups}")
        half = self.fresh_groups // 2
        checks.integer("probe.fresh_noise_groups", self.fresh_noise_groups, 0, half)
        checks.integer("probe.crn_groups", self.crn_groups, 0, half)
        if (self.align_variants or self.align_moments) and not self.align_groups:
            raise ValueError("probe.align_variants and probe.align_moments measure align "
                             "panels: set probe.align_groups > 0 with them, got "
                             f"align_groups=0, align_variants={self.align_variants}, "
                             f"align_moments={self.align_moments}")
        for name in ("align_groups", "align_ref_groups"):
            groups = getattr(self, name)
            if self.align_groups and groups % self.align_chunks:
                raise ValueError(f"probe.{name} must be a multiple of probe.align_chunks "
                                 f"({self.align_chunks}): chunks of whole groups, got {groups}")


@dataclass
class Config:
    """A whole run configuration, one dataclass per section."""
    run: RunConfig = field(default_factory=RunConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)

    def to_dict(self) -> dict:
        """Nested plain dicts (YAML/JSON serialisable)."""
        return dataclasses.asdict(self)

    def section_hash(self, *sections: str) -> str:
        """A short stable hash of the named sections (cache keys)."""
        d = self.to_dict()
        text = json.dumps({s: d[s] for s in sections}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def from_dict(data: dict | None, base: Config | None = None) -> Config:
    """Build a checked ``Config`` from nested dicts on top of ``base`` (defaults if None):
    each section checks its own fields, then ``buffer.capacity`` is resolved from
    ``buffer.horizon`` and ``check_resolved`` checks the whole."""
    d = (base or Config()).to_dict()
    for section, values in (data or {}).items():
        if section not in SECTIONS:
            raise ValueError(f"unknown config section {section!r}; allowed: {sorted(SECTIONS)}")
        if not isinstance(values, dict):
            raise ValueError(f"config section {section!r} must be a mapping, got {values!r}")
        keys = [f.name for f in dataclasses.fields(SECTIONS[section])]
        for key, value in values.items():
            if key not in keys:
                raise ValueError(f"unknown config key {section}.{key}; allowed keys in "
                                 f"{section}: {sorted(keys)}")
            d[section][key] = value
    cfg = Config(**{s: SECTIONS[s](**d[s]) for s in SECTIONS})
    _resolve_capacity(cfg)
    check_resolved(cfg)
    return cfg


def _resolve_capacity(cfg: Config) -> None:
    """Set buffer.capacity from buffer.horizon (see ``BufferConfig``)."""
    b, sc = cfg.buffer, cfg.schedule
    if b.horizon <= 0 or sc.mode == "on_policy":
        return
    if sc.mode == "async" and sc.mu_accounting == -1.0:
        raise ValueError("buffer.horizon > 0 needs schedule.mu_accounting (> 0) with "
                         "schedule.engine=ray: the rollouts per step R = B W / (T mu) are "
                         "set from it; or give buffer.capacity and buffer.horizon=0")
    n = max(1, round(b.horizon * rollouts_per_step(sc, sc.mu_accounting)))
    unit = buffer_shards(sc) * _draw_unit(cfg)  # whole shards of whole groups
    b.capacity = -(-n // unit) * unit


def _draw_unit(cfg: Config) -> int:
    """Rollouts a buffer draws at a time: schedule.group_size with a group sampling mode
    (``replaytheory.buffer.GROUP_MODES``; not the LIFO queue), else 1."""
    b = cfg.buffer
    return cfg.schedule.group_size if b.sampling in GROUP_MODES and not b.lifo else 1


def check_resolved(cfg: Config) -> None:
    """Checks across sections, after ``buffer.capacity`` is resolved; ValueError names the keys
    (buffer semantics: theory.md section 1; compute accounting: section 3).

    Every step must fill its batch with a bounded number of extra groups
    (``schedule.Production.fill``): each buffer shard must always keep B / T rollouts when
    drawing without replacement or from the LIFO queue (1 with replacement), counting only
    its recent part, as its positive part may stay empty. Where each rollout is used once
    (on-policy, LIFO), no rollout may be made only to be evicted unused but charged: whole
    groups per batch and at most B made per step. Ratio-based losses need the sampler's
    behaviour log-probs to be those the trainer computes (full softmax at the temperature).
    """
    sc, b, B, G = cfg.schedule, cfg.buffer, cfg.schedule.batch_size, cfg.schedule.group_size
    once = "schedule.mode=on_policy" if sc.mode == "on_policy" else \
        "buffer.lifo=true" if b.lifo else None
    if once and B % G:
        raise ValueError(f"schedule.batch_size ({B}) must be a multiple of schedule.group_size "
                         f"({G}) with {once}: each rollout is used once and advantages need "
                         f"whole groups, so {G - B % G} rollouts a step would be made and "
                         f"thrown away; e.g. {B - B % G or G} or {B - B % G + G}")
    if sc.mode != "on_policy":
        rate = rollouts_per_step(sc, sc.mu_accounting)
        # The Ray engine's samplers wait while the LIFO queue is full: nothing is wasted.
        if b.lifo and sc.engine != "ray" and rate > B + 1e-9:
            raise ValueError(f"buffer.lifo=true uses each rollout once, so the rollouts made "
                             f"per step (B / schedule.replay_ratio in sync, B W / (T mu) in "
                             f"async; here {rate:g}) must be <= schedule.batch_size ({B}): "
                             f"the surplus would be evicted unused but charged as compute")
        shards, unit = buffer_shards(sc), _draw_unit(cfg)
        if b.capacity % shards:
            raise ValueError(f"buffer.capacity ({b.capacity}) must be divisible by "
                             f"schedule.trainers ({shards}): one shard per trainer")
        if unit > 1:
            _check_group_draws(cfg, shards)
        per = b.capacity // shards
        kept = per - positive_part(per, b.delta, unit)  # the recent part
        by_batch = b.lifo or b.sampling not in REPLACING
        need = B // shards if by_batch else unit
        if kept < need:
            origin = f", from buffer.horizon={b.horizon:g}" if b.horizon > 0 else ""
            recent = f" less its positive part round(buffer.delta x {per}), {kept}," \
                if b.delta else ""
            how = "buffer.lifo=true" if b.lifo else f"buffer.sampling={b.sampling}"
            least = f"{need}, the batch per trainer with {how}" if by_batch else \
                f"{need}, one group with {how}" if unit > 1 else "1"
            raise ValueError(f"buffer.capacity per shard ({per}{origin}){recent} must be >= "
                             f"{least}, or the buffer can never give a batch")
        if b.lifo and sc.engine == "ray":
            _check_ray_lifo(cfg)
    if b.horizon_growth > 0:
        _check_growing_horizon(cfg)
    if b.drop_logr2 > 0:
        _check_adaptive_horizon(cfg)
    if cfg.task.name == "long_addition":
        _check_long_addition(cfg)
    s, loss = cfg.sampler, cfg.trainer.loss
    if s.top_p < 1 and loss in RATIO_LOSSES:
        raise ValueError(f"sampler.top_p ({s.top_p:g}) must be 1 with trainer.loss={loss}: "
                         f"the trainer scores the full softmax, so a fresh sample's importance "
                         f"ratio would be below 1; allowed: sampler.top_p=1, or "
                         f"trainer.loss=asymre (no ratio) with any top_p in (0, 1]")
    if sc.ray_loop == "actors" and (cfg.probe.every or b.lifo):
        raise ValueError(f"schedule.ray_loop=actors needs probe.every=0 and buffer.lifo=false "
                         f"(the driver pauses the samplers for those), got probe.every="
                         f"{cfg.probe.every}, buffer.lifo={str(b.lifo).lower()}")
    if sc.engine == "overlap" and (cfg.probe.every or cfg.probe.contribution):
        raise ValueError(f"probe.every ({cfg.probe.every}) must be 0 and probe.contribution "
                         f"false with schedule.engine=overlap: the probes read the sampler's "
                         f"weights mid-step, which the sampler thread owns there")
    for name in ("panel_groups", "align_groups"):
        if getattr(cfg.probe, name) and cfg.schedule.engine != "emulated":
            raise ValueError(f"probe.{name} > 0 (long-range panels) runs on "
                             f"schedule.engine=emulated only, got {cfg.schedule.engine}")
        if getattr(cfg.probe, name) and loss not in RATIO_LOSSES:
            raise ValueError(f"probe.{name} > 0 needs a trainer.loss with an importance "
                             f"ratio, one of {list(RATIO_LOSSES)}; got "
                             f"trainer.loss={loss}")
    if cfg.probe.contribution and loss not in RATIO_LOSSES:
        raise ValueError(f"probe.contribution=true needs a trainer.loss with an importance "
                         f"ratio, one of {list(RATIO_LOSSES)}; got "
                         f"trainer.loss={loss}")


def _check_long_addition(cfg: Config) -> None:
    """A worked solution of ``task.name=long_addition`` must fit the sampler's completion
    length and (tiny model) the supervised warm start's sequence length, which would otherwise
    cut every solution before its final answer and never reward anything."""
    d = cfg.task.digits
    need = solution_chars(d) + 1  # the end-of-sequence token
    if cfg.sampler.max_new_tokens < need:
        raise ValueError(f"sampler.max_new_tokens must be an integer >= {need} for "
                         f"task.name=long_addition at task.digits={d} (its worked solution "
                         f"and end-of-sequence), got {cfg.sampler.max_new_tokens}")
    total = prompt_chars(d) + need
    if cfg.model.name == "tiny" and cfg.model.max_len < total:
        raise ValueError(f"model.max_len must be an integer >= {total} for "
                         f"task.name=long_addition at task.digits={d} (prompt, solution and "
                         f"end-of-sequence), got {cfg.model.max_len}")


def _check_group_draws(cfg: Config, shards: int) -> None:
    """A group sampling mode draws batch_size / (T G) whole groups from each of the T
    shards, each holding whole groups (theory.md section 11.9)."""
    sc, b = cfg.schedule, cfg.buffer
    whole = sc.group_size * shards
    trainers = f" x schedule.trainers ({shards})" if shards > 1 else ""
    for key, value, why in (("schedule.batch_size", sc.batch_size, "each trainer draws "
                             "batch_size / (trainers x group_size) whole groups"),
                            ("buffer.capacity", b.capacity, "each shard holds whole groups")):
        if value % whole:
            raise ValueError(f"{key} ({value}) must be a multiple of schedule.group_size "
                             f"({sc.group_size}){trainers} = {whole} with "
                             f"buffer.sampling={b.sampling}: {why}; e.g. "
                             f"{max(whole, value - value % whole)} or "
                             f"{value - value % whole + whole}")


def _check_adaptive_horizon(cfg: Config) -> None:
    """buffer.drop_logr2 > 0 evicts after the update, in the emulated synchronous loop, with a
    ratio to measure and draws that never need more than what is left."""
    sc, b = cfg.schedule, cfg.buffer
    d = f"buffer.drop_logr2 ({b.drop_logr2:g})"
    if sc.mode != "sync" or sc.engine != "emulated":
        raise ValueError(f"{d} needs schedule.mode=sync on schedule.engine=emulated; got "
                         f"schedule.mode={sc.mode}, schedule.engine={sc.engine}")
    if cfg.trainer.loss not in RATIO_LOSSES:
        raise ValueError(f"{d} needs a trainer.loss with an importance ratio, one of "
                         f"{list(RATIO_LOSSES)}; got trainer.loss={cfg.trainer.loss}")
    if b.sampling != "with_replacement" or b.lifo:
        raise ValueError(f"{d} needs buffer.sampling=with_replacement and buffer.lifo=false "
                         f"(an eviction must never leave too few rollouts for a batch)")


def _check_growing_horizon(cfg: Config) -> None:
    """buffer.horizon_growth > 0 (theory.md section 11.13) is built for the synchronous
    emulated schedule, where every step makes at least one group (so the window of its last
    step is never empty) and the window grows to x_max >= 1 steps."""
    sc, b = cfg.schedule, cfg.buffer
    g = f"buffer.horizon_growth ({b.horizon_growth:g})"
    if sc.mode != "sync":
        raise ValueError(f"{g} needs schedule.mode=sync (the synchronous emulated engine); "
                         f"got schedule.mode={sc.mode}")
    rate = rollouts_per_step(sc)
    if rate < sc.group_size - 1e-9:
        raise ValueError(f"{g} needs at least one group made per step, schedule.batch_size / "
                         f"schedule.replay_ratio ({rate:g}) >= schedule.group_size "
                         f"({sc.group_size}): a window of one step would hold no rollout")
    if b.max_horizon(rate) < 1:
        raise ValueError(f"{g} needs a buffer of at least one step: buffer.horizon >= 1 (or "
                         f"buffer.capacity >= {rate:g} with buffer.horizon=0); got "
                         f"x_max={b.max_horizon(rate):g} steps")


def _check_ray_lifo(cfg: Config) -> None:
    """The Ray engine's LIFO queue must be large enough that its samplers, which wait while
    the queue could not take their chunk, can never all wait with less than a batch held
    (``engines.ray_plan.lifo_min_capacity``, a deadlock)."""
    sc, b = cfg.schedule, cfg.buffer
    n = chunk_groups(sc.batch_size, sc.workers, sc.group_size) * sc.group_size
    least = lifo_min_capacity(sc.batch_size, n)
    if b.capacity < least:
        fit = -(-least // sc.trainers) * sc.trainers
        raise ValueError(
            f"buffer.capacity ({b.capacity}) must be >= {least} with buffer.lifo=true on "
            f"schedule.engine=ray: each sampler call makes {n} rollouts (schedule.batch_size "
            f"{sc.batch_size} / schedule.workers {sc.workers} in whole groups of "
            f"schedule.group_size {sc.group_size}) and a sampler waits while the queue could "
            f"not take them, so with this capacity every sampler can wait while the queue "
            f"holds fewer than schedule.batch_size (a deadlock); least capacity = batch_size "
            f"+ {n} - gcd({n}, batch_size); e.g. buffer.capacity={fit}")


def parse_override(text: str) -> tuple[str, str, object]:
    """Split ``section.key=value`` (value parsed as YAML) into its parts."""
    if "=" not in text:
        raise ValueError(f"--set expects section.key=value, got {text!r}")
    path, raw = text.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--set key must be section.key (e.g. trainer.lr), got {path!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts[0], parts[1], value


def config_path(name: str) -> str:
    """Path of a shipped config name (``cpu_tiny``) or of a YAML file; clear error if absent."""
    if os.path.isfile(name):
        return name
    path = os.path.join(CONFIG_DIR, f"{name}.yaml")
    if not os.path.isfile(path):
        shipped = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
        raise ValueError(f"config {name!r} is neither a YAML file nor a shipped config "
                         f"({', '.join(shipped)})")
    return path


def read_yaml(path: str, flag: str = "") -> dict:
    """The YAML mapping in the file ``path`` (an empty file: {}); ``BadInput`` naming ``flag``
    and ``path`` for a file that is missing, unreadable, not YAML or not a mapping."""
    text = read_text(path, flag)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise BadInput(f"{file_label(path, flag)}: not YAML "
                       f"({getattr(exc, 'problem', None) or type(exc).__name__}{where})") \
            from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"{file_label(path, flag)}: holds {kind_name(type(data))}, not a "
                       f"mapping")
    return data


def load_config(name: str = "cpu_tiny", overrides=()) -> Config:
    """Load a shipped config or YAML file and apply ``section.key=value`` overrides."""
    data = read_yaml(config_path(name), "config")
    for text in overrides:
        section, key, value = parse_override(text)
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ValueError(f"config section {section!r} must be a mapping")
        data[section][key] = value
    return from_dict(data)


def save_config(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML, atomically."""
    from replaytheory.io import atomic_write
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    atomic_write(path, lambda fh: fh.write(text))


def read_config(path: str) -> Config:
    """Read a resolved ``config.yaml`` written by ``save_config``."""
    return from_dict(read_yaml(path, "saved config"))


def differences(a: Config, b: Config) -> list[str]:
    """Keys (section.key) whose values differ between two configs."""
    da, db = a.to_dict(), b.to_dict()
    return [f"{s}.{k}" for s in da for k in da[s] if da[s][k] != db[s][k]]
