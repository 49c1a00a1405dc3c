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

// ---- Warpgroup MMA (sm_90a): wgmma.mma_async m64nNk16, bf16 inputs, f32 accumulators ----
// PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions". A warpgroup (four
// consecutive warps, the first a multiple of 4) computes D (64 x N) = A (64 x 16) B (16 x N) (+ D)
// in one instruction; warp w % 4 of it holds rows 16 (w % 4).. of A (register form) and of D, in the
// mma.m16n8k16 layouts above: d[4 j + i] is accumulator element i of columns 8 j..8 j + 7, a[0..3]
// an A fragment. B, and A in the shared form, are read from shared memory by a matrix descriptor
// (wgmma_descriptor below). The instruction is asynchronous:
//   wgmma_fence()            before the first wgmma and after the warp's own accesses to registers a
//                            wgmma reads or writes (the accumulators, A fragments)
//   wgmma_m64k16_*(...)      issue (several into the same accumulators chain in order)
//   wgmma_commit_group()     closes the issued instructions into a group
//   wgmma_wait_group<P>()    waits until at most P groups are in flight; then
//   wgmma_fence_operands(d)  keeps the compiler from moving the accumulators' uses above the wait.
// Until the wait, neither the accumulators nor the shared-memory operands may be touched. Shared
// memory written by ordinary stores (or cp.async) must be made visible to the instruction's async
// proxy by fence_proxy_async_shared() and a barrier before it is read.
//
// The GPU forms exist for sm_90a only (nvcc -gencode arch=compute_90a,code=sm_90a); compiled for
// another architecture they trap. The emulator (emu/tensor_core.cpp) runs them warp by warp with
// the same operands and k order as mma.sync, holds the accumulators NaN until the wait retires them,
// and fails the launch when an operand in shared memory is rewritten or an accumulator written
// before that, when a wgmma follows a wait without a fence, or the lanes disagree on the operands.
// It does not check fence_proxy_async_shared.

// The shared-memory address (the .shared window) that descriptors hold.
__device__ inline uint32_t shared_address(const void* p) {
#ifdef __CUDACC__
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
    return cuemu::shared_window_address(p);
#endif
}

// Matrix descriptor swizzle modes (PTX ISA, "Matrix Descriptor Format", bits 62-63).
enum class SmemSwizzle : uint64_t { none = 0, bytes128 = 1, bytes64 = 2, bytes32 = 3 };

// A wgmma shared-memory matrix descriptor: the operand at `smem` in a canonical layout (PTX ISA,
// "Shared Memory Matrix Layout"; emu/tensor_core.cpp writes out where element (mn, k) lies in
// each). leading_bytes (LBO) and stride_bytes (SBO) are multiples of 16 below 2^18; the swizzled
// layouts' atoms (8 rows of 32, 64 or 128 bytes) start at multiples of their size. Base offset 0.
__device__ inline uint64_t wgmma_descriptor(const void* smem, SmemSwizzle swizzle, uint32_t leading_bytes, uint32_t stride_bytes) {
    return uint64_t((shared_address(smem) >> 4) & 0x3fff) | (uint64_t((leading_bytes >> 4) & 0x3fff) << 16) |
           (uint64_t((stride_bytes >> 4) & 0x3fff) << 32) | (uint64_t(swizzle) << 62);
}

__device__ inline void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#elif !defined(__CUDACC__)
    cuemu::wgmma_fence();
#endif
}
__device__ inline void wgmma_commit_group() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#elif !defined(__CUDACC__)
    cuemu::wgmma_commit_group();
#endif
}
template <int kPending> __device__ inline void wgmma_wait_group() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#elif !defined(__CUDACC__)
    cuemu::wgmma_wait_group(kPending);
#endif
}
// An empty instruction that reads and writes each register: the compiler cannot move their uses
// across it, nor it across the asm volatile wgmma instructions. After a wait: the accumulators' uses
// stay below it. Before a wgmma_fence: the registers a wgmma reads (A fragments, rescaled
// accumulators) are computed above the fence, or ptxas injects a warpgroup.arrive of its own before
// each wgmma that reads them (C7519).
template <int kCount> __device__ inline void wgmma_fence_operands(float (&d)[kCount]) {
#ifdef __CUDACC__
    FULL_UNROLL
    for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}
template <int kCount> __device__ inline void wgmma_fence_operands(uint32_t (&r)[kCount]) {
#ifdef __CUDACC__
    FULL_UNROLL
    for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(r[i])::"memory");
#endif
}
// fence.proxy.async.shared::cta: this thread's earlier shared-memory writes become visible to the
// async proxy (wgmma's operand reads) once a barrier follows.
__device__ inline void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

