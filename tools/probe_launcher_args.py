"""Host time of Triton's launcher by argument count: one trivial kernel with 4 and with 36
parameters (pointers and ints, as a row-wise split kernel takes), each started through its
compiled kernel's launcher as a replay starts it, and through JITFunction's own path.

Usage (GPU machine): PYTHONPATH=. python3 tools/probe_launcher_args.py
"""

import torch
import triton
import triton.language as tl
from triton.runtime import driver

from tools.probe_function_forms import host_us


@triton.jit
def _few(x_ptr, out_ptr, n, s0):
    offs = tl.arange(0, 128)
    tl.store(out_ptr + offs * s0, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _many(x_ptr, w_ptr, b_ptr, out_ptr, n, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12,
          a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29,
          a30, a31):
    offs = tl.arange(0, 128)
    total = (a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15 + a16
             + a17 + a18 + a19 + a20 + a21 + a22 + a23 + a24 + a25 + a26 + a27 + a28 + a29 + a30
             + a31)
    value = tl.load(x_ptr + offs, mask=offs < n) + tl.load(w_ptr + offs, mask=offs < n) \
        + tl.load(b_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, value + total, mask=offs < n)


def main():
    x = torch.randn(128, device="cuda")
    out = torch.empty_like(x)
    few_args = (x, out, 128, 1)
    # ints of 3 and more: neither 1 (specialized away) nor multiples of 16
    many_args = (x, x, x, out, 128, *range(3, 34))
    stream = driver.active.get_current_stream
    device = driver.active.get_current_device()
    for name, kernel, args in (("4 params", _few, few_args), ("35 params", _many, many_args)):
        compiled = kernel[(1,)](*args)
        ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        forms = {
            "JITFunction": lambda: kernel[(1,)](*args),
            "launcher, tensors": lambda: compiled.run(1, 1, 1, stream(device), compiled.function,
                                                      compiled.packed_metadata, None, None, None,
                                                      *args),
            "launcher, addresses": lambda: compiled.run(1, 1, 1, stream(device), compiled.function,
                                                        compiled.packed_metadata, None, None,
                                                        None, *ints),
            "torch.empty(4 MB)": lambda: torch.empty(1 << 21, dtype=torch.bfloat16, device="cuda"),
        }
        for form, fn in forms.items():
            print(f"{name:9s} {form:20s} {host_us(fn):6.2f} us", flush=True)


if __name__ == "__main__":
    main()
