// Generation with a key/value cache: causal self-attention of ONE new query row per head over the
// cached keys and values of every earlier position and its own (Pope et al. 2022, "Efficiently
// Scaling Transformer Inference", section 3: the cache turns each new token's attention into a
// matrix-vector product).
//
// Layouts: the caches of one layer are (T_cache, C) per tensor, position-major: position t's key for
// head h at keys[t * C + h * hs .. + hs) (hs = C/NH), the same row layout as the k part of a qkv row,
// so appending a position is a contiguous copy. The query is the q part of one qkv row (3C wide); the
// output one C-wide row, heads concatenated, like the flash attention kernels' (kernels/attention.cuh).
//
// One block per head. softmax(q k_j / sqrt(hs)) over j < n in three passes over shared memory:
// scores (one thread per key), their max and exp-sum (fixed-order block reductions: deterministic),
// then sum_j p_j v_j with the threads split into groups of keys that each own whole 16-byte vectors
// of the value rows, the groups' partial rows added in group order.
#pragma once

#include <cmath>
#include <string>

#include "attention.cuh"  // attention_detail::allow_smem
#include "common.cuh"

namespace attention_decode_detail {
constexpr int kThreads = 128;
constexpr int kValuePack = Packed128<floatX>::size;  // value elements one thread reads as a vector
// Shared memory, in floats: the query (hs), the scores (n), the groups' partial output rows and the
// reductions' scratch (kBlockReduceScratch).
inline size_t smem_floats(int n, int hs) {
    const int groups = kThreads / (hs / kValuePack);
    return size_t(hs) + size_t(n) + size_t(groups) * hs + kBlockReduceScratch;
}
}  // namespace attention_decode_detail

// "" when the decode kernel supports C, NH and a cache of n positions, else why not.
inline std::string attention_decode_requirements(int C, int NH, int n) {
    using namespace attention_decode_detail;
    if (C < 1 || NH < 1 || C % NH != 0)
        return "attention_decode: C = " + std::to_string(C) + " must be a positive multiple of NH = " + std::to_string(NH);
    const int hs = C / NH;
    // hs / kValuePack threads read one value row, and they must tile the block exactly.
    if (hs % kValuePack != 0 || kThreads % (hs / kValuePack) != 0 || hs > kThreads * kValuePack)
        return "attention_decode: head size C/NH = " + std::to_string(hs) + " must be a multiple of " +
               std::to_string(kValuePack) + " dividing " + std::to_string(kThreads * kValuePack);
    if (n < 1) return "attention_decode: the cache must hold at least the new position (n = " + std::to_string(n) + ")";
    if (smem_floats(n, hs) * sizeof(float) > 96 * 1024)
        return "attention_decode: " + std::to_string(n) + " cached positions exceed the kernel's shared memory";
    return "";
}

// Rows [pos, pos + n) of a layer's key and value caches from the k and v parts of n qkv rows.
static __global__ void kv_cache_append_kernel(floatX* keys, floatX* values, const floatX* qkv, int pos, int n, int C) {
    using Pack = Packed128<floatX>;
    const int packs_per_row = C / Pack::size;
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n * packs_per_row) return;
    const int row = i / packs_per_row, c = (i % packs_per_row) * Pack::size;
    const floatX* src = qkv + size_t(row) * 3 * C;
    const size_t dst = size_t(pos + row) * C + c;
    store128(keys + dst, load128(src + C + c));
    store128(values + dst, load128(src + 2 * C + c));
}

