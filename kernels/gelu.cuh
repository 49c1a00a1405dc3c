// GELU, tanh approximation (Hendrycks & Gimpel 2016, "Gaussian Error Linear Units"), as GPT-2 uses:
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// Elementwise: one Packed128 per thread, and the last thread takes the tail when N is not a
// multiple of the pack size. Each thread reads its elements before writing them, so outputs may
// alias inputs.
#pragma once

#include <string>

#include "common.cuh"

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ inline float gelu_tanh(float x) {
    const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    return 0.5f * x * (1.0f + t);
}

__device__ inline float gelu_tanh_derivative(float x) {
    const float t = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

static __global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    using Pack = Packed128<floatX>;
    const size_t pack = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t first = pack * Pack::size;
    if (first + Pack::size <= N) {
        const Pack x = load128cs(inp + first);
        Pack y;
        for (int k = 0; k < Pack::size; ++k) y[k] = from_float<floatX>(gelu_tanh(to_float(x[k])));
        store128(out + first, y);
    } else {
        for (size_t i = first; i < N; ++i) out[i] = from_float<floatX>(gelu_tanh(to_float(inp[i])));
    }
}

static __global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    using Pack = Packed128<floatX>;
    const size_t pack = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t first = pack * Pack::size;
    if (first + Pack::size <= N) {
        const Pack x = load128cs(inp + first), d = load128cs(dout + first);
        Pack g;
        for (int k = 0; k < Pack::size; ++k) g[k] = from_float<floatX>(to_float(d[k]) * gelu_tanh_derivative(to_float(x[k])));
        store128(dinp + first, g);
    } else {
        for (size_t i = first; i < N; ++i) dinp[i] = from_float<floatX>(to_float(dout[i]) * gelu_tanh_derivative(to_float(inp[i])));
    }
}

// Packed128 access needs 16-byte aligned tensors (cudaMalloc gives 256).
inline std::string gelu_alignment_problem(const char* name, const void* p) {
    return is_aligned16(p) ? "" : std::string(name) + " is not 16-byte aligned";
}

// FLOPs per element, counting tanhf as one operation (its cost on the GPU is a few instructions
// of the special-function unit): forward 8 (x^3, the polynomial, the scale, 0.5 x (1 + t));
// backward 16 (the same tanh argument, then the two terms of gelu' and the product with dout).
constexpr double kGeluForwardFlops = 8, kGeluBackwardFlops = 16;

inline void gelu_forward(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    require_supported("gelu_forward", gelu_alignment_problem("out", out));
    require_supported("gelu_forward", gelu_alignment_problem("inp", inp));
    if (N == 0) return;
    const int block = 256;
    const KernelCost cost{kGeluForwardFlops * double(N), 2.0 * double(N) * sizeof(floatX)};  // inp in, out out
    launch<gelu_forward_kernel>(cost, dim3(ceil_div(ceil_div(N, Packed128<floatX>::size), block)), dim3(block), 0,
                                stream, out, inp, N);
}

inline void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, cudaStream_t stream) {
    require_supported("gelu_backward", gelu_alignment_problem("dinp", dinp));
    require_supported("gelu_backward", gelu_alignment_problem("inp", inp));
    require_supported("gelu_backward", gelu_alignment_problem("dout", dout));
    if (N == 0) return;
    const int block = 256;
    const KernelCost cost{kGeluBackwardFlops * double(N), 3.0 * double(N) * sizeof(floatX)};  // inp, dout in; dinp out
    launch<gelu_backward_kernel>(cost, dim3(ceil_div(ceil_div(N, Packed128<floatX>::size), block)), dim3(block), 0,
                                 stream, dinp, inp, dout, N);
}
