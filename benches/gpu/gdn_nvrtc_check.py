"""Compile Weft's gated-delta CUDA kernel (core/mlx-sys/kernels/gated_delta_cuda.h) with NVRTC
on a machine without a GPU: the body is wrapped the way MLX's fast::cuda_kernel wraps a custom
kernel (its default header, a __global__ function in namespace mlx::core::cu whose parameters
are the inputs, q_shape, the outputs; the template arguments as constants), for the dtypes and
shapes Weft uses. Exits 1 on any compile error, printing NVRTC's log.

Needs: libnvrtc (pip nvidia-cuda-nvrtc-cu12), the CUDA runtime headers (pip
nvidia-cuda-runtime-cu12: cuda_bf16.h, ...), CCCL (the mlx-cuda wheel's include/cccl) and MLX's
device headers (mlx/backend/cuda/device/*.cuh from an MLX source checkout of the pinned
version; the wheel embeds them in libmlx instead of shipping them).

Usage: python3 gdn_nvrtc_check.py --nvrtc LIBNVRTC -I CUDA_INCLUDE -I CCCL -I MLX_SOURCE_ROOT
"""
import argparse, ctypes, pathlib, re, sys

HEADER = pathlib.Path(__file__).resolve().parents[2] / "core/mlx-sys/kernels/gated_delta_cuda.h"

CUDA_TYPE = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half", "bool": "bool"}


def body():
    text = HEADER.read_text()
    m = re.search(r'R"WEFT_GDN_CUDA\((.*)\)WEFT_GDN_CUDA"', text, re.S)
    if not m:
        sys.exit(f"no kernel source between the markers in {HEADER}")
    return m.group(1)


def wrap(source, in_t, g_t, b_t, dk, dv, hk, hv, has_mask):
    """The kernel source MLX's cuda_kernel builds (mlx/backend/cuda/custom_kernel.cpp)."""
    inputs = [("q", in_t), ("k", in_t), ("v", in_t), ("g", g_t), ("beta", b_t), ("state_in", "float32"), ("mask", "bool")]
    params = []
    for name, t in inputs:
        params.append(f"    const {CUDA_TYPE[t]}* {name}")
        # An input's shape/strides/ndim parameters follow it when the body names them (and the
        # input is not a scalar; the mask placeholder is one when there is no mask).
        for suffix, decl in (("_shape", "const __grid_constant__ Shape"), ("_strides", "const __grid_constant__ Strides"), ("_ndim", "const __grid_constant__ int")):
            if name + suffix in source and not (name == "mask" and not has_mask):
                params.append(f"    {decl} {name}{suffix}")
    params += [f"    {CUDA_TYPE[in_t]}* y", "    float* state_out"]
    consts = [f"  using InT = {CUDA_TYPE[in_t]};", f"  using GT = {CUDA_TYPE[g_t]};", f"  using BT = {CUDA_TYPE[b_t]};"]
    consts += [f"  constexpr int {n} = {v};" for n, v in (("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv))]
    consts.append(f"  constexpr bool HasMask = {'true' if has_mask else 'false'};")
    return (
        '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
        "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
        "__global__ void custom_kernel_weft_gated_delta(\n" + ",\n".join(params) + ") {\n"
        + "\n".join(consts) + "\n\n" + source + "\n}\n\n} // namespace mlx::core::cu\n"
    )


def compile_one(lib, src, includes, arch):
    prog = ctypes.c_void_p()
    check = lambda r, what: r == 0 or sys.exit(f"{what} failed: {lib.nvrtcGetErrorString(r).decode()}")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"gdn.cu", 0, None, None), "nvrtcCreateProgram")
    # The options MLX compiles custom kernels with (mlx/backend/cuda/jit_module.cpp).
    opts = ["--device-as-default-execution-space", f"--gpu-architecture={arch}"] + [f"--include-path={i}" for i in includes]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    res = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return res, log.value.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvrtc", required=True)
    ap.add_argument("-I", dest="includes", action="append", default=[])
    ap.add_argument("--arch", default="compute_90a")
    a = ap.parse_args()
    lib = ctypes.CDLL(a.nvrtc)
    src = body()
    bad = 0
    for in_t in ("float32", "bfloat16", "float16"):
        for b_t in sorted({in_t, "float32"}):
            for dk, dv, hk, hv in ((16, 16, 2, 4), (128, 128, 16, 32), (48, 40, 3, 3)):
                for has_mask in (False, True):
                    res, log = compile_one(lib, wrap(src, in_t, "float32", b_t, dk, dv, hk, hv, has_mask), a.includes, a.arch)
                    what = f"InT={in_t} BT={b_t} Dk={dk} Dv={dv} Hk={hk} Hv={hv} mask={has_mask}"
                    if res != 0:
                        bad += 1
                        print(f"FAIL {what}\n{log}")
                    else:
                        print(f"ok   {what}" + (f" (log: {log.strip()})" if log.strip() else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
