// Tensor-core and asynchronous-copy instructions for kernels: inline PTX under nvcc, the
// emulator's warp collectives (emu/tensor_core.cpp) under g++. Semantics and fragment layouts
// are those of the PTX ISA (sm_80+): "Matrix Fragments for mma.m16n8k16 with floating point
// type", "Warp-level matrix load instruction: ldmatrix", "cp.async", "cp.async.commit_group",
// "cp.async.wait_group". With groupID = lane >> 2 and tig = lane % 4 (threadID_in_group):
//   A (16x16, row-major): a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//                         a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, "col"):      b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C, D (16x8, f32):     c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// (two 16-bit elements per 32-bit register, the lower-indexed one in the low half). ldmatrix:
// lane 8i + r gives the address of row r of matrix i; register i of a lane receives row g,
// columns 2t and 2t+1 of matrix i, or with .trans column g, rows 2t and 2t+1.
//
// All of mma and ldmatrix must be executed by the full warp (warp-uniform control flow).
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_common.h"

// Full unrolling of loops over fragment arrays, which must stay in registers (nvcc only; the
// emulator needs none).
#ifdef __CUDACC__
#define TC_UNROLL _Pragma("unroll")
#else
#define TC_UNROLL
#endif

// Two floats rounded to bf16 (nearest even) in one 32-bit register: `lo` in the low half.
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

// d = a * b + c with m16n8k16 bf16 inputs and f32 accumulation. d may alias c.
__device__ inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
#ifdef __CUDACC__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
#else
    cuemu::mma_m16n8k16_bf16(d, a, b, c);
#endif
}

// ldmatrix.m8n8.b16: `row` is this lane's row address in shared memory (16-byte aligned); only
// lanes 0-7 (x1), 0-15 (x2) or all (x4) are used, but every lane must execute the instruction.
#ifdef __CUDACC__
#define TENSOR_CORE_SMEM_ADDRESS(p) static_cast<unsigned>(__cvta_generic_to_shared(p))
#endif

__device__ inline void ldmatrix_x1(uint32_t r[1], const void* row) {
#ifdef __CUDACC__
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(TENSOR_CORE_SMEM_ADDRESS(row))
                 : "memory");
#else
    cuemu::ldmatrix(r, 1, false, row);
#endif
}
__device__ inline void ldmatrix_x2(uint32_t r[2], const void* row) {
#ifdef __CUDACC__
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(TENSOR_CORE_SMEM_ADDRESS(row))
                 : "memory");
#else
    cuemu::ldmatrix(r, 2, false, row);
#endif
}
__device__ inline void ldmatrix_x4(uint32_t r[4], const void* row) {
#ifdef __CUDACC__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(TENSOR_CORE_SMEM_ADDRESS(row))
                 : "memory");
#else
    cuemu::ldmatrix(r, 4, false, row);
#endif
}
__device__ inline void ldmatrix_x1_trans(uint32_t r[1], const void* row) {
#ifdef __CUDACC__
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(TENSOR_CORE_SMEM_ADDRESS(row))
                 : "memory");
#else
    cuemu::ldmatrix(r, 1, true, row);
#endif
}
__device__ inline void ldmatrix_x2_trans(uint32_t r[2], const void* row) {
#ifdef __CUDACC__
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(TENSOR_CORE_SMEM_ADDRESS(row))
                 : "memory");
#else
    cuemu::ldmatrix(r, 2, true, row);
#endif
}
__device__ inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
#ifdef __CUDACC__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(TENSOR_CORE_SMEM_ADDRESS(row))
                 : "memory");
#else
    cuemu::ldmatrix(r, 4, true, row);
#endif
}

// 2^x by ex2.approx.ftz.f32 (PTX ISA, "ex2": the special-function unit's approximation, subnormal
// inputs and results flushed to zero). Plain exp2f compiles to the non-ftz ex2.approx, whose
// subnormal handling costs extra instructions per call. The emulator takes exp2f and flushes a
// subnormal result to zero: its last bits can differ from the GPU's, as exp2f's already do.
__device__ inline float exp2_ftz(float x) {
#ifdef __CUDACC__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    const float y = exp2f(x);
    return y < 0x1p-126f ? 0.0f : y;  // 2^x > 0: below the smallest normal float is subnormal (or 0)
#endif
}

// cp.async.cg: 16 bytes global -> shared, both 16-byte aligned, completed by cp_async_wait of
// its group (then visible to this thread; other threads need a __syncthreads after that).
__device__ inline void cp_async_16(void* smem, const void* gmem) {
#ifdef __CUDACC__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(TENSOR_CORE_SMEM_ADDRESS(smem)), "l"(gmem)
                 : "memory");
#else
    cuemu::cp_async(smem, gmem, 16, 16);
#endif
}
// The same, but when !valid nothing is read (src-size 0) and the 16 bytes become zeros; gmem
// should still be a valid address.
__device__ inline void cp_async_16_or_zero(void* smem, const void* gmem, bool valid) {
#ifdef __CUDACC__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(TENSOR_CORE_SMEM_ADDRESS(smem)),
                 "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
#else
    cuemu::cp_async(smem, gmem, 16, valid ? 16 : 0);
#endif
}
// Closes this thread's current group of cp.async (an empty group is fine).
__device__ inline void cp_async_commit() {
#ifdef __CUDACC__
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    cuemu::cp_async_commit();
#endif
}
// Waits until at most kPending of this thread's most recent groups are still in flight.
template <int kPending> __device__ inline void cp_async_wait() {
#ifdef __CUDACC__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
    cuemu::cp_async_wait(kPending);
#endif
}
