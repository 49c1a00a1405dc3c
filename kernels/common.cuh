// Device helpers every kernel family shares: the element type of parameters, activations and
// gradients (floatX), 16-byte vector access, conversions, and warp/block reductions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda_common.h"

#if !defined(__CUDACC__) && (defined(__FMA__) || defined(__AVX2__))
#include <immintrin.h>  // fma4's and unpack_floats' SIMD forms in the CPU build
#endif

// BF16 by default (FP32 accumulation inside kernels); -DPRECISION_FP32 for FP32 everywhere.
#if defined(PRECISION_FP32)
using floatX = float;
constexpr const char* kPrecisionName = "FP32";
#else
using floatX = __nv_bfloat16;
constexpr const char* kPrecisionName = "BF16";
#endif

// Before a loop over a thread's few vector lanes that the CPU build should run as SIMD: g++ unrolls
// such short loops completely before its loop vectorizer runs, and its basic-block vectorizer then
// leaves their selects scalar (and the lanes meet a vector load, e.g. expf_each, through
// store-forwarding stalls): the classifier ran at 4.3 ns a logit so, 2.2 with these loops kept
// whole for the loop vectorizer. nvcc unrolls them as always (registers, not local memory).
#ifdef __CUDACC__
#define LANE_LOOP
#else
#define LANE_LOOP _Pragma("GCC unroll 1")
#endif

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Rounds to nearest even (deterministic); a NaN becomes the canonical BF16 NaN 0x7FFF, as both
// cvt.rn.bf16.f32 and cuda_bf16.hpp's host __float2bfloat16 give. Stochastic rounding is the
// optimizer's business. The host form (the CPU build runs kernels there) computes the same bits
// without branches, so that the loops around it vectorize; cuda_bf16.hpp's host version branches.
__host__ __device__ inline uint16_t bf16_bits_from_float_bits(uint32_t bits) {
    const uint32_t nearest_even = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return uint16_t((bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFFu : nearest_even);
}
template <typename T> __host__ __device__ inline T from_float(float x);
template <> __host__ __device__ inline float from_float<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
#ifdef __CUDA_ARCH__
    return __float2bfloat16(x);
#else
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    return __ushort_as_bfloat16(bf16_bits_from_float_bits(bits));
#endif
}

// fmaxf: IEEE 754 maxNum, a NaN operand gives the other one. On the host (the CPU build runs kernels
// there) a compare and select, which g++ inlines and vectorizes; glibc's fmaxf is a call.
__host__ __device__ inline float max_number(float a, float b) {
#ifdef __CUDA_ARCH__
    return fmaxf(a, b);
#else
    return ((a > b) | (b != b)) ? a : b;
#endif
}

// acc + x * y per component, each a fused multiply-add (what nvcc and g++ contract a * b + c to
// anyway). The CPU build runs it as one 4-wide SIMD instruction: g++ kept float4 arithmetic scalar.
__host__ __device__ inline float4 fma4(const float4& x, const float4& y, const float4& acc) {
#if defined(__CUDACC__) || !defined(__FMA__)
    return make_float4(fmaf(x.x, y.x, acc.x), fmaf(x.y, y.y, acc.y), fmaf(x.z, y.z, acc.z), fmaf(x.w, y.w, acc.w));
#else
    __m128 a, b, c;
    memcpy(&a, &x, sizeof(a));
    memcpy(&b, &y, sizeof(b));
    memcpy(&c, &acc, sizeof(c));
    const __m128 r = _mm_fmadd_ps(a, b, c);
    float4 out;
    memcpy(&out, &r, sizeof(out));
    return out;
#endif
}

// out[k] = expf(in[k]) for a thread's N values. The CPU build takes them 8 at a time through
// glibc's vector expf (emu/cuda_emu.h); g++ would make N scalar calls.
template <int N> __device__ inline void expf_each(float (&out)[N], const float (&in)[N]) {
#ifdef __CUDACC__
    for (int k = 0; k < N; ++k) out[k] = expf(in[k]);
#else
    cuemu::expf_each(out, in, N);
#endif
}

// ---------------------------------------------------------------------------------------------
// 16 bytes of T moved as one vector (one 128-bit load/store instruction on the GPU). Pointers
// must be 16-byte aligned: kernels require the relevant dimensions to be multiples of
// Packed128<T>::size, and launchers check it.

template <typename T> struct alignas(16) Packed128 {
    static constexpr int size = int(16 / sizeof(T));
    T v[size];
    __host__ __device__ T& operator[](int i) { return v[i]; }
    __host__ __device__ const T& operator[](int i) const { return v[i]; }
    __host__ __device__ static Packed128 filled(float value) {
        Packed128 p;
        for (int i = 0; i < size; ++i) p.v[i] = from_float<T>(value);
        return p;
    }
};

