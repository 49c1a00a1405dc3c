// Elementwise helpers of the training step: dst += src (ZeRO-2 adds each micro-step's reduced
// gradient shard into the step's accumulated one).
#pragma once

#include <algorithm>

#include "common.cuh"

// dst[i] += src[i] in FP32, rounded to floatX (nearest even). One element per thread: the arrays
// are shard slices that may start anywhere, so no 16-byte vectors.
static __global__ void accumulate_kernel(floatX* dst, const floatX* src, size_t n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_float<floatX>(to_float(dst[i]) + to_float(src[i]));
}

inline void accumulate(floatX* dst, const floatX* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    require_supported("accumulate", dst == nullptr || src == nullptr ? "accumulate: null pointer" : "");
    const unsigned threads = 256;
    const KernelCost cost{double(n), 3.0 * double(n) * sizeof(floatX)};  // one add; dst read + written, src read
    launch<accumulate_kernel>(cost, dim3(ceil_div(n, threads)), dim3(threads), 0, stream, dst, src, n);
}

// Rows of `width` elements between two row-major arrays with different row strides (elements) and
// element types (float or floatX; to floatX rounded to nearest even), 16 bytes at a time. Context
// parallelism (parallel/context.h) packs a qkv buffer's keys and values (rows 3C apart) into a compact
// k|v buffer (2C) for the ring, and writes its FP32 sums back into floatX activations and gradients.
template <typename Dst, typename Src>
static __global__ void copy_rows_kernel(Dst* dst, size_t dst_stride, const Src* src, size_t src_stride, size_t rows, int width) {
    // Elements per thread: one 16-byte vector of the narrower type, whole vectors of the wider one.
    constexpr int kStep = Packed128<Dst>::size > Packed128<Src>::size ? Packed128<Dst>::size : Packed128<Src>::size;
    const int steps_per_row = width / kStep;
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * steps_per_row) return;
    const size_t row = i / steps_per_row, column = size_t(i % steps_per_row) * kStep;
    float x[kStep];
    for (int k = 0; k < kStep; k += Packed128<Src>::size) {
        const Packed128<Src> from = load128(src + row * src_stride + column + k);
        for (int e = 0; e < Packed128<Src>::size; ++e) x[k + e] = to_float(from[e]);
    }
    for (int k = 0; k < kStep; k += Packed128<Dst>::size) {
        Packed128<Dst> to;
        for (int e = 0; e < Packed128<Dst>::size; ++e) to[e] = from_float<Dst>(x[k + e]);
        store128(dst + row * dst_stride + column + k, to);
    }
}

template <typename Dst, typename Src>
inline void copy_rows(Dst* dst, size_t dst_stride, const Src* src, size_t src_stride, size_t rows, int width, cudaStream_t stream) {
    if (rows == 0) return;
    constexpr size_t kVector = 8;  // elements: a multiple of 16 bytes in either type
    const bool aligned = width % kVector == 0 && dst_stride % kVector == 0 && src_stride % kVector == 0;
    require_supported("copy_rows", aligned ? "" : "copy_rows: width and strides must be multiples of 8 elements");
    constexpr size_t kStep = std::max(Packed128<Dst>::size, Packed128<Src>::size);
    const size_t threads_needed = rows * (size_t(width) / kStep);
    const unsigned threads = 256;
    const double n = double(rows) * width;
    const KernelCost cost{0.0, n * (sizeof(Dst) + sizeof(Src))};
    launch<copy_rows_kernel<Dst, Src>>(cost, dim3(ceil_div(threads_needed, threads)), dim3(threads), 0, stream, dst, dst_stride,
                                       src, src_stride, rows, width);
}
