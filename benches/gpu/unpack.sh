#!/usr/bin/env bash
# On the GPU machine: receives the pieces made by pack.sh. `unpack.sh stash DIR` copies one
# part-NN folder's pieces to $RT/parts (between transfers); `unpack.sh assemble BUNDLE` joins
# them into $RT/site: mlx (Python bindings + the CUDA libmlx.so + include/), mlx_lm,
# mlx_cuda_13.libs, and a `nvidia` link to the CUDA libraries of the machine's PyTorch venv,
# which is where the wheel's RUNPATH ($ORIGIN/../../nvidia/...) looks. Then:
#   export PYTHONPATH=$RT/site LD_LIBRARY_PATH=$RT/site/mlx/lib   (weft at $RT/weft)
set -euo pipefail
RT="${RT:-/tmp/weft-gpu}"
mkdir -p "$RT/parts"
case "$1" in
  stash) cp "$2"/libmlx.so.xz.* "$RT/parts/" ;;
  assemble)
    B="$(cd "$2" && pwd)"; S="$RT/site"; rm -rf "$S"; mkdir -p "$S"
    cat "$RT"/parts/libmlx.so.xz.* > "$RT/libmlx.so.xz"
    (cd "$RT" && sha256sum -c "$B/libmlx.so.xz.sha256" >/dev/null) || { echo "libmlx parts incomplete" >&2; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$S" "$B"/mlx-0.32.4-*.whl "$B"/mlx_lm-0.32.2-*.whl
    mkdir -p "$S/mlx/lib"
    xz -d -c "$RT/libmlx.so.xz" > "$S/mlx/lib/libmlx.so"
    tar -C "$S/mlx" -xJf "$B/include.tar.xz"
    tar -C "$S" -xJf "$B/libs.tar.xz"
    NV="$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia"
    # $S/nvidia mirrors the machine's tree with links, plus the crt/ headers of its CUDA runtime
    # version (the pip runtime of CUDA 13 lacks them; MLX's JIT kernels include them).
    mkdir -p "$S/nvidia/cu13/include"
    for e in "$NV"/*; do [ "$(basename "$e")" = cu13 ] || ln -sfn "$e" "$S/nvidia/"; done
    for e in "$NV"/cu13/*; do [ "$(basename "$e")" = include ] || ln -sfn "$e" "$S/nvidia/cu13/"; done
    for e in "$NV"/cu13/include/*; do ln -sfn "$e" "$S/nvidia/cu13/include/"; done
    if [ ! -e "$S/nvidia/cu13/include/crt/mma.h" ]; then
      minor=$(ls -d "$NV"/../nvidia_cuda_runtime*.dist-info 2>/dev/null | grep -o '13\.[0-9]*' | head -1)
      crt=$(ls "$B"/crt/nvidia_cuda_crt-"${minor:-13.0}".*.whl 2>/dev/null | tail -1)
      [ -n "$crt" ] || crt=$(ls "$B"/crt/*.whl | tail -1)
      rm -f "$S/nvidia/cu13/include/crt"; T="$(mktemp -d)"; python3 -m zipfile -e "$crt" "$T"
      cp -r "$T/nvidia/cu13/include/crt" "$S/nvidia/cu13/include/"; echo "crt headers from $(basename "$crt")"
    fi
    xz -d -c "$B/weft.xz" > "$RT/weft"; chmod +x "$RT/weft"
    echo "assembled in $S (nvidia -> $NV)" ;;
  *) echo "usage: unpack.sh stash DIR | assemble BUNDLE" >&2; exit 2 ;;
esac
