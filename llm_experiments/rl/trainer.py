"""The trainer's side of a run: grading a generation into rollouts with group advantages, and
the policy update (theory.md section 6). Shared by the emulated run (``experiment.Experiment``)
and the Ray engine's trainer actors (``engines.ray_engine``), which therefore import neither
each other."""

from __future__ import annotations

import time

import numpy as np
import torch

from .buffer import Rollout
from ..config import OPTIMIZERS, Config
from .gradients import clipped_mean_grad, flat_grad
from .memory import ModelShape, budget_bytes, choose_micro_batch, logit_chunk, trainer_bytes
from .losses import (SequenceBatch, TokenBatch, batch_logprobs, collate, collate_direct,
                     group_advantages, loss_stats, policy_loss, update_terms)
from .objectives import BATCH_MASKED
from ..policy.models import DTYPES, autocast


def grade_rollouts(cfg: Config, task, tokenizer, encode, problems, gen, version: int,
                   first_item: int, first_group: int) -> list[Rollout]:
    """Rollouts of a generation ``gen`` of ``problems`` (each repeated G times) made with
    weight ``version``: completions graded by ``task``, advantages computed once per group of
    G (theory.md section 6), item ids from ``first_item``, group ids from ``first_group``.
    ``encode(problem)`` gives the prompt ids."""
    g = cfg.schedule.group_size
    texts = [tokenizer.decode(gen.completion(i), skip_special_tokens=True)
             for i in range(len(gen.lengths))]
    rewards = np.array([task.reward(problems[i // g], t) for i, t in enumerate(texts)])
    adv = group_advantages(rewards.reshape(-1, g), cfg.trainer.loss,
                           cfg.trainer.dv).reshape(-1)
    out = []
    for i in range(len(texts)):
        p = problems[i // g]
        out.append(Rollout(item_id=first_item + i, group_id=first_group + i // g,
                           problem_id=p.pid, version=version,
                           prompt=np.asarray(encode(p), dtype=np.int32),
                           completion=gen.completion(i).copy(),
                           logprobs=gen.logprobs[i, :gen.lengths[i]].copy(),
                           reward=float(rewards[i]), advantage=float(adv[i])))
    return out


def loss_kwargs(cfg: Config) -> dict:
    """Keyword arguments of ``losses.policy_loss`` for the run's training loss."""
    tr = cfg.trainer
    return {"loss": tr.loss, "clip_low": tr.clip_low, "clip_high": tr.clip_high,
            "is_cap": tr.is_cap, "cispo_cap": tr.cispo_cap, "m2_threshold": tr.m2_threshold,
            "max_new_tokens": cfg.sampler.max_new_tokens}


def row_logr2(logp, batch, below_p: float = 1.0) -> np.ndarray:
    """Each rollout's mean (log r)^2 (n,), nats^2, at the weights ``logp`` (n, L) was computed
    with: the adaptive horizon's statistic (theory.md 12.4), over its completion tokens, or
    with ``below_p`` < 1 (a probability in (0, 1]) over those whose sampling probability was
    below it (12.7; a rollout with none scores 0)."""
    m = batch.mask.double()
    if below_p < 1:
        m = m * (batch.old_logp.double() < np.log(below_p))
    sq = ((logp.detach().double() - batch.old_logp.double()) ** 2) * m
    return (sq.sum(-1) / m.sum(-1).clamp(min=1)).cpu().numpy()


def uncertain_share(batch, below_p: float) -> float:
    """The share of the batch's completion tokens whose sampling probability was below
    ``below_p`` (in (0, 1]): the tokens ``row_logr2`` reads at that bound (theory.md 12.7)."""
    m = batch.mask
    return float(((batch.old_logp < np.log(below_p)) & m).sum() / m.sum().clamp(min=1))


def head_grad_norm(model) -> float | None:
    """Norm of the output layer's gradient before clipping (DGG: it spikes before a
    collapse), or None when the model has no ``lm_head`` with a gradient. With tied
    embeddings this is the shared matrix's gradient, input side included."""
    head = getattr(model, "lm_head", None)
    grad = getattr(getattr(head, "weight", None), "grad", None)
    return None if grad is None else float(grad.detach().double().norm())


class PolicyTrainer:
    """The trainer's update (theory.md section 6), shared by the emulated run (``Experiment``)
    and the Ray engine's trainer actors (``engines.ray_engine``).

    Needs the attributes cfg, model, opt, tokenizer, device, direct, loss_kwargs and clock
    (a ``ComputeClock``).
    """

    def setup_update(self) -> None:
        """The optimizer over ``self.model`` and the loss's keyword arguments, from
        ``self.cfg.trainer``."""
        tr = self.cfg.trainer
        opt_cls = getattr(torch.optim, OPTIMIZERS[tr.optimizer])
        self.opt = opt_cls(self.model.parameters(), lr=tr.lr, betas=(tr.beta1, tr.beta2),
                           weight_decay=tr.weight_decay, fused=self.cfg.run.fast_kernels or None)
        self.loss_kwargs = loss_kwargs(self.cfg)
        self.shape = ModelShape.of(self.model)
        self.logit_chunk = tr.logit_chunk or logit_chunk(self.shape.vocab)

    @torch.no_grad()
    def log_ratios(self, rollouts: list[Rollout]) -> np.ndarray:
        """log(pi_trainer / pi_behaviour) of every valid completion token of ``rollouts``
        (float64, flattened), scored as the update scores them (collation, autocast). For
        rollouts just made from the trainer's weights this is the precision floor under
        every importance ratio: ~1e-7 in float32, ~1e-3 for a bfloat16 sampler copy of a
        tiny model, growing with width (issue 28; ``benchmarks.gpu`` measures it at 0.3B
        and 0.74B)."""
        pad = self.tokenizer.pad_token_id
        batch = collate_direct(rollouts, self.cfg.run.train_layout, pad, self.device) \
            if self.direct else collate(rollouts, pad, self.device)
        with autocast(self.cfg, self.device):
            logp, _ = batch_logprobs(self.model, batch, self.cfg.sampler.temperature,
                                     self.logit_chunk)
        return (logp.double() - batch.old_logp.double())[batch.mask].cpu().numpy()

    def micro_batch(self, batch) -> int:
        """Rows per forward/backward pass: ``trainer.micro_batch``, else the largest whose
        predicted peak fits the memory budget (``memory.choose_micro_batch``): on a CUDA
        device what is free there, for every process, plus the trainer's own state
        (``memory.budget_bytes``)."""
        tr = self.cfg.trainer
        if tr.micro_batch:
            return tr.micro_batch
        width = batch.input_ids.shape[1] if isinstance(batch, (TokenBatch, SequenceBatch)) else \
            batch.prompt_ids.shape[1] + batch.targets.shape[1]
        return choose_micro_batch(self.shape, len(batch), width,
                                  budget_bytes(tr.memory_gb, self.device,
                                               trainer_bytes(self.model, self.opt,
                                                             self.device)),
                                  compute_bytes=DTYPES[self.cfg.model.dtype].itemsize,
                                  chunk=self.logit_chunk)

    def reduce_gradients(self) -> None:
        """Average the gradient over data-parallel trainers; one process holding the whole
        batch has nothing to average."""

    def train_step(self, rollouts: list[Rollout], keep_grad: bool) -> dict:
        """One optimizer update on the batch; returns loss statistics (and the raw gradient
        as ``grad`` when ``keep_grad``, for the minibatch-noise probe)."""
        tr, temp = self.cfg.trainer, self.cfg.sampler.temperature
        self.model.train()
        t0 = time.perf_counter()
        pad = self.tokenizer.pad_token_id
        batch = collate_direct(rollouts, self.cfg.run.train_layout, pad, self.device) \
            if self.direct and not tr.per_sample_clip else collate(rollouts, pad, self.device)
        n = len(batch)
        self.opt.zero_grad(set_to_none=True)
        micro = self.micro_batch(batch)
        terms = self.split_terms(batch) if micro < n else None
        logps, ents, losses = [], [], []
        for start in range(0, n, micro):
            part = batch.rows(slice(start, start + micro))
            with autocast(self.cfg, self.device):
                logp, ent = batch_logprobs(self.model, part, temp, self.logit_chunk)
            loss = policy_loss(logp, part, **self.loss_kwargs, terms=terms and
                               terms.rows(slice(start, start + micro))).sum() / n
            if not tr.per_sample_clip:
                loss.backward()
            losses.append(loss.detach())  # read once, after the loop: no sync per micro-batch
            logps.append(logp.detach())
            ents.append(ent.detach())
        if tr.per_sample_clip:
            self._per_sample_clipped_grad(batch)
        self.reduce_gradients()
        logp = torch.cat(logps)
        stats = loss_stats(logp, torch.cat(ents), batch, tr.clip_low, tr.clip_high,
                           loss_kwargs=self.loss_kwargs, terms=terms)
        if self.cfg.buffer.drop_logr2 > 0:
            below_p = self.cfg.buffer.drop_tokens_below_p
            stats["row_logr2"] = row_logr2(logp, batch, below_p)
            if below_p < 1:  # how much of the batch the restricted statistic reads (12.7)
                stats["uncertain_share"] = uncertain_share(batch, below_p)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if keep_grad:
            stats["grad"] = flat_grad(self.model)
        stats["head_grad_norm"] = head_grad_norm(self.model)
        clip = tr.grad_clip if tr.grad_clip > 0 else float("inf")
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, clip))
        self.opt.step()
        if self.device.type == "cuda":  # the optimizer's kernels are part of the update's time
            torch.cuda.synchronize(self.device)
        self.clock.train_seconds += time.perf_counter() - t0
        self.clock.train_tokens += int(sum(len(r.prompt) + len(r.completion) for r in rollouts))
        self.clock.steps += 1
        stats["loss"] = sum(torch.stack(losses).tolist())
        return stats

    @torch.no_grad()
    def split_terms(self, batch):
        """The whole batch's ``objectives.BatchTerms`` when it is split into micro-batches:
        m2po's mask needs every row's log-ratio first (one forward pass without a graph);
        the others only the batch's mask."""
        if self.cfg.trainer.loss not in BATCH_MASKED:
            return update_terms(None, batch, self.loss_kwargs)
        micro, temp = self.micro_batch(batch), self.cfg.sampler.temperature
        parts = []
        for start in range(0, len(batch), micro):
            with autocast(self.cfg, self.device):
                parts.append(batch_logprobs(self.model, batch.rows(slice(start, start + micro)),
                                            temp, self.logit_chunk)[0].float())
        return update_terms(torch.cat(parts), batch, self.loss_kwargs)

    def _per_sample_clipped_grad(self, batch) -> None:
        """Set .grad to the mean of per-rollout gradients clipped to trainer.per_sample_clip."""
        total = clipped_mean_grad(self.model, batch, self.loss_kwargs,
                                  self.cfg.sampler.temperature, self.cfg.trainer.per_sample_clip,
                                  self.cfg.probe.chunk)
        offset = 0
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = total[offset:offset + p.numel()].view_as(p).to(p.dtype).clone()
                offset += p.numel()


