"""Float32 linear layers through oneDNN on CPU: the same products, about twice as fast on a
CPU with AVX-512.

torch's default float32 GEMM on CPU is MKL's ``sgemm``, which runs its AVX2 code path on AMD
processors (~90 GFLOP/s a core measured on this project's AMD EPYC machines), while oneDNN
uses AVX-512 on the same core (~190 GFLOP/s; ``benchmarks/machine_limit.py``). Linear layers
are most of the time of a training step and of a generation step, so ``use_onednn_linear``
routes every ``nn.Linear`` of a model through ``torch.ops.mkldnn._linear_pointwise``, forward
and backward (grad_x = grad_y W, grad_W = grad_y^T x, both as oneDNN products). On a CPU
without AVX-512 the two kernels measured alike on a large product (75 and 72 GFLOP/s) and
oneDNN slower on the project's models, so ``use_fast_linear`` (what ``run.fast_kernels``
calls) switches only where it pays (``onednn_pays``).

Numerics: every output is the same float32 dot product; only the blocking of the sum differs,
so results differ from the default kernel by float32 rounding (~1e-7 relative; identical for
reduction lengths <= 128 in the measured shapes). Deterministic for fixed shapes and threads.
``run.fast_kernels=false`` keeps the default kernel. Under CPU autocast to a lower precision
(float32 master weights of a bfloat16/float16 ``model.dtype``) a layer takes the default
``F.linear``, so the products run in the configured dtype; so does a layer whose weights or
input are not float32 (a copy cast after the switch).
"""

from __future__ import annotations

import torch
from torch import nn


def onednn_linear(x, weight, bias=None):
    """x W^T + b (float32, CPU) by oneDNN's inner product; by ``F.linear`` while
    ``torch.compile`` traces (``decode_step.compiled_step``): inductor fails to lower this
    call and picks the products' kernel itself."""
    if torch.compiler.is_compiling():
        return nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinearFn(torch.autograd.Function):
    """y = x W^T + b with oneDNN products in both passes."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        gy = grad_y.reshape(-1, grad_y.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = onednn_linear(gy, weight.t()).view(*grad_y.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = onednn_linear(gy.t(), x.reshape(-1, x.shape[-1]).t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = gy.sum(0)
        return grad_x, grad_w, grad_b


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` computed by oneDNN (same parameters and state-dict keys)."""

    def forward(self, x):
        if self.weight.dtype != torch.float32 or x.dtype != torch.float32:
            # A copy cast to a lower precision after the switch (the sampler's bfloat16
            # weights): oneDNN's low-precision inner product exists only on CPUs with native
            # support (AVX512-BF16; CI's machine has none and fails to create the primitive).
            return super().forward(x)
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") \
                and torch.get_autocast_dtype("cpu") != torch.float32:
            # Float32 master weights under CPU autocast (a bfloat16/float16 ``model.dtype``):
            # the oneDNN op has no autocast rule, so it would get low-precision activations
            # with float32 weights and fail, or return float32 and ignore the compute dtype.
            # ``F.linear`` is autocast's own path: products in the configured dtype.
            return super().forward(x)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _OneDNNLinearFn.apply(x, self.weight, self.bias)
        return onednn_linear(x, self.weight, self.bias)


def onednn_available() -> bool:
    """Whether the oneDNN linear kernel runs here and agrees with ``F.linear``."""
    try:
        x, w = torch.randn(3, 5), torch.randn(4, 5)
        return bool(torch.allclose(onednn_linear(x, w), nn.functional.linear(x, w), atol=1e-5))
    except (RuntimeError, AttributeError):
        return False


# CPU capabilities (``torch.backends.cpu.get_cpu_capability()``) on which oneDNN's float32
# products were measured faster than torch's default kernel. With AVX-512 a model's forward
# and backward ran 1.5x (cpu_tiny) and 1.8x (3.2M) faster (benchmarks/results/
# machine_limit.json, a 2048^2 product 2.3x). On an AVX2-only machine they ran at 0.97x and
# 0.92x (machine_limit_avx2.json, the 2048^2 product 0.96x), and decoding was slower at
# every size measured (samplers_long.json).
ONEDNN_CAPABILITIES = ("AVX512",)


def onednn_pays() -> bool:
    """Whether oneDNN's linear kernel runs here and this CPU is of a capability on which it
    was measured faster (``ONEDNN_CAPABILITIES``)."""
    return torch.backends.cpu.get_cpu_capability() in ONEDNN_CAPABILITIES and \
        onednn_available()


def use_fast_linear(model) -> int:
    """``run.fast_kernels``: ``use_onednn_linear`` where oneDNN pays (``onednn_pays``), else
    nothing. Returns the number of layers switched."""
    return use_onednn_linear(model) if onednn_pays() else 0


def use_onednn_linear(model) -> int:
    """Switch every float32 CPU ``nn.Linear`` of ``model`` to ``OneDNNLinear`` in place (a
    no-op where oneDNN is unavailable). Returns the number of layers switched."""
    if not onednn_available():
        return 0
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.float32 \
                and module.weight.device.type == "cpu":
            module.__class__ = OneDNNLinear
            n += 1
    return n


# The least hidden size at which oneDNN's linear layers decode faster than torch's default
# kernel on this project's CPUs (one thread, idle machine, ``benchmarks.samplers``): at hidden
# 64 (cpu_long's shape, 143 new tokens) oneDNN decodes at 0.75x and 0.65x the default kernel's
# tokens/s (batch 64 and 8, ``benchmarks/results/samplers_long.json``), at hidden 128 at
# 0.95-1.43x and at 256 at 1.46-1.61x (``samplers.json``). Between 64 and 128 it is
# unmeasured.
ONEDNN_MIN_HIDDEN = 128


def set_sampler_kernel(model, choice: str) -> int:
    """Set the linear kernel of a sampler's own model copy ``model`` in place: ``choice``
    "onednn" (every float32 CPU linear layer through oneDNN), "default" (torch's kernel),
    or "auto" = keep what the run gave the model (``run.fast_kernels``) when its hidden size
    is at least ``ONEDNN_MIN_HIDDEN``, else the default kernel. Returns the number of layers
    left on oneDNN."""
    hidden = getattr(getattr(model, "config", None), "hidden_size", ONEDNN_MIN_HIDDEN)
    if choice == "onednn":
        use_onednn_linear(model)
    elif choice == "default" or (choice == "auto" and hidden < ONEDNN_MIN_HIDDEN):
        for m in model.modules():
            if type(m) is OneDNNLinear:
                m.__class__ = nn.Linear
    elif choice != "auto":
        raise ValueError(f"sampler kernel must be auto, onednn or default, got {choice!r}")
    return sum(type(m) is OneDNNLinear for m in model.modules())


class default_linear:
    """Context manager: the model's ``OneDNNLinear`` layers as plain ``nn.Linear`` (for
    ``torch.func`` transforms such as ``vmap``, which the oneDNN op has no rule for)."""

    def __init__(self, model):
        self.layers = [m for m in model.modules() if type(m) is OneDNNLinear]

    def __enter__(self):
        for m in self.layers:
            m.__class__ = nn.Linear

    def __exit__(self, *exc):
        for m in self.layers:
            m.__class__ = OneDNNLinear
