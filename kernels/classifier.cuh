// Fused classifier: softmax cross-entropy over the first V of Vp logit columns, and its gradient
// written over the logits in place, so no probability tensor is ever stored.
//   loss_i    = logsumexp(x_i[:V]) - x_i[t_i]
//   dlogits_ij = dloss * (softmax(x_i[:V])_j - [j == t_i])  for j < V, 0 for the padding V <= j < Vp
// One block per row. Pass 1 finds the row's max M and S = sum exp(x - M): each thread over its own
// 16-byte chunks, then the block, combining the threads' (m, s) pairs as in the online-softmax merge
// (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"). Pass 2 re-reads the row
// and writes the gradient. Deterministic: the reductions have a fixed order.
#pragma once

#include "common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

// Threads a row (a block). The two builds choose differently, for different reasons; the launchers take
// any multiple of 32 up to kClassifierMaxThreads, and the tests run both choices in the CPU build.
//
// The CPU emulator: 64, where each thread pays a fiber switch at every barrier and reduction. A `make
// train` classifier (512 rows of 50304, quiet 2-core VM, --profile-step) measured 1024 threads: 60% of
// the step; 256: ~75 ms; 128: 67-72 ms; 64: 44-59 ms; 32: 40-45 ms. A 100 KB row is in a core's L2
// between the passes whatever the count.
//
// A GPU: pass 2 should find its row still in L2 (50 MB on an H100 or H200, 132 SMs). At 32 registers
// (ptxas, sm_90; __launch_bounds__ holds them there) an SM runs 2048 of these threads, so 2048 / threads
// rows are in flight on each, and a row's pass 1 lasts about as long as the GPU takes to stream all of
// them once. At 64 threads that is 4,224 GPT-2 rows, 422 MB: pass 2 re-read its row from HBM. On an
// H100 (d12, B=64, 2026-11-27) the kernel took 6.69 ms: 2.96 TB/s if it moved each row three times,
// 1.97 if twice, where the LayerNorm kernels reached 2.4-2.8. At 1024 threads (2 blocks an SM) 264
// rows are in flight, 26.5 MB, and the gradient is written with streaming stores that do not stay in
// L2. A row narrower than 1024 chunks of 8 (the vocabulary-parallel shards) takes one thread a chunk,
// in whole warps: its rows are smaller in proportion.
constexpr int kClassifierEmulatorThreads = 64;
constexpr int kClassifierMaxThreads = 1024;
constexpr int kClassifierMinBlocksPerSm = 2048 / kClassifierMaxThreads;  // 32 registers a thread

// The threads a row of `columns` gets in this build (see above).
inline int classifier_block_threads(int columns) {
    if (kernels_run_on_cpu()) return kClassifierEmulatorThreads;
    const int chunks = int(ceil_div(std::max(columns, 1), Packed128<floatX>::size));
    return std::clamp(int(ceil_div(chunks, 32)) * 32, kClassifierEmulatorThreads, kClassifierMaxThreads);
}

// A launcher's `threads` argument: 0 for this build's choice, else checked (a multiple of 32 in
// [32, kClassifierMaxThreads]: block_reduce's warps).
inline int classifier_threads(const char* launcher, int requested, int columns) {
    if (requested == 0) return classifier_block_threads(columns);
    require_supported(launcher, requested % 32 != 0 || requested < 32 || requested > kClassifierMaxThreads
                                    ? "classifier: " + std::to_string(requested) + " threads a row: not a multiple of 32 in [32, " +
                                          std::to_string(kClassifierMaxThreads) + "]"
                                    : "");
    return requested;
}

