"""Supervised warm start of the tiny model: cross-entropy on the task's reference answers.

From a random init a correct 4-token answer has probability ~24^-4, so RL would never see a
reward; a short supervised phase brings the policy to where it sometimes succeeds
(``model.warm_start_target``). ``models.load_policy`` caches the result.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from ..config import Config


def _sft_batch(tokenizer, problems, max_len: int):
    """Right-padded (prompt + answer + eos) ids and a mask of the answer positions."""
    rows, masks = [], []
    for p in problems:
        prompt = tokenizer.encode(p.prompt, add_special_tokens=False)
        answer = tokenizer.encode(p.answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        ids = (prompt + answer)[:max_len]
        rows.append(ids)
        masks.append([0] * len(prompt) + [1] * (len(ids) - len(prompt)))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.bool)
    return ids, mask


def _exact_match(model, tokenizer, ids, mask) -> float:
    """Share of rows whose every answer token (and eos) is the argmax given the true prefix.

    Under teacher forcing this equals greedy decoding reproducing the reference exactly, at
    the cost of one forward pass.
    """
    with torch.no_grad():
        pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
    ok = (pred == ids[:, 1:]) | ~mask[:, 1:]
    return float(ok.all(dim=1).float().mean())


def warm_start(model, tokenizer, task, cfg: Config) -> int:
    """Supervised training on reference answers (AdamW, linear warm-up, clip 1.0), in place.

    Loss: cross-entropy of the answer tokens (and end-of-sequence) given the prompt. With
    ``model.warm_start_target`` > 0, stops at the first check (every 2 steps, or the task's
    ``warm_start_check_every``) where greedy accuracy on 512 fixed training problems reaches
    the target. Returns the steps taken. With ``run.progress`` a bar shows the steps on
    stderr: the first run of a config on a machine spends about a minute here, before the
    run's own bar appears.
    """
    with tqdm(total=cfg.model.warm_start_steps, disable=not cfg.run.progress,
              desc="warm start (once per config, then cached)", dynamic_ncols=True) as bar:
        return _train(model, tokenizer, task, cfg, bar)


def _train(model, tokenizer, task, cfg: Config, bar) -> int:
    """``warm_start``'s steps, each counted on ``bar``."""
    m = cfg.model
    # A check is one forward pass over 512 problems: with long worked solutions and small
    # batches that costs several steps, so such a task checks less often.
    every = getattr(task, "warm_start_check_every", 2)
    rng = np.random.default_rng(m.warm_start_seed)
    check_ids, check_mask = _sft_batch(tokenizer, task.sample_train(512, rng), m.max_len)
    opt = torch.optim.AdamW(model.parameters(), lr=m.warm_start_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, m.warm_start_warmup)))
    for step in range(m.warm_start_steps):
        if m.warm_start_target > 0 and step % every == 0:
            accuracy = _exact_match(model, tokenizer, check_ids, check_mask)
            bar.set_postfix(accuracy=f"{accuracy:.3f}", target=m.warm_start_target)
            if accuracy >= m.warm_start_target:
                return step
        model.train()
        ids, mask = _sft_batch(tokenizer, task.sample_train(m.warm_start_batch, rng), m.max_len)
        logits = model(input_ids=ids).logits[:, :-1].float()
        target, tmask = ids[:, 1:], mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[tmask], target[tmask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.update(1)
    return m.warm_start_steps
