"""Gradients as flat vectors: per-sample gradients (torch.func), their clipped mean, and the
model's current gradient and parameters flattened.

The training loss is a mean over sequences of a per-sequence loss (``losses.policy_loss``), so
the batch gradient is exactly the mean of the per-sample gradients computed here (the theory's
g_t, a mean of B estimates, theory.md section 4). The probes measure their noise from these;
the trainer uses ``clipped_mean_grad`` for per-sample clipping. A flat vector lists the
trainable parameters in ``model.parameters()`` order; all vectors are float32.
"""

from __future__ import annotations

import torch

from ..policy.kernels import default_linear
from .losses import TokenBatch, policy_loss, token_logprobs, update_terms
from .objectives import BATCH_MASKED, BatchTerms
from ..probing.sketch import Exact


class eager_attention:
    """Context manager: switch a transformers model to eager attention (vmap-able), then back."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.before = self.model.config._attn_implementation
        if self.before != "eager":
            self.model.set_attn_implementation("eager")
        return self.model

    def __exit__(self, *exc):
        if self.before != "eager":
            self.model.set_attn_implementation(self.before)


def per_sample_grads(model, batch: TokenBatch, loss_kwargs: dict, temperature: float,
                     chunk: int = 16, params: dict | None = None, project=None):
    """Yield (start, grads) with grads a (c, P) float32 matrix of flattened per-sequence
    gradients of ``policy_loss`` for rows start..start+c of the batch (torch.func; eager
    attention and the default linear kernel, which vmap supports).

    loss_kwargs: keyword arguments of ``policy_loss``; temperature > 0; chunk >= 1: rows per
    vmap call (memory ~ chunk copies of the parameters). ``params``: parameters to
    differentiate at (default: the model's own). ``project``: a ``sketch`` projection applied
    to the parameter blocks of each chunk (grads then (c, k); default exact, (c, P)). The
    model's weights and .grad fields are not modified.
    """
    from torch.func import functional_call, grad, vmap
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if params is None:
        params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def logprobs(p, rows):
        logits = functional_call(model, (p, buffers), args=(),
                                 kwargs={"input_ids": rows.input_ids}).logits
        return token_logprobs(logits, rows, temperature)[0]

    def one(p, ids, index, targets, mask, old, adv, keep, denominator):
        row = TokenBatch(targets[None], mask[None], old[None], adv[None],
                         input_ids=ids[None], index=index[None])
        return policy_loss(logprobs(p, row), row, **loss_kwargs,
                           terms=BatchTerms(keep[None], denominator[None]))[0]

    g = vmap(grad(one), in_dims=(None, 0, 0, 0, 0, 0, 0, 0, 0))
    with eager_attention(model), default_linear(model):
        terms = _batch_terms(batch, loss_kwargs, lambda rows: logprobs(params, rows), chunk)
        for start in range(0, len(batch), chunk):
            sl = slice(start, start + chunk)
            rows = batch.rows(sl)
            out = g(params, rows.input_ids, rows.index, rows.targets, rows.mask, rows.old_logp,
                    rows.adv, terms.keep[sl], terms.denominator[sl])
            yield start, (project or Exact).rows([out[n] for n in names])


@torch.no_grad()
def _batch_terms(batch: TokenBatch, loss_kwargs: dict, logprobs, chunk: int) -> BatchTerms:
    """The whole batch's ``objectives.BatchTerms``, so that every per-sample gradient sees
    the batch's m2po mask and token denominator; ``logprobs(rows)`` (n, L) is called,
    ``chunk`` rows at a time, only for a loss in ``objectives.BATCH_MASKED``. asymre (no
    ratio) gets the completion mask and unit denominators, which it does not read."""
    logp = None
    if loss_kwargs.get("loss") in BATCH_MASKED:
        logp = torch.cat([logprobs(batch.rows(slice(s, s + chunk)))
                          for s in range(0, len(batch), chunk)])
    terms = update_terms(logp, batch, loss_kwargs)
    return terms or BatchTerms(batch.mask, torch.ones(len(batch), device=batch.mask.device))


def clipped_mean_grad(model, batch: TokenBatch, loss_kwargs: dict, temperature: float,
                      clip: float, chunk: int = 16) -> torch.Tensor:
    """Mean over the batch of per-sequence gradients, each first scaled down to norm at most
    ``clip`` (> 0, in gradient-norm units), flattened (float32, length P)."""
    total = None
    for _, g in per_sample_grads(model, batch, loss_kwargs, temperature, chunk):
        scale = (clip / g.norm(dim=1).clamp(min=1e-12)).clamp(max=1.0)
        part = (g * scale[:, None]).sum(0)
        total = part if total is None else total + part
    return total / len(batch)


def flat_grad(model) -> torch.Tensor:
    """The model's current .grad fields flattened (zeros where None), float32."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                      for p in model.parameters() if p.requires_grad])


def flat_params(model) -> torch.Tensor:
    """The model's trainable parameters flattened, detached, float32 (a copy)."""
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()
                      if p.requires_grad])


def sq_norm(x: torch.Tensor) -> float:
    """||x||^2 of a flat vector, summed in float64."""
    return float(torch.dot(x.double(), x.double()))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two flat vectors in float64; 0 when either is zero."""
    na, nb = a.double().norm(), b.double().norm()
    return float(torch.dot(a.double(), b.double()) / (na * nb)) if na > 0 and nb > 0 else 0.0


def kept_share(kept: torch.Tensor, full: torch.Tensor) -> tuple[float, float]:
    """(<kept, full> / ||full||^2, ||full||^2): the share of the unclipped gradient ``full``
    that the clipped one ``kept`` keeps (theory.md 8.9.3); 1 when ``full`` is zero (a sample
    without gradient keeps everything)."""
    sq_full = sq_norm(full)
    return (float(torch.dot(kept.double(), full.double())) / sq_full if sq_full else 1.0,
            sq_full)
