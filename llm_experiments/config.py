"""Typed run configuration: dataclasses, YAML files and ``--set section.key=value`` overrides.

A configuration is one ``Config`` with a section per concern (run, task, model, sampler,
schedule, buffer, trainer, eval, probe). Shipped configurations live in ``configs/*.yaml``
(``cpu_tiny`` is the default). Every value is type-checked and range-checked when the config
is built, and an error names the offending key and the allowed range, so that the command line
can print it as one line.

Units: steps are trainer steps (one optimizer update on one global batch); batch sizes and
buffer sizes count rollouts (sequences), group sizes count sequences per prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from dataclasses import dataclass, field

import yaml

from replaytheory import _validate as v

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")


@dataclass
class RunConfig:
    """Run-level settings.

    steps: trainer steps (>= 1). seed: seed of the training randomness (>= 0).
    threads: torch CPU threads (>= 1; 1 is robust on a shared 2-core machine).
    device: "cpu", "cuda" or "cuda:N". log_every: steps between metrics records (>= 1).
    checkpoint_every: steps between checkpoints (>= 1). progress: terminal progress bar.
    tensorboard: also write TensorBoard events (needs the ``tensorboard`` package).
    cache_dir: where warm starts are cached ("" = ``$LLM_EXPERIMENTS_CACHE`` or ``./.cache``).
    fast_kernels: float32 CPU linear layers (training and sampling) through oneDNN, about 2x
        faster than torch's default kernel on AMD CPUs (``kernels.py``), and the fused
        Adam/AdamW step; same math, float32 rounding differs. false: the default kernels.
    direct_forward: drive Llama/Qwen-style models layer by layer (``direct.py``): sampling
        with a static KV cache and each distinct prompt prefilled once, training with each
        distinct prompt of a batch computed once; same math, float32 rounding differs.
        false (with fast_kernels false): bitwise the computation of earlier versions.
    """

    steps: int = 300
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    log_every: int = 1
    checkpoint_every: int = 25
    progress: bool = True
    tensorboard: bool = False
    cache_dir: str = ""
    fast_kernels: bool = True
    direct_forward: bool = True


@dataclass
class TaskConfig:
    """The task with a verifiable reward.

    name: "addition" (built in), "reasoning_gym" or "math".
    digits: addition difficulty, operand digits (1..9). eval_size: held-out problems (>= 1).
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

    name: str = "addition"
    digits: int = 2
    eval_size: int = 200
    eval_seed: int = 1234
    rg_name: str = "chain_sum"
    rg_config: dict = field(default_factory=dict)
    rg_size: int = 10000
    prompt_field: str = "question"
    dataset: str = ""
    eval_dataset: str = ""
    split: str = "train"
    eval_split: str = "test"
    problem_key: str = "problem"
    answer_key: str = "answer"
    prompt_template: str = "{problem}"
    chat_template: bool = False