// D (64 x N) (+)= A B, A and B from shared memory (the SS form). kAMnMajor / kBMnMajor: the operand
// is stored M- / N-major (imm-trans 1), else K-major. accumulate false: D = A B (scale-d 0).
template <int N, bool kAMnMajor, bool kBMnMajor>
__device__ inline void wgmma_m64k16_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, bool accumulate) {
    static_assert(N == 64 || N == 128, "the shapes written out below: m64n64k16 and m64n128k16");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "%32, %33, p, 1, 1, %35, %36;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)), "n"(int(kAMnMajor)), "n"(int(kBMnMajor)));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1, %67, %68;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)), "n"(int(kAMnMajor)), "n"(int(kBMnMajor)));
    }
#elif defined(__CUDA_ARCH__)
    __trap();
#elif !defined(__CUDACC__)
    cuemu::wgmma_mma_async({N, true, kAMnMajor, kBMnMajor, accumulate, a_desc, b_desc, nullptr}, d);
#endif
}

// D (64 x N) (+)= A B, A from the warp's registers (its 16 rows, the mma.m16n8k16 A fragment), B
// from shared memory (the RS form).
template <int N, bool kBMnMajor>
__device__ inline void wgmma_m64k16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc, bool accumulate) {
    static_assert(N == 64 || N == 128, "the shapes written out below: m64n64k16 and m64n128k16");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)), "n"(int(kBMnMajor)));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate)), "n"(int(kBMnMajor)));
    }
#elif defined(__CUDA_ARCH__)
    __trap();
#elif !defined(__CUDACC__)
    cuemu::wgmma_mma_async({N, false, false, kBMnMajor, accumulate, 0, b_desc, a}, d);
#endif
}

// ---- Warp tile products: a warp's 16-row fragments times a shared-memory tile, by ldmatrix and
// mma.sync m16n8k16. The accumulators and P operands are in the mma accumulator layout (acc[j] or
// p[j] holds columns 8j..8j+7); every element adds its bf16 products in k order, one mma's 16 after
// another. All lanes call them with the same (warp-uniform) arguments.
//
// The emulator runs each whole product as one warp collective (emu/tensor_core.cpp): it reads the
// same shared-memory elements and adds the same products in the same order, so the result is bitwise
// that of the instructions below, with one fiber switch per lane instead of one per lane and
// instruction (a 16 x 64 x 64 product is 52 of them). CUEMU_TENSOR_CORE=instructions runs the
// instructions instead, and the test suite runs both and compares them. The hooks return false where
// the instructions must run: always on a GPU, where they compile to nothing.

__device__ inline bool tile_product_in_emulator_a_bt(int frags, int n, int k, const __nv_bfloat16* a,
                                                     const __nv_bfloat16* b, int ld, float* acc, int live_begin, int live_end) {
#ifdef __CUDACC__
    return false;
#else
    return cuemu::warp_tile_product({cuemu::TileOperands::a_bt, frags, n, k, a, ld, b, ld, nullptr, live_begin, live_end}, acc,
                                    nullptr);
#endif
}
__device__ inline bool tile_product_in_emulator_p_b(int frags, int n, int k, const float* p, const __nv_bfloat16* b,
                                                    int ld, float* acc, int live_begin, int live_end) {
#ifdef __CUDACC__
    return false;
#else
    return cuemu::warp_tile_product({cuemu::TileOperands::p_b, frags, n, k, nullptr, 0, b, ld, nullptr, live_begin, live_end}, acc,
                                    p);
#endif
}
__device__ inline bool tile_product_in_emulator_at_b(int n, int k, const __nv_bfloat16* at, int ld_at,
                                                     const __nv_bfloat16* b, int ld, const int* live, float* acc,
                                                     int live_begin, int live_end) {
#ifdef __CUDACC__
    return false;
#else
    return cuemu::warp_tile_product({cuemu::TileOperands::at_b, 1, n, k, at, ld_at, b, ld, live, live_begin, live_end}, acc,
                                    nullptr);
#endif
}

// Live ranges (warp-uniform, multiples of 16): the products below take [live_begin, live_end) of their
// n (mma_a_bt: the other columns of acc are left as they are, their B rows unread) or of their k
// (mma_p_b, mma_at_b: the other k blocks add nothing). The attention kernels pass the part of a tile
// that the causal mask leaves to a warp, so the diagonal tiles' masked blocks cost no MMA; what is
// skipped would only add exact zeros (P = 0, dS = 0) or be masked to -inf, so the bits are those of
// the whole product.

