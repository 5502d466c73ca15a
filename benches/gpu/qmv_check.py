"""Weft's few-row quantized matmul CUDA kernel (core/mlx-sys/kernels/qmv_cuda.h) against MLX's
`quantized_matmul`: outputs and speed, through MLX's Python `mx.fast.cuda_kernel` (the same
source and template arguments the engine passes from C++), so the kernel can be checked and
tuned on a GPU machine without rebuilding weft.

    python3 benches/gpu/qmv_check.py                 # correctness over shapes/dtypes/rows, then speed
    python3 benches/gpu/qmv_check.py --speed-only --rows 1,2,4
    python3 benches/gpu/qmv_check.py --nvrtc LIBNVRTC -I CUDA_INCLUDE -I CCCL -I MLX_SRC   # compile only, no GPU

Correctness: max |weft - reference| / max |reference| where the reference is the dequantized
weight times x in float32; MLX's own error against the same reference is printed beside it.
Exit 1 when Weft's error is past the tolerance of its dtype.
"""
import argparse, pathlib, re, sys, time

HEADER = pathlib.Path(__file__).resolve().parents[2] / "core/mlx-sys/kernels/qmv_cuda.h"
XKIND = {"float32": 0, "float16": 1, "bfloat16": 2}
CUDA_TYPE = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half", "uint32": "uint32_t"}
TOL = {"float32": 2e-4, "float16": 4e-3, "bfloat16": 2e-2}

# (name, N, K): the decode matmuls of the Llama-3.1-8B, Llama-3.2-1B and SmolLM2-135M shapes.
SHAPES = [
    ("8b q/o", 4096, 4096), ("8b k/v", 1024, 4096), ("8b gate/up", 14336, 4096), ("8b down", 4096, 14336),
    ("8b head", 128256, 4096),
    ("1b q/o", 2048, 2048), ("1b k/v", 512, 2048), ("1b gate/up", 8192, 2048), ("1b down", 2048, 8192),
    ("smol q/o", 576, 576), ("smol k/v", 192, 576), ("smol gate/up", 1536, 576), ("smol down", 576, 1536),
    ("smol head", 49152, 576),
]


def source():
    m = re.search(r'R"WEFT_QMV_CUDA\((.*)\)WEFT_QMV_CUDA"', HEADER.read_text(), re.S)
    if not m:
        sys.exit(f"no kernel source between the markers in {HEADER}")
    return m.group(1)


def DT(name):
    """The dtype named `name` for MLX's template arguments; the name itself without MLX (--nvrtc)."""
    try:
        import mlx.core as mx
        return getattr(mx, name)
    except ImportError:
        return name


def bucket(M):
    return 1 if M <= 1 else 2 if M <= 2 else 4 if M <= 4 else 8


def template(xdt, sdt, M, K, bits, gs, rows):
    """What qmv.cpp passes (MB: the row bucket of M)."""
    return [("InT", DT(xdt)), ("ST", DT(sdt)), ("XKind", XKIND[xdt]), ("MB", bucket(M)), ("K", K),
            ("BITS", bits), ("GS", gs), ("ROWS", rows)]


