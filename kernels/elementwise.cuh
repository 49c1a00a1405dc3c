// Elementwise helpers of the training step: dst += src (ZeRO-2 adds each micro-step's reduced
// gradient shard into the step's accumulated one).
#pragma once

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
