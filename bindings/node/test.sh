#!/usr/bin/env bash
# Builds the addon with the napi CLI (weft.node + a freshly generated index.d.ts), checks that the
# committed index.d.ts is up to date, then runs the JS suites under Node.js (node --test, which
# includes the tsc type check) and Bun.
#
#   bindings/node/test.sh                   # from anywhere
#   WEFT_UPDATE_DTS=1 bindings/node/test.sh  # accept a regenerated index.d.ts
#
# `cargo test --workspace` runs the same suites (tests/node.rs) on the addon it builds itself,
# without the index.d.ts check; this script is for working on the binding.
set -euo pipefail
cd "$(dirname "$0")"

# npm ci when node_modules does not match package-lock.json.
if ! cmp -s package-lock.json node_modules/.weft-lock 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.weft-lock
fi

target_dir="$(cargo metadata --format-version 1 --no-deps | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).target_directory))')"
gen_dir="$target_dir/weft-node"
mkdir -p "$gen_dir"
# --dts is relative to the output dir (this one).
rel_dts="$(node -e 'console.log(require("path").relative(process.argv[1], process.argv[2]))' "$PWD" "$gen_dir/index.d.ts")"
npx napi build --release --no-js --dts "$rel_dts" -p weft-node -- -j"${CARGO_BUILD_JOBS:-2}"

if ! cmp -s "$gen_dir/index.d.ts" index.d.ts; then
  if [[ "${WEFT_UPDATE_DTS:-}" == 1 ]]; then
    cp "$gen_dir/index.d.ts" index.d.ts
    echo "index.d.ts updated"
  else
    diff -u index.d.ts "$gen_dir/index.d.ts" || true
    echo "index.d.ts is stale: rerun with WEFT_UPDATE_DTS=1 and commit it" >&2
    exit 1
  fi
fi

node --test test/*.test.mjs
node_modules/.bin/bun test ./test/