@dataclass
class ModelConfig:
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
    """

    name: str = "tiny"
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 512
    max_len: int = 32
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    warm_start_steps: int = 550
    warm_start_lr: float = 2e-3
    warm_start_batch: int = 64
    warm_start_warmup: int = 50
    warm_start_seed: int = 0
    warm_start_target: float = 0.0


@dataclass
class SamplerConfig:
    """Rollout generation.

    backend: "hf" (torch, KV cache) or "vllm". temperature: training sampling temperature
    (> 0). top_p: nucleus mass in (0, 1] (1 = full distribution). max_new_tokens (>= 1).
    vllm_kv_cache_gb: KV-cache size of the vLLM CPU backend, GiB (>= 1).
    """

    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 6
    vllm_kv_cache_gb: int = 1


@dataclass
class ScheduleConfig:
    """Who produces how much, with which weights (theory.md sections 1, 3 and 4).

    mode: "on_policy" (R = B fresh rollouts per step, each used once), "sync" (the theory's
        synchronous model: R = B / replay_ratio new rollouts per step with the current
        weights, B drawn from the buffer) or "async" (the paper's W workers / T trainers,
        emulated deterministically: B W / (T mu_accounting) new rollouts per step, made with
        weights published every ``refresh_every`` steps and ``latency_steps`` old).
    batch_size: B, rollouts per trainer step (>= 1; divisible by ``trainers``).
    group_size: G, rollouts per prompt (>= 2; advantages are normalised within a group).
    replay_ratio: y = B / R for "sync" (> 0; non-integer values are exact on average).
    workers, trainers: W, T >= 1 ("async"; T is also the number of buffer shards there).
    refresh_every: k >= 1, steps between weight refreshes of the workers ("async").
    latency_steps: steps a worker needs to produce its batch (>= 0; -1 = round(mu T)).
    mu_accounting: mu used to account compute (and to set the async producer rate), > 0;
        -1 = the measured mu (then compute units depend on timing).
    """

    mode: str = "sync"
    batch_size: int = 64
    group_size: int = 8
    replay_ratio: float = 2.0
    workers: int = 1
    trainers: int = 1
    refresh_every: int = 1
    latency_steps: int = -1
    mu_accounting: float = -1.0


@dataclass
class BufferConfig:
    """The replay buffer (theory.md section 1; semantics in ``replaytheory.buffer``).

    capacity: N rollouts (>= batch_size / trainers per shard unless sampling with
    replacement). sampling: "with_replacement", "without_replacement", "never_used_first".
    delta: positive-bias coefficient in [0, 1). lifo: the no-buffer queue (each rollout used
    once, freshest first) instead of a replay buffer.
    horizon: staleness horizon x = N/R in steps (theory.md section 4), >= 0. When > 0 it sets
    capacity = round(x R) (at least 1, rounded up to a multiple of the trainers), with R the
    rollouts per step of the schedule (sync: B/y; async: B W / (T mu_accounting)); 0 = use
    capacity as given.
    """

    capacity: int = 512
    sampling: str = "with_replacement"
    delta: float = 0.0
    lifo: bool = False
    horizon: float = 0.0


@dataclass
class TrainerConfig:
    """Loss and optimizer (theory.md section 6).

    loss: "grpo" (clipped ratio), "grpo_unclipped" (plain importance weight),
        "grpo_truncated" (importance weight truncated at ``is_cap``, no gradient through it),
        "asymre" (asymmetric REINFORCE, baseline shift ``dv``, no importance ratio).
    clip_low, clip_high: PPO clip range [1 - clip_low, 1 + clip_high], each in [0, 1].
    is_cap: truncation of importance weights (> 0). dv: AsymRE baseline shift (any real).
    optimizer: "adamw" or "adam". lr (> 0), beta1, beta2 in [0, 1), weight_decay >= 0.
    grad_clip: global gradient-norm clip (0 = off). per_sample_clip: clip each rollout's
        gradient norm before averaging (0 = off; uses per-sample gradients, slower).
    micro_batch: rollouts per forward/backward pass (0 = the whole batch at once); the
        gradient is the same, only memory changes.
    """

    loss: str = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    is_cap: float = 1.0
    dv: float = -0.1
    optimizer: str = "adamw"
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    per_sample_clip: float = 0.0
    micro_batch: int = 0


@dataclass
class EvalConfig:
    """Held-out evaluation.

    every: steps between evaluations (>= 1; also at step 0 and at the end).
    temperature: 0 = greedy, else sampling temperature (e.g. 0.1) for accuracy.
    pass_k: k values of pass@k (each >= 1), estimated from max(pass_k) samples per problem
    at ``pass_k_temperature`` / ``pass_k_top_p`` on the first ``pass_k_problems`` problems
    (0 = no pass@k).
    """

    every: int = 25
    temperature: float = 0.0
    pass_k: list = field(default_factory=lambda: [1, 2, 4, 8, 16])
    pass_k_problems: int = 64
    pass_k_temperature: float = 1.0
    pass_k_top_p: float = 0.95


@dataclass
class ProbeConfig:
    """Gradient-noise probes (theory.md sections 4 and 8); ``every`` = 0 turns them off.

    every: steps between probes. fresh_groups: on-policy groups of the reference gradient
    (>= 4, even; split in two disjoint halves). fresh_noise_groups: fresh groups whose
    per-sample noise is recorded (staleness 0). buffer_groups: buffer groups probed per
    probe, spread over insertion steps. crn_groups: groups regenerated from old weights with
    common random numbers, per staleness in ``crn_staleness`` (steps). chunk: per-sample
    gradients computed at once (memory ~ chunk x parameters). max_snapshots: weight
    snapshots kept for drift and regeneration.
    """

    every: int = 0
    fresh_groups: int = 32
    fresh_noise_groups: int = 4
    buffer_groups: int = 8
    crn_groups: int = 8
    crn_staleness: list = field(default_factory=lambda: [1, 4, 16])
    chunk: int = 16
    max_snapshots: int = 64


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


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section_types(name: str) -> dict[str, type]:
    cls = type(getattr(Config(), name))
    return typing.get_type_hints(cls)


def _coerce(key: str, value, kind):
    """Return ``value`` as ``kind`` or raise ValueError naming ``key``."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if kind is int:
        return v.integer(key, value)
    if kind is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        return v.real(key, value)
    if kind is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{key} must be a string, got {value!r}")
    if kind is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        raise ValueError(f"{key} must be a list, got {value!r}")
    if kind is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ValueError(f"{key} must be a mapping, got {value!r}")
    raise TypeError(f"unsupported config type {kind} for {key}")  # pragma: no cover


def from_dict(data: dict | None, base: Config | None = None) -> Config:
    """Build a validated ``Config`` from nested dicts on top of ``base`` (defaults if None)."""
    d = (base or Config()).to_dict()
    for section, values in (data or {}).items():
        if section not in SECTIONS:
            raise ValueError(f"unknown config section {section!r}; allowed: {sorted(SECTIONS)}")
        if not isinstance(values, dict):
            raise ValueError(f"config section {section!r} must be a mapping, got {values!r}")
        types = _section_types(section)
        for key, value in values.items():
            if key not in types:
                raise ValueError(f"unknown config key {section}.{key}; allowed keys in "
                                 f"{section}: {sorted(types)}")
            d[section][key] = _coerce(f"{section}.{key}", value, types[key])
    cfg = Config(**{s: type(getattr(Config(), s))(**d[s]) for s in SECTIONS})
    validate(cfg)
    _resolve_capacity(cfg)
    return cfg


def _resolve_capacity(cfg: Config) -> None:
    """Set buffer.capacity from buffer.horizon (see ``BufferConfig``)."""
    b, sc = cfg.buffer, cfg.schedule
    if b.horizon <= 0 or sc.mode == "on_policy":
        return
    if sc.mode == "sync":
        rollouts = sc.batch_size / sc.replay_ratio
    else:
        rollouts = sc.batch_size * sc.workers / (sc.trainers * sc.mu_accounting)
    n = max(1, round(b.horizon * rollouts))
    b.capacity = -(-n // sc.trainers) * sc.trainers if sc.mode == "async" else n


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


def load_config(name: str = "cpu_tiny", overrides=()) -> Config:
    """Load a shipped config or YAML file and apply ``section.key=value`` overrides."""
    with open(config_path(name)) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {name!r} must hold a mapping of sections")
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
    with open(path) as fh:
        return from_dict(yaml.safe_load(fh))


def differences(a: Config, b: Config) -> list[str]:
    """Keys (section.key) whose values differ between two configs."""
    da, db = a.to_dict(), b.to_dict()
    return [f"{s}.{k}" for s in da for k in da[s] if da[s][k] != db[s][k]]


def validate(cfg: Config) -> None:
    """Range checks across the whole config; raises ValueError naming the key."""
    r, t, m, s, sc, b, tr, e, p = (cfg.run, cfg.task, cfg.model, cfg.sampler, cfg.schedule,
                                   cfg.buffer, cfg.trainer, cfg.eval, cfg.probe)
    v.integer("run.steps", r.steps, 1)
    v.integer("run.seed", r.seed, 0)
    v.integer("run.threads", r.threads, 1)
    if not (r.device == "cpu" or r.device.startswith("cuda")):
        raise ValueError(f"run.device must be 'cpu', 'cuda' or 'cuda:N', got {r.device!r}")
    v.integer("run.log_every", r.log_every, 1)
    v.integer("run.checkpoint_every", r.checkpoint_every, 1)
    v.choice("task.name", t.name, ("addition", "reasoning_gym", "math"))
    v.integer("task.digits", t.digits, 1, 9)
    v.integer("task.eval_size", t.eval_size, 1)
    v.integer("task.rg_size", t.rg_size, 2)
    if t.name == "math" and not t.dataset:
        raise ValueError("task.dataset must name a dataset or a .jsonl file for task.name=math")
    if "{problem}" not in t.prompt_template:
        raise ValueError(f"task.prompt_template must contain {{problem}}, got "
                         f"{t.prompt_template!r}")
    for key in ("layers", "heads", "kv_heads", "hidden_size", "intermediate_size", "max_len"):
        v.integer(f"model.{key}", getattr(m, key), 1)
    if m.heads % m.kv_heads or m.hidden_size % m.heads:
        raise ValueError("model.heads must divide model.hidden_size and be a multiple of "
                         "model.kv_heads")
    v.choice("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    v.choice("model.attn_implementation", m.attn_implementation, ("sdpa", "eager"))
    v.integer("model.warm_start_steps", m.warm_start_steps, 0)
    v.positive("model.warm_start_lr", m.warm_start_lr)
    v.integer("model.warm_start_batch", m.warm_start_batch, 1)
    v.integer("model.warm_start_warmup", m.warm_start_warmup, 0)
    v.real("model.warm_start_target", m.warm_start_target, 0.0, 1.0, hi_open=True)
    v.choice("sampler.backend", s.backend, ("hf", "vllm"))
    v.positive("sampler.temperature", s.temperature)
    v.real("sampler.top_p", s.top_p, 0.0, 1.0, lo_open=True)
    v.integer("sampler.max_new_tokens", s.max_new_tokens, 1)
    v.integer("sampler.vllm_kv_cache_gb", s.vllm_kv_cache_gb, 1)
    v.choice("schedule.mode", sc.mode, ("on_policy", "sync", "async"))
    v.integer("schedule.batch_size", sc.batch_size, 1)
    v.integer("schedule.group_size", sc.group_size, 2)
    v.positive("schedule.replay_ratio", sc.replay_ratio)
    v.integer("schedule.workers", sc.workers, 1)
    v.integer("schedule.trainers", sc.trainers, 1)
    v.integer("schedule.refresh_every", sc.refresh_every, 1)
    v.integer("schedule.latency_steps", sc.latency_steps, -1)
    if sc.mu_accounting != -1.0:
        v.positive("schedule.mu_accounting (-1 = measured)", sc.mu_accounting)
    if sc.mode == "async" and sc.mu_accounting == -1.0:
        raise ValueError("schedule.mode=async needs schedule.mu_accounting (> 0): it sets the "
                         "producer rate B W / (T mu), which must not depend on timing")
    if sc.batch_size % sc.trainers:
        raise ValueError(f"schedule.batch_size ({sc.batch_size}) must be divisible by "
                         f"schedule.trainers ({sc.trainers})")
    v.integer("buffer.capacity", b.capacity, 1)
    v.nonnegative("buffer.horizon", b.horizon)
    v.choice("buffer.sampling", b.sampling, ("with_replacement", "without_replacement",
                                             "never_used_first"))
    v.real("buffer.delta", b.delta, 0.0, 1.0, hi_open=True)
    if b.lifo and b.delta > 0:
        raise ValueError("buffer.delta must be 0 with buffer.lifo=true (no replay)")
    if sc.mode == "async" and b.capacity % sc.trainers:
        raise ValueError(f"buffer.capacity ({b.capacity}) must be divisible by "
                         f"schedule.trainers ({sc.trainers}): one shard per trainer")
    if sc.mode != "on_policy" and (b.lifo or b.sampling != "with_replacement") \
            and b.capacity // sc.trainers < sc.batch_size // sc.trainers:
        raise ValueError(f"buffer.capacity per shard ({b.capacity // sc.trainers}) must be >= "
                         f"the batch per trainer ({sc.batch_size // sc.trainers}) when sampling "
                         f"without replacement or with buffer.lifo")
    v.choice("trainer.loss", tr.loss, ("grpo", "grpo_unclipped", "grpo_truncated", "asymre"))
    v.unit_interval("trainer.clip_low", tr.clip_low)
    v.unit_interval("trainer.clip_high", tr.clip_high)
    v.positive("trainer.is_cap", tr.is_cap)
    v.real("trainer.dv", tr.dv)
    v.choice("trainer.optimizer", tr.optimizer, ("adamw", "adam"))
    v.positive("trainer.lr", tr.lr)
    v.real("trainer.beta1", tr.beta1, 0.0, 1.0, hi_open=True)
    v.real("trainer.beta2", tr.beta2, 0.0, 1.0, hi_open=True)
    v.nonnegative("trainer.weight_decay", tr.weight_decay)
    v.nonnegative("trainer.grad_clip", tr.grad_clip)
    v.nonnegative("trainer.per_sample_clip", tr.per_sample_clip)
    v.integer("trainer.micro_batch", tr.micro_batch, 0)
    v.integer("eval.every", e.every, 1)
    v.nonnegative("eval.temperature", e.temperature)
    for k in e.pass_k:
        v.integer("eval.pass_k entries", k, 1)
    v.integer("eval.pass_k_problems", e.pass_k_problems, 0)
    v.positive("eval.pass_k_temperature", e.pass_k_temperature)
    v.real("eval.pass_k_top_p", e.pass_k_top_p, 0.0, 1.0, lo_open=True)
    v.integer("probe.every", p.every, 0)
    v.integer("probe.fresh_groups", p.fresh_groups, 4)
    if p.fresh_groups % 2:
        raise ValueError(f"probe.fresh_groups must be even (two disjoint halves), got "
                         f"{p.fresh_groups}")
    v.integer("probe.fresh_noise_groups", p.fresh_noise_groups, 0, p.fresh_groups // 2)
    v.integer("probe.buffer_groups", p.buffer_groups, 0)
    v.integer("probe.crn_groups", p.crn_groups, 0, p.fresh_groups // 2)
    for s_ in p.crn_staleness:
        v.integer("probe.crn_staleness entries", s_, 1)
    v.integer("probe.chunk", p.chunk, 1)
    v.integer("probe.max_snapshots", p.max_snapshots, 1)
