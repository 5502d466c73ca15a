"""How close MLX's own B=1 quantized matmul and op dispatch come to the GPU's limits.

Builds the 8B-shape decode matmuls (32 layers of q, k, v, o, gate, up, down, 4-bit, group 64,
bfloat16) and times them three ways, with no model around them: every matmul of a step in one
evaluation (kernel time + MLX's encode), one large matmul repeated (the kernel alone), and a chain
of tiny elementwise ops (MLX's per-op host cost). Prints effective weight bandwidth in GB/s.

    python3 benches/gpu/qmv_roof.py [--layers 32] [--runs 5]
"""
import argparse, time
import mlx.core as mx

def qweights(n_out, n_in, bits, gs):
    w = mx.random.normal((n_out, n_in)).astype(mx.bfloat16) * 0.02
    q = mx.quantize(w, group_size=gs, bits=bits)
    mx.eval(q)
    return q

def nbytes(q):
    return sum(a.nbytes for a in q)

def med(xs):
    xs = sorted(xs); return xs[len(xs) // 2]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    a = ap.parse_args()
    H, KV, FF = 4096, 1024, 14336
    shapes = [(H, H), (KV, H), (KV, H), (H, H), (FF, H), (FF, H), (H, FF)]
    layers = [[qweights(o, i, a.bits, a.group) for (o, i) in shapes] for _ in range(a.layers)]
    total = sum(nbytes(q) for l in layers for q in l)
    xs = {H: mx.random.normal((1, 1, H)).astype(mx.bfloat16), FF: mx.random.normal((1, 1, FF)).astype(mx.bfloat16)}
    mx.eval(list(xs.values()))

    def step():
        outs = []
        for l in layers:
            for (o, i), (w, s, b) in zip(shapes, l):
                outs.append(mx.quantized_matmul(xs[i], w, s, b, transpose=True, group_size=a.group, bits=a.bits))
        return outs

    for _ in range(3):
        mx.eval(step())
    ts, builds = [], []
    for _ in range(a.runs):
        mx.synchronize(); t0 = time.perf_counter()
        outs = step(); t1 = time.perf_counter()
        mx.eval(outs); mx.synchronize(); t2 = time.perf_counter()
        ts.append(t2 - t0); builds.append(t1 - t0)
    t = med(ts)
    print(f"all {len(shapes) * a.layers} matmuls of a step: {t * 1e3:.2f} ms (build {med(builds) * 1e3:.2f} ms), "
          f"{total / 1e9:.2f} GB -> {total / t / 1e9:.0f} GB/s")

    # One large matmul repeated inside one evaluation: the kernel's own bandwidth.
    w, s, b = layers[0][4]
    for reps in (1, 64):
        ys = [mx.quantized_matmul(xs[H], w, s, b, transpose=True, group_size=a.group, bits=a.bits) for _ in range(reps)]
        mx.eval(ys)
        ts = []
        for _ in range(a.runs):
            mx.synchronize(); t0 = time.perf_counter()
            ys = [mx.quantized_matmul(xs[H] + i * 0, w, s, b, transpose=True, group_size=a.group, bits=a.bits) for i in range(reps)]
            mx.eval(ys); mx.synchronize()
            ts.append(time.perf_counter() - t0)
        t = med(ts)
        print(f"gate 4096->14336 x{reps}: {t / reps * 1e6:.1f} us each, {nbytes((w, s, b)) * reps / t / 1e9:.0f} GB/s")

    # Per-op host cost: a chain of tiny adds in one evaluation.
    for n in (100, 1000):
        y = xs[H]
        for _ in range(3):
            z = y
            for _ in range(n): z = z + 1
            mx.eval(z)
        ts = []
        for _ in range(a.runs):
            mx.synchronize(); t0 = time.perf_counter()
            z = y
            for _ in range(n): z = z + 1
            mx.eval(z); mx.synchronize()
            ts.append(time.perf_counter() - t0)
        print(f"chain of {n} tiny adds: {med(ts) / n * 1e6:.2f} us per op")

if __name__ == "__main__":
    main()