// Pass 1 of both classifiers: over row[0, columns) (the block's threads in 16-byte chunks), the max M
// and the sum S of exp(x - M); (-inf, 0) when there are no columns. Block-wide (its reductions
// synchronize the block). Each thread reads its chunks twice: once for their max m, then for the sum
// s of exp(x - m), in kPack vector lanes added in lane order at the end. One exponential per logit:
// the online recurrence within a thread (a running max, and s rescaled when it grows) took two, the
// rescale's and the value's, and was about 40% of a `make train` classifier in the CPU build. A
// thread's chunks (about 1.6 KB over GPT-2's vocabulary) are in L1 for the second read.
__device__ inline void row_max_and_sum(const floatX* row, int columns, float* reduce_scratch, float* out_max, float* out_sum) {
    constexpr int kPack = Packed128<floatX>::size;
    const int first = threadIdx.x * kPack, stride = blockDim.x * kPack;
    // Columns past the end count as -inf: no effect on the max, exp(-inf) = 0 added exactly. The
    // padding past `columns` is in bounds (rows of 8k).
    float lane_max[kPack];
    for (int k = 0; k < kPack; ++k) lane_max[k] = -INFINITY;
    for (int j = first; j < columns; j += stride) {
        float values[kPack];
        unpack_floats(values, load128(row + j));
        // A NaN logit is passed over here (NaN > m is false) and makes the sum NaN below. This select
        // vectorizes in the CPU build; max_number's (whose NaN test is on either side) did not.
        LANE_LOOP
        for (int k = 0; k < kPack; ++k) {
            const float value = j + k < columns ? values[k] : -INFINITY;
            lane_max[k] = value > lane_max[k] ? value : lane_max[k];
        }
    }
    float thread_max = -INFINITY;
    for (int k = 0; k < kPack; ++k) thread_max = max_number(thread_max, lane_max[k]);
    // A thread whose max is -inf (no columns, or only -inf logits) takes exponents relative to 0:
    // exp(-inf - -inf) would be NaN.
    const float reference = thread_max == -INFINITY ? 0.0f : thread_max;
    float lane_sum[kPack];
    for (int k = 0; k < kPack; ++k) lane_sum[k] = 0.0f;
    for (int j = first; j < columns; j += stride) {
        float exps[kPack];
        unpack_floats(exps, load128(row + j));
        LANE_LOOP
        for (int k = 0; k < kPack; ++k) exps[k] = (j + k < columns ? exps[k] : -INFINITY) - reference;
        expf_each(exps, exps);
        LANE_LOOP
        for (int k = 0; k < kPack; ++k) lane_sum[k] += exps[k];
    }
    float thread_sum = 0.0f;
    for (int k = 0; k < kPack; ++k) thread_sum += lane_sum[k];
    // Combine (m_t, s_t): M = max m_t, S = sum s_t exp(m_t - M). Threads without columns add 0. With no
    // columns at all M is -inf for the whole block (uniform): S = 0, not exp(-inf + inf).
    const float row_max = block_max(thread_max, reduce_scratch);
    *out_max = row_max;
    *out_sum = row_max == -INFINITY ? 0.0f : block_sum(thread_sum * expf(thread_max - row_max), reduce_scratch);
}

// Pass 2 of both classifiers: row[j] = scale * (exp(x_j - M) * inverse_sum - [j == target]) over the row's
// `width` columns, 0 past its first `columns` (padding); `target` in the row's own columns (it may
// lie outside them: then no column is the target).
__device__ inline void write_row_dlogits(floatX* row, int width, int columns, int target, float row_max, float inverse_sum,
                                         float scale) {
    constexpr int kPack = Packed128<floatX>::size;
    for (int j = threadIdx.x * kPack; j < width; j += blockDim.x * kPack) {
        const Packed128<floatX> x = load128cs(row + j);  // the last read of these logits
        float shifted[kPack], exps[kPack], grad[kPack];
        unpack_floats(shifted, x);
        for (int k = 0; k < kPack; ++k) shifted[k] -= row_max;
        expf_each(exps, shifted);
        LANE_LOOP
        for (int k = 0; k < kPack; ++k) {
            const int column = j + k;
            const float probability = exps[k] * inverse_sum;
            const float indicator = column == target ? 1.0f : 0.0f;
            grad[k] = column < columns ? scale * (probability - indicator) : 0.0f;
        }
        store128cs(row + j, pack_floats<floatX>(grad));  // not read again here: no need to keep it in L2
    }
}

static __global__ void __launch_bounds__(kClassifierMaxThreads, kClassifierMinBlocksPerSm)
    fused_classifier_kernel(floatX* logits, float* losses, const int* targets, const float* dloss, int V, int Vp,
                            bool write_dlogits) {
    constexpr int kPack = Packed128<floatX>::size;
    __shared__ float reduce_scratch[kBlockReduceScratch];
    floatX* row = logits + size_t(blockIdx.x) * Vp;
    const int target = targets[blockIdx.x];

    // Ignored position (target -1): no loss and no gradient; the branch is uniform over the block.
    if (target == -1) {
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        if (write_dlogits)
            for (int j = threadIdx.x * kPack; j < Vp; j += blockDim.x * kPack) store128(row + j, Packed128<floatX>::filled(0.0f));
        return;
    }
    // A target outside [0, V) is bad input: a NaN loss and gradient row make it visible.
    const bool valid = target >= 0 && target < V;
    // Read before pass 2 overwrites the row (the block reductions below order it before any write).
    const float target_logit = valid && threadIdx.x == 0 ? to_float(row[target]) : 0.0f;

    float row_max, row_sum;
    row_max_and_sum(row, V, reduce_scratch, &row_max, &row_sum);
    const float nan = __int_as_float(0x7fc00000);
    if (threadIdx.x == 0) losses[blockIdx.x] = valid ? row_max + logf(row_sum) - target_logit : nan;
    if (!write_dlogits) return;

    write_row_dlogits(row, Vp, V, target, row_max, 1.0f / row_sum, valid ? *dloss : nan);
}

