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
  estimate of ||grad F||^2 (independent chunks);
* with ``probe.align_variants``, panel rows under each variant loss (part 2 + its index in
  ``ALIGN_VARIANTS``: the importance ratio without the clip, or neither), from the same
  forward pass, and one ``align_stats`` row per panel chunk (clip fraction, importance
  ratios): what separates the ratio's and the clip's part in align from the rollouts' own
  (theory.md 11.16);
* with ``probe.align_moments``, ``align_pairs`` rows: <m_k, m_l> (k <= l) per loss and
  ||r_a||^2, from which ``align_fit.fit_align_moments`` estimates the stale bias and the
  per-sequence noise by gap.

align(g) is the ratio of their means; panel chunks and reference chunks are the units a
bootstrap resamples (``replaytheory.fit.align_fit.fit_align``), the reference's jointly in
both means, since its noise enters both. Rows go to the ``align`` probe table; the measure
at the birth step itself (gap 0) checks the estimator against its known value 1.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from replaytheory.fit.probes import ALIGN_PANEL, ALIGN_REFERENCE, align_part

from ..rl.losses import collate, loss_stats, policy_loss, token_logprobs
from ..engines.seeds import ALIGN_STREAM, derived_seed


def variant_losses(logp, batch, loss_kwargs: dict, variants) -> list:
    """Per-sequence losses (n,): the training loss's (``loss_kwargs``), then each variant's
    (``ALIGN_VARIANTS``): "unclipped", the importance-weighted loss without its clip;
    "ratio_one", the same with the ratio held at 1 (gradient -A grad log pi per token)."""
    out = [policy_loss(logp, batch, **loss_kwargs)]
    plain = {**loss_kwargs, "loss": "grpo_unclipped"}
    for v in variants:
        at = replace(batch, old_logp=logp.detach()) if v == "ratio_one" else batch
        out.append(policy_loss(logp, at, **plain))
    return out


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

    def _chunk_means(self, rollouts: list, variants=()):
        """Yield, for each of ``probe.align_chunks`` equal chunks of ``rollouts`` (whole
        groups: they are stored group by group), the flat float64 gradients (P,) of the mean
        training loss and of each of ``variants``' (``variant_losses``) at the current
        weights, as a list, and, with variants, the chunk's ``losses.loss_stats`` with its
        mean importance ratio (None without). Under ``probe.sketch_dim`` = k > 0 a gradient is its (k,) count sketch (inner
        products unbiased, theory.md 8.1.1), which a model too large to hold 2 x align_chunks
        exact gradients needs."""
        run = self.prober.run
        kw = run.loss_kwargs
        params = [q for q in run.model.parameters() if q.requires_grad]
        for part in np.array_split(np.arange(len(rollouts)), self.cfg.probe.align_chunks):
            batch = collate([rollouts[i] for i in part], self.prober.pad_id, run.device)
            logp, _ = token_logprobs(run.model(input_ids=batch.input_ids).logits, batch,
                                     self.cfg.sampler.temperature)
            losses = variant_losses(logp, batch, kw, variants)
            grads = []
            for i, loss in enumerate(losses):
                g = torch.autograd.grad(loss.mean(), params, retain_graph=i < len(losses) - 1)
                grads.append(self.prober.project.rows([gr[None] for gr in g])[0].double())
            if not variants:
                yield grads, None
                continue
            stats = loss_stats(logp.detach(), torch.zeros_like(logp), batch, kw["clip_low"],
                               kw["clip_high"])
            ratio = (logp.detach() - batch.old_logp)[batch.mask].double().exp()
            yield grads, {**stats, "mean_ratio": float(ratio.mean())}

    def measure(self, step: int) -> None:
        """Birth and/or measure the align panels due at ``step`` (weights theta_step, before
        its update)."""
        p = self.cfg.probe
        rng = np.random.default_rng(derived_seed(self.cfg.run.seed, step, ALIGN_STREAM))
        if step in p.panel_births and step not in self.panels:
            self.panels[step] = self._fresh(p.align_groups, rng)
        due = [b for b in sorted(self.panels) if step - b in p.panel_gaps or step == b]
        if due:
            ref = torch.stack([g[0] for g, _ in
                               self._chunk_means(self._fresh(p.align_ref_groups, rng))])
            gram = (ref @ ref.T).cpu().numpy()
            a, b = np.triu_indices(len(gram), 1)
            n_ref = p.align_ref_groups * self.cfg.schedule.group_size
            for birth in due:
                base = {"probe_step": step, "birth_step": birth, "gap": step - birth}
                ref_base = {**base, "part": ALIGN_REFERENCE, "n_seq": n_ref}
                self.prober.rows["align"].extend(
                    {**ref_base, "chunk": int(i), "other": int(j), "value": float(gram[i, j])}
                    for i, j in zip(a, b))
                if p.align_moments:
                    self.prober.rows["align_pairs"].extend(
                        {**ref_base, "chunk": i, "other": i, "value": float(gram[i, i])}
                        for i in range(len(gram)))
                self._measure_panel(self.panels[birth], ref, base)
        last = max(p.panel_gaps)
        self.panels = {b: v for b, v in self.panels.items() if step - b < last}

    def _measure_panel(self, rollouts: list, ref: torch.Tensor, base: dict) -> None:
        """The panel rows of one measurement (``base``: probe_step, birth_step, gap) against
        the reference chunks' mean gradients ``ref`` (chunks, P), under the training loss
        and each of ``probe.align_variants``; its ``align_stats`` rows with variants, and
        with ``probe.align_moments`` its ``align_pairs`` rows (every chunk's gradients held
        until the last chunk is done)."""
        p = self.cfg.probe
        parts = [ALIGN_PANEL] + [align_part(v) for v in p.align_variants]
        panel_base = {**base, "n_seq": len(rollouts)}
        held = {part: [] for part in parts}
        for k, (grads, stats) in enumerate(self._chunk_means(rollouts, p.align_variants)):
            for part, m in zip(parts, grads):
                self.prober.rows["align"].extend(
                    {**panel_base, "part": part, "chunk": k, "other": i, "value": float(v)}
                    for i, v in enumerate((ref @ m).cpu().numpy()))
                if p.align_moments:
                    held[part].append(m)
            if p.align_variants:
                self.prober.rows["align_stats"].append(
                    {**base, "chunk": k, **{c: stats[c] for c in
                     ("clip_fraction", "is_ess", "approx_kl", "mean_ratio")},
                     "n_seq": len(rollouts) // p.align_chunks})
        if p.align_moments:
            for part, chunks in held.items():
                m = torch.stack(chunks)
                gram = (m @ m.T).cpu().numpy()
                self.prober.rows["align_pairs"].extend(
                    {**panel_base, "part": part, "chunk": int(i), "other": int(j),
                     "value": float(gram[i, j])} for i, j in zip(*np.triu_indices(len(m))))