// out (one row of C) = causal attention of the query in `qkv` (one qkv row) over cache positions
// [0, n) of keys/values, for the head blockIdx.x.
static __global__ void __launch_bounds__(attention_decode_detail::kThreads)
    attention_decode_kernel(floatX* out, const floatX* qkv, const floatX* keys, const floatX* values, int n, int C,
                            int NH) {
    using namespace attention_decode_detail;
    using Pack = Packed128<floatX>;
    const int h = int(blockIdx.x), hs = C / NH, tid = int(threadIdx.x);
    const int lanes_per_row = hs / kValuePack, groups = kThreads / lanes_per_row;
    DYNAMIC_SHARED(float, smem);
    float* q = smem;                // hs
    float* scores = q + hs;         // n: scores, then unnormalized probabilities
    float* partial = scores + n;    // groups x hs
    float* reduce = partial + size_t(groups) * hs;  // kBlockReduceScratch

    const float score_scale = 1.0f / sqrtf(float(hs));  // as the flash attention kernels scale
    for (int d = tid; d < hs; d += kThreads) q[d] = to_float(qkv[h * hs + d]);
    __syncthreads();

    // Scores: one thread per cached key, read as whole 16-byte vectors.
    float local_max = -INFINITY;
    for (int j = tid; j < n; j += kThreads) {
        const floatX* k = keys + size_t(j) * C + h * hs;
        float s = 0.0f;
        for (int d = 0; d < hs; d += Pack::size) {
            const Pack kv = load128(k + d);
            for (int e = 0; e < Pack::size; ++e) s += q[d + e] * to_float(kv[e]);
        }
        s *= score_scale;
        scores[j] = s;
        local_max = fmaxf(local_max, s);
    }
    const float max_score = block_max(local_max, reduce);  // its barrier also publishes the scores
    float local_sum = 0.0f;
    for (int j = tid; j < n; j += kThreads) {
        const float p = expf(scores[j] - max_score);
        scores[j] = p;
        local_sum += p;
    }
    const float total = block_sum(local_sum, reduce);  // its barriers publish the probabilities

    // sum_j p_j v_j: group g takes keys g, g + groups, ...; lane `lane` of it the lane-th vector of hs.
    const int g = tid / lanes_per_row, d0 = (tid % lanes_per_row) * kValuePack;
    float acc[kValuePack];
    for (int e = 0; e < kValuePack; ++e) acc[e] = 0.0f;
    for (int j = g; j < n; j += groups) {
        const Pack v = load128(values + size_t(j) * C + h * hs + d0);
        const float p = scores[j];
        for (int e = 0; e < kValuePack; ++e) acc[e] += p * to_float(v[e]);
    }
    for (int e = 0; e < kValuePack; ++e) partial[g * hs + d0 + e] = acc[e];
    __syncthreads();
    for (int d = tid; d < hs; d += kThreads) {
        float sum = 0.0f;
        for (int i = 0; i < groups; ++i) sum += partial[i * hs + d];
        out[h * hs + d] = from_float<floatX>(sum / total);
    }
}

// Appends positions [pos, pos + n) (the k and v parts of n consecutive qkv rows) to a layer's caches.
inline void kv_cache_append(floatX* keys, floatX* values, const floatX* qkv, int pos, int n, int C, cudaStream_t stream) {
    using Pack = Packed128<floatX>;
    if (C % Pack::size != 0 || pos < 0 || n < 1)
        require_supported("kv_cache_append", "kv_cache_append: C = " + std::to_string(C) + " must be a multiple of " +
                                                 std::to_string(Pack::size) + ", pos >= 0 and n >= 1 (pos = " +
                                                 std::to_string(pos) + ", n = " + std::to_string(n) + ")");
    const size_t packs = size_t(n) * C / Pack::size;
    const int block = 256;
    launch<kv_cache_append_kernel>(KernelCost{0.0, 4.0 * n * C * sizeof(floatX)}, dim3(ceil_div(packs, block)), dim3(block),
                                   0, stream, keys, values, qkv, pos, n, C);
}

// out (C) = attention of the query in the qkv row `qkv` over cache positions [0, n) (the new position
// n - 1 included: appended before).
inline void attention_decode(floatX* out, const floatX* qkv, const floatX* keys, const floatX* values, int n, int C, int NH,
                             cudaStream_t stream) {
    using namespace attention_decode_detail;
    require_supported("attention_decode", attention_decode_requirements(C, NH, n));
    const size_t smem = smem_floats(n, C / NH) * sizeof(float);
    attention_detail::allow_smem<attention_decode_kernel>(smem);
    // Per head: n dots of hs (2 hs flops), n exps, n * hs fmas for the output. Bytes: the cache's n
    // keys and values of this layer once, the query and output row.
    const double pairs = double(n) * NH * (C / NH);
    launch<attention_decode_kernel>(KernelCost{4.0 * pairs + 2.0 * n * NH, 2.0 * n * C * sizeof(floatX) + 4.0 * C * sizeof(floatX)},
                                    dim3(NH), dim3(kThreads), smem, stream, out, qkv, keys, values, n, C, NH);
}
