// Measures what the emulator costs: ns per fiber switch, per thread of an elementwise kernel
// (against the plain loop, vectorized and kept scalar), per lane-shuffle of a warp reduction (and
// per lane of the kernels' warp_sum, whose five shuffles the emulator runs as one collective),
// against plain C++ loops doing the same arithmetic, per emulated mma.sync (m16n8k16 BF16, 4096 FLOPs), and per warp tile product of
// the attention kernels' shape (S = Q K^T, 16 x 64 x 64: 32 mma.sync and 20 ldmatrix) run as one
// collective and as its instructions (CUEMU_TENSOR_CORE), and the cost of a launch of two blocks
// that do nothing on two OS threads (waking the pool's thread and waiting for it).
//   make emu-bench        (runs with CUEMU_THREADS=1 so the numbers are per core; the launch on 2)
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cuda_common.h"
#include "kernels/tensor_core.cuh"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename F> double best_of(int reps, F f) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        best = std::min(best, seconds_since(t0));
    }
    return best;
}

}  // namespace

__global__ void scale_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

// The same loop kept scalar: what a thread of the kernel, one element, is fairly compared with.
__attribute__((optimize("no-tree-vectorize"))) void scale_scalar(float* x, int n) {
    for (int i = 0; i < n; ++i) x[i] = 2.0f * x[i] + 1.0f;
}

// Every lane of every warp passes `rounds` __syncwarp barriers: one switch per lane per round.
__global__ void syncwarp_kernel(int rounds) {
    for (int r = 0; r < rounds; ++r) __syncwarp();
}

// Warp sums of 32 values per row: 5 xor-shuffles per lane per row.
__global__ void warp_sum_kernel(const float* x, float* out, int rows) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows) return;
    float v = x[size_t(warp) * 32 + lane];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[warp] = v;
}

// The same sums through kernels/common.cuh's warp_sum (one emulated collective for the chain).
__global__ void warp_sum_chain_kernel(const float* x, float* out, int rows) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows) return;
    const float v = warp_sum(x[size_t(warp) * 32 + lane]);
    if (lane == 0) out[warp] = v;
}

// A kernel that does nothing (given null): what a launch itself costs.
__global__ void empty_kernel(float* out) {
    if (out != nullptr && threadIdx.x == 0) out[blockIdx.x] = 0.0f;
}

// `count` dependent mma.sync per warp: the accumulator feeds the next one.
__global__ void mma_kernel(float* out, int count) {
    const uint32_t one = pack_bf16x2(1.0f, 1.0f);
    const uint32_t a[4] = {one, one, one, one}, b[2] = {one, one};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < count; ++i) mma_m16n8k16_bf16(d, a, b, d);
    out[blockIdx.x * blockDim.x + threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}

// `count` tile products per warp (16 query rows against 64 keys at head size 64), 4 warps a block.
__global__ void tile_product_kernel(float* out, int count) {
    constexpr int kLd = 64 + 8;
    DYNAMIC_SHARED(__nv_bfloat16, smem);  // 64 query rows, then 64 key rows
    for (int i = int(threadIdx.x); i < 128 * kLd; i += int(blockDim.x)) smem[i] = __float2bfloat16(0.0f);
    __syncthreads();
    float s[8][4] = {};
    const int warp = int(threadIdx.x) / 32;
    for (int i = 0; i < count; ++i) mma_a_bt<64, 64>(s, smem + warp * 16 * kLd, smem + 64 * kLd, kLd);
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[0][0] + s[7][3];
}