// A Packed128's values as floats, and floats rounded into one (from_float's rounding). The CPU
// build converts the 16 bytes in two plain loops over integers, which g++ vectorizes; element by
// element through to_float/from_float, BF16 conversions were 16-bit scalar loads and inserts that
// kept the math around them scalar too.
template <typename T> __host__ __device__ inline void unpack_floats(float (&out)[Packed128<T>::size], const Packed128<T>& p) {
#ifdef __CUDA_ARCH__
    for (int k = 0; k < Packed128<T>::size; ++k) out[k] = to_float(p[k]);
#else
    if constexpr (std::is_same_v<T, float>) {
        memcpy(out, &p, sizeof(p));
    } else {
        static_assert(sizeof(T) == 2, "BF16");
#if !defined(__CUDACC__) && defined(__AVX2__)
        // One 32-byte result: g++'s loop below made two 16-byte halves, stored apart, which the
        // 32-byte load of the code that used them could not forward from (a ~15-cycle stall each).
        __m128i raw;
        memcpy(&raw, &p, sizeof(p));
        const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16);
        memcpy(out, &bits, sizeof(bits));
#else
        uint16_t raw[Packed128<T>::size];
        uint32_t bits[Packed128<T>::size];
        memcpy(raw, &p, sizeof(p));
        for (int k = 0; k < Packed128<T>::size; ++k) bits[k] = uint32_t(raw[k]) << 16;
        memcpy(out, bits, sizeof(bits));
#endif
    }
#endif
}
template <typename T> __host__ __device__ inline Packed128<T> pack_floats(const float (&in)[Packed128<T>::size]) {
    Packed128<T> p;
#ifdef __CUDA_ARCH__
    for (int k = 0; k < Packed128<T>::size; ++k) p[k] = from_float<T>(in[k]);
#else
    if constexpr (std::is_same_v<T, float>) {
        memcpy(&p, in, sizeof(p));
    } else {
#if !defined(__CUDACC__) && defined(__AVX2__)
        // bf16_bits_from_float_bits on all 8 lanes of one 32-byte register, narrowed to 16 bytes in
        // registers: g++ made the loop below two 4-lane halves joined through memory (a tenth of
        // `make train`'s classifier, perf).
        __m256i bits;
        memcpy(&bits, in, sizeof(bits));
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        const __m256i nearest_even = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
        const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
        const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));  // both below 2^31
        const __m256i rounded = _mm256_blendv_epi8(nearest_even, _mm256_set1_epi32(0x7FFF), nan);
        // packus packs each 128-bit half on its own (values fit 16 bits, so no saturation): 64-bit
        // quarters 0 and 2 hold lanes 0-3 and 4-7 (1 and 3 repeat them); the permute puts 2 after 0.
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
        const __m128i low = _mm256_castsi256_si128(packed);
        memcpy(&p, &low, sizeof(p));
#else
        uint32_t bits[Packed128<T>::size];
        uint16_t raw[Packed128<T>::size];
        memcpy(bits, in, sizeof(bits));
        LANE_LOOP
        for (int k = 0; k < Packed128<T>::size; ++k) raw[k] = bf16_bits_from_float_bits(bits[k]);
        memcpy(&p, raw, sizeof(p));
#endif
    }
#endif
    return p;
}

template <typename T> __device__ inline Packed128<T> load128(const T* p) {
    return *reinterpret_cast<const Packed128<T>*>(p);
}
// Streaming load/store: data touched once, so keep it out of the caches (ld.global.cs).
// (memcpy between the int4 and the Packed128 avoids type punning; it compiles to a register move.)
template <typename T> __device__ inline Packed128<T> load128cs(const T* p) {
    int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
    Packed128<T> r;
    memcpy(&r, &raw, sizeof(r));
    return r;
}
template <typename T> __device__ inline void store128(T* p, const Packed128<T>& value) {
    *reinterpret_cast<Packed128<T>*>(p) = value;
}
template <typename T> __device__ inline void store128cs(T* p, const Packed128<T>& value) {
    int4 raw;
    memcpy(&raw, &value, sizeof(raw));
    __stcs(reinterpret_cast<int4*>(p), raw);
}

// ---------------------------------------------------------------------------------------------
// Reductions. The order of additions is fixed by the code, so results are deterministic.

struct AddOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return max_number(a, b); }
};

// v = op(v, __shfl_xor_sync(0xffffffff, v, offset)) for each of Offsets in turn, in all lanes of
// a warp: a butterfly, whose lanes end equal within each group the offsets span. The CPU build
// runs the whole chain as one warp collective with the same operations in the same order
// (emu/cuda_emu.h): there a shuffle costs a fiber switch per lane, and these chains are most of
// a training step's shuffles.
template <typename Op, int... Offsets> __device__ inline float warp_xor_chain(float v) {
#ifdef __CUDACC__
    ((v = Op{}(v, __shfl_xor_sync(0xffffffffu, v, Offsets))), ...);
    return v;
#else
    return cuemu::warp_xor_chain<Op, Offsets...>(v);
#endif
}