inline std::string classifier_requirements(int V, int Vp) {
    const std::string sizes = "classifier: V = " + std::to_string(V) + ", Vp = " + std::to_string(Vp) + ": ";
    if (V < 1) return sizes + "V must be at least 1";
    if (V > Vp) return sizes + "V must not exceed Vp";
    // Rows are read in 16-byte chunks: every row must start 16-byte aligned (8 BF16 elements).
    if (Vp % 8 != 0) return sizes + "Vp is not a multiple of 8";
    return "";
}

// logits (N, Vp) become dlogits in place when write_dlogits; losses (N) are written; targets (N)
// are in [0, V) or -1 (ignored). *dloss (device memory, read only when write_dlogits): 1 / (number of
// valid targets in the optimizer step), which changes every step; read on the device, so that a
// captured CUDA graph replays for any step.
// threads: a row's threads, 0 for this build's choice (classifier_block_threads).
inline void fused_classifier(floatX* logits, float* losses, const int* targets, const float* dloss, int N, int V, int Vp,
                             bool write_dlogits, cudaStream_t stream, int threads = 0) {
    require_supported("fused_classifier", classifier_requirements(V, Vp));
    require_supported("fused_classifier", N < 0 ? "classifier: N = " + std::to_string(N) + " is negative" : "");
    require_supported("fused_classifier", N > 0 && (logits == nullptr || losses == nullptr || targets == nullptr)
                                              ? "classifier: logits, losses or targets is NULL"
                                              : "");
    require_supported("fused_classifier", write_dlogits && dloss == nullptr ? "classifier: dloss is NULL" : "");
    require_supported("fused_classifier", reinterpret_cast<uintptr_t>(logits) % 16 != 0
                                              ? "classifier: logits is not 16-byte aligned"
                                              : "");
    threads = classifier_threads("fused_classifier", threads, Vp);
    if (N == 0) return;
    // FLOPs per row: pass 1 takes a max, a subtraction, an exp and an add per column (exp counted
    // as one operation), pass 2 an exp, a subtraction, two multiplies and a subtraction per padded
    // column. Bytes: the logits once, dlogits written once, the targets and losses. The kernel reads
    // each row twice; the second read is meant to come from L2 (see classifier_block_threads), not counted.
    const double rows = N, X = sizeof(floatX);
    const KernelCost cost{rows * (4.0 * V + (write_dlogits ? 5.0 * Vp : 0.0)),
                          rows * ((write_dlogits ? 2.0 * Vp : double(V)) * X + sizeof(int) + sizeof(float))};
    launch<fused_classifier_kernel>(cost, dim3(N), dim3(threads), 0, stream, logits, losses, targets, dloss, V, Vp,
                                    write_dlogits);
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel classifier (Shoeybi et al. 2019, section 3: the output embedding split by
// vocabulary, "fuse the output of the parallel GEMM with the cross entropy loss"): tensor rank r holds
// the logit columns of vocabulary entries [first, first + Vr) (Vr = the padded vocabulary / tp); no
// rank ever holds a whole row. Two kernels around one all-gather the caller makes:
//  1. classifier_shard_stats: per row, over this rank's real columns (those below V), the max m_r,
//     s_r = sum exp(x - m_r), and the target's logit if this rank holds the target (else 0);
//  2. the caller all-gathers the (m, s, target logit) triples of the tensor group, rank after rank;
//  3. classifier_shard_finish: M = max_r m_r, S = sum_r s_r exp(m_r - M) in rank order (so every rank
//     gets the same bits), loss = M + log S - x_target, and dlogits over this rank's columns in place.
// Deterministic (fixed reduction orders, no atomics); rows with target -1 get no loss or gradient.

constexpr int kClassifierStats = 3;  // floats per row and rank: max, sum of exponentials, target logit

static __global__ void __launch_bounds__(kClassifierMaxThreads, kClassifierMinBlocksPerSm)
    classifier_shard_stats_kernel(float* stats, const floatX* logits, const int* targets, int first, int V, int Vr) {
    __shared__ float reduce_scratch[kBlockReduceScratch];
    const floatX* row = logits + size_t(blockIdx.x) * Vr;
    const int target = targets[blockIdx.x];
    const int columns = max(0, min(Vr, V - first));  // this rank's real vocabulary columns
    // A rank without real columns (all padding) reports (-inf, 0): it adds nothing in the finish.
    float shard_max, shard_sum;
    row_max_and_sum(row, columns, reduce_scratch, &shard_max, &shard_sum);
    if (threadIdx.x == 0) {
        float* out = stats + size_t(blockIdx.x) * kClassifierStats;
        out[0] = shard_max;
        out[1] = shard_sum;
        out[2] = target >= first && target < first + columns ? to_float(row[target - first]) : 0.0f;
    }
}

// gathered: (tp, N, kClassifierStats), rank r's block of N rows after rank r - 1's.
static __global__ void __launch_bounds__(kClassifierMaxThreads, kClassifierMinBlocksPerSm)
    classifier_shard_finish_kernel(floatX* logits, float* losses, const float* gathered, const int* targets,
                                   const float* dloss, int N, int tp, int first, int V, int Vr, bool write_dlogits) {
    constexpr int kPack = Packed128<floatX>::size;
    floatX* row = logits + size_t(blockIdx.x) * Vr;
    const int target = targets[blockIdx.x];
    if (target == -1) {  // ignored: no loss, no gradient (as in fused_classifier_kernel)
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        if (write_dlogits)
            for (int j = threadIdx.x * kPack; j < Vr; j += blockDim.x * kPack) store128(row + j, Packed128<floatX>::filled(0.0f));
        return;
    }
    const bool valid = target >= 0 && target < V;
    // Every thread combines the ranks' statistics the same way (tp triples: cheaper than a broadcast).
    float row_max = -INFINITY, target_logit = 0.0f;
    for (int r = 0; r < tp; ++r) {
        const float* s = gathered + (size_t(r) * N + blockIdx.x) * kClassifierStats;
        row_max = max_number(row_max, s[0]);
        target_logit += s[2];  // only the rank holding the target contributes
    }
    float row_sum = 0.0f;
    for (int r = 0; r < tp; ++r) {
        const float* s = gathered + (size_t(r) * N + blockIdx.x) * kClassifierStats;
        if (s[0] != -INFINITY) row_sum += s[1] * expf(s[0] - row_max);
    }
    const float nan = __int_as_float(0x7fc00000);
    if (threadIdx.x == 0) losses[blockIdx.x] = valid ? row_max + logf(row_sum) - target_logit : nan;
    if (!write_dlogits) return;
    write_row_dlogits(row, Vr, max(0, min(Vr, V - first)), target - first, row_max, 1.0f / row_sum, valid ? *dloss : nan);
}

inline std::string classifier_shard_requirements(int first, int V, int Vr) {
    const std::string sizes = "vocabulary-parallel classifier: first = " + std::to_string(first) + ", V = " + std::to_string(V) +
                              ", Vr = " + std::to_string(Vr) + ": ";
    if (V < 1 || Vr < 1 || first < 0) return sizes + "V and Vr must be positive, first not negative";
    if (Vr % 8 != 0) return sizes + "Vr is not a multiple of 8 (16-byte rows)";
    return "";
}

// Step 1 over this rank's logits (N, Vr), columns of vocabulary entries [first, first + Vr): its
// (max, sum, target logit) triples at `stats` (N x kClassifierStats floats).
inline void classifier_shard_stats(float* stats, const floatX* logits, const int* targets, int N, int first, int V, int Vr,
                                   cudaStream_t stream, int threads = 0) {
    require_supported("classifier_shard_stats", classifier_shard_requirements(first, V, Vr));
    threads = classifier_threads("classifier_shard_stats", threads, Vr);
    if (N == 0) return;
    const double rows = N, X = sizeof(floatX);
    const KernelCost cost{rows * 4.0 * Vr, rows * (double(Vr) * X + sizeof(int) + kClassifierStats * sizeof(float))};
    launch<classifier_shard_stats_kernel>(cost, dim3(N), dim3(threads), 0, stream, stats, logits, targets, first, V, Vr);
}

// Step 3: the losses (N) from the tp ranks' gathered triples, and with write_dlogits this rank's
// dlogits over its logits in place, scaled by *dloss (device memory; see fused_classifier).
inline void classifier_shard_finish(floatX* logits, float* losses, const float* gathered, const int* targets, const float* dloss,
                                    int N, int tp, int first, int V, int Vr, bool write_dlogits, cudaStream_t stream,
                                    int threads = 0) {
    require_supported("classifier_shard_finish", classifier_shard_requirements(first, V, Vr));
    threads = classifier_threads("classifier_shard_finish", threads, Vr);
    require_supported("classifier_shard_finish", write_dlogits && dloss == nullptr ? "classifier: dloss is NULL" : "");
    if (N == 0) return;
    const double rows = N, X = sizeof(floatX);
    const KernelCost cost{rows * (4.0 * tp + (write_dlogits ? 5.0 * Vr : 0.0)),
                          rows * ((write_dlogits ? 2.0 * Vr * X : 0.0) + sizeof(int) + sizeof(float) +
                                  double(tp) * kClassifierStats * sizeof(float))};
    launch<classifier_shard_finish_kernel>(cost, dim3(N), dim3(threads), 0, stream, logits, losses, gathered, targets, dloss, N,
                                           tp, first, V, Vr, write_dlogits);
}
