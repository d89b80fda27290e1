"""The trainers' gradient all-reduce (``engines.grad_reduce.all_reduce_mean``, used by
``TrainerRank.reduce_gradients``) on two CPU gloo ranks: in place (no tensor replaced) and
bitwise the mean the former flat all-reduce gave, for any bucket size."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from llm_experiments.engines.grad_reduce import all_reduce_mean, buckets
from llm_helpers import import_extra

WORLD = 2
SHAPES = [(7, 5), (3,), (64, 33), (1,), (129,)]


def _grads(rank):
    gen = torch.Generator().manual_seed(100 + rank)
    out = [torch.randn(s, generator=gen) for s in SHAPES]
    out.append(torch.randn(6, 4, generator=gen).t())  # a non-contiguous gradient
    out.append(torch.randn(9, generator=gen).to(torch.bfloat16))
    return out


def _former(grads, world):
    """The reduction before: one flat fp32 copy, all-reduced, divided, cut into clones."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    out, offset = [], 0
    for g in grads:
        out.append(flat[offset:offset + g.numel()].view_as(g).clone())
        offset += g.numel()
    return out


def _rank(rank, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    fp32 = [g for g in _grads(rank) if g.dtype == torch.float32]
    want = _former(fp32, WORLD)
    both = [_grads(r) for r in range(WORLD)]
    for bucket_bytes in (1, 200, 1 << 25):
        grads = _grads(rank)
        ptrs = [g.data_ptr() for g in grads]
        all_reduce_mean(grads, WORLD, bucket_bytes)
        assert [g.data_ptr() for g in grads] == ptrs  # in place
        got = [g for g in grads if g.dtype == torch.float32]
        assert all(torch.equal(a, b) for a, b in zip(got, want)), bucket_bytes
        for g, a, b in zip(grads, *both):
            assert torch.equal(g, (a + b) / WORLD)
    dist.destroy_process_group()


def test_two_gloo_ranks_average_in_place_bitwise(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path / "init"),), nprocs=WORLD, join=True)


def _trainer_rank(rank, init_file):
    from llm_helpers import small_config
    from llm_experiments.engines.ray_actors import TrainerRank
    cfg = small_config("schedule.engine=ray", "schedule.mode=async", "probe.every=0",
                       f"schedule.trainers={WORLD}", "buffer.capacity=32")
    trainer = TrainerRank(cfg, rank, None, None, None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    mine = [p for p in trainer.model.parameters() if p.requires_grad]

    def grads(r):  # rank r's gradient; the last parameter has none
        gen = torch.Generator().manual_seed(r)
        return [torch.randn(p.shape, generator=gen) for p in mine[:-1]]

    want = [sum(g) / WORLD for g in zip(*(grads(r) for r in range(WORLD)))]
    for p, g in zip(mine, grads(rank)):
        p.grad = g
    ptrs = [p.grad.data_ptr() for p in mine[:-1]]
    trainer.reduce_gradients()
    assert [p.grad.data_ptr() for p in mine[:-1]] == ptrs  # no per-parameter clone
    assert all(torch.equal(p.grad, w) for p, w in zip(mine, want))
    assert torch.equal(mine[-1].grad, torch.zeros_like(mine[-1]))
    dist.destroy_process_group()


def test_trainer_ranks_reduce_in_place(tmp_path):
    """``TrainerRank.reduce_gradients`` keeps each rank's gradient tensors (the former flat
    reduction replaced them with clones) and leaves the two ranks' mean in them."""
    import_extra("ray", "ray")
    mp.spawn(_trainer_rank, args=(str(tmp_path / "init"),), nprocs=WORLD, join=True)


def test_buckets_split_by_size_and_dtype():
    ts = [torch.zeros(10), torch.zeros(10), torch.zeros(3, dtype=torch.bfloat16),
          torch.zeros(100), torch.zeros(1)]
    sizes = [[t.numel() for t in b] for b in buckets(ts, 80)]
    assert sizes == [[10, 10], [3], [100], [1]]
    assert [len(b) for b in buckets(ts, 1 << 20)] == [2, 1, 2]
