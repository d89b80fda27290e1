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

All rows follow ``replaytheory.probes`` (extra columns: noise.source 0 buffer / 1 fresh,
noise.insert_step, noise.uses (earlier uses of the sample; under clipping noise depends on
them), bias.method, bias.indep_noise_sq, minibatch.grad_sq (||g_ref||^2),
minibatch.grad_change_sq (||g_ref - previous probe's g_ref||^2 with both reference errors
removed), minibatch.drift_prev (||theta - previous probe's theta||); 0 where not
applicable). Coupling rows count buffer_size and rollouts_per_step in the row's unit (groups
of G for group rows). Probes draw
from their own seeded stream and never write the model, its gradients, or the run's RNG.
Their cost (seconds) is reported and bounded by the sizes in ``ProbeConfig``.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import numpy as np
import torch

from replaytheory.probes import SCHEMA, UNIT_GROUP, UNIT_SEQUENCE, ProbeSet

from .losses import collate, flat_params, per_sample_grads, policy_loss, token_logprobs
from .samplers import WeightUpdate
from .samplers.hf import HFSampler

EXTRA = {"noise": ("source", "insert_step", "uses"), "bias": ("method", "indep_noise_sq"),
         "minibatch": ("grad_sq", "grad_change_sq", "drift_prev")}
SOURCE_BUFFER, SOURCE_FRESH = 0, 1
METHOD_BUFFER, METHOD_CRN = 0, 1


def _sq(x: torch.Tensor) -> float:
    return float(torch.dot(x.double(), x.double()))


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = a.double().norm(), b.double().norm()
    return float(torch.dot(a.double(), b.double()) / (na * nb)) if na > 0 and nb > 0 else 0.0