int main() {
    std::printf("emu_bench: CUEMU_THREADS=%d, schedule %d\n", cuemu::threads(), int(cuemu::schedule()));

    // 1. Elementwise kernel: per-thread cost against a plain loop.
    const int n = 1 << 22;
    float* x;
    CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(x, 0, n * sizeof(float)));
    double t_kernel = best_of(5, [&] { launch<scale_kernel>(dim3(n / 256), dim3(256), 0, nullptr, x, n); });
    std::vector<float> host(n, 0.0f);
    volatile float sink = 0;
    double t_loop = best_of(5, [&] {
        for (int i = 0; i < n; ++i) host[i] = 2.0f * host[i] + 1.0f;
        sink = host[n / 2];
    });
    double t_scalar = best_of(5, [&] {
        scale_scalar(host.data(), n);
        sink = host[n / 2];
    });
    std::printf("elementwise: %.2f ns per thread (plain loop %.2f ns per element, %.2f kept scalar)\n",
                1e9 * t_kernel / n, 1e9 * t_loop / n, 1e9 * t_scalar / n);

    // 2. Fiber switches: blocks of 1024 threads meeting at __syncwarp.
    const int rounds = 200, blocks = 8;
    auto s0 = cuemu::executor_stats();
    auto t0 = std::chrono::steady_clock::now();
    launch<syncwarp_kernel>(dim3(blocks), dim3(1024), 0, nullptr, rounds);
    double t_sw = seconds_since(t0);
    auto s1 = cuemu::executor_stats();
    std::printf("switch: %.1f ns per switch (%llu switches, 1024-thread blocks)\n", 1e9 * t_sw / double(s1.switches - s0.switches),
                (unsigned long long)(s1.switches - s0.switches));

    // 3. Warp shuffles: per lane-shuffle cost of a warp reduction.
    const int rows = 1 << 15;
    float *in, *out;
    CUDA_CHECK(cudaMalloc(&in, size_t(rows) * 32 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&out, rows * sizeof(float)));
    CUDA_CHECK(cudaMemset(in, 0, size_t(rows) * 32 * sizeof(float)));
    double t_shfl = best_of(3, [&] { launch<warp_sum_kernel>(dim3(rows * 32 / 256), dim3(256), 0, nullptr, in, out, rows); });
    std::printf("shuffle: %.1f ns per lane-shuffle (%d rows x 32 lanes x 5 shuffles)\n", 1e9 * t_shfl / (double(rows) * 32 * 5),
                rows);
    double t_chain = best_of(3, [&] { launch<warp_sum_chain_kernel>(dim3(rows * 32 / 256), dim3(256), 0, nullptr, in, out, rows); });
    std::printf("warp_sum: %.1f ns per lane (%.1f per lane-shuffle it replaces; kernels/common.cuh, one collective)\n",
                1e9 * t_chain / (double(rows) * 32), 1e9 * t_chain / (double(rows) * 32 * 5));

    // 4. Tensor-core instructions: per emulated mma.sync of a warp (a collective plus the product).
    const int mma_warps = 64, mma_count = 200;
    double t_mma = best_of(3, [&] { launch<mma_kernel>(dim3(mma_warps / 4), dim3(128), 0, nullptr, out, mma_count); });
    std::printf("mma.sync: %.0f ns per warp-wide m16n8k16 (%d warps x %d)\n", 1e9 * t_mma / (double(mma_warps) * mma_count),
                mma_warps, mma_count);

    // 5. A warp tile product (kernels/tensor_core.cuh) as one collective and as its instructions.
    const int tile_warps = 64, tile_count = 20;
    const size_t tile_smem = 128 * (64 + 8) * sizeof(__nv_bfloat16);
    const cuemu::TensorCoreMode mode = cuemu::tensor_core_mode();
    for (const cuemu::TensorCoreMode m : {cuemu::TensorCoreMode::tiles, cuemu::TensorCoreMode::instructions}) {
        cuemu::set_tensor_core_mode(m);
        const double t_tile = best_of(3, [&] {
            launch<tile_product_kernel>(dim3(tile_warps / 4), dim3(128), tile_smem, nullptr, out, tile_count);
        });
        const double per_product = t_tile / (double(tile_warps) * tile_count);
        std::printf("tile product 16x64x64 (%s): %.1f us per warp, %.0f ns per mma.sync it holds (%d warps x %d)\n",
                    m == cuemu::TensorCoreMode::tiles ? "one collective" : "instructions", 1e6 * per_product,
                    1e9 * per_product / 32, tile_warps, tile_count);
    }
    cuemu::set_tensor_core_mode(mode);

    // 6. Launch: two blocks on two OS threads, so the pool's thread takes one (back to back, as a
    // training step's kernels come).
    const int threads_before = cuemu::threads();
    cuemu::set_threads(2);
    constexpr int launches = 2000;
    const double t_launch = best_of(3, [&] {
        for (int i = 0; i < launches; ++i) launch<empty_kernel>(dim3(2), dim3(32), 0, nullptr, (float*)nullptr);
        cudaDeviceSynchronize();
    });
    cuemu::set_threads(threads_before);
    std::printf("launch: %.1f us per launch of two empty blocks on 2 OS threads (%d launches)\n", 1e6 * t_launch / launches, launches);
    cudaFree(x);
    cudaFree(in);
    cudaFree(out);
    return 0;
}
