"""Device time of the attention backward's two kernels per config, to set their config spaces.

For scaled_dot_product_attention (bf16) at the issue's cells, each backward kernel (the query
pass and the key pass) is given a wide candidate space in place of the spec's, with the
shared-memory prune off (a config that does not fit fails to compile and the autotuner drops it);
the autotuner then times every candidate (no call is replayed meanwhile) (do_bench's median, L2 flushed) and this script prints
them, best first, with the time of the whole backward under the spec's own space for comparison.
One GPU call, about 5 minutes.

Usage (GPU machine): PYTHONPATH=. python3 tools/perf/sweep_attention_backward.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import sys

import torch
import triton
import triton.testing

import generated
from specgen.runtime import record_launches
launch = importlib.import_module("specgen.runtime.launch")

# (batch, heads, length, head dim, causal)
SHAPES = ((4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False))
# (BLOCK_M, BLOCK_N, num_warps, num_stages). The query pass keeps BLOCK_M rows and walks keys
# BLOCK_N at a time; the key pass keeps BLOCK_N keys and walks query rows BLOCK_M at a time.
CANDIDATES = {
    "backward_query": [(128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2),
                       (128, 128, 8, 3), (128, 32, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3),
                       (64, 32, 4, 3), (128, 32, 4, 3)],
    "backward_key": [(64, 128, 8, 1), (64, 128, 8, 2), (64, 128, 8, 3), (64, 128, 8, 4),
                     (32, 128, 8, 2), (32, 128, 8, 3), (32, 128, 8, 4), (32, 128, 4, 3),
                     (32, 128, 4, 5), (32, 64, 4, 3), (32, 64, 4, 4), (64, 64, 4, 3)],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the first shape only")
    options = parser.parse_args()
    module = sys.modules["generated.scaled_dot_product_attention"]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    spec_space = {role: list(module.KERNELS[role].configs) for role in CANDIDATES}
    for batch, heads, length, dim, causal in SHAPES[:1] if options.quick else SHAPES:
        q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        grad = torch.randn_like(q)
        flops = 2.5 * 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
        out = generated.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def backward():
            return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

        def tuned_backward():
            # watched launches are never replayed: the call goes through the autotuner
            with record_launches():
                backward()

        name = f"B{batch} H{heads} S{length} E{dim}" + (" causal" if causal else "")
        for role in CANDIDATES:
            module.KERNELS[role].configs = spec_space[role]
        _retune(module)
        tuned_backward()
        ms = triton.testing.do_bench(backward)
        print(f"\n{name}: backward with the spec's space {ms:.3f} ms, "
              f"{flops / ms / 1e9:.0f} TFLOP/s")
        for role, space in CANDIDATES.items():
            kernel = module.KERNELS[role]
            print(f"  {role} chose {kernel.best_config}")
            kernel.configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                              for m, n, w, s in space]
            prune, kernel.early_config_prune = kernel.early_config_prune, None
            _retune(module)
            tuned_backward()
            timings = sorted(getattr(kernel, "configs_timings", {}).items(),
                             key=lambda item: _first(item[1]))
            for config, times in timings:
                print(f"    {role} {config}: {_first(times):.3f} ms")
            kernel.configs, kernel.early_config_prune = spec_space[role], prune
        del q, k, v, grad, out


def _first(times) -> float:
    return times[0] if isinstance(times, (list, tuple)) else times


def _retune(module) -> None:
    launch._tuned.clear()
    for kernel in module.KERNELS.values():
        if hasattr(kernel, "cache"):
            kernel.cache.clear()


if __name__ == "__main__":
    main()
