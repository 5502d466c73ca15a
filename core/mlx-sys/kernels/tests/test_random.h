// The standalone kernel tests' and benchmarks' inputs: a fixed-seed xorshift, so every run (and
// the qemu run of the NEON build) sees the same values.
#pragma once
#include <cstdint>

static uint64_t state = 0x9E3779B97F4A7C15ull;
static inline uint32_t next_u32() {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return uint32_t(state >> 32);
}
// Uniform in [-1, 1).
static inline float uniform() { return (next_u32() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }
