"""Memory of an update (issue 28, item 2): logits in chunks over the sequence, entropy off
the graph, a micro-batch from a memory budget, and a predicted peak checked against the
peak torch measures (``MemTracker`` on CPU)."""

import warnings

import pytest
import torch

from llm_experiments.config import load_config
from llm_experiments.rl.losses import batch_logprobs, collate, collate_prompts
from llm_experiments.rl.memory import (ModelShape, choose_micro_batch, logit_chunk,
                                       predict_update_memory)
from test_gpu_master_weights import _Trainer, synthetic_rollouts


def _model(vocab: int, hidden: int = 32, intermediate: int = 64, dtype="float32"):
    from llm_experiments.config import Config
    from llm_experiments.policy.models import char_tokenizer, tiny_model
    torch.set_num_threads(1)
    cfg = Config()
    cfg.model.hidden_size, cfg.model.layers, cfg.model.intermediate_size = hidden, 2, intermediate
    cfg.model.dtype = dtype
    return tiny_model(cfg, vocab), char_tokenizer("0123456789+=")


@pytest.mark.parametrize("make", [collate, collate_prompts])
def test_chunked_logprobs_match_the_whole_and_keep_no_entropy_graph(make):
    """Chunks of 7 tokens give the log-probs and gradient of one full-vocabulary pass; the
    entropy carries no autograd graph."""
    model, _ = _model(vocab=300)
    batch = make(synthetic_rollouts(8), 0)
    grads = []
    for chunk in (0, 7):
        model.zero_grad()
        logp, ent = batch_logprobs(model, batch, 0.9, chunk)
        assert ent.grad_fn is None and not ent.requires_grad
        logp.sum().backward()
        grads.append((logp.detach(), ent,
                      torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1][2], grads[0][2], atol=1e-5, rtol=1e-4)


