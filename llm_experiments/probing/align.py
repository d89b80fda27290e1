"""A stale rollout's worth through grad F, measured on large panels (theory.md section 11.15).

align(g) = <E G(theta_t, z_b), grad F(theta_t)> / ||grad F(theta_t)||^2 for rollouts z_b made at
a birth step b and used once at t = b + g (1 for a fresh rollout). The panels of ``panel.py``
estimate it from per-sample gradients, which cost a gradient per sequence: at one sequence's
signal-to-noise ratio of ~0.003 (11.13) their 256 sequences leave align(0) at 1.20 [0.83, 1.58].
Only inner products with grad F are needed, and those of a mean are means of inner products,
so here an align panel of ``probe.align_groups`` groups, made at each of ``probe.panel_births``
and never trained on, is measured at each ``probe.panel_gaps`` through the gradients of the
mean loss of ``probe.align_chunks`` chunks of whole groups (one backward pass per chunk, not
per sequence), against a reference of ``probe.align_ref_groups`` fresh groups in as many
chunks:

* ``panel`` rows (part 0), one per (panel chunk k, reference chunk a): <m_k, r_a>, m_k the
  chunk's mean gradient at theta_t, r_a the reference chunk's;
* ``reference`` rows (part 1), one per pair a < b of reference chunks: <r_a, r_b>, an unbiased
  estimate of ||grad F||^2 (independent chunks).

align(g) is the ratio of their means; panel chunks and reference chunks are the units a
bootstrap resamples (``replaytheory.fit.panel_fit.fit_align``), the reference's jointly in
both means, since its noise enters both. Rows go to the ``align`` probe table; the measure
at the birth step itself (gap 0) checks the estimator against its known value 1.
"""

from __future__ import annotations

import numpy as np
import torch

from ..rl.losses import collate, policy_loss, token_logprobs
from ..engines.seeds import ALIGN_STREAM, derived_seed

PART_PANEL, PART_REFERENCE = 0, 1


class AlignProbe:
    """The align panels of one run, measured through its ``probes.Prober`` (which owns the
    sampler and the run's view)."""

    def __init__(self, prober):
        self.prober, self.cfg = prober, prober.cfg
        self.panels: dict[int, list] = {}  # birth step -> the panel's rollouts

    def due(self, step: int) -> bool:
        """Whether step ``step`` births an align panel or measures one."""
        p = self.cfg.probe
        if not p.align_groups:
            return False
        return step in p.panel_births or any(step - b in p.panel_gaps for b in self.panels)

    def state_dict(self) -> dict:
        """The panels' rollouts, for a checkpoint."""
        return {"panels": self.panels}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore ``state_dict``'s panels (none from a checkpoint without them)."""
        self.panels = dict(state["panels"]) if state else {}

    def _fresh(self, groups: int, rng: np.random.Generator) -> list:
        """``groups`` on-policy groups at the current weights, drawn with ``rng``."""
        pr, g = self.prober, self.cfg.schedule.group_size
        problems = pr.run.sample_problems(groups, rng)
        uniforms = rng.random((groups * g, self.cfg.sampler.max_new_tokens))
        made = pr.generate(problems, uniforms, pr.run.current_weights(), 0)
        return [r for grp in made for r in grp]

    def _chunk_means(self, rollouts: list):
        """Yield the flat float64 gradient (P,) of the mean training loss of each of
        ``probe.align_chunks`` equal chunks of ``rollouts`` (whole groups: they are stored
        group by group), at the current weights; its (k,) count sketch under
        ``probe.sketch_dim`` = k > 0 (inner products unbiased, theory.md 8.1.1), which a model
        too large to hold 2 x align_chunks exact gradients needs."""
        run = self.prober.run
        params = [q for q in run.model.parameters() if q.requires_grad]
        for part in np.array_split(np.arange(len(rollouts)), self.cfg.probe.align_chunks):
            batch = collate([rollouts[i] for i in part], self.prober.pad_id, run.device)
            logp, _ = token_logprobs(run.model(input_ids=batch.input_ids).logits, batch,
                                     self.cfg.sampler.temperature)
            loss = policy_loss(logp, batch, **run.loss_kwargs).mean()
            grads = torch.autograd.grad(loss, params)
            yield self.prober.project.rows([gr[None] for gr in grads])[0].double()

    def measure(self, step: int) -> None:
        """Birth and/or measure the align panels due at ``step`` (weights theta_step, before
        its update)."""
        p = self.cfg.probe
        rng = np.random.default_rng(derived_seed(self.cfg.run.seed, step, ALIGN_STREAM))
        if step in p.panel_births and step not in self.panels:
            self.panels[step] = self._fresh(p.align_groups, rng)
        due = [b for b in sorted(self.panels) if step - b in p.panel_gaps or step == b]
        if due:
            ref = torch.stack(list(self._chunk_means(self._fresh(p.align_ref_groups, rng))))
            gram = (ref @ ref.T).cpu().numpy()
            a, b = np.triu_indices(len(gram), 1)
            n_ref = p.align_ref_groups * self.cfg.schedule.group_size
            for birth in due:
                rollouts = self.panels[birth]
                base = {"probe_step": step, "birth_step": birth, "gap": step - birth}
                rows = [{**base, "part": PART_REFERENCE, "chunk": int(i), "other": int(j),
                         "value": float(gram[i, j]), "n_seq": n_ref} for i, j in zip(a, b)]
                for k, m in enumerate(self._chunk_means(rollouts)):
                    rows += [{**base, "part": PART_PANEL, "chunk": k, "other": i,
                              "value": float(v), "n_seq": len(rollouts)}
                             for i, v in enumerate((ref @ m).cpu().numpy())]
                self.prober.rows["align"].extend(rows)
        last = max(p.panel_gaps)
        self.panels = {b: v for b, v in self.panels.items() if step - b < last}