// Runs product(begin, end) over the live range; when that is the whole extent, with the whole extent
// as constants, so a full tile's products compile as they would without ranges (no per-block tests
// between the loads the compiler hoists and their MMAs) and only a tile the mask cuts pays for them.
template <int kExtent, typename Product>
__device__ inline void with_live_range(int live_begin, int live_end, Product&& product) {
    if (live_begin == 0 && live_end == kExtent) product(0, kExtent);
    else product(live_begin, live_end);
}
// The live part of a tile of `width` from `first`, as the kernels and their cost counts take it: up to
// and including `last` (rounded up to 16), or from `from` on (rounded down to 16).
__host__ __device__ inline int live_end_through(int last, int first, int width) {
    const int end = last < first ? 0 : (last - first + 16) / 16 * 16;  // last - first + 1, rounded up
    return end > width ? width : end;
}
__host__ __device__ inline int live_begin_from(int from, int first, int width) {
    const int begin = from <= first ? 0 : (from - first) / 16 * 16;
    return begin > width ? width : begin;
}

// acc (16 x N) += A B^T, both operands row-major in shared memory with K columns: A is the warp's
// 16 rows at a, B is N rows at b. (S = Q K^T, dP = dO V^T, and their transposes.)
template <int N, int K>
__device__ inline void mma_a_bt(float (&acc)[N / 8][4], const __nv_bfloat16* a, const __nv_bfloat16* b, int ld,
                                int live_begin = 0, int live_end = N) {
    if (tile_product_in_emulator_a_bt(1, N, K, a, b, ld, &acc[0][0], live_begin, live_end)) return;
    const int lane = int(threadIdx.x) % 32;
    FULL_UNROLL
    for (int k0 = 0; k0 < K; k0 += 16) {
        // Matrices: rows 0-7 / 8-15 of columns k0.. , then of columns k0+8.. (the A fragment order).
        uint32_t af[4];
        ldmatrix_x4(af, a + (lane % 16) * ld + k0 + (lane / 16) * 8);
        FULL_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            if (8 * n < live_begin || 8 * n >= live_end) continue;
            // Matrices: rows 8n.. columns k0.. and k0+8.., then rows 8n+8.. (B fragments of n, n+1).
            uint32_t bf[4];
            ldmatrix_x4(bf, b + (8 * n + lane % 8 + (lane / 16) * 8) * ld + k0 + (lane / 8 % 2) * 8);
            mma_m16n8k16_bf16(acc[n], af, bf, acc[n]);
            mma_m16n8k16_bf16(acc[n + 1], af, bf + 2, acc[n + 1]);
        }
    }
}

// acc (16 x N) += P B: P (16 x K) is an accumulator-layout fragment (p[j] holds columns 8j..8j+7),
// rounded to bf16; B is K rows of N columns in shared memory at b, read transposed by ldmatrix.
// (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.)
template <int N, int K>
__device__ inline void mma_p_b(float (&acc)[N / 8][4], const float (&p)[K / 8][4], const __nv_bfloat16* b, int ld,
                               int live_begin = 0, int live_end = K) {
    if (tile_product_in_emulator_p_b(1, N, K, &p[0][0], b, ld, &acc[0][0], live_begin, live_end)) return;
    const int lane = int(threadIdx.x) % 32;
    FULL_UNROLL
    for (int k = 0; k < K / 16; ++k) {
        if (16 * k < live_begin || 16 * k >= live_end) continue;
        // Accumulator tiles 2k and 2k+1 are, register for register, the A fragment of columns
        // 16k..16k+15 (PTX ISA m16n8k16 figures: c0,c1 / c2,c3 = rows g / g+8, as a0,a1 / a2,a3).
        const uint32_t af[4] = {pack_bf16x2(p[2 * k][0], p[2 * k][1]), pack_bf16x2(p[2 * k][2], p[2 * k][3]),
                                pack_bf16x2(p[2 * k + 1][0], p[2 * k + 1][1]),
                                pack_bf16x2(p[2 * k + 1][2], p[2 * k + 1][3])};
        FULL_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            // Matrices: rows 16k.. / 16k+8.. of columns 8n.., then of columns 8n+8.. (transposed).
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (16 * k + lane % 16) * ld + 8 * n + (lane / 16) * 8);
            mma_m16n8k16_bf16(acc[n], af, bf, acc[n]);
            mma_m16n8k16_bf16(acc[n + 1], af, bf + 2, acc[n + 1]);
        }
    }
}

