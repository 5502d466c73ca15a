"""MLX's CUDA quantized matmul for a batched decode step's input: `[B, 1, K]` (how a model's
activations arrive) vs the same rows as `[B, K]`, and dequantize + dense matmul, on the layer
shapes of Llama-3.2-1B (4-bit, group 64, bfloat16). Prints microseconds per call (queued calls,
one eval) and the largest difference between the two layouts' outputs (0: bit-identical).

    python3 benches/gpu/flat_rows.py     # on the GPU machine, PYTHONPATH/LD_LIBRARY_PATH as in README
"""
import time

import mlx.core as mx
dt = mx.bfloat16
def timed(fn, reps=20):
    mx.eval([fn() for _ in range(3)]); mx.synchronize()
    t = time.perf_counter(); outs = [fn() for _ in range(reps)]; mx.eval(outs); mx.synchronize()
    return (time.perf_counter() - t) / reps * 1e6
res = {}
for name, (n, k) in {"qo": (2048, 2048), "gate_up": (8192, 2048), "down": (2048, 8192), "lm_head": (128256, 2048)}.items():
    wf = (mx.random.normal((n, k)) * 0.02).astype(dt)
    w, s, b = mx.quantize(wf, group_size=64, bits=4)
    for B in [1, 2, 8, 16, 32, 64]:
        x3 = mx.random.normal((B, 1, k)).astype(dt); x2 = x3.reshape(B, k)
        a = timed(lambda: mx.quantized_matmul(x3, w, s, b, transpose=True, group_size=64, bits=4))
        c = timed(lambda: mx.quantized_matmul(x2, w, s, b, transpose=True, group_size=64, bits=4))
        d = timed(lambda: x3 @ mx.dequantize(w, s, b, group_size=64, bits=4).T)
        y3 = mx.quantized_matmul(x3, w, s, b, transpose=True, group_size=64, bits=4).reshape(B, n)
        y2 = mx.quantized_matmul(x2, w, s, b, transpose=True, group_size=64, bits=4)
        diff = mx.abs(y3.astype(mx.float32) - y2.astype(mx.float32)).max().item()
        print(f"{name} n={n} k={k} B={B}: [B,1,K] {a:.1f} us  [B,K] {c:.1f} us  dequant+mm {d:.1f} us  maxdiff {diff:.3g}", flush=True)
