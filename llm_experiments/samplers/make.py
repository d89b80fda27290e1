"""Build the sampler a configuration names (``sampler.backend``)."""

from __future__ import annotations

from . import Sampler


def make_sampler(cfg, model, tokenizer) -> Sampler:
    """The sampler of ``cfg.sampler.backend`` for a copy of ``model`` in ``model.dtype``
    (the trainer may hold float32 master weights, ``models.trainer_dtype``)."""
    from ..policy.models import DTYPES
    dtype = DTYPES[cfg.model.dtype]
    if cfg.sampler.backend == "vllm":
        from .vllm import VLLMSampler
        return VLLMSampler(model, tokenizer, max_model_len=cfg.model.max_len
                           if cfg.model.name == "tiny" else None,
                           kv_cache_gb=cfg.sampler.vllm_kv_cache_gb, seed=cfg.run.seed,
                           dtype=dtype, eager=cfg.sampler.vllm_eager,
                           gpu_memory=None if cfg.run.device == "cpu"
                           else cfg.sampler.vllm_gpu_memory)
    return hf_sampler(cfg, model, tokenizer)


def hf_sampler(cfg, model, tokenizer):
    """An ``hf.HFSampler`` for a copy of ``model`` as ``cfg`` sets it: ``model.dtype``,
    ``run.direct_forward`` and the ``sampler`` section's decoding settings and linear kernel
    (``sampler.linear_kernel``, ``kernels.set_sampler_kernel``). The run's sampler with the
    hf backend, and the probes' own (which needs the HF sampler's uniforms), so
    that the probes sample as the run does (issue 38 N7: theirs was float32)."""
    from ..policy.kernels import set_sampler_kernel
    from ..policy.models import DTYPES
    from .hf import HFSampler
    sampler = HFSampler(model, tokenizer.eos_token_id, tokenizer.pad_token_id,
                        direct=cfg.run.direct_forward, dtype=DTYPES[cfg.model.dtype],
                        compact_below=cfg.sampler.compact_below, cdf=cfg.sampler.cdf_dtype,
                        graphs=cfg.sampler.decode_graphs,
                        max_concurrent=cfg.sampler.max_concurrent,
                        compile_step=cfg.sampler.compile_step)
    set_sampler_kernel(sampler.model, cfg.sampler.linear_kernel)
    return sampler
