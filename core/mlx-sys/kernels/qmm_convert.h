// float16 / bfloat16 scales and biases into float32 for the quantized-matmul kernels. Included
// inside each kernel file's per-ISA anonymous namespace (after <immintrin.h> where F16C is on),
// so every instruction set gets its own internal copy.
inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal: normalize.
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while (!(man & 0x400));
    bits = sign | uint32_t(112 - e) << 23 | ((man & 0x3ff) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// One row of scales or biases (n values of `dtype`) into float32.
void to_f32(const void* src, int dtype, int n, float* dst) {
  if (dtype == F32) {
    __builtin_memcpy(dst, src, size_t(n) * 4);
  } else if (dtype == BF16) {
    auto s = static_cast<const uint16_t*>(src);
    for (int i = 0; i < n; i++) {
      uint32_t bits = uint32_t(s[i]) << 16;
      __builtin_memcpy(dst + i, &bits, 4);
    }
  } else {
    auto s = static_cast<const uint16_t*>(src);
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#elif defined(__aarch64__)
    for (; i < n; i++) {
      __fp16 h;
      __builtin_memcpy(&h, s + i, 2);
      dst[i] = float(h);
    }
#endif
    for (; i < n; i++) dst[i] = half_to_float(s[i]);
  }
}
