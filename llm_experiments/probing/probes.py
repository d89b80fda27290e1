"""Gradient-noise probes: measure sigma(s), rho and kappa of theory.md section 4 during a run.

Every ``probe.every`` steps, at the current weights theta_t (before the update of step t):

1. Reference gradient. Generate ``fresh_groups`` on-policy groups (own random stream, inverse
   CDF with stored uniforms) and compute each group's gradient of the training loss. Split
   them in two disjoint halves with means g1, g2: g_ref = (g1 + g2) / 2 with squared error
   ~ ||g1 - g2||^2 / 4, and each half is an independent reference for samples of the other
   (error ~ ||g1 - g2||^2 / 2).
2. Noise of samples. Per-sequence gradients (torch.func, eager attention) of
   ``buffer_groups`` buffer groups spread over insertion steps, and of
   ``fresh_noise_groups`` fresh groups of half 1 (staleness 0, measured against g2).
   Rows in sequence units and in group units (a group's gradient is the mean of its
   sequences'; GRPO advantages are normalised per group, so a group's sequences are strongly
   correlated). eps = G(theta_t, z) - reference.
3. Coupling: mean <eps_i, eps_j> over pairs of buffer samples by insertion gap |t_i - t_j|
   (sequence units: pairs from different groups only).
4. Bias: per staleness, the mean eps of buffer samples (method 0); and, from kept weight
   snapshots theta_{t-s}, regenerate ``crn_groups`` groups of half 1 with the same prompts and
   uniforms (common random numbers) and average d = G(theta_t, z_s) - G(theta_t, z_0) over
   groups (method 1): E[d] is the bias of a rollout s steps stale, and pairing cuts the
   variance of the difference (``indep_noise_sq`` is the unpaired value, for comparison).
5. Minibatch: ||g_t - g_ref||^2 of the actual training batch of step t, and the change of the
   reference gradient since the previous probe against the parameter drift since then (an
   estimate of the smoothness L of section 4).
6. Reuse (``probe.reuse_gaps``, off by default): for each probed buffer sequence that existed
   at an earlier probe t - g, its noise at the weights of t - g against that probe's g_ref,
   with its noise now (the ``reuse`` table: one rollout's noise at two steps; theory.md
   section 8.9). The references of the last probes are kept for this.
7. Contribution (``probe.contribution``, off by default): per probed buffer sequence, the
   clip fraction, the importance weight and the share of its unclipped gradient the trained
   loss keeps (the ``contribution`` table).

All rows follow ``replaytheory.fit.probes`` (extra columns: noise.source 0 buffer / 1 fresh,
noise.insert_step, noise.uses (earlier uses of the sample; under clipping noise depends on
them), bias.method, bias.indep_noise_sq, minibatch.grad_sq (||g_ref||^2),
minibatch.grad_change_sq (||g_ref - previous probe's g_ref||^2 with both reference errors
removed), minibatch.drift_prev (||theta - previous probe's theta||); 0 where not
applicable), contribution.sq_unclip (||G_unclip||^2, the weight of a row in a pooled
contribution). Coupling rows count buffer_size and rollouts_per_step in the row's unit (groups
of G for group rows). Probes draw
from their own seeded stream and never write the model, its gradients, or the run's RNG.
Their cost (seconds) is reported and bounded by the sizes in ``ProbeConfig``.

Sketch (``probe.sketch_dim`` = k > 0; 0, the default, is exact): every gradient the probes
keep (per-sequence, group, reference and minibatch gradients) is a k-dimensional count sketch
S g of one seeded projection for the whole run (``sketch.CountSketch``), so kept memory grows
with k, not with the parameter count P. Every table entry is an inner product or a squared norm
of linear combinations of gradients, and E[<S a, S b>] = <a, b>, so each stays unbiased, with
standard deviation at most sqrt(2 / k) ||a|| ||b|| (theory.md section 8.1.1); ratios (cosines,
kept shares) are consistent, not unbiased. Weights (drift, theta) stay exact.

The prober sees the run only through a ``RunView`` (implemented by ``Experiment``, by trainer
rank 0 of the Ray engine, and by the TRL callback's ``TrainerRun``): the policy, the buffer's rollouts and weight
snapshots (read only, as messages: the buffer may live in another process), prompt encoding and
grading, and the run's counts. The columns that depend on the run's rate R are filled when the
tables are written, so a run whose rate comes from the clock carries one R in every row.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from replaytheory.fit.probes import SCHEMA, UNIT_GROUP, UNIT_SEQUENCE, ProbeSet

from ..rl.buffer import HeldRollouts, Rollout
from ..config import Config
from ..rl.gradients import cosine, flat_params, kept_share, per_sample_grads, sq_norm
from ..rl.losses import collate, loss_stats, policy_loss, token_logprobs
from .align import AlignProbe
from .panel import PanelProbe
from ..samplers import Generation, WeightUpdate
from ..samplers.make import hf_sampler
from ..engines.seeds import PROBE_STREAM, SKETCH_STREAM, derived_seed
from .sketch import projection

EXTRA = {"noise": ("source", "insert_step", "uses"), "bias": ("method", "indep_noise_sq"),
         "panel": ("group", "n_mates", "sq_unclip", "ref_sq_error_birth"),
         "diversity": ("ref_sq_error_birth",),
         "minibatch": ("grad_sq", "grad_change_sq", "drift_prev"),
         "contribution": ("sq_unclip",)}
SOURCE_BUFFER, SOURCE_FRESH = 0, 1
METHOD_BUFFER, METHOD_CRN = 0, 1




@dataclass(frozen=True)
class RunCounts:
    """A run's counts so far, written with the probes: rollouts generated, rollouts drawn
    for training, trainer steps taken, and mu (generation cost of a batch over the cost of an
    update, theory.md section 3): time-measured and the one used for accounting (None until
    known)."""

    unique_rollouts: int
    samples_consumed: int
    steps: int
    mu_measured: float | None
    mu_accounting: float | None


@dataclass(frozen=True)
class Reference:
    """A probe's reference gradient (section 8.1) and what it was made from: the weights
    theta (flat), the fresh problems, uniforms, groups and their group gradients fresh_g,
    half 2's mean g2, g_ref = the mean of both halves, its estimated squared error ref_err,
    that of one half against the other half_err, and ||g_ref||^2 grad_sq."""

    theta: torch.Tensor
    problems: list
    uniforms: np.ndarray
    fresh: list
    fresh_g: torch.Tensor
    g2: torch.Tensor
    g_ref: torch.Tensor
    ref_err: float
    half_err: float
    grad_sq: float


@runtime_checkable
class RunView(Protocol):
    """What the prober reads of a live run: each engine implements these members (the
    emulated ``Experiment``, the Ray engine's trainer rank 0, the TRL callback's
    ``integrations.trl.TrainerRun``). Read on every call, not copied: the run replaces its
    buffer and snapshots on resume, and they change every step.

    model: the trainer's policy (probes differentiate at its weights, never write them).
    tokenizer: its tokenizer (``pad_token_id``, ``eos_token_id``). device: the model's.
    loss_kwargs: keyword arguments of ``losses.policy_loss`` (the training loss).
    probe_dir: the folder ``probes.npz`` goes in. buffer_capacity: N, in rollouts.
    """

    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    loss_kwargs: dict
    probe_dir: str
    buffer_capacity: int

    def rollouts_per_step(self) -> float:
        """R > 0, new rollouts per trainer step (section 4): the schedule's rate, or, where it
        comes from the clock, the rate measured so far; read when the tables are written
        (``Prober.probe_set``)."""

    def sample_problems(self, n: int, rng: np.random.Generator) -> list:
        """``n`` >= 0 training problems drawn with ``rng``."""

    def encode(self, problem) -> list[int]:
        """The prompt token ids of ``problem``."""

    def make_rollouts(self, problems: list, gen: Generation, version: int, first_item: int,
                      first_group: int) -> list[Rollout]:
        """Graded rollouts with group advantages (section 6) of a generation made with weight
        ``version``, items and groups numbered from ``first_item`` and ``first_group``."""

    def current_weights(self) -> WeightUpdate:
        """The trainer's weights now."""

    def snapshot_versions(self) -> set[int]:
        """The weight versions (steps) kept as snapshots."""

    def snapshot(self, version: int) -> WeightUpdate:
        """A kept version's weights."""

    def buffer_versions(self) -> np.ndarray:
        """The weight version of every rollout the buffer holds."""

    def probe_groups(self, group_size: int, versions: set[int], limit: int) -> HeldRollouts:
        """At most ``limit`` buffer groups of ``group_size`` made with kept ``versions``, with
        insertion steps and use counts (``RolloutBuffer.probe_groups``)."""

    def run_counts(self) -> RunCounts:
        """The run's counts so far."""


class Prober:
    """Runs the probes of a live run (seen through a ``RunView``) and writes ``probes.npz``
    in its folder."""

    def __init__(self, cfg: Config, run: RunView):
        self.cfg, self.run = cfg, run
        self.pad_id = run.tokenizer.pad_token_id
        self.sampler = hf_sampler(cfg, run.model, run.tokenizer)
        self.rows: dict[str, list[dict]] = {name: [] for name in SCHEMA}
        self.seconds = 0.0
        self._ref = None  # (g_ref, ref_sq_error, sigma_bar2) of the current probe
        self._prev = None  # (g_ref, ref_sq_error, theta) of the previous probe
        self._smooth = (0.0, 0.0, 0.0)  # grad_sq, grad_change_sq, drift_prev of this probe
        self._refs: dict[int, torch.Tensor] = {}  # probe step -> its g_ref, for reuse rows
        self.panel = PanelProbe(self)
        self.align = AlignProbe(self)
        # One S for the whole run, so sketches of different probes and weights combine.
        self.project = projection(cfg.probe.sketch_dim,
                                  derived_seed(cfg.run.seed, SKETCH_STREAM))

    # ---- bookkeeping --------------------------------------------------------------------------

    def versions_needed(self, step: int) -> set[int]:
        """Snapshots to keep: buffer items' versions, the CRN staleness window and the probe
        steps whose references the reuse rows still need, newest ``probe.max_snapshots`` of
        them."""
        window = step - max(self.cfg.probe.crn_staleness, default=0)
        versions = set(self.run.buffer_versions().tolist())
        versions |= {v for v in self.run.snapshot_versions() if v >= window}
        versions |= set(self._refs)
        kept = set(sorted(versions)[-self.cfg.probe.max_snapshots:])
        return kept | self.panel.versions_needed()

    def state_dict(self) -> dict:
        """Rows measured so far, the previous probe's reference and the probe seconds."""
        return {"rows": self.rows, "seconds": self.seconds, "prev": self._prev,
                "refs": self._refs, "panel": self.panel.state_dict(),
                "align": self.align.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a state saved by ``state_dict``."""
        self.rows, self.seconds = state["rows"], state["seconds"]
        self._prev = state.get("prev")
        self._refs = state.get("refs", {})
        self.rows = {name: state["rows"].get(name, []) for name in SCHEMA}
        self.panel.load_state_dict(state.get("panel"))
        self.align.load_state_dict(state.get("align"))

    def due(self, step: int) -> bool:
        """Whether the buffer probes run at trainer step ``step``."""
        return bool(self.cfg.probe.every) and step % self.cfg.probe.every == 0

    def panel_step(self, step: int) -> None:
        """Birth or measure the long-range panels due at ``step`` (``panel.PanelProbe``,
        ``align.AlignProbe``)."""
        for probe in (self.panel, self.align):
            if probe.due(step):
                t0 = time.perf_counter()
                probe.measure(step)
                self.seconds += time.perf_counter() - t0

    def probe_set(self) -> ProbeSet:
        """The rows so far as a ``replaytheory.fit.probes.ProbeSet`` with the run counts; the
        columns of the rate R (``RunView.rollouts_per_step``) take its value now."""
        tables, rate = {}, self.run.rollouts_per_step()
        for name, cols in SCHEMA.items():
            cols = cols + EXTRA.get(name, ())
            rows = [{**r, **self._rate_columns(name, r, rate)} for r in self.rows[name]]
            tables[name] = {c: np.array([r[c] for r in rows], dtype=float) for c in cols}
        c, sc = self.run.run_counts(), self.cfg.schedule
        counts = {"unique_rollouts": c.unique_rollouts, "samples_consumed": c.samples_consumed,
                  "workers": sc.workers, "trainers": sc.trainers, "steps": c.steps}
        for key, val in (("mu_measured", c.mu_measured), ("mu_accounting", c.mu_accounting)):
            if val is not None:
                counts[key] = float(val)
        return ProbeSet(tables, counts)

    def _rate_columns(self, name: str, row: dict, rate: float) -> dict:
        """The columns of table ``name``'s ``row`` that depend on R = ``rate`` (rollouts per
        step; in the row's unit for coupling rows): horizon N / R and replay ratio B / R."""
        if name == "coupling":
            per = self.cfg.schedule.group_size if row["unit"] == UNIT_GROUP else 1
            return {"rollouts_per_step": rate / per}
        if name == "minibatch":
            return {"horizon": self.run.buffer_capacity / rate,
                    "replay_ratio": self.cfg.schedule.batch_size / rate,
                    "rollouts_per_step": rate}
        return {}

    def save(self) -> None:
        """Write ``probes.npz`` in the run folder, atomically."""
        self.probe_set().save(os.path.join(self.run.probe_dir, "probes.npz"))

    # ---- gradients ----------------------------------------------------------------------------

    def _group_grads(self, groups: list[list]) -> torch.Tensor:
        """(n_groups, P) gradients of each group's mean loss at the current weights ((n_groups,
        k) sketches with ``probe.sketch_dim`` = k > 0)."""
        r = self.run
        params = [p for p in r.model.parameters() if p.requires_grad]
        out = []
        for rollouts in groups:
            batch = collate(rollouts, self.pad_id, r.device)
            logp, _ = token_logprobs(r.model(input_ids=batch.input_ids).logits, batch,
                                     self.cfg.sampler.temperature)
            loss = policy_loss(logp, batch, **r.loss_kwargs).mean()
            grads = torch.autograd.grad(loss, params)
            out.append(self.project.rows([g[None] for g in grads])[0])
        return torch.stack(out)

    def seq_grads(self, rollouts: list, params: dict | None = None,
                   loss_kwargs: dict | None = None) -> torch.Tensor:
        """(n, P) per-sequence gradients (torch.func) of the training loss (or of the loss
        ``loss_kwargs``) at the current weights (or at ``params``, {name: tensor}); (n, k)
        sketches with ``probe.sketch_dim`` = k > 0."""
        r = self.run
        batch = collate(rollouts, self.pad_id, r.device)
        return torch.cat([g for _, g in per_sample_grads(
            r.model, batch, r.loss_kwargs if loss_kwargs is None else loss_kwargs,
            self.cfg.sampler.temperature, self.cfg.probe.chunk, params, self.project)])

    def generate(self, problems, uniforms, update: WeightUpdate, first_group: int):
        r, g = self.run, self.cfg.schedule.group_size
        self.sampler.load_weights(update)
        prompts = [r.encode(p) for p in problems for _ in range(g)]
        gen = self.sampler.generate(prompts, max_new_tokens=self.cfg.sampler.max_new_tokens,
                                    temperature=self.cfg.sampler.temperature,
                                    top_p=self.cfg.sampler.top_p, uniforms=uniforms)
        rollouts = r.make_rollouts(problems, gen, update.version, 0, first_group)
        return [rollouts[i * g:(i + 1) * g] for i in range(len(problems))]

    def drift(self, theta: torch.Tensor, version: int) -> float:
        names = [n for n, p in self.run.model.named_parameters() if p.requires_grad]
        snap = self.run.snapshot(version).state
        old = torch.cat([snap[n].reshape(-1).float() for n in names]).to(theta.device)
        return float((theta - old).double().norm())

    # ---- the probe ----------------------------------------------------------------------------

    def reference(self, rng: np.random.Generator) -> Reference:
        """The reference gradient at the current weights from ``probe.fresh_groups`` fresh
        groups drawn with ``rng`` (section 8.1: two disjoint halves, g_ref their mean)."""
        r, p, g = self.run, self.cfg.probe, self.cfg.schedule.group_size
        theta = flat_params(r.model)
        problems = r.sample_problems(p.fresh_groups, rng)
        uniforms = rng.random((p.fresh_groups * g, self.cfg.sampler.max_new_tokens))
        fresh = self.generate(problems, uniforms, r.current_weights(), -1)
        fresh_g = self._group_grads(fresh)
        half = p.fresh_groups // 2
        g1, g2 = fresh_g[:half].mean(0), fresh_g[half:].mean(0)
        g_ref = (g1 + g2) / 2
        diff_sq = sq_norm(g1 - g2)
        return Reference(theta=theta, problems=problems, uniforms=uniforms, fresh=fresh,
                         fresh_g=fresh_g, g2=g2, g_ref=g_ref, ref_err=diff_sq / 4,
                         half_err=diff_sq / 2, grad_sq=sq_norm(g_ref))

    def probe(self, step: int) -> None:
        """Measure noise, coupling and bias at the current weights (trainer step ``step``)."""
        t0 = time.perf_counter()
        p = self.cfg.probe
        rng = np.random.default_rng(derived_seed(self.cfg.run.seed, step, PROBE_STREAM))
        ref = self.reference(rng)
        theta, g_ref, ref_err, grad_sq = ref.theta, ref.g_ref, ref.ref_err, ref.grad_sq

        if self._prev is None:
            self._smooth = (grad_sq, 0.0, 0.0)
        else:
            prev_g, prev_err, prev_theta = self._prev
            self._smooth = (grad_sq, sq_norm(g_ref - prev_g) - ref_err - prev_err,
                            float((theta - prev_theta).double().norm()))
        self._prev = (g_ref.detach().cpu().clone(), ref_err, theta.detach().cpu().clone())

        # Fresh samples of half 1, against the independent half 2.
        for gi in range(p.fresh_noise_groups):
            seq = self.seq_grads(ref.fresh[gi])
            for row in seq:
                self._noise(step, 0, 0.0, sq_norm(row - ref.g2), ref.half_err, UNIT_SEQUENCE,
                            SOURCE_FRESH, step, 0)
            self._noise(step, 0, 0.0, sq_norm(seq.mean(0) - ref.g2), ref.half_err, UNIT_GROUP,
                        SOURCE_FRESH, step, 0)

        buffer_seq_sq = self._buffer_samples(step, theta, g_ref, ref_err, grad_sq)
        g = self.cfg.schedule.group_size
        self._crn_bias(step, theta, ref.problems[:p.crn_groups],
                       ref.uniforms[:p.crn_groups * g], ref.fresh_g[:p.crn_groups], g_ref,
                       grad_sq)
        sigma_bar2 = float(np.mean(buffer_seq_sq)) if buffer_seq_sq else 0.0
        self._ref = (g_ref, ref_err, sigma_bar2)
        if p.reuse_gaps:
            oldest = step - max(p.reuse_gaps) * p.every
            self._refs = {s: ref for s, ref in self._refs.items() if s >= oldest}
            self._refs[step] = g_ref.detach().cpu().clone()
        self.seconds += time.perf_counter() - t0

    def _noise(self, step, staleness, drift, sq, ref_err, unit, source, insert_step, uses):
        self.rows["noise"].append({"probe_step": step, "staleness": staleness, "drift": drift,
                                   "sq_noise": sq, "ref_sq_error": ref_err, "unit": unit,
                                   "source": source, "insert_step": insert_step,
                                   "uses": uses})

    def _buffer_samples(self, step, theta, g_ref, ref_err, grad_sq) -> list[float]:
        """Noise, coupling and buffer-based bias rows; returns the sequences' sq noise."""
        p = self.cfg.probe
        held = self.run.probe_groups(self.cfg.schedule.group_size,
                                     self.run.snapshot_versions(), p.buffer_groups)
        groups, row_of, insert = defaultdict(list), {}, {}
        for i, r in enumerate(held.rollouts):
            groups[r.group_id].append(r)
            row_of[r.item_id] = i
            insert.setdefault(r.group_id, int(held.insert_step[i]))
        chosen = list(groups)
        if not chosen:
            return []
        seq_eps, seq_group, group_eps, seq_sq = [], [], [], []
        for gid in chosen:
            rs = groups[gid]
            grads = self.seq_grads(rs)
            eps = grads - g_ref
            version = rs[0].version
            drift = self.drift(theta, version)
            uses = held.uses[[row_of[r.item_id] for r in rs]]
            if p.reuse_gaps:
                self._reuse(step, rs, eps, uses)
            if p.contribution:
                self._contribution(step, rs, grads, uses)
            for row, u in zip(eps, uses):
                sq = sq_norm(row)
                seq_sq.append(sq)
                self._noise(step, step - version, drift, sq, ref_err, UNIT_SEQUENCE,
                            SOURCE_BUFFER, insert[gid], int(u))
            ge = eps.mean(0)
            self._noise(step, step - version, drift, sq_norm(ge), ref_err, UNIT_GROUP,
                        SOURCE_BUFFER, insert[gid], float(np.mean(uses)))
            seq_eps.append(eps)
            seq_group += [gid] * len(rs)
            group_eps.append(ge)
        meta = {"ins": [insert[gid] for gid in chosen],
                "stale": [step - groups[gid][0].version for gid in chosen],
                "drift": [self.drift(theta, groups[gid][0].version) for gid in chosen]}
        G = torch.stack(group_eps)
        # One float32 Gram matrix of the sequences (BLAS); the groups' follows from it, since a
        # group's noise is the mean of its sequences'.
        S = torch.cat(seq_eps)
        gram_s = (S @ S.T).double().cpu().numpy()
        seq_group = np.array(seq_group)
        avg = (seq_group[None, :] == np.array(chosen)[:, None]).astype(float)
        avg /= avg.sum(1, keepdims=True)
        self._coupling(step, avg @ gram_s @ avg.T, np.array(meta["ins"]),
                       np.arange(len(chosen)), ref_err, UNIT_GROUP)
        seq_ins = np.repeat(meta["ins"], [len(groups[gid]) for gid in chosen])
        self._coupling(step, gram_s, seq_ins, seq_group, ref_err, UNIT_SEQUENCE)
        for s in sorted(set(meta["stale"])):
            idx = [i for i, st in enumerate(meta["stale"]) if st == s]
            m = G[idx].mean(0)
            self.rows["bias"].append({
                "probe_step": step, "staleness": s, "drift": meta["drift"][idx[0]],
                "n_samples": len(idx), "mean_sq": sq_norm(m),
                "noise_sq": float(np.mean([sq_norm(G[i]) for i in idx])), "grad_sq": grad_sq,
                "cos_grad": cosine(m, g_ref), "ref_sq_error": ref_err, "unit": UNIT_GROUP,
                "method": METHOD_BUFFER, "indep_noise_sq": 0.0})
        return seq_sq

    def _reuse(self, step, rollouts, eps, uses) -> None:
        """``reuse`` rows of one probed group: each sequence's noise now (``eps``, (n, P))
        against its noise at the weights and reference of the probe ``k * every`` steps ago,
        for k in ``probe.reuse_gaps`` where that probe, its snapshot and the rollout existed;
        one row per sequence and one for the group (noise = mean of its sequences')."""
        p, r = self.cfg.probe, self.run
        version, kept = rollouts[0].version, r.snapshot_versions()
        names = [n for n, q in r.model.named_parameters() if q.requires_grad]
        for k in p.reuse_gaps:
            then = step - k * p.every
            if then < version or then not in self._refs or then not in kept:
                continue
            snap = r.snapshot(then).state
            params = {n: snap[n].to(r.device) for n in names}
            old = self.seq_grads(rollouts, params=params) - self._refs[then].to(eps.device)
            pairs = [(now, before, UNIT_SEQUENCE, float(u))
                     for now, before, u in zip(eps, old, uses)]
            pairs.append((eps.mean(0), old.mean(0), UNIT_GROUP, float(np.mean(uses))))
            for now, before, unit, u in pairs:
                self.rows["reuse"].append({
                    "probe_step": step, "gap": step - then, "staleness": step - version,
                    "uses": u, "inner": float(torch.dot(now.double(), before.double())),
                    "sq_now": sq_norm(now), "sq_then": sq_norm(before), "unit": unit})

    def _contribution(self, step, rollouts, grads, uses) -> None:
        """``contribution`` rows of one probed group (per sequence, and the group): clip
        fraction and importance weight of its tokens at the current weights, and the share
        <G_clip, G_unclip> / ||G_unclip||^2 of the unclipped gradient that the trained loss
        keeps (``grads``: the trained loss's per-sequence gradients, (n, P)). A sequence
        without gradient (zero advantage) keeps everything: contribution 1, sq_unclip 0."""
        r, kw = self.run, self.run.loss_kwargs
        unclipped = self.seq_grads(rollouts, loss_kwargs={**kw, "loss": "grpo_unclipped"})
        batch = collate(rollouts, self.pad_id, r.device)
        with torch.no_grad():
            logp, entropy = token_logprobs(r.model(input_ids=batch.input_ids).logits, batch,
                                           self.cfg.sampler.temperature)
        parts = [(slice(i, i + 1), grads[i], unclipped[i], UNIT_SEQUENCE, float(u))
                 for i, u in enumerate(uses)]
        parts.append((slice(0, len(rollouts)), grads.mean(0), unclipped.mean(0), UNIT_GROUP,
                      float(np.mean(uses))))
        for rows, kept, full, unit, u in parts:
            sub = batch.rows(rows)
            clip = loss_stats(logp[rows], entropy[rows], sub, kw["clip_low"],
                              kw["clip_high"])["clip_fraction"]
            ratio = torch.exp(logp[rows] - sub.old_logp)[sub.mask]
            share, sq_full = kept_share(kept, full)
            self.rows["contribution"].append({
                "probe_step": step, "staleness": step - rollouts[0].version, "uses": u,
                "clip_fraction": clip, "contribution": share,
                "is_weight": float(ratio.double().mean()), "unit": unit,
                "sq_unclip": sq_full})

    def _coupling(self, step, gram, insert, group, ref_err, unit) -> None:
        """Mean pairwise inner products of noise vectors (Gram matrix ``gram``) by insertion
        gap, over pairs of distinct groups only."""
        sq = np.diag(gram)
        i, j = np.triu_indices(len(insert), 1)
        keep = group[i] != group[j]
        i, j = i[keep], j[keep]
        gaps = np.abs(insert[i] - insert[j])
        per = self.cfg.schedule.group_size if unit == UNIT_GROUP else 1
        for gap in np.unique(gaps):
            sel = gaps == gap
            self.rows["coupling"].append({
                "probe_step": step, "gap": int(gap), "n_pairs": int(sel.sum()),
                "mean_inner": float(gram[i[sel], j[sel]].mean()),
                "mean_sq": float(((sq[i[sel]] + sq[j[sel]]) / 2).mean()),
                "ref_sq_error": ref_err,
                "buffer_size": self.run.buffer_capacity / per, "unit": unit})

    def _crn_bias(self, step, theta, problems, uniforms, fresh_g, g_ref, grad_sq) -> None:
        """Regenerate the same prompts with the same uniforms from old snapshots (method 1)."""
        n = len(problems)
        if n == 0:
            return
        kept = self.run.snapshot_versions()
        for s in self.cfg.probe.crn_staleness:
            version = step - s
            if version < 0 or version not in kept:
                continue
            old = self.generate(problems, uniforms, self.run.snapshot(version), -1)
            old_g = self._group_grads(old)
            d = old_g - fresh_g
            m = d.mean(0)
            unpaired = old_g - fresh_g.roll(1, 0) if n > 1 else d
            self.rows["bias"].append({
                "probe_step": step, "staleness": s, "drift": self.drift(theta, version),
                "n_samples": n, "mean_sq": sq_norm(m),
                "noise_sq": float(np.mean([sq_norm(x) for x in d])), "grad_sq": grad_sq,
                "cos_grad": cosine(m, g_ref), "ref_sq_error": 0.0, "unit": UNIT_GROUP,
                "method": METHOD_CRN,
                "indep_noise_sq": float(np.mean([sq_norm(x) for x in unpaired]))})

    def add_minibatch(self, step: int, grad: torch.Tensor) -> None:
        """Minibatch noise of the training batch of ``step`` (``grad``: its flat gradient,
        length P) against this probe's g_ref."""
        g_ref, ref_err, sigma_bar2 = self._ref
        grad = self.project.vector(grad.to(g_ref.device))
        self.rows["minibatch"].append({
            "probe_step": step, "batch_size": self.cfg.schedule.batch_size,
            "buffer_size": self.run.buffer_capacity,
            "sq_error": sq_norm(grad - g_ref), "ref_sq_error": ref_err,
            "sigma_bar2": sigma_bar2, "grad_sq": self._smooth[0],
            "grad_change_sq": self._smooth[1], "drift_prev": self._smooth[2]})
