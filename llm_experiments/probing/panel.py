"""Long-range panel probes: what a rollout is worth many steps after it was made.

The buffer probes of ``probes.py`` read the rollouts a run keeps, so they see staleness only up
to the run's own horizon, with staleness and use count confounded. A panel separates them and
reaches any staleness: at a birth step b the prober generates ``probe.panel_groups`` on-policy
groups (its own random stream, behaviour log-probs stored as for training) that are never
trained on, and at each step b + g, g in ``probe.panel_gaps``, measures them again at the
current weights theta_t against a fresh reference gradient g_ref(t) (theory.md section 11.1):

* ``panel`` rows (per sequence and per group): the noise eps_t(z) = G(theta_t, z) - g_ref(t)
  at staleness g and use count 0; its inner product with the same rollout's noise at birth,
  eps_b(z) = G(theta_b, z) - g_ref(b) (the self-correlation c(g)), and with its group mates'
  noise at birth (the cross-time group correlation); the share of its unclipped gradient that
  the clipped loss keeps, with the clip fraction and the importance weight.
* ``diversity`` rows (per panel and gap): mean squared noise and the mean inner products of
  pairs of sequences in the same group and in different groups, from which the variance of a
  batch of B sequences holding D distinct prompts follows (section 11.2).
* ``bias`` rows (method 2): the panel's mean noise, a stale-bias estimate with n = the panel's
  groups, as section 8.9.4 reads buffer rows.

The birth noise is recomputed at each measurement from the kept birth weights and reference,
so a panel costs a few megabytes, not a copy of every per-sample gradient (and its kept
reference is a k-vector under ``probe.sketch_dim``, theory.md section 8.1.1).
"""

from __future__ import annotations

import numpy as np
import torch

from replaytheory.fit.probes import UNIT_GROUP, UNIT_SEQUENCE

from ..rl.gradients import cosine, kept_share, sq_norm
from ..rl.losses import collate, loss_stats, token_logprobs
from ..engines.seeds import PANEL_STREAM, derived_seed

METHOD_PANEL = 2  # ``bias.method`` of panel rows (0 buffer, 1 common random numbers)



def pair_means(eps: torch.Tensor, group: np.ndarray) -> tuple[float, float]:
    """Mean inner product over ordered pairs of distinct rows of ``eps`` ((n, P)) in the same
    group and in different groups (``group``: (n,) labels); 0 where there are no such pairs."""
    gram = (eps @ eps.T).double().cpu().numpy()
    same = group[:, None] == group[None, :]
    np.fill_diagonal(same, False)
    other = group[:, None] != group[None, :]
    within = float(gram[same].mean()) if same.any() else 0.0
    across = float(gram[other].mean()) if other.any() else 0.0
    return within, across


