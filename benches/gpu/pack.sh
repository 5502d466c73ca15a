#!/usr/bin/env bash
# Packs what a GPU machine without network or Rust needs to run Weft and mlx-lm on MLX's CUDA
# backend, in pieces small enough for a transfer limit (default 20 MB each): the CUDA wheel's
# libmlx.so (xz, split), its include/ tree and bundled libs, the mlx (cp312 bindings) and mlx-lm
# wheels, and a weft binary. Output: $OUT_DIR/part-NN/ (one per transfer) and $OUT_DIR/bundle/.
# Usage: benches/gpu/pack.sh [WEFT_BIN] ; see benches/gpu/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
WEFT_BIN="${1:-target/release/weft}"
OUT_DIR="${OUT_DIR:-.gpu}"
PART_MB="${PART_MB:-20}"
CACHE="${WEFT_BUILD_CACHE:-$HOME/.cache/weft/build}"
WHEEL_DIR="$CACHE/mlx-cuda-13-0.32.4-manylinux_2_35_x86_64"
[ -f "$WHEEL_DIR/mlx/lib/libmlx.so" ] || { echo "no $WHEEL_DIR: build once with WEFT_MLX_BACKEND=cuda13" >&2; exit 1; }
mkdir -p "$OUT_DIR/stage" "$OUT_DIR/bundle"
stage="$OUT_DIR/stage"
if [ ! -s "$stage/libmlx.so.xz" ]; then
  xz -9 -T0 -c "$WHEEL_DIR/mlx/lib/libmlx.so" > "$stage/libmlx.so.xz.tmp" && mv "$stage/libmlx.so.xz.tmp" "$stage/libmlx.so.xz"
fi
rm -rf "$OUT_DIR"/part-*
(cd "$stage" && split -b "${PART_MB}M" -d -a 2 libmlx.so.xz libmlx.so.xz.)
for p in "$stage"/libmlx.so.xz.[0-9][0-9]; do
  n="${p##*.}"; mkdir -p "$OUT_DIR/part-$n"; mv "$p" "$OUT_DIR/part-$n/"
done
(cd "$stage" && sha256sum libmlx.so.xz) > "$OUT_DIR/bundle/libmlx.so.xz.sha256"
tar -C "$WHEEL_DIR/mlx" -cJf "$OUT_DIR/bundle/include.tar.xz" include
tar -C "$WHEEL_DIR" -cJf "$OUT_DIR/bundle/libs.tar.xz" mlx_cuda_13.libs
for spec in "mlx==0.32.4" "mlx-lm==0.32.2"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 -d "$OUT_DIR/bundle" "$spec"
done
# MLX's CUDA JIT includes the crt/ headers, a package of their own from CUDA 13 on: one per
# minor version, unpack.sh picks the machine's.
mkdir -p "$OUT_DIR/bundle/crt"
for minor in 0 1 2 3 4 5; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$OUT_DIR/bundle/crt" "nvidia-cuda-crt==13.$minor.*"
done
xz -9 -T0 -c "$WEFT_BIN" > "$OUT_DIR/bundle/weft.xz"
ls -la "$OUT_DIR"/part-* "$OUT_DIR/bundle"