def _measured_peak(cfg_overrides, vocab, rows=32, dtype="float32"):
    """(measured, predicted) peak bytes of the second update (Adam state present) on CPU."""
    from torch.distributed._tools.mem_tracker import MemTracker
    cfg = load_config("cpu_tiny", [f"model.dtype={dtype}", "run.fast_kernels=false",
                                   f"schedule.batch_size={rows}", "schedule.group_size=4",
                                   *cfg_overrides])
    model, tok = _model(vocab, dtype=dtype)
    trainer = _Trainer(cfg, model, tok)
    rollouts = synthetic_rollouts(rows)
    trainer.train_step(rollouts, keep_grad=False)
    tracker = MemTracker()
    tracker.track_external(trainer.model, trainer.opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracker:
            trainer.train_step(rollouts, keep_grad=False)
    measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    micro = trainer.micro_batch(collate(rollouts, 0))
    predicted = predict_update_memory(ModelShape.of(trainer.model), micro, 9,
                                      compute_bytes=2 if dtype == "bfloat16" else 4,
                                      chunk=trainer.logit_chunk).peak
    return measured, predicted


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_predicted_peak_matches_measured_and_chunks_cut_it(dtype):
    """With a 4,096-token vocabulary the logits dominate: chunks of 16 tokens cut the
    measured peak by more than half, and the prediction is within 25% of the measured peak
    with and without chunks, in float32 and with bfloat16 autocast."""
    whole, whole_pred = _measured_peak(["trainer.logit_chunk=100000"], 4096, dtype=dtype)
    chunked, chunked_pred = _measured_peak(["trainer.logit_chunk=16"], 4096, dtype=dtype)
    assert chunked < 0.5 * whole
    assert whole_pred == pytest.approx(whole, rel=0.25)
    assert chunked_pred == pytest.approx(chunked, rel=0.25)


def test_micro_batch_from_the_budget():
    """The default micro-batch is the whole batch when it fits (so small CPU runs compute as
    before) and the largest that fits a tight budget otherwise; the measured peak at a
    budget-chosen micro-batch stays within the budget's scale."""
    shape = ModelShape(params=600_000_000, hidden=1024, layers=28, q_dim=2048, kv_dim=1024,
                       intermediate=3072, vocab=151_936)
    chunk = logit_chunk(shape.vocab)
    full = predict_update_memory(shape, 256, 1280, compute_bytes=2, chunk=chunk)
    budget = int(0.85 * 141e9)
    m = choose_micro_batch(shape, 256, 1280, budget, compute_bytes=2, chunk=chunk)
    assert 1 <= m < 256 and full.peak > budget
    assert predict_update_memory(shape, m, 1280, compute_bytes=2, chunk=chunk).peak <= budget
    assert predict_update_memory(shape, m + 1, 1280, compute_bytes=2, chunk=chunk).peak > budget
    # Chunked logits at most 1 GiB, never 256 x 1,024 x 151,936 x 4 bytes (~159 GB).
    assert full.logits <= 2 ** 30
    assert choose_micro_batch(shape, 4, 16, 10 ** 12) == 4
    measured, predicted = _measured_peak(["trainer.memory_gb=0.004"], 512)
    assert predicted <= 0.004 * 2 ** 30 and measured <= 1.25 * 0.004 * 2 ** 30


def test_the_cuda_budget_is_what_the_driver_reports_free_plus_the_trainers_own(monkeypatch):
    """Issue 38 N4: on a CUDA device the default budget starts from the free memory the
    driver reports, so tensors of other processes on the same GPU (samplers in Ray actors,
    an evaluator) and of this one (a 32 GB decode cache) are left out, while the trainer's
    own state, which the prediction counts, and the allocator's unused reserve are put
    back; 15% of the device is headroom. memory_gb > 0 and the CPU budget ignore them. A
    0.6B-shape, 256 x 1,280-token update gets a smaller micro-batch beside a 32 GB cache."""
    from llm_experiments.rl.memory import CPU_BUDGET_BYTES, budget_bytes
    total, gb = 141 * 10 ** 9, 10 ** 9
    used = {"others": 0}  # bytes held outside this process's allocator cache

    def mem_get_info(device):
        return total - 2 * gb - used["others"], total  # 2 GB: context and this trainer

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3 * gb)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 * gb)
    alone = budget_bytes(0, "cuda", own=gb)
    assert alone == int(total - 2 * gb + gb + gb - 0.15 * total)
    used["others"] = 32 * gb  # a Ray sampler actor's cache, or this process's
    beside = budget_bytes(0, "cuda", own=gb)
    assert beside == alone - 32 * gb
    assert budget_bytes(2, "cuda", own=gb) == 2 * 2 ** 30
    assert budget_bytes(0, "cpu", own=gb) == CPU_BUDGET_BYTES
    shape = ModelShape(params=600_000_000, hidden=1024, layers=28, q_dim=2048, kv_dim=1024,
                       intermediate=3072, vocab=151_936)
    chunk = logit_chunk(shape.vocab)
    assert choose_micro_batch(shape, 256, 1280, beside, compute_bytes=2, chunk=chunk) < \
        choose_micro_batch(shape, 256, 1280, alone, compute_bytes=2, chunk=chunk)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trainer_bytes_count_the_trainers_state_only():
    """The model's parameters, gradients and Adam state are counted; a tensor allocated
    beside them is not, and it lowers the budget by its size."""
    from llm_experiments.rl.memory import budget_bytes, trainer_bytes
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256, device="cuda")).sum().backward()
    opt.step()
    params = sum(p.numel() for p in model.parameters())
    assert trainer_bytes(model, opt, "cuda") == 4 * 4 * params  # weights, grads, 2 moments
    before = budget_bytes(0, "cuda", trainer_bytes(model, opt, "cuda"))
    other = torch.empty(2 ** 28, dtype=torch.uint8, device="cuda")
    after = budget_bytes(0, "cuda", trainer_bytes(model, opt, "cuda"))
    assert abs((before - after) - other.numel()) < 2 ** 22


def test_memory_fields_are_checked():
    with pytest.raises(ValueError, match="trainer.memory_gb"):
        load_config("cpu_tiny", ["trainer.memory_gb=-1"])
    with pytest.raises(ValueError, match="trainer.logit_chunk"):
        load_config("cpu_tiny", ["trainer.logit_chunk=-2"])
