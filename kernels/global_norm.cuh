// Sum of squares of a floatX array (the squared global gradient norm, for clipping), deterministic:
// each block writes its partial sum to scratch, then one block adds the partials in a fixed order.
// The grid depends on n only (not on the device), every thread's share of elements and every
// reduction tree are fixed, and squares accumulate with explicit fmaf: two runs, and the GPU and
// CPU builds, give the same bits. No atomics.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.cuh"

// Two warps a block. The CPU emulator's cost is per thread (a fiber's start, the block reduction's
// switches and waits): 256-thread blocks made GPT-2 124M's norm 262k threads, 4x its reads' time.
constexpr int kGlobalNormBlock = 64;
// About 8 blocks on each of an H100's 132 SMs; the finishing kernel sums them with one thread each,
// so it must stay <= 1024.
constexpr size_t kGlobalNormMaxBlocks = 1024;

// At least this many vectors a thread before another block is added. The CPU emulator runs a warp's
// lanes one after another, so a lane's loads (512 bytes apart) are a strided stream of their own, and
// short streams read at a fraction of the memory's speed: `make train`'s 7.2M-parameter gradient took
// 21-24 ms at 16 vectors a thread, 7 at 64, 3.1 at 256 (throwaway benchmark, one core, best of 5).
// From 122M parameters on (BF16; 61M FP32) the grid is the full 1024 blocks whatever this is. On a
// GPU a small gradient is a few microseconds either way.
constexpr size_t kGlobalNormMinVectorsPerThread = 256;
// A lane's vectors go round kGlobalNormChains running sums (vector i of the lane into sum i mod 4):
// one sum was a chain of dependent multiply-adds whose latency, four cycles a vector, bounded the
// CPU emulator's lanes (GPT-2 124M: 18 ms -> 15 ms).
constexpr int kGlobalNormChains = 4;

inline size_t global_norm_blocks(size_t n) {
    const size_t per_block = size_t(kGlobalNormBlock) * Packed128<floatX>::size * kGlobalNormMinVectorsPerThread;
    return std::clamp<size_t>((n + per_block - 1) / per_block, 1, kGlobalNormMaxBlocks);
}
inline size_t global_norm_scratch_floats(size_t n) { return global_norm_blocks(n); }

// Vectors of Packed128 from element `head` on (16-byte aligned there): block b takes the b-th
// contiguous range of them, warp w the w-th contiguous piece of that, its lanes striding by the warp
// (coalesced); then the `head` elements before them and the tail after them, one per thread,
// grid-strided. Pieces per warp rather than a block-wide stride: the CPU emulator runs a warp's lanes
// one after another, and a lane's loads 512 bytes apart stay in a page, where the hardware prefetcher
// follows them (4 KB apart, each in a new page, it did not). Per lane kGlobalNormChains running sums
// of each vector lane (independent fma chains), added in a fixed order. The block's sum: each thread's
// into shared memory, one barrier, thread 0 adds them in thread order. A shuffle tree cost the
// emulator two warp collectives and two barriers per thread, a fiber switch each (`make emu-bench`:
// ~55-65 ns a lane per collective); on a GPU the 64 serial adds per block hide behind the other
// blocks' loads.
// GPT-2 124M's gradient (BF16, `make`'s -O3 CPU build, 2 cores): 42-60 ms with 256-thread blocks and a
// block-wide stride, 18 ms with warp pieces, 13 ms with the chains and the serial block sum (a plain
// OpenMP loop over the same array: 6.5 ms).
static __global__ void __launch_bounds__(kGlobalNormBlock)
    global_norm_partials_kernel(float* partials, const floatX* values, size_t n, size_t head, size_t vectors) {
    __shared__ float thread_sums[kGlobalNormBlock];
    constexpr int width = Packed128<floatX>::size;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    const size_t thread = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
    const auto smaller = [](size_t a, size_t b) { return a < b ? a : b; };
    const size_t block_begin = smaller(size_t(blockIdx.x) * per_block, vectors);
    const size_t block_end = smaller(block_begin + per_block, vectors);
    const size_t warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t per_warp = (block_end - block_begin + warps - 1) / warps;
    const size_t first = smaller(block_begin + warp * per_warp, block_end);
    const size_t last = smaller(first + per_warp, block_end);
    float lane_sums[kGlobalNormChains][width] = {};
    const auto add_squares = [&](float (&sums)[width], size_t vector) {
        float x[width];
        unpack_floats(x, load128(values + head + vector * width));
        LANE_LOOP
        for (int k = 0; k < width; ++k) sums[k] = fmaf(x[k], x[k], sums[k]);
    };
    size_t j = first + lane;
    for (; j + 32 * (kGlobalNormChains - 1) < last; j += 32 * kGlobalNormChains) {
        FULL_UNROLL
        for (int c = 0; c < kGlobalNormChains; ++c) add_squares(lane_sums[c], j + 32 * c);
    }
    for (int c = 0; j < last; j += 32, ++c) add_squares(lane_sums[c], j);  // the last, fewer than the chains
    const size_t vector_end = head + vectors * width;
    for (size_t i = thread; i < n - vectors * width; i += stride) {
        const float x = to_float(values[i < head ? i : vector_end + (i - head)]);
        lane_sums[0][0] = fmaf(x, x, lane_sums[0][0]);
    }
    float sum = 0.0f;
    for (int c = 0; c < kGlobalNormChains; ++c)
        for (int k = 0; k < width; ++k) sum += lane_sums[c][k];
    thread_sums[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x != 0) return;
    float total = 0.0f;
    for (int t = 0; t < int(blockDim.x); ++t) total += thread_sums[t];
    partials[blockIdx.x] = total;
}

// One block, a multiple of 32 threads >= count: thread i takes partial i.
static __global__ void __launch_bounds__(kGlobalNormMaxBlocks)
    global_norm_finish_kernel(float* out, const float* partials, int count) {
    __shared__ float scratch[kBlockReduceScratch];
    const float partial = int(threadIdx.x) < count ? partials[threadIdx.x] : 0.0f;
    const float total = block_sum(partial, scratch);
    if (threadIdx.x == 0) *out = total;
}

// *out (one device float) = sum of values[i]^2 over [0, n), accumulated in FP32. scratch holds
// global_norm_scratch_floats(n) floats. For a norm over several tensors or ranks, add the results.
inline void global_norm_squared(float* out, const floatX* values, size_t n, float* scratch, cudaStream_t stream) {
    if (!out || !scratch || (n > 0 && !values))
        require_supported("global_norm_squared", "global_norm: null out, scratch or values pointer");
    constexpr size_t width = Packed128<floatX>::size;
    const size_t head = std::min(elements_to_align16(values), n);
    const size_t vectors = (n - head) / width;
    const size_t blocks = global_norm_blocks(n);
    // One fma (2 FLOPs) per value, then the block sums; values read once, one partial per block written.
    const KernelCost partials_cost{2.0 * double(n) + double(blocks) * kGlobalNormBlock,
                                   double(n) * sizeof(floatX) + double(blocks) * sizeof(float)};
    launch<global_norm_partials_kernel>(partials_cost, dim3(unsigned(blocks)), dim3(kGlobalNormBlock), 0, stream,
                                        scratch, values, n, head, vectors);
    const unsigned finish_threads = ceil_div(blocks, 32) * 32;
    const KernelCost finish_cost{double(finish_threads), (double(blocks) + 1) * sizeof(float)};
    launch<global_norm_finish_kernel>(finish_cost, dim3(1), dim3(finish_threads), 0, stream, out, scratch, int(blocks));
}
