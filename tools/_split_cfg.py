import importlib, torch, triton, generated
from specgen.runtime import override
rt = importlib.import_module("specgen.runtime.launch")
from tools.probe_memory import bench_us
for op in ("softmax", "rms_norm"):
    m = importlib.import_module(f"generated.{op}")
    w = torch.randn(262144, device="cuda", dtype=torch.bfloat16)
    f = (lambda t: generated.softmax(t, -1)) if op == "softmax" else (lambda t: generated.rms_norm(t, [262144], w))
    x = [(torch.randn(8, 262144, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
    def fresh():
        rt._tuned.clear(); m._replays._entries.clear()
        for obj in vars(m).values():
            if isinstance(obj, triton.runtime.Autotuner):
                obj.cache.clear()
    for attempt in range(4):
        fresh(); f(x[0][0])
        print(op, "tuned", attempt, [(k[0].fn.__name__[-12:], f"{v.kwargs['BLOCK_N']}x{v.num_warps}w") for k, v in rt._tuned.items()],
              [round(bench_us(f, x), 1) for _ in range(2)], flush=True)
    for i, c in enumerate(m.SPLIT_CONFIGS):
        fresh()
        with override(config=i):
            print(op, "config", i, c, [round(bench_us(f, x), 1) for _ in range(2)], flush=True)