class PanelProbe:
    """The panels of one run, measured through its ``probes.Prober`` (which owns the sampler,
    the per-sample gradients and the reference gradient)."""

    def __init__(self, prober):
        self.prober, self.cfg = prober, prober.cfg
        self.panels: dict[int, dict] = {}  # birth step -> {"rollouts", "g_ref", "ref_err"}

    def due(self, step: int) -> bool:
        """Whether step ``step`` births a panel or measures one."""
        p = self.cfg.probe
        if not p.panel_groups:
            return False
        return step in p.panel_births or any(step - b in p.panel_gaps for b in self.panels)

    def versions_needed(self) -> set[int]:
        """Birth weight versions of the panels that still have a gap to measure."""
        return set(self.panels)

    def state_dict(self) -> dict:
        """The panels (rollouts, birth reference) for a checkpoint."""
        return {"panels": self.panels}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore ``state_dict``'s panels (none from a checkpoint without them)."""
        self.panels = dict(state["panels"]) if state else {}

    def measure(self, step: int) -> None:
        """Birth and/or measure the panels due at ``step`` (weights theta_step, before its
        update)."""
        p, g = self.cfg.probe, self.cfg.schedule.group_size
        rng = np.random.default_rng(derived_seed(self.cfg.run.seed, step, PANEL_STREAM))
        ref = self.prober.reference(rng)
        if step in p.panel_births and step not in self.panels:
            problems = self.prober.run.sample_problems(p.panel_groups, rng)
            uniforms = rng.random((p.panel_groups * g, self.cfg.sampler.max_new_tokens))
            groups = self.prober.generate(problems, uniforms,
                                          self.prober.run.current_weights(), 0)
            self.panels[step] = {"rollouts": [r for grp in groups for r in grp],
                                 "g_ref": ref.g_ref.detach().cpu().clone(),
                                 "ref_err": ref.ref_err}
        for birth, panel in sorted(self.panels.items()):
            if step - birth in p.panel_gaps or step == birth:
                self._measure_panel(step, birth, panel, ref)
        last = max(p.panel_gaps)
        self.panels = {b: v for b, v in self.panels.items() if step - b < last}

    def _measure_panel(self, step, birth, panel, ref) -> None:
        pr, run = self.prober, self.prober.run
        rollouts = panel["rollouts"]
        group = np.array([r.group_id for r in rollouts])
        now = pr.seq_grads(rollouts)
        unclipped = pr.seq_grads(rollouts, loss_kwargs={**run.loss_kwargs,
                                                        "loss": "grpo_unclipped"})
        eps = now - ref.g_ref
        if step == birth:
            then = eps
        else:
            names = [n for n, q in run.model.named_parameters() if q.requires_grad]
            snap = run.snapshot(birth).state
            params = {n: snap[n].to(run.device) for n in names}
            then = pr.seq_grads(rollouts, params=params) - panel["g_ref"].to(eps.device)
        kept = self._kept(rollouts, now, unclipped)
        cross = (eps @ then.T).double().cpu().numpy()
        same = group[:, None] == group[None, :]
        base = {"probe_step": step, "birth_step": birth, "gap": step - birth,
                "ref_sq_error": ref.ref_err, "ref_sq_error_birth": panel["ref_err"]}
        for i in range(len(rollouts)):
            mates = same[i].copy()
            mates[i] = False
            pr.rows["panel"].append({
                **base, "unit": UNIT_SEQUENCE, "group": float(group[i]),
                "sq_noise": sq_norm(eps[i]), "sq_birth": sq_norm(then[i]), "inner_birth": cross[i, i],
                "inner_mates": float(cross[i, mates].sum()), "n_mates": int(mates.sum()),
                **kept[i]})
        labels = sorted(set(group.tolist()))
        group_eps, group_then = [], []
        for gid in labels:
            rows = group == gid
            ge, gt = eps[rows].mean(0), then[rows].mean(0)
            group_eps.append(ge)
            group_then.append(gt)
            pr.rows["panel"].append({
                **base, "unit": UNIT_GROUP, "group": float(gid), "sq_noise": sq_norm(ge),
                "sq_birth": sq_norm(gt), "inner_birth": float(torch.dot(ge.double(), gt.double())),
                "inner_mates": 0.0, "n_mates": 0,
                **self._kept_row(now[rows].mean(0), unclipped[rows].mean(0),
                                 np.mean([k["clip_fraction"] for k, r in zip(kept, rows) if r]),
                                 np.mean([k["is_weight"] for k, r in zip(kept, rows) if r]))})
        within, across = pair_means(eps, group)
        pr.rows["diversity"].append({
            **base, "n_groups": len(labels), "group_size": len(rollouts) / len(labels),
            "mean_sq": float(np.mean([sq_norm(e) for e in eps])), "within_inner": within,
            "across_inner": across})
        stacked = torch.stack(group_eps)
        m = stacked.mean(0)
        pr.rows["bias"].append({
            "probe_step": step, "staleness": step - birth,
            "drift": pr.drift(ref.theta, birth), "n_samples": len(labels),
            "mean_sq": sq_norm(m), "noise_sq": float(np.mean([sq_norm(e) for e in stacked])),
            "grad_sq": ref.grad_sq, "cos_grad": cosine(m, ref.g_ref),
            "ref_sq_error": ref.ref_err, "unit": UNIT_GROUP, "method": METHOD_PANEL,
            "indep_noise_sq": 0.0})

    def _kept(self, rollouts, grads, unclipped) -> list[dict]:
        """Per sequence: kept share of the unclipped gradient, clip fraction, mean ratio."""
        run, kw = self.prober.run, self.prober.run.loss_kwargs
        batch = collate(rollouts, self.prober.pad_id, run.device)
        with torch.no_grad():
            logp, entropy = token_logprobs(run.model(input_ids=batch.input_ids).logits, batch,
                                           self.cfg.sampler.temperature)
        out = []
        for i in range(len(rollouts)):
            sub = batch.rows(slice(i, i + 1))
            clip = loss_stats(logp[i:i + 1], entropy[i:i + 1], sub, kw["clip_low"],
                              kw["clip_high"])["clip_fraction"]
            ratio = torch.exp(logp[i:i + 1] - sub.old_logp)[sub.mask]
            out.append(self._kept_row(grads[i], unclipped[i], clip,
                                      float(ratio.double().mean())))
        return out

    @staticmethod
    def _kept_row(kept, full, clip, is_weight) -> dict:
        share, sq_full = kept_share(kept, full)
        return {"contribution": share, "sq_unclip": sq_full, "clip_fraction": float(clip),
                "is_weight": float(is_weight)}

