"""Average tensors (gradients) over the ranks of a torch.distributed group, in place.

Tensors go into buckets of at most ``BUCKET_BYTES`` (consecutive tensors of one dtype and
device); a bucket of one contiguous tensor is reduced where it lies, a larger one through one
flat copy whose views are copied back into the tensors. So the extra memory is one bucket, and
no tensor is replaced: optimizer state and views that refer to a gradient stay valid.

Each element is summed over the ranks and then divided by their number, as a reduction of one
flat vector would do; with two ranks (a + b is commutative) the result is bitwise that of any
other bucketing. With more ranks the backend's ring may add in an order that depends on the
bucket, so results can differ in the last bit between bucket sizes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 1 << 25  # 32 MiB: few collectives, little extra memory


def buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> Iterator[list[torch.Tensor]]:
    """Consecutive runs of ``tensors`` of one dtype and device, each of at most
    ``bucket_bytes`` (>= 1) bytes unless a single tensor is larger."""
    bucket, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and (size + nbytes > bucket_bytes or t.dtype != bucket[0].dtype
                       or t.device != bucket[0].device):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += nbytes
    if bucket:
        yield bucket


def all_reduce_mean(tensors: Sequence[torch.Tensor], world: int,
                    bucket_bytes: int = BUCKET_BYTES, group=None) -> None:
    """Replace every tensor's values with their mean over the ``world`` (>= 1) ranks of the
    process group ``group`` (default: the whole world), in place. Every rank must pass tensors
    of the same shapes, dtypes and order."""
    for bucket in buckets(tensors, bucket_bytes):
        if len(bucket) == 1 and bucket[0].is_contiguous():
            torch.distributed.all_reduce(bucket[0], group=group)
            bucket[0].div_(world)
            continue
        flat = _flatten_dense_tensors(bucket)
        torch.distributed.all_reduce(flat, group=group)
        flat.div_(world)
        for t, mean in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(mean)