def nvrtc_main(a):
    import ctypes
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from gdn_nvrtc_check import compile_one  # NVRTC with MLX's custom-kernel options
    lib = ctypes.CDLL(a.nvrtc)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    bad = 0
    for xdt in ("bfloat16", "float16", "float32"):
        for M, K, N, bits, gs, rows in ((1, 4096, 4096, 4, 64, 2), (4, 576, 192, 4, 32, 1), (8, 2048, 8192, 8, 64, 4), (1, 1536, 576, 8, 128, 2)):
            args = template(xdt, xdt, M, K, bits, gs, rows)
            consts = []
            for n, v in args:
                consts.append(f"  constexpr int {n} = {v};" if isinstance(v, int) else f"  using {n} = {CUDA_TYPE[str(v).split('.')[-1]]};")
            params = [f"    const {CUDA_TYPE[xdt]}* x", "    const __grid_constant__ Shape x_shape", "    const uint32_t* w",
                      "    const __grid_constant__ Shape w_shape", f"    const {CUDA_TYPE[xdt]}* scales",
                      f"    const {CUDA_TYPE[xdt]}* biases", f"    {CUDA_TYPE[xdt]}* y"]
            src = ('\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
                   "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
                   "__global__ void custom_kernel_weft_qmv(\n" + ",\n".join(params) + ") {\n"
                   + "\n".join(consts) + "\n\n" + source() + "\n}\n\n} // namespace mlx::core::cu\n")
            res, log = compile_one(lib, src, a.includes, a.arch)
            what = f"{xdt} M={M} K={K} N={N} bits={bits} gs={gs} rows={rows}"
            if res != 0:
                bad += 1
                print(f"FAIL {what}\n{log}")
            else:
                print(f"ok   {what}" + (f" (log: {log.strip()})" if log.strip() else ""))
    sys.exit(1 if bad else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvrtc")
    ap.add_argument("-I", dest="includes", action="append", default=[])
    ap.add_argument("--arch", default="compute_90a")
    ap.add_argument("--rows", default="1,2,4", help="rows of W per warp to try")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if a.nvrtc:
        return nvrtc_main(a)

    import mlx.core as mx
    kern = mx.fast.cuda_kernel("weft_qmv", ["x", "w", "scales", "biases"], ["y"], source())
    dtypes = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
    rows_list = [int(r) for r in a.rows.split(",")]

    def weft(x, q, bits, gs, rows):
        w, s, b = q
        M, K = x.shape
        N = w.shape[0]
        xdt = str(x.dtype).split(".")[-1]
        sdt = str(s.dtype).split(".")[-1]
        return kern(inputs=[x, w, s, b], template=template(xdt, sdt, M, K, bits, gs, rows),
                    grid=(32, (N + rows - 1) // rows, 1), threadgroup=(32, a.warps, 1),
                    output_shapes=[(M, N)], output_dtypes=[x.dtype])[0]

    def quant(N, K, bits, gs, dt):
        wf = (mx.random.normal((N, K)) * 0.02).astype(dt)
        q = mx.quantize(wf, group_size=gs, bits=bits)
        mx.eval(q)
        return q

    bad = 0
    if not a.speed_only:
        # (bits, group, x dtype, rows of x): every dtype and width once, batches in bfloat16.
        cases = [(4, 64, "bfloat16", M) for M in (1, 2, 3, 5, 8)] + [(4, 32, "bfloat16", 1), (8, 64, "bfloat16", 1), (8, 64, "bfloat16", 8),
                 (4, 64, "float32", 1), (4, 64, "float32", 4), (4, 64, "float16", 1), (8, 32, "float16", 2)]
        print("correctness: max|err| / max|ref| (ref: dequantized W in float32)")
        for name, N, K in SHAPES:
            if name.endswith("head") or name.endswith("k/v") and not name.startswith("smol"):
                continue
            for bits, gs, xname, M in cases:
                dt = dtypes[xname]
                q = quant(N, K, bits, gs, dt)
                wd = mx.dequantize(*q, group_size=gs, bits=bits).astype(mx.float32)
                x = mx.random.normal((M, K)).astype(dt)
                ref = x.astype(mx.float32) @ wd.T
                theirs = mx.quantized_matmul(x, *q, transpose=True, group_size=gs, bits=bits).astype(mx.float32)
                scale = mx.max(mx.abs(ref)).item()
                e_mlx = mx.max(mx.abs(theirs - ref)).item() / scale
                for rows in (rows_list if (M == 1 and xname == "bfloat16" and bits == 4 and gs == 64) else [rows_list[0]]):
                    ours = weft(x, q, bits, gs, rows).astype(mx.float32)
                    e = mx.max(mx.abs(ours - ref)).item() / scale
                    ok = e <= max(TOL[xname], 2 * e_mlx)
                    bad += not ok
                    print(f"  {'ok  ' if ok else 'FAIL'} {name:12s} bits={bits} gs={gs} {xname:8s} M={M} rows={rows}: weft {e:.2e}  mlx {e_mlx:.2e}")
        print(f"correctness: {'all ok' if not bad else f'{bad} FAILED'}", flush=True)

    def timed(fn):
        mx.eval(fn())
        ts = []
        for _ in range(a.runs):
            mx.synchronize(); t0 = time.perf_counter()
            mx.eval(fn()); mx.synchronize()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2]

    print(f"speed, bfloat16, 4-bit group 64, {a.reps} calls in one evaluation (us per call, GB/s of W)")
    for name, N, K in SHAPES:
        q = quant(N, K, 4, 64, mx.bfloat16)
        nbytes = sum(t.nbytes for t in q)
        for M in (1, 8):
            x = mx.random.normal((M, K)).astype(mx.bfloat16)
            t_mlx = timed(lambda: [mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4) for _ in range(a.reps)]) / a.reps
            line = f"  {name:12s} M={M}: mlx {t_mlx * 1e6:7.1f} us {nbytes / t_mlx / 1e9:5.0f} GB/s"
            for rows in (rows_list if M == 1 else [1]):
                t = timed(lambda: [weft(x, q, 4, 64, rows) for _ in range(a.reps)]) / a.reps
                line += f" | rows={rows} {t * 1e6:7.1f} us {nbytes / t / 1e9:5.0f} GB/s ({t_mlx / t:.2f}x)"
            print(line, flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
