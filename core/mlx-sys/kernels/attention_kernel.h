// Weft's CPU attention: out = softmax(q k^T * scale + mask) v, one pass over the keys per block
// of queries (online softmax, no Lq x Lk buffer). The inner loops live in attention_kernel.cpp,
// compiled once per instruction set like qmm_kernel.cpp; attention.cpp is the MLX primitive.
#pragma once

#include <cstdint>

namespace weft_attn {

enum Mask : int { NONE = 0, CAUSAL = 1, BOOL = 2, ADDITIVE = 3 };

struct Args {
  // Element strides of [B, heads, L, D] views (k / v need not be contiguous: a cache's slice).
  const float* q;
  int64_t qs[4];
  const float* k;
  int64_t ks[4];
  const float* v;
  int64_t vs[4];
  float* out;  // [B, Hq, Lq, Dv], row-contiguous
  int B, Hq, Hkv, Lq, Lk, D, Dv;
  float scale;
  int mask;  // Mask
  // BOOL (one byte per element, nonzero = attend) or ADDITIVE (float32) mask broadcast to
  // [B, Hq, Lq, Lk]: element strides, 0 along broadcast axes.
  const void* m;
  int64_t ms[4];
  int q_block;  // query positions per work item
};

// Query positions per work item for `rep` = Hq / Hkv query heads per key/value head: the rows
// of one item (rep heads x positions) share every key and value they read. (Static: each
// translation unit, compiled with its own -m flags, keeps its own copy.)
static inline int query_block(int rep, int Lq) {
  int qb = 64 / (rep < 64 ? rep : 64);
  if (qb < 1) qb = 1;
  return qb < Lq ? qb : Lq;
}

// Work items: (query block, batch, kv head), the last query blocks (the most keys under a
// causal mask) first so the pool's dynamic hand-out balances.
static inline int items(const Args& a) {
  return (a.Lq + a.q_block - 1) / a.q_block * a.B * a.Hkv;
}

// One work item; items write disjoint rows of out, so they may run on any threads.
using ItemFn = void (*)(const Args&, int item);

struct Kernel {
  ItemFn item;
  int width;
  const char* name;
};

namespace generic { extern const Kernel kernel; }
#if defined(__x86_64__)
namespace avx2 { extern const Kernel kernel; }
namespace avx512 { extern const Kernel kernel; }
#endif

}  // namespace weft_attn
