"""Where a replayed call's host time goes, piece by piece, and what each way of starting a
compiled Triton kernel costs from Python (issue 34, part 5; docs/performance.md item 000s).

On add(x, y) of 8x1024 bf16 (host-bound: the kernel takes a few us): torch eager, our public
call, the replay's parts (signature, lookup, allocation, launch), tensor attribute reads, and
four ways of launching the same compiled kernel: ``CompiledKernel.run`` with tensors (what
``JITFunction.run`` does), the same with data pointers as ints, Triton's C launcher called
directly, and torch's ``_StaticCudaLauncher`` (Inductor's launcher of Triton cubins). Each is
checked to compute x + y before it is timed.

Usage (GPU machine): PYTHONPATH=. python3 tools/perf/probe_launch_host.py
"""

import statistics
import sys
import time

import torch
import triton

import generated
from specgen.runtime import context, native, replay as rp


def per_call(fn, calls=2000, rounds=5):
    """Host us per call: median of ``rounds`` loops of ``calls`` unsynchronized calls."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def row(label, fn, **kw):
    print(f"{label:<58} {per_call(fn, **kw):7.2f} us", flush=True)


def interleaved(fns, calls=2000, rounds=7):
    """Host us per call of each of ``fns``, measured in turn round by round: the median."""
    times = {label: [] for label in fns}
    for fn in fns.values():
        for _ in range(50):
            fn()
    for _ in range(rounds):
        for label, fn in fns.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[label].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    for label, t in times.items():
        print(f"{label:<58} {statistics.median(t):7.2f} us (rounds {min(t):.2f}-{max(t):.2f})")


def main():
    print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
          torch.cuda.get_device_name())
    x, y = (torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    op = sys.modules["generated.add"].OP
    with rp.record_at_once():
        generated.add(x, y)
        generated.add(x, y)
    key, run = op.replays.lookup((x, y), ())
    assert run is not None, op.replays.failures
    rep = op.replays._entries[key]
    (launch,) = rep.launches
    compiled = launch.compiled
    print("kernel", launch.fn.__name__, "grid", launch.grid, "slots", launch.slots)
    print("signature", compiled.src.signature, "constants", getattr(compiled.src, "constants", None))
    md = compiled.metadata
    for name in ("num_warps", "num_ctas", "shared", "global_scratch_size", "profile_scratch_size",
                 "launch_pdl", "launch_cooperative_grid"):
        print(" ", name, getattr(md, name, "-"))
    print("packed_metadata", compiled.packed_metadata, "launcher", type(compiled.run))

    out = torch.empty_like(x)
    # the call and its parts, interleaved round by round (this host drifts by a third between
    # runs): the public call, its signature's tensor part and lookup, the replay, and a bare
    # allocation and launch
    tensor_key = generated.add.__globals__["_tensor_key"]
    print("replays through", "the C++ core" if native.module() else "Python functions")
    static, stream = rep.launches[0].static, torch._C._cuda_getCurrentRawStream
    interleaved({
        "eager x + y": lambda: x + y,
        "generated.add(x, y), replayed": lambda: generated.add(x, y),
        "its tensors' signature": lambda: tensor_key(x, y),
        "its dict lookup": lambda: op.replays.ready.get(key),
        "Replay.run (the replay)": lambda: rep.run(x, y),
        "Replay.generic (its data, through Triton's launcher)": lambda: rep.generic((x, y)),
        "torch.empty_strided": lambda: torch.empty_strided((8, 1024), (1024, 1), dtype=x.dtype,
                                                           device=x.device),
        "_StaticCudaLauncher._launch_kernel": lambda: torch._C._StaticCudaLauncher._launch_kernel(
            static.function, 8, 1, 1, static.num_warps, static.shared, static.types,
            (x.data_ptr(), y.data_ptr(), out.data_ptr(), 8192, None, None), stream(0)),
    })
    print(rep.source)
    for label, fn in [("x.shape", lambda: x.shape), ("x.stride()", lambda: x.stride()),
                      ("x.dtype", lambda: x.dtype), ("x.device", lambda: x.device),
                      ("x.data_ptr()", lambda: x.data_ptr()),
                      ("x.requires_grad", lambda: x.requires_grad),
                      ("torch.is_grad_enabled()", torch.is_grad_enabled),
                      ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
                      ("context.tracing()", context.tracing),
                      ("torch._C._is_any_autocast_enabled()", torch._C._is_any_autocast_enabled),
                      ("rp._launch_hooked()", rp._launch_hooked),
                      ("torch._C._cuda_getDevice()", torch._C._cuda_getDevice),
                      ("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0)),
                      ("key hash", lambda: hash(key)),
                      ("ready.get(key)", lambda: op.replays.ready.get(key))]:
        row(label, fn)
    for label, fn in [("torch.empty(shape, dtype=, device=)",
                       lambda: torch.empty((8, 1024), dtype=torch.bfloat16, device=x.device)),
                      ("torch.empty_like(x)", lambda: torch.empty_like(x)),
                      ("x.new_empty_strided(shape, strides)",
                       lambda: x.new_empty_strided((8, 1024), (1024, 1)))]:
        row(label, fn)

    row("_Launch.__call__ (Triton's launcher)", lambda: launch((x, y), [out]))

    stream = torch._C._cuda_getCurrentRawStream(0)
    args = list(launch.args)
    for position, source, index in launch.slots:
        args[position] = (x, y)[index] if source == "in" else out
    ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    gx, gy, gz = launch.grid
    function, packed = compiled.function, compiled.packed_metadata
    expect = (x.float() + y.float()).to(x.dtype)

    def check(label, fn):
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        ok = torch.equal(out, expect)
        print(f"{label}: {'computes x + y' if ok else 'WRONG RESULT'}")
        return ok

    def run_tensors():
        compiled.run(gx, gy, gz, stream, function, packed, None, None, None, *args)

    def run_ints():
        compiled.run(gx, gy, gz, stream, function, packed, None, None, None, *ints)

    launcher = compiled.run
    c_launch = getattr(launcher, "launch", None)
    coop = getattr(launcher, "launch_cooperative_grid", False)
    pdl = getattr(launcher, "launch_pdl", False)

    def c_direct():
        c_launch(gx, gy, gz, stream, function, coop, pdl, None, None, packed, None, None, None, *ints)

    forms = [("CompiledKernel.run, tensors", run_tensors), ("CompiledKernel.run, ints", run_ints)]
    if triton.__version__.startswith("3.6") and c_launch is not None:
        forms.append(("Triton's C launch, ints (3.6 signature)", c_direct))
    static = getattr(torch._C, "_StaticCudaLauncher", None)
    print("torch._C._StaticCudaLauncher:", static)
    if static is not None:
        sig = compiled.src.signature
        names = list(launch.fn.arg_names)
        constants = getattr(compiled.src, "constants", {}) or {}
        const_pos = {names.index(k) if isinstance(k, str) else k[0] for k in constants}
        types = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B",
                 "u16": "H", "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f",
                 "f32": "f", "fp64": "d"}
        arg_tys, kept = "", []
        for i, name in enumerate(names):
            ty = sig[name] if name in sig else sig.get(i)
            if ty == "constexpr" or i in const_pos:
                continue
            arg_tys += "O" if ty.startswith("*") else types[ty]
            kept.append(i)
        arg_tys += "OO"  # global and profile scratch (None)
        static_ints = tuple(ints[i] for i in kept) + (None, None)
        static_tensors = tuple(args[i] for i in kept) + (None, None)
        print("static arg_tys", arg_tys)
        nw, shared = md.num_warps, md.shared
        forms.append(("torch _StaticCudaLauncher, ints",
                      lambda: static._launch_kernel(function, gx, gy, gz, nw, shared, arg_tys,
                                                    static_ints, stream)))
        forms.append(("torch _StaticCudaLauncher, tensors",
                      lambda: static._launch_kernel(function, gx, gy, gz, nw, shared, arg_tys,
                                                    static_tensors, stream)))
    for label, fn in forms:
        try:
            if check(label, fn):
                row(label, fn)
        except Exception as exc:  # a form this version does not take
            print(f"{label}: {type(exc).__name__}: {exc}")
    row("3 data_ptr() calls", lambda: (x.data_ptr(), y.data_ptr(), out.data_ptr()))


if __name__ == "__main__":
    main()
