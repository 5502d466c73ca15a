// What the kernels share across their files (defined in qmm_primitive.cpp): the thread pool and
// the instruction-set choice.
#pragma once

namespace weft_kernels {

// Runs fn(ctx, chunk) for every chunk in [0, chunks) on the pool (the calling thread works too;
// chunks run inline when the pool is busy with another stream's job).
void parallel_for(int chunks, void (*fn)(void*, int), void* ctx);

// Threads in the pool, the caller included.
int pool_threads();

// The widest instruction set this CPU has, under the WEFT_CPU_ISA / weft_kernels_limit_isa cap:
// 0 AVX-512, 1 AVX2 + FMA + F16C, 2 the baseline (SSE2 / NEON).
int isa_level();

}  // namespace weft_kernels