class Prober:
    """Runs the probes of a live ``Experiment`` and writes ``probes.npz`` in its folder."""

    def __init__(self, cfg, exp):
        self.cfg, self.exp = cfg, exp
        self.sampler = HFSampler(exp.model, exp.tokenizer.eos_token_id,
                                 exp.tokenizer.pad_token_id, direct=cfg.run.direct_forward)
        self.rows: dict[str, list[dict]] = {name: [] for name in SCHEMA}
        self.seconds = 0.0
        self._ref = None  # (g_ref, ref_sq_error, sigma_bar2) of the current probe
        self._prev = None  # (g_ref, ref_sq_error, theta) of the previous probe
        self._smooth = (0.0, 0.0, 0.0)  # grad_sq, grad_change_sq, drift_prev of this probe

    # ---- bookkeeping --------------------------------------------------------------------------

    def versions_needed(self, step: int) -> set[int]:
        """Snapshots to keep: buffer items' versions and the CRN staleness window, newest
        ``probe.max_snapshots`` of them."""
        window = step - max(self.cfg.probe.crn_staleness, default=0)
        versions = set(self.exp.buffer.versions().tolist())
        versions |= {v for v in self.exp.weights.snapshots if v >= window}
        return set(sorted(versions)[-self.cfg.probe.max_snapshots:])

    def state_dict(self) -> dict:
        """Rows measured so far, the previous probe's reference and the probe seconds."""
        return {"rows": self.rows, "seconds": self.seconds, "prev": self._prev}

    def load_state_dict(self, state: dict) -> None:
        """Restore a state saved by ``state_dict``."""
        self.rows, self.seconds = state["rows"], state["seconds"]
        self._prev = state.get("prev")

    def probe_set(self) -> ProbeSet:
        """The rows so far as a ``replaytheory.probes.ProbeSet`` with the run counts."""
        tables = {}
        for name, cols in SCHEMA.items():
            cols = cols + EXTRA.get(name, ())
            tables[name] = {c: np.array([r[c] for r in self.rows[name]], dtype=float)
                            for c in cols}
        e, sc = self.exp, self.cfg.schedule
        counts = {"unique_rollouts": e.clock.generated, "samples_consumed": e.consumed,
                  "workers": sc.workers, "trainers": sc.trainers, "steps": e.clock.steps}
        for key, val in (("mu_measured", e.clock.mu_time()),
                         ("mu_accounting", e.mu_accounting())):
            if val is not None:
                counts[key] = float(val)
        return ProbeSet(tables, counts)

    def save(self) -> None:
        """Write ``probes.npz`` in the run folder, atomically."""
        self.probe_set().save(os.path.join(self.exp.out, "probes.npz"))

    # ---- gradients ----------------------------------------------------------------------------

    def _group_grads(self, groups: list[list]) -> torch.Tensor:
        """(n_groups, P) gradients of each group's mean loss at the current weights."""
        e = self.exp
        params = [p for p in e.model.parameters() if p.requires_grad]
        out = []
        for rollouts in groups:
            batch = collate(rollouts, e.tokenizer.pad_token_id, e.device)
            logp, _ = token_logprobs(e.model(input_ids=batch.input_ids).logits, batch,
                                     self.cfg.sampler.temperature)
            loss = policy_loss(logp, batch, **e.loss_kwargs).mean()
            grads = torch.autograd.grad(loss, params)
            out.append(torch.cat([g.reshape(-1).float() for g in grads]))
        return torch.stack(out)

    def _seq_grads(self, rollouts: list) -> torch.Tensor:
        """(n, P) per-sequence gradients (torch.func)."""
        e = self.exp
        batch = collate(rollouts, e.tokenizer.pad_token_id, e.device)
        return torch.cat([g for _, g in per_sample_grads(
            e.model, batch, e.loss_kwargs, self.cfg.sampler.temperature, self.cfg.probe.chunk)])

    def _generate(self, problems, uniforms, update: WeightUpdate, first_group: int):
        e, g = self.exp, self.cfg.schedule.group_size
        self.sampler.load_weights(update)
        prompts = [e.encode(p) for p in problems for _ in range(g)]
        gen = self.sampler.generate(prompts, max_new_tokens=self.cfg.sampler.max_new_tokens,
                                    temperature=self.cfg.sampler.temperature,
                                    top_p=self.cfg.sampler.top_p, uniforms=uniforms)
        rollouts = e.make_rollouts(problems, gen, update.version, 0, first_group)
        return [rollouts[i * g:(i + 1) * g] for i in range(len(problems))]

    def _drift(self, theta: torch.Tensor, version: int) -> float:
        names = [n for n, p in self.exp.model.named_parameters() if p.requires_grad]
        snap = self.exp.weights.snapshots[version]
        old = torch.cat([snap[n].reshape(-1).float() for n in names]).to(theta.device)
        return float((theta - old).double().norm())

    # ---- the probe ----------------------------------------------------------------------------

    def probe(self, step: int) -> None:
        """Measure noise, coupling and bias at the current weights (trainer step ``step``)."""
        from .experiment import derived_seed
        t0 = time.perf_counter()
        e, p, g = self.exp, self.cfg.probe, self.cfg.schedule.group_size
        rng = np.random.default_rng(derived_seed(self.cfg.run.seed, step, 2))
        theta = flat_params(e.model)
        n_seq = p.fresh_groups * g
        problems = e.task.sample_train(p.fresh_groups, rng)
        uniforms = rng.random((n_seq, self.cfg.sampler.max_new_tokens))
        fresh = self._generate(problems, uniforms, e.current_weights(), -1)
        fresh_g = self._group_grads(fresh)
        half = p.fresh_groups // 2
        g1, g2 = fresh_g[:half].mean(0), fresh_g[half:].mean(0)
        g_ref = (g1 + g2) / 2
        diff_sq = _sq(g1 - g2)
        ref_err, half_err = diff_sq / 4, diff_sq / 2
        grad_sq = _sq(g_ref)

        if self._prev is None:
            self._smooth = (grad_sq, 0.0, 0.0)
        else:
            prev_g, prev_err, prev_theta = self._prev
            self._smooth = (grad_sq, _sq(g_ref - prev_g) - ref_err - prev_err,
                            float((theta - prev_theta).double().norm()))
        self._prev = (g_ref.detach().cpu().clone(), ref_err, theta.detach().cpu().clone())

        # Fresh samples of half 1, against the independent half 2.
        for gi in range(p.fresh_noise_groups):
            seq = self._seq_grads(fresh[gi])
            for row in seq:
                self._noise(step, 0, 0.0, _sq(row - g2), half_err, UNIT_SEQUENCE,
                            SOURCE_FRESH, step, 0)
            self._noise(step, 0, 0.0, _sq(seq.mean(0) - g2), half_err, UNIT_GROUP,
                        SOURCE_FRESH, step, 0)

        buffer_seq_sq = self._buffer_samples(step, theta, g_ref, ref_err, grad_sq)
        self._crn_bias(step, theta, problems[:p.crn_groups], uniforms[:p.crn_groups * g],
                       fresh_g[:p.crn_groups], g_ref, grad_sq)
        sigma_bar2 = float(np.mean(buffer_seq_sq)) if buffer_seq_sq else 0.0
        self._ref = (g_ref, ref_err, sigma_bar2)
        self.seconds += time.perf_counter() - t0

    def _noise(self, step, staleness, drift, sq, ref_err, unit, source, insert_step, uses):
        self.rows["noise"].append({"probe_step": step, "staleness": staleness, "drift": drift,
                                   "sq_noise": sq, "ref_sq_error": ref_err, "unit": unit,
                                   "source": source, "insert_step": insert_step,
                                   "uses": uses})

    def _buffer_samples(self, step, theta, g_ref, ref_err, grad_sq) -> list[float]:
        """Noise, coupling and buffer-based bias rows; returns the sequences' sq noise."""
        e, p = self.exp, self.cfg.probe
        groups = defaultdict(list)
        for r in e.buffer.rollouts():
            groups[r.group_id].append(r)
        size = self.cfg.schedule.group_size
        candidates = [gid for gid, rs in groups.items()
                      if len(rs) == size and rs[0].version in e.weights.snapshots]
        if not candidates or not p.buffer_groups:
            return []
        insert = {gid: int(e.buffer.index.metadata([groups[gid][0].item_id])["insert_step"][0])
                  for gid in candidates}
        candidates.sort(key=lambda gid: (insert[gid], gid))
        pick = np.unique(np.round(np.linspace(0, len(candidates) - 1,
                                              min(p.buffer_groups, len(candidates)))))
        chosen = [candidates[int(i)] for i in pick]
        seq_eps, seq_group, group_eps, seq_sq = [], [], [], []
        for gid in chosen:
            rs = groups[gid]
            eps = self._seq_grads(rs) - g_ref
            version = rs[0].version
            drift = self._drift(theta, version)
            uses = e.buffer.index.metadata([r.item_id for r in rs])["uses"]
            for row, u in zip(eps, uses):
                sq = _sq(row)
                seq_sq.append(sq)
                self._noise(step, step - version, drift, sq, ref_err, UNIT_SEQUENCE,
                            SOURCE_BUFFER, insert[gid], int(u))
            ge = eps.mean(0)
            self._noise(step, step - version, drift, _sq(ge), ref_err, UNIT_GROUP,
                        SOURCE_BUFFER, insert[gid], float(np.mean(uses)))
            seq_eps.append(eps)
            seq_group += [gid] * len(rs)
            group_eps.append(ge)
        meta = {"ins": [insert[gid] for gid in chosen],
                "stale": [step - groups[gid][0].version for gid in chosen],
                "drift": [self._drift(theta, groups[gid][0].version) for gid in chosen]}
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
                "n_samples": len(idx), "mean_sq": _sq(m),
                "noise_sq": float(np.mean([_sq(G[i]) for i in idx])), "grad_sq": grad_sq,
                "cos_grad": _cos(m, g_ref), "ref_sq_error": ref_err, "unit": UNIT_GROUP,
                "method": METHOD_BUFFER, "indep_noise_sq": 0.0})
        return seq_sq

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
                "buffer_size": self.exp.buffer.index.capacity / per,
                "rollouts_per_step": self.exp.production.rollouts_per_step / per,
                "unit": unit})

    def _crn_bias(self, step, theta, problems, uniforms, fresh_g, g_ref, grad_sq) -> None:
        """Regenerate the same prompts with the same uniforms from old snapshots (method 1)."""
        e = self.exp
        n = len(problems)
        if n == 0:
            return
        for s in self.cfg.probe.crn_staleness:
            version = step - s
            if version < 0 or version not in e.weights.snapshots:
                continue
            old = self._generate(problems, uniforms, e.weights.update(version), -1)
            old_g = self._group_grads(old)
            d = old_g - fresh_g
            m = d.mean(0)
            unpaired = old_g - fresh_g.roll(1, 0) if n > 1 else d
            self.rows["bias"].append({
                "probe_step": step, "staleness": s, "drift": self._drift(theta, version),
                "n_samples": n, "mean_sq": _sq(m),
                "noise_sq": float(np.mean([_sq(x) for x in d])), "grad_sq": grad_sq,
                "cos_grad": _cos(m, g_ref), "ref_sq_error": 0.0, "unit": UNIT_GROUP,
                "method": METHOD_CRN,
                "indep_noise_sq": float(np.mean([_sq(x) for x in unpaired]))})

    def add_minibatch(self, step: int, grad: torch.Tensor) -> None:
        """Minibatch noise of the training batch of ``step`` against this probe's g_ref."""
        g_ref, ref_err, sigma_bar2 = self._ref
        sc, prod = self.cfg.schedule, self.exp.production
        r = prod.rollouts_per_step
        self.rows["minibatch"].append({
            "probe_step": step, "horizon": self.exp.buffer.index.capacity / r,
            "replay_ratio": sc.batch_size / r, "batch_size": sc.batch_size,
            "buffer_size": self.exp.buffer.index.capacity, "rollouts_per_step": r,
            "sq_error": _sq(grad.to(g_ref.device) - g_ref), "ref_sq_error": ref_err,
            "sigma_bar2": sigma_bar2, "grad_sq": self._smooth[0],
            "grad_change_sq": self._smooth[1], "drift_prev": self._smooth[2]})