// kCount values' chains at once, each with warp_xor_chain's operations in its order: one collective
// in the CPU build instead of kCount (a fiber switch per lane each).
template <typename Op, int kCount, int... Offsets> __device__ inline void warp_xor_chain_each(float (&v)[kCount]) {
#ifdef __CUDACC__
    FULL_UNROLL
    for (int i = 0; i < kCount; ++i) ((v[i] = Op{}(v[i], __shfl_xor_sync(0xffffffffu, v[i], Offsets))), ...);
#else
    cuemu::warp_xor_chain_each<Op, kCount, Offsets...>(v);
#endif
}

// Butterfly reduction over the 32 lanes of a warp; every lane gets the result.
template <typename Op> __device__ inline float warp_reduce(float v, Op) { return warp_xor_chain<Op, 16, 8, 4, 2, 1>(v); }
__device__ inline float warp_sum(float v) { return warp_reduce(v, AddOp{}); }
__device__ inline float warp_max(float v) { return warp_reduce(v, MaxOp{}); }
// warp_sum of each of kCount values.
template <int kCount> __device__ inline void warp_sum_each(float (&v)[kCount]) { warp_xor_chain_each<AddOp, kCount, 16, 8, 4, 2, 1>(v); }

// Reduction over the block, returned to every thread. blockDim.x must be a multiple of 32 (at most
// 1024); `scratch` is kBlockReduceScratch floats of shared memory, which the next block_reduce over
// the same scratch may reuse at once (any other use needs a barrier first). Warp 0 alone reduces
// the warps' sums and leaves the result in scratch[32]: the other warps wait at two barriers and
// no second shuffle chain (the CPU emulator's cost per thread is a switch per wait).
constexpr int kBlockReduceScratch = 33;
template <typename Op> __device__ inline float block_reduce(float v, float* scratch, float identity, Op op) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_reduce(v, op);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_reduce(lane < nwarps ? scratch[lane] : identity, op);
        if (lane == 0) scratch[32] = v;
    }
    // Also orders warp 0's reads of scratch[0..31] before any thread's next write there, and every
    // thread's read of scratch[32] comes before it reaches the next reduction's first barrier, after
    // which alone scratch[32] is written again.
    __syncthreads();
    return scratch[32];
}
__device__ inline float block_sum(float v, float* scratch) { return block_reduce(v, scratch, 0.0f, AddOp{}); }
// (the classifier's softmax)
__device__ inline float block_max(float v, float* scratch) { return block_reduce(v, scratch, -INFINITY, MaxOp{}); }

// ---------------------------------------------------------------------------------------------
// Column sums of partial rows (the deterministic second half of a reduction over rows: the LayerNorm
// parameter gradients, the bias gradients): a block's threads of one column-group take the rows in
// blockDim.y slices, slice y the rows y, y + slices, ... in order, then the slices are added in order.
// Slices in parallel pay only for many rows: one per 32 rows, at most 16, a function of the row count
// alone, so the sums' order is too (one slice, the rows in order, below 64 rows).
constexpr int kPartialRowSlices = 16;
constexpr int kPartialRowsPerSlice = 32;
inline int partial_row_slices(int partial_rows) {
    return std::clamp(partial_rows / kPartialRowsPerSlice, 1, kPartialRowSlices);
}

// ---------------------------------------------------------------------------------------------
// Launcher input checks. A launcher that gets sizes its kernels do not support (the message of
// its family's `<family>_requirements(...)`, or its own) throws that one line with the launcher's
// name (kernels/cuda_common.h, "Errors"), like a failed launch does: a silently wrong result would
// be worse.

inline void require_supported(const char* launcher, const std::string& problem) {
    if (!problem.empty()) throw TrainGptError(problem + " (in " + launcher + ")");
}

// ---------------------------------------------------------------------------------------------
// Alignment of arrays that may start anywhere (ZeRO shards, slices of the flat parameter
// buffer): launchers peel scalar elements until the pointers reach a 16-byte boundary, then use
// Packed128 for the rest.

#include <cstdint>

// Elements from p to the first 16-byte boundary at or after it (p is aligned to sizeof(T)).
template <typename T> inline size_t elements_to_align16(const T* p) {
    const size_t misalignment = reinterpret_cast<uintptr_t>(p) % 16;
    return misalignment == 0 ? 0 : (16 - misalignment) / sizeof(T);
}
inline bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