// acc (16 x N) += A B: A (16 x K) stored transposed in shared memory (K rows at at, A's row r in column
// r of each), B (K x N) row-major at b; ldmatrix .trans reads both. (dQ += dS K from dS^T.) Columns
// 16k.. of A with live[k] == 0 are zeros and are skipped, B's rows 16k.. unread: they may hold NaN
// (a masked document's keys), and 0 * NaN is NaN.
template <int N, int K>
__device__ inline void mma_at_b(float (&acc)[N / 8][4], const __nv_bfloat16* at, int ld_at, const __nv_bfloat16* b, int ld, const int* live,
                                int live_begin = 0, int live_end = K) {
    static_assert(N == 8 || N % 16 == 0, "n tiles in pairs, or one");
    if (tile_product_in_emulator_at_b(N, K, at, ld_at, b, ld, live, &acc[0][0], live_begin, live_end)) return;
    const int lane = int(threadIdx.x) % 32;
    FULL_UNROLL
    for (int k = 0; k < K / 16; ++k) {
        if (!live[k] || 16 * k < live_begin || 16 * k >= live_end) continue;
        // Matrices: A rows 0-7 / 8-15 of columns 16k.. (stored rows 16k.., columns 0.. / 8..), then of
        // columns 16k+8.. (stored rows 16k+8..), each transposed on the way.
        uint32_t af[4];
        ldmatrix_x4_trans(af, at + (16 * k + lane % 8 + (lane / 16) * 8) * ld_at + (lane / 8 % 2) * 8);
        if constexpr (N == 8) {  // one n tile (hs 16's dQ column parts): rows 16k.. and 16k+8.. of B
            uint32_t bf[2];
            ldmatrix_x2_trans(bf, b + (16 * k + lane % 16) * ld);
            mma_m16n8k16_bf16(acc[0], af, bf, acc[0]);
        }
        FULL_UNROLL
        for (int n = 0; n + 1 < N / 8; n += 2) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (16 * k + lane % 16) * ld + 8 * n + (lane / 16) * 8);
            mma_m16n8k16_bf16(acc[n], af, bf, acc[n]);
            mma_m16n8k16_bf16(acc[n + 1], af, bf + 2, acc[n + 1]);
        }
    }
}

// mma_a_bt for F row fragments at once: fragment f's 16 rows at a + 16 f ld, acc[f] += A_f B^T. Each
// B fragment is loaded once for all F (FlashAttention-2's reuse across a warp's rows).
template <int F, int N, int K>
__device__ inline void mma_a_bt_rows(float (&acc)[F][N / 8][4], const __nv_bfloat16* a, const __nv_bfloat16* b, int ld,
                                     int live_begin = 0, int live_end = N) {
    if (tile_product_in_emulator_a_bt(F, N, K, a, b, ld, &acc[0][0][0], live_begin, live_end)) return;
    const int lane = int(threadIdx.x) % 32;
    FULL_UNROLL
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[F][4];
        FULL_UNROLL
        for (int f = 0; f < F; ++f) ldmatrix_x4(af[f], a + (16 * f + lane % 16) * ld + k0 + (lane / 16) * 8);
        FULL_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            if (8 * n < live_begin || 8 * n >= live_end) continue;
            uint32_t bf[4];
            ldmatrix_x4(bf, b + (8 * n + lane % 8 + (lane / 16) * 8) * ld + k0 + (lane / 8 % 2) * 8);
            FULL_UNROLL
            for (int f = 0; f < F; ++f) {
                mma_m16n8k16_bf16(acc[f][n], af[f], bf, acc[f][n]);
                mma_m16n8k16_bf16(acc[f][n + 1], af[f], bf + 2, acc[f][n + 1]);
            }
        }
    }
}

// mma_p_b for F row fragments at once: acc[f] += P_f B, each B fragment loaded once for all F.
template <int F, int N, int K>
__device__ inline void mma_p_b_rows(float (&acc)[F][N / 8][4], const float (&p)[F][K / 8][4], const __nv_bfloat16* b, int ld,
                                    int live_begin = 0, int live_end = K) {
    if (tile_product_in_emulator_p_b(F, N, K, &p[0][0][0], b, ld, &acc[0][0][0], live_begin, live_end)) return;
    const int lane = int(threadIdx.x) % 32;
    FULL_UNROLL
    for (int k = 0; k < K / 16; ++k) {
        if (16 * k < live_begin || 16 * k >= live_end) continue;
        uint32_t af[F][4];
        FULL_UNROLL
        for (int f = 0; f < F; ++f) {
            af[f][0] = pack_bf16x2(p[f][2 * k][0], p[f][2 * k][1]);
            af[f][1] = pack_bf16x2(p[f][2 * k][2], p[f][2 * k][3]);
            af[f][2] = pack_bf16x2(p[f][2 * k + 1][0], p[f][2 * k + 1][1]);
            af[f][3] = pack_bf16x2(p[f][2 * k + 1][2], p[f][2 * k + 1][3]);
        }
        FULL_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (16 * k + lane % 16) * ld + 8 * n + (lane / 16) * 8);
            FULL_UNROLL
            for (int f = 0; f < F; ++f) {
                mma_m16n8k16_bf16(acc[f][n], af[f], bf, acc[f][n]);
                mma_m16n8k16_bf16(acc[f][n + 1], af[f], bf + 2, acc[f][n + 1]);
            }
        }
    }
}
