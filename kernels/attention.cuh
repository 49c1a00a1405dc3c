// Causal multi-head self-attention, SIMT (CUDA-core) flash attention: FlashAttention-2's tiled
// online softmax (Dao 2023, "FlashAttention-2", Algorithms 1 and 2). No T x T tensor ever
// reaches global memory; the forward pass keeps only the per-row logsumexp for backward.
//
// Layouts: qkv (B, T, 3C) = q | k | v per position, head h at channels [h*hs, (h+1)*hs) of each
// group (hs = C/NH); out (B, T, C) the same way; lse and the backward scratch D are (B, NH, T).
//
// Every kernel works on 32 x 32 tiles (kTile query rows by kTile keys) of one (b, h). Tiles are
// staged in shared memory as floats. ROW_THREADS threads own a row (a query, or a key in the dK/dV
// kernel) and split its score entries (keys part, part + ROW_THREADS, ...) and its hs-wide
// accumulator (float4 groups part, part + ROW_THREADS, ...), so per-thread registers are bounded by
// the template parameters HS_MAX and ROW_THREADS. On a GPU 4 threads share a row (128-thread blocks
// keep an SM's warps busy); where the CPU emulator runs the kernels a thread takes a whole row
// (simt_row_threads): it then holds every score of its row, so the kernels need no score tiles in
// shared memory nor the barrier that completes them, and the emulator switches a quarter as many
// fibers (GPT-2 124M, B=4, T=64, one core, with dot_group: forward 5.4 -> 1.7 ms a launch, backward
// 10.4 -> 4.5).
// Both forms compute every value in the same order: the same bits (test_kernel_attention).
//
// Document masking (--doc-mask, host/documents.h): with doc_start (B, T) ints, the start of each
// token's document within its row, query t sees key k only when doc_start[t] <= k <= t; null is plain
// causal attention. Over a span (below) doc_start[t] is the first key, in the span's key coordinates,
// that query t sees (Tk or more: none; parallel/context.h's context_first_keys), query-side layout. Document starts never decrease along a row, so a query tile's first query has
// the smallest start: key tiles before it are skipped, not loaded, and so are, for a key tile, the
// query tiles from the first query whose document starts after the tile's last key.
//
// Spans (AttentionSpan): the kernels run queries [0, Tq) of each sequence against keys [0, Tk), query
// t seeing key k when k <= t + key_lead. The plain call is causal_span(T, C): one qkv buffer, Tq = Tk =
// T, key_lead 0. Context parallelism (parallel/context.h) runs a rank's queries against the keys of
// another rank's chunk: then the query-side arrays (q, out, lse, D, dout, dq) and the key-side ones
// (k, v, dk, dv) differ in length and sequence stride, and key_lead >= Tk lets every query see every key
// of a chunk that lies wholly before it. With `accumulate`, the backward kernels add their gradients to
// what the destination holds (one ring step's share of a sum over all of them) instead of writing them.
//
// The tiles a kernel loads in its loop (K and V, or Q and dO) have two buffers, used by alternate
// iterations: a tile's loads go to the buffer the iteration before last read, which every thread has
// left once all have passed the last iteration's barriers, so an iteration needs no barrier before its
// loads (two a tile with 4 threads a row, one with a thread a row; the CPU emulator pays a fiber
// switch per thread at each). Shared memory reaches 110 KB per block (dK/dV kernel, hs 128);
// launchers opt in beyond 48 KB. __launch_bounds__(block_threads, 1): without the minimum-blocks hint
// ptxas capped registers at 80-128 and spilled a few bytes on sm_80/sm_90; with it the kernels use
// 121-241 and never spill.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>

#include "common.cuh"

// Which queries see which keys, and how the arrays are laid out; see the top of the file.
// Query-side arrays: q rows 3C apart (a qkv buffer), out/dout rows C apart, lse/D one float per row, dq
// rows 3C apart; q_seq rows (entries) from one sequence to the next, (b, h)'s lse/D at (b NH + h) q_seq.
// Key-side arrays: k rows kv_stride apart (3C in a qkv buffer, 2C in a compact k|v buffer), v = k + C;
// dk, dv likewise; kv_seq rows from one sequence to the next.
struct AttentionSpan {
    int Tq = 0, Tk = 0;
    int q_seq = 0, kv_seq = 0;
    int kv_stride = 0;
    int key_lead = 0;  // query t sees key k <= t + key_lead (>= 0; >= Tk: every key)
};
// Causal self-attention over sequences of T positions in one qkv buffer (B, T, 3C).
inline AttentionSpan causal_span(int T, int C) { return {T, T, T, T, 3 * C, 0}; }

namespace attention_detail {

constexpr int kTile = 32;  // query rows and keys per tile
// A row's softmax max and sum run as 4 shares (keys s, s + 4, ...) combined by row_combined's butterfly:
// the shares of the 4 threads of a row on a GPU, and the same order where one thread owns the row.
constexpr int kShares = 4;
constexpr int kMaxHeadSize = 128;
// The largest head size whose kernels take a thread a row (GPT-2's heads are 64 wide; the emulator's
// fibers hold larger accumulators in memory anyway). The CPU build alone has these kernels: on a GPU
// they would spill registers (ptxas, sm_90, hs 64: dK/dV 260 bytes, with dK and dV 128 floats a
// thread; dQ 60) and leave an SM a few 32-thread blocks.
constexpr int kMaxHeadSizeOneThreadRows = 64;
__host__ __device__ constexpr bool one_thread_rows_exist(int hs) { return kEmulatedDevice && hs <= kMaxHeadSizeOneThreadRows; }
template <int ROW_THREADS> constexpr int block_threads = kTile * ROW_THREADS;
template <int ROW_THREADS> constexpr int entries_per_thread = kTile / ROW_THREADS;
constexpr int kVec = 8;  // hs must be a multiple of Packed128<bf16>::size, in both precisions
// Shared-memory rows hold hs floats plus 4: float4-aligned, and consecutive rows start on
// different banks (row stride 4 mod 32 words when hs is a multiple of 32).
constexpr int kRowPad = 4;
constexpr int kScoreStride = kTile + 1;  // score tiles [row][key], padded so columns spread over banks

__host__ __device__ inline int row_stride(int hs) { return hs + kRowPad; }

// Dynamic shared memory of each kernel, in floats (see the carving at the top of each kernel): score
// tiles only where threads share a row.
inline size_t score_tiles_floats(int count, int row_threads) { return row_threads > 1 ? size_t(count) * kTile * kScoreStride : 0; }
inline size_t forward_smem_floats(int hs, int row_threads) { return 5 * kTile * row_stride(hs) + score_tiles_floats(1, row_threads); }
inline size_t dkdv_smem_floats(int hs, int row_threads) {
    return 6 * kTile * row_stride(hs) + score_tiles_floats(2, row_threads) + 4 * kTile;
}
inline size_t dq_smem_floats(int hs, int row_threads) { return 6 * kTile * row_stride(hs) + score_tiles_floats(1, row_threads) + 2 * kTile; }

// Rows [row0, row0 + kTile) of one head (hs values at src + t * src_stride for position t) into
// shared memory as floats; positions at or beyond T read as zeros (so that masked entries, whose
// probability is 0, never meet a NaN from poisoned or stale shared memory).
__device__ inline void load_tile(float* dst, const floatX* src, size_t src_stride, int row0, int T, int hs) {
    const int vecs_per_row = hs / Packed128<floatX>::size;
    for (int i = int(threadIdx.x); i < kTile * vecs_per_row; i += int(blockDim.x)) {
        const int r = i / vecs_per_row, d = (i % vecs_per_row) * Packed128<floatX>::size;
        float* to = dst + r * row_stride(hs) + d;
        if (row0 + r < T) {
            const Packed128<floatX> v = load128(src + size_t(row0 + r) * src_stride + d);
            for (int k = 0; k < Packed128<floatX>::size; ++k) to[k] = to_float(v[k]);
        } else {
            for (int k = 0; k < Packed128<floatX>::size; ++k) to[k] = 0.0f;
        }
    }
}

// The inverse of load_tile for rows below T, into floatX or float (context parallelism's FP32
// partial results and sums); with `accumulate`, added to what dst holds.
template <typename Dst>
__device__ inline void store_tile(Dst* dst, size_t dst_stride, const float* src, int row0, int T, int hs,
                                  bool accumulate = false) {
    using Pack = Packed128<Dst>;
    const int vecs_per_row = hs / Pack::size;
    for (int i = int(threadIdx.x); i < kTile * vecs_per_row; i += int(blockDim.x)) {
        const int r = i / vecs_per_row, d = (i % vecs_per_row) * Pack::size;
        if (row0 + r >= T) continue;
        const float* from = src + r * row_stride(hs) + d;
        Dst* to = dst + size_t(row0 + r) * dst_stride + d;
        const Pack before = accumulate ? load128(to) : Pack::filled(0.0f);
        float sums[Pack::size];
        unpack_floats(sums, before);
        LANE_LOOP
        for (int k = 0; k < Pack::size; ++k) sums[k] += from[k];
        store128(to, pack_floats<Dst>(sums));  // the CPU build's SIMD rounding (one by one it was scalar)
    }
}

// Per-row floats (lse or D) of positions [row0, row0 + kTile); zeros beyond T.
__device__ inline void load_row_values(float* dst, const float* src, int row0, int T) {
    for (int r = int(threadIdx.x); r < kTile; r += int(blockDim.x)) dst[r] = row0 + r < T ? src[row0 + r] : 0.0f;
}

// Dot products of hs-wide rows in the kernels' one order: four running sums, one per float4 component,
// added pairwise at the end (dot_total): independent chains (a single in-order sum was a chain of hs
// dependent adds), and in the CPU build one 4-wide SIMD multiply-add per float4 (fma4).
// dot_total is also the last step of the backward's D (attention_backward_rowdot_kernel): one order.
__device__ inline float dot_total(const float4& sums) { return (sums.x + sums.y) + (sums.z + sums.w); }
// D's dot of a row of dO with its row of O (hs elements, 16-byte aligned, hs a multiple of 8), in that
// order: the rowdot kernel's and the fused tensor-core backward's (kernels/attention_tc.cuh), one sum.
template <typename X>
__device__ inline float row_dot(const X* dout_row, const X* out_row, int hs) {
    using Pack = Packed128<X>;
    float4 sums = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int d = 0; d < hs; d += Pack::size) {
        float g[Pack::size], o[Pack::size];
        unpack_floats(g, load128(dout_row + d));
        unpack_floats(o, load128(out_row + d));
        for (int k = 0; k < Pack::size; k += 4)
            sums = fma4(make_float4(g[k], g[k + 1], g[k + 2], g[k + 3]), make_float4(o[k], o[k + 1], o[k + 2], o[k + 3]), sums);
    }
    return dot_total(sums);
}
// The dots of row a with the kDotGroup rows b + g * b_stride, the group's chains side by side so that
// their dependent multiply-adds overlap (one dot at a time, the CPU build waited on each fma's latency:
// about half of the dQ kernel's time went there). fma is symmetric in its factors, so a query row
// against key rows and a key row against query rows give the same bits.
constexpr int kDotGroup = 8;
static_assert(entries_per_thread<1> % kDotGroup == 0 && entries_per_thread<4> % kDotGroup == 0, "whole groups a thread");
__device__ inline void dot_group(float (&out)[kDotGroup], const float* a, const float* b, int b_stride, int hs) {
    float4 sums[kDotGroup];
    for (int g = 0; g < kDotGroup; ++g) sums[g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int d = 0; d < hs; d += 4) {
        const float4 x = *reinterpret_cast<const float4*>(a + d);
        FULL_UNROLL
        for (int g = 0; g < kDotGroup; ++g) sums[g] = fma4(x, *reinterpret_cast<const float4*>(b + g * b_stride + d), sums[g]);
    }
    for (int g = 0; g < kDotGroup; ++g) out[g] = dot_total(sums[g]);
}

// A thread's share of an hs-wide row accumulator: float4 groups part, part + ROW_THREADS, ... of the
// row, i.e. acc[i] holds dimensions 4*(part + ROW_THREADS*i) .. +3. Loops have compile-time trip counts
// so acc stays in registers; dimensions at or beyond hs are skipped.
template <int HS_MAX, int ROW_THREADS> struct RowShare {
    static constexpr int kGroups = HS_MAX / (4 * ROW_THREADS);
    float4 acc[kGroups];

    __device__ void zero() {
        for (int i = 0; i < kGroups; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __device__ void scale(float s) {
        for (int i = 0; i < kGroups; ++i) acc[i] = make_float4(acc[i].x * s, acc[i].y * s, acc[i].z * s, acc[i].w * s);
    }
    // acc += w * row (row: hs floats in shared memory), one fused multiply-add per value. Rows of
    // HS_MAX (every GPT-2 shape) take a path without the per-group test: with it, g++ kept acc in
    // memory (a store and reload per key and group in the CPU build).
    __device__ void add_scaled(float w, const float* row, int part, int hs) {
        if (hs == HS_MAX) {
            for (int i = 0; i < kGroups; ++i)
                acc[i] = fma4(make_float4(w, w, w, w), *reinterpret_cast<const float4*>(row + 4 * (part + ROW_THREADS * i)), acc[i]);
            return;
        }
        for (int i = 0; i < kGroups; ++i) {
            const int d = 4 * (part + ROW_THREADS * i);
            if (d < hs) acc[i] = fma4(make_float4(w, w, w, w), *reinterpret_cast<const float4*>(row + d), acc[i]);
        }
    }
    // acc += sum over r < count of weights[r * weight_stride] * rows[r * rows_stride], r in order (add_scaled
    // per row). The sum runs in a local copy: acc lives across barriers, which are calls in the CPU build,
    // and there g++ otherwise kept it in memory through the loop (a store and reload per row and group).
    __device__ void add_scaled_rows(const float* weights, int weight_stride, const float* rows, int rows_stride, int count,
                                    int part, int hs) {
        RowShare local = *this;
        for (int r = 0; r < count; ++r) local.add_scaled(weights[r * weight_stride], rows + r * rows_stride, part, hs);
        *this = local;
    }
    // The same for weights held by the thread, weights[r] for row r: add_scaled_rows over an array whose
    // size the compiler knows, so that a GPU keeps it in registers.
    template <int kCount>
    __device__ void add_scaled_rows(const float (&weights)[kCount], const float* rows, int rows_stride, int part, int hs) {
        RowShare local = *this;
        FULL_UNROLL
        for (int r = 0; r < kCount; ++r) local.add_scaled(weights[r], rows + r * rows_stride, part, hs);
        *this = local;
    }
    // row = s * acc, this thread's dimensions only
    __device__ void write_scaled(float s, float* row, int part, int hs) const {
        for (int i = 0; i < kGroups; ++i) {
            const int d = 4 * (part + ROW_THREADS * i);
            if (d < hs) *reinterpret_cast<float4*>(row + d) = make_float4(s * acc[i].x, s * acc[i].y, s * acc[i].z, s * acc[i].w);
        }
    }
};

// Combines a value over the 4 threads of a row (adjacent lanes of one warp): the tensor-core kernels'.
__device__ inline float row_max(float v) { return warp_xor_chain<MaxOp, 1, 2>(v); }
__device__ inline float row_sum(float v) { return warp_xor_chain<AddOp, 1, 2>(v); }
// What that butterfly (xor 1, then xor 2) gives thread `part` of a row, from the 4 threads' values
// held by one thread: the same operations in the same order, so the same bits, and no shuffle.
// Lane p folds op(op(v[p], v[p^1]), op(v[p^2], v[p^3])); written with selects, not an index by
// p, which would put the shares in a GPU's local memory.
// A thread that owns its row takes part 0.
template <typename Op> __device__ inline float row_combined(const float (&shares)[kShares], int part) {
    static_assert(kShares == 4, "the butterfly of row_max and row_sum");
    const Op op;
    const bool odd = (part & 1) != 0, high = (part & 2) != 0;
    const float low_pair = odd ? op(shares[1], shares[0]) : op(shares[0], shares[1]);
    const float high_pair = odd ? op(shares[3], shares[2]) : op(shares[2], shares[3]);
    return high ? op(high_pair, low_pair) : op(low_pair, high_pair);
}

// Key tiles (of `tile` keys) that `rows` queries from q0 see: those starting at or before the last key
// their last query sees (fully masked tiles are never loaded). key_lead is at most Tk (the launchers
// clamp it). Also the tensor-core kernels', with their tile sizes, and the launch costs'.
__host__ __device__ inline int span_key_tiles(int q0, const AttentionSpan& s, int rows = kTile, int tile = kTile) {
    const int last_query = (q0 + rows < s.Tq ? q0 + rows : s.Tq) - 1;
    const int last_key = last_query + s.key_lead < s.Tk - 1 ? last_query + s.key_lead : s.Tk - 1;
    return last_key / tile + 1;
}
// The first query tile (kTile-aligned) with a query that sees key k0.
__device__ inline int span_first_query_tile(int k0, const AttentionSpan& s) { return max(0, k0 - s.key_lead) / kTile * kTile; }

// Document masking (see the top of the file). doc_row: the document starts of one row of the batch,
// or null without document masking. Used by the tensor-core kernels too, with their tile sizes.
// A query kernel masks with each query's first visible key; a key kernel with each key's end of
// visible queries: key k is seen by the queries [k, visible_query_end(doc_row, k, k, T)).

// The first key a query sees; rows at or beyond T (a last partial tile's padding) see from key 0.
__device__ inline int first_visible_key(const int* doc_row, int query, int T) {
    return doc_row != nullptr && query < T ? doc_row[query] : 0;
}
// The first key tile (of `tile` keys) a query tile starting at q0 < T sees: its first query's
// document start is the smallest of the tile's. Every key tile from there to the diagonal holds a
// key some query of the tile sees (its first query sees up to q0, each later one itself).
__device__ inline int first_key_tile(const int* doc_row, int q0, int tile) {
    return doc_row != nullptr ? doc_row[q0] / tile : 0;
}
// The end of the queries that see some key up to last_key: the first query at or after `from`
// (<= T) whose document starts after last_key, or T. The starts never decrease, so the queries at or
// after `from` that see such a key are a prefix of them: a binary search over the row (~log2 T
// cached loads; the threads of a block that search for the same key run the same one).
__device__ inline int visible_query_end(const int* doc_row, int from, int last_key, int T) {
    if (doc_row == nullptr) return T;
    int lo = from, hi = T;  // the answer lies in [lo, hi]
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (doc_row[mid] > last_key) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

}  // namespace attention_detail

// ---------------------------------------------------------------------------------------------
// Forward: grid (query tiles, NH, B). Per key tile: S = q k^T / sqrt(hs) (masked where key >
// query), m' = max(m, rowmax S), P = exp(S - m'), l' = l exp(m - m') + rowsum P,
// O' = O exp(m - m') + P V (FlashAttention-2, Algorithm 1); at the end O / l and lse = m + log l.

template <int HS_MAX, int ROW_THREADS, typename Out>
static __global__ void __launch_bounds__(attention_detail::block_threads<ROW_THREADS>, 1)
    attention_forward_kernel(Out* out, float* lse, const floatX* q, const floatX* kv, const int* doc_start,
                             AttentionSpan span, int C, int NH) {
    using namespace attention_detail;
    constexpr int kEntries = entries_per_thread<ROW_THREADS>;
    const int hs = C / NH, stride = row_stride(hs), Tq = span.Tq, Tk = span.Tk;
    const float score_scale = 1.0f / sqrtf(float(hs));
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kTile;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int row = int(threadIdx.x) / ROW_THREADS, part = int(threadIdx.x) % ROW_THREADS;
    const int query = q0 + row;

    DYNAMIC_SHARED(float, smem);
    float* q_tile = smem;                          // [kTile][stride], later the normalized output
    float* kv_buffers = q_tile + kTile * stride;   // 2 x (k_tile, v_tile), [kTile][stride] each
    float* s_tile = kv_buffers + 4 * kTile * stride;  // [kTile][kScoreStride]: S[query row][key] (ROW_THREADS > 1)

    const floatX* q_src = q + size_t(b) * span.q_seq * 3 * C + h * hs;
    const floatX* k_src = kv + size_t(b) * span.kv_seq * span.kv_stride + h * hs;
    load_tile(q_tile, q_src, 3 * size_t(C), q0, Tq, hs);
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    const int first_key = first_visible_key(doc_row, query, Tq);
    const int last_key = min(query + span.key_lead, Tk - 1);  // of this row

    float m = -INFINITY, l = 0.0f;  // running max and softmax denominator of this row
    RowShare<HS_MAX, ROW_THREADS> o;
    o.zero();
    const int key_tiles = span_key_tiles(q0, span);
    for (int kt = first_key_tile(doc_row, q0, kTile); kt < key_tiles; ++kt) {
        const int k0 = kt * kTile;
        float* k_tile = kv_buffers + (kt & 1) * 2 * kTile * stride;  // the buffer the tile before last used
        float* v_tile = k_tile + kTile * stride;
        load_tile(k_tile, k_src, size_t(span.kv_stride), k0, Tk, hs);
        load_tile(v_tile, k_src + C, size_t(span.kv_stride), k0, Tk, hs);
        __syncthreads();  // K and V (on the first tile also Q) loaded; the last tile's S reads done

        float scores[kEntries];  // keys part + ROW_THREADS * j of the tile
        for (int j0 = 0; j0 < kEntries; j0 += kDotGroup) {
            const int first_col = part + ROW_THREADS * j0, first = k0 + first_col, last = first + ROW_THREADS * (kDotGroup - 1);
            float qk[kDotGroup] = {};
            if (first <= last_key && first_key <= last)  // a group of masked keys skips its dots
                dot_group(qk, q_tile + row * stride, k_tile + first_col * stride, ROW_THREADS * stride, hs);
            for (int g = 0; g < kDotGroup; ++g) {
                const int key = first + ROW_THREADS * g;
                scores[j0 + g] = first_key <= key && key <= last_key ? qk[g] * score_scale : -INFINITY;
            }
        }
        // Each thread of a row takes the row's kTile scores and repeats its softmax update (the max,
        // kTile exponentials, the sum) instead of combining the threads' shares with shuffles: the CPU
        // emulator pays a fiber switch per thread for each shuffle chain, two a tile, and was ~30%
        // switches. The shares are combined as the shuffles did (row_combined), so the bits are theirs;
        // the repeated exponentials cost little on a GPU.
        float p[kTile];
        if constexpr (ROW_THREADS > 1) {
            for (int j = 0; j < kEntries; ++j) s_tile[row * kScoreStride + part + ROW_THREADS * j] = scores[j];
            __syncthreads();  // S complete
            for (int c = 0; c < kTile; ++c) p[c] = s_tile[row * kScoreStride + c];
        } else {
            for (int c = 0; c < kTile; ++c) p[c] = scores[c];
        }
        // Share t is keys t, t + 4, ...: the loops run over the keys in order with the four shares side
        // by side, which the CPU build does as one 4-wide select per key group.
        float share_max[kShares];
        for (int t = 0; t < kShares; ++t) share_max[t] = -INFINITY;
        for (int j = 0; j < kTile / kShares; ++j) {
            LANE_LOOP
            for (int t = 0; t < kShares; ++t) share_max[t] = max_number(share_max[t], p[t + kShares * j]);
        }
        // A row's fully masked tile after its first visible key gives correction 1 and P = 0. Before
        // it (a document that starts later in the query tile) m_new is still -inf: exponents
        // relative to 0 then keep P = 0 and o = l = 0 (exp(-inf - -inf) would be NaN).
        const float m_new = max_number(m, row_combined<MaxOp>(share_max, part));
        const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
        const float correction = expf(m - m_ref);  // 0 on the row's first tile (m = -inf)
        for (int c = 0; c < kTile; ++c) p[c] -= m_ref;
        expf_each(p, p);  // the CPU build's vector expf, 8 at a time
        float share_sum[kShares];
        for (int t = 0; t < kShares; ++t) share_sum[t] = 0.0f;
        for (int j = 0; j < kTile / kShares; ++j) {
            LANE_LOOP
            for (int t = 0; t < kShares; ++t) share_sum[t] += p[t + kShares * j];
        }
        l = l * correction + row_combined<AddOp>(share_sum, part);
        m = m_new;
        o.scale(correction);
        o.add_scaled_rows(p, v_tile, stride, part, hs);
    }
    // q_tile stages the output once its row's threads have left the loop (the loop reads a thread's own
    // row only) and every thread's share of its load is done: a span's query tile may see no key tile at
    // all (documents under context parallelism), and then no barrier of the loop came after the load.
    // Such a row gets out 0 and lse -inf: the ring's merge gives it weight 0.
    __syncthreads();
    o.write_scaled(l > 0.0f ? 1.0f / l : 0.0f, q_tile + row * stride, part, hs);
    if (part == 0 && query < Tq) lse[(size_t(b) * NH + h) * span.q_seq + query] = l > 0.0f ? m + logf(l) : -INFINITY;
    __syncthreads();
    store_tile(out + size_t(b) * span.q_seq * C + h * hs, size_t(C), q_tile, q0, Tq, hs);
}

// ---------------------------------------------------------------------------------------------
// Backward (FlashAttention-2, Algorithm 2, split into two atomic-free kernels):
//   P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P * (dP - D) with D = rowsum(dO * O),
//   dQ = dS K / sqrt(hs), dK = dS^T Q / sqrt(hs).

// D for every (b, h, t): one thread per row, heads of a position in adjacent threads. A row is short
// (hs <= 128), so a thread sums it alone, with no warp reduction. The sum runs in the dots' order (four
// running sums, added pairwise): where out is one value row (a query that sees a single key), D and the
// backward kernels' dP = dO . V are then the same sum and dS = P (dP - D) is 0 exactly, as it is
// mathematically (in another order the two roundings differed by ~1e-7).
// Row r = (b, t, h) starts at element r * hs of dout and out, so a warp's 32 rows are one contiguous
// span. Read row by row, a warp's every 16-byte load touched 32 lines hs elements apart: on an H100
// (d12, B=64, 2026-11-27) 1.80 ms a step, 1.36 TB/s, against 0.95 ms on the roofline. So on a GPU
// (kStaged) the warp (a block) first copies its span into shared memory in consecutive 16-byte pieces
// (a load instruction covers 512 contiguous bytes), then each thread sums its row from there, in the
// same order. Rows in shared memory are padded by one piece: a 16-byte read by 8 threads of 8 rows
// then falls in 8 different groups of 4 banks (the stride is 4 banks modulo 32). The CPU emulator reads
// the rows directly: there the copy and the warp's wait cost 2.7 ms of a d12 B=4 T=64 step against
// 0.63 (--profile-step). Both forms give the same bits.
constexpr int kRowdotRows = 32;  // a warp, a block (staged)
constexpr int kRowdotDirectRows = 128;  // a block of the direct form (the old kernel's block)
constexpr int kRowdotPiecesInFlight = 4;  // a thread's 16-byte loads of each operand issued together
__host__ __device__ inline int rowdot_row_stride(int hs) { return hs + Packed128<floatX>::size; }  // elements
inline size_t rowdot_smem_bytes(int hs) { return 2 * size_t(kRowdotRows) * size_t(rowdot_row_stride(hs)) * sizeof(floatX); }

template <bool kStaged>
static __global__ void __launch_bounds__(kStaged ? kRowdotRows : kRowdotDirectRows)
    attention_backward_rowdot_kernel(float* D, const floatX* dout, const floatX* out, int B, int T, int C, int NH) {
    using Pack = Packed128<floatX>;
    constexpr int kBlockRows = kStaged ? kRowdotRows : kRowdotDirectRows;
    const int hs = C / NH, pieces_per_row = hs / Pack::size;
    const size_t rows = size_t(B) * T * NH, first_row = size_t(blockIdx.x) * kBlockRows;
    const int block_rows = rows - first_row < size_t(kBlockRows) ? int(rows - first_row) : kBlockRows;
    const int r = int(threadIdx.x);
    const floatX* dout_row = dout + (first_row + size_t(r)) * hs;  // row r's own pieces
    const floatX* out_row = out + (first_row + size_t(r)) * hs;
    if constexpr (kStaged) {
        DYNAMIC_SHARED(floatX, smem);
        const int ld = rowdot_row_stride(hs);
        floatX* dout_rows = smem;
        floatX* out_rows = smem + size_t(kRowdotRows) * ld;
        const size_t span = first_row * hs;  // element offset of the block's first row
        const int pieces = block_rows * pieces_per_row;
        for (int first = r; first < pieces; first += kRowdotRows * kRowdotPiecesInFlight) {
            Pack g[kRowdotPiecesInFlight], o[kRowdotPiecesInFlight];  // all loaded before any is stored
            FULL_UNROLL
            for (int i = 0; i < kRowdotPiecesInFlight; ++i) {
                const size_t at = span + size_t(first + i * kRowdotRows) * Pack::size;
                const bool load = first + i * kRowdotRows < pieces;
                g[i] = load ? load128cs(dout + at) : Pack::filled(0.0f);
                o[i] = load ? load128cs(out + at) : Pack::filled(0.0f);
            }
            FULL_UNROLL
            for (int i = 0; i < kRowdotPiecesInFlight; ++i) {
                const int piece = first + i * kRowdotRows;
                if (piece >= pieces) break;
                const int at = (piece / pieces_per_row) * ld + (piece % pieces_per_row) * Pack::size;
                store128(dout_rows + at, g[i]);
                store128(out_rows + at, o[i]);
            }
        }
        __syncwarp();
        dout_row = dout_rows + r * ld;
        out_row = out_rows + r * ld;
    }
    if (r >= block_rows) return;
    const size_t row = first_row + size_t(r), bt = row / NH, b = bt / T, t = bt % T;
    const int h = int(row % NH);
    D[(b * NH + h) * T + t] = attention_detail::row_dot(dout_row, out_row, hs);
}

// dK, dV: grid (key tiles, NH, B). A key row's threads loop over the query tiles at or after the key
// tile, the ones the causal mask lets see these keys, up to the first query whose document starts
// after the tile's last key.
template <int HS_MAX, int ROW_THREADS, typename Grad>
static __global__ void __launch_bounds__(attention_detail::block_threads<ROW_THREADS>, 1)
    attention_backward_dkdv_kernel(Grad* dkv, int dkv_stride, const floatX* dout, const floatX* q, const floatX* kv,
                                   const float* lse, const float* D, const int* doc_start, AttentionSpan span, int C, int NH,
                                   bool accumulate) {
    using namespace attention_detail;
    constexpr int kEntries = entries_per_thread<ROW_THREADS>;
    const int hs = C / NH, stride = row_stride(hs), Tq = span.Tq, Tk = span.Tk;
    const float score_scale = 1.0f / sqrtf(float(hs));
    const int k0 = int(blockIdx.x) * kTile;  // the first key tiles see the most queries: first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int key_col = int(threadIdx.x) / ROW_THREADS, part = int(threadIdx.x) % ROW_THREADS;
    const int key = k0 + key_col;

    DYNAMIC_SHARED(float, smem);
    float* k_tile = smem;                         // [kTile][stride], later dK
    float* v_tile = k_tile + kTile * stride;      // [kTile][stride], later dV
    float* query_buffers = v_tile + kTile * stride;   // 2 x (q_tile, dout_tile), [kTile][stride] each
    float* row_buffers = query_buffers + 4 * kTile * stride;  // 2 x (lse_rows, d_rows), [kTile] each
    // ROW_THREADS > 1: [kTile][kScoreStride] each, P and dS [query row][key]
    float* p_tile = row_buffers + 4 * kTile;
    float* ds_tile = p_tile + kTile * kScoreStride;

    const size_t qkv_stride = 3 * size_t(C), kv_stride = size_t(span.kv_stride);
    const floatX* q_src = q + size_t(b) * span.q_seq * qkv_stride + h * hs;
    const floatX* k_src = kv + size_t(b) * span.kv_seq * kv_stride + h * hs;
    const floatX* dout_src = dout + size_t(b) * span.q_seq * C + h * hs;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    // The searches start at the first query that could see the key (k - key_lead): any lower bound will do.
    const int query_end = visible_query_end(doc_row, min(max(k0 - span.key_lead, 0), Tq), min(k0 + kTile, Tk) - 1, Tq);
    const int key_query_end = key < Tk ? visible_query_end(doc_row, min(max(key - span.key_lead, 0), Tq), key, Tq) : 0;
    const float* lse_src = lse + (size_t(b) * NH + h) * span.q_seq;
    const float* d_src = D + (size_t(b) * NH + h) * span.q_seq;
    load_tile(k_tile, k_src, kv_stride, k0, Tk, hs);
    load_tile(v_tile, k_src + C, kv_stride, k0, Tk, hs);

    RowShare<HS_MAX, ROW_THREADS> dk, dv;
    dk.zero();
    dv.zero();
    // kTile-aligned: the query tiles before the first that sees key k0 see none of these keys
    for (int q0 = span_first_query_tile(k0, span); q0 < query_end; q0 += kTile) {
        const int buffer = (q0 / kTile) & 1;  // the one the query tile before last used
        float* q_tile = query_buffers + buffer * 2 * kTile * stride;
        float* dout_tile = q_tile + kTile * stride;
        float* lse_rows = row_buffers + buffer * 2 * kTile;
        float* d_rows = lse_rows + kTile;
        load_tile(q_tile, q_src, qkv_stride, q0, Tq, hs);
        load_tile(dout_tile, dout_src, size_t(C), q0, Tq, hs);
        load_row_values(lse_rows, lse_src, q0, Tq);
        load_row_values(d_rows, d_src, q0, Tq);
        __syncthreads();  // Q, dO and their rows (on the first tile also K, V) loaded; the last tile's P, dS reads done

        // Both dots of each entry first, then the exponentials in one call (expf_each), then dS = P (dP -
        // D). A group of masked entries skips its dots; a masked entry gets exponent -inf, so P = 0, and
        // dP - D = 0, so dS = 0, whatever its dots were (NaN included, from rows of another document).
        // Entry j: query row part + ROW_THREADS * j of the tile.
        float exponent[kEntries], dp_minus_d[kEntries], p[kEntries], ds[kEntries];
        for (int j0 = 0; j0 < kEntries; j0 += kDotGroup) {
            const int first_row = part + ROW_THREADS * j0, first = q0 + first_row, last = first + ROW_THREADS * (kDotGroup - 1);
            float qk[kDotGroup] = {}, dov[kDotGroup] = {};
            if (key <= last + span.key_lead && first < key_query_end) {  // the key's visible queries are a range
                dot_group(qk, k_tile + key_col * stride, q_tile + first_row * stride, ROW_THREADS * stride, hs);
                dot_group(dov, v_tile + key_col * stride, dout_tile + first_row * stride, ROW_THREADS * stride, hs);
            }
            for (int g = 0; g < kDotGroup; ++g) {
                const int r = first_row + ROW_THREADS * g, query = q0 + r;
                const bool visible = key <= query + span.key_lead && query < key_query_end;
                exponent[j0 + g] = visible ? qk[g] * score_scale - lse_rows[r] : -INFINITY;
                dp_minus_d[j0 + g] = visible ? dov[g] - d_rows[r] : 0.0f;
            }
        }
        expf_each(p, exponent);
        for (int j = 0; j < kEntries; ++j) ds[j] = p[j] * dp_minus_d[j];
        if constexpr (ROW_THREADS > 1) {  // every thread of the key row adds every query row
            for (int j = 0; j < kEntries; ++j) {
                const int r = part + ROW_THREADS * j;
                p_tile[r * kScoreStride + key_col] = p[j];
                ds_tile[r * kScoreStride + key_col] = ds[j];
            }
            __syncthreads();  // P and dS complete
            dv.add_scaled_rows(p_tile + key_col, kScoreStride, dout_tile, stride, kTile, part, hs);
            dk.add_scaled_rows(ds_tile + key_col, kScoreStride, q_tile, stride, kTile, part, hs);
        } else {  // the thread holds its key's P and dS of every query row, in row order
            dv.add_scaled_rows(p, dout_tile, stride, part, hs);
            dk.add_scaled_rows(ds, q_tile, stride, part, hs);
        }
    }
    // A key row's threads read k_tile and v_tile at their own row only, in the loop; with no query tile (a
    // span's keys that no query sees) the barrier orders the writes after every thread's loads.
    __syncthreads();
    dk.write_scaled(score_scale, k_tile + key_col * stride, part, hs);
    dv.write_scaled(1.0f, v_tile + key_col * stride, part, hs);
    __syncthreads();
    Grad* head_dst = dkv + size_t(b) * span.kv_seq * dkv_stride + h * hs;
    store_tile(head_dst, size_t(dkv_stride), k_tile, k0, Tk, hs, accumulate);
    store_tile(head_dst + C, size_t(dkv_stride), v_tile, k0, Tk, hs, accumulate);
}

// dQ: grid (query tiles, NH, B). A query row's threads loop over the key tiles the causal and
// document masks let it see, as the forward pass does.
template <int HS_MAX, int ROW_THREADS, typename Grad>
static __global__ void __launch_bounds__(attention_detail::block_threads<ROW_THREADS>, 1)
    attention_backward_dq_kernel(Grad* dq, int dq_stride, const floatX* dout, const floatX* q, const floatX* kv,
                                 const float* lse, const float* D, const int* doc_start, AttentionSpan span, int C, int NH,
                                 bool accumulate) {
    using namespace attention_detail;
    constexpr int kEntries = entries_per_thread<ROW_THREADS>;
    const int hs = C / NH, stride = row_stride(hs), Tq = span.Tq, Tk = span.Tk;
    const float score_scale = 1.0f / sqrtf(float(hs));
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kTile;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int row = int(threadIdx.x) / ROW_THREADS, part = int(threadIdx.x) % ROW_THREADS;
    const int query = q0 + row;

    DYNAMIC_SHARED(float, smem);
    float* q_tile = smem;                            // [kTile][stride], later dQ
    float* dout_tile = q_tile + kTile * stride;      // [kTile][stride]
    float* kv_buffers = dout_tile + kTile * stride;  // 2 x (k_tile, v_tile), [kTile][stride] each
    float* lse_rows = kv_buffers + 4 * kTile * stride;  // [kTile]
    float* d_rows = lse_rows + kTile;                   // [kTile]
    float* ds_tile = d_rows + kTile;  // ROW_THREADS > 1: [kTile][kScoreStride], dS[query row][key]

    const size_t qkv_stride = 3 * size_t(C), kv_stride = size_t(span.kv_stride);
    const floatX* q_src = q + size_t(b) * span.q_seq * qkv_stride + h * hs;
    const floatX* k_src = kv + size_t(b) * span.kv_seq * kv_stride + h * hs;
    load_tile(q_tile, q_src, qkv_stride, q0, Tq, hs);
    load_tile(dout_tile, dout + size_t(b) * span.q_seq * C + h * hs, size_t(C), q0, Tq, hs);
    load_row_values(lse_rows, lse + (size_t(b) * NH + h) * span.q_seq, q0, Tq);
    load_row_values(d_rows, D + (size_t(b) * NH + h) * span.q_seq, q0, Tq);
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    const int first_key = first_visible_key(doc_row, query, Tq);
    const int last_key = min(query + span.key_lead, Tk - 1);  // of this row

    RowShare<HS_MAX, ROW_THREADS> dq_row;
    dq_row.zero();
    const int key_tiles = span_key_tiles(q0, span);
    for (int kt = first_key_tile(doc_row, q0, kTile); kt < key_tiles; ++kt) {
        const int k0 = kt * kTile;
        float* k_tile = kv_buffers + (kt & 1) * 2 * kTile * stride;  // the buffer the tile before last used
        float* v_tile = k_tile + kTile * stride;
        load_tile(k_tile, k_src, kv_stride, k0, Tk, hs);
        load_tile(v_tile, k_src + C, kv_stride, k0, Tk, hs);
        __syncthreads();  // K and V (on the first tile also Q, dO and their rows) loaded; the last tile's dS reads done

        // As in the dK/dV kernel: both dots, one expf_each, then dS; masked entries P = 0, dS = 0.
        // Entry j: key part + ROW_THREADS * j of the tile.
        float exponent[kEntries], dp_minus_d[kEntries], p[kEntries], ds[kEntries];
        for (int j0 = 0; j0 < kEntries; j0 += kDotGroup) {
            const int first_col = part + ROW_THREADS * j0, first = k0 + first_col, last = first + ROW_THREADS * (kDotGroup - 1);
            float qk[kDotGroup] = {}, dov[kDotGroup] = {};
            if (query < Tq && first <= last_key && first_key <= last) {
                dot_group(qk, q_tile + row * stride, k_tile + first_col * stride, ROW_THREADS * stride, hs);
                dot_group(dov, dout_tile + row * stride, v_tile + first_col * stride, ROW_THREADS * stride, hs);
            }
            for (int g = 0; g < kDotGroup; ++g) {
                const int key = first + ROW_THREADS * g;
                const bool visible = first_key <= key && key <= last_key && query < Tq;
                exponent[j0 + g] = visible ? qk[g] * score_scale - lse_rows[row] : -INFINITY;
                dp_minus_d[j0 + g] = visible ? dov[g] - d_rows[row] : 0.0f;
            }
        }
        expf_each(p, exponent);
        for (int j = 0; j < kEntries; ++j) ds[j] = p[j] * dp_minus_d[j];
        if constexpr (ROW_THREADS > 1) {  // every thread of the row adds every key row
            for (int j = 0; j < kEntries; ++j) ds_tile[row * kScoreStride + part + ROW_THREADS * j] = ds[j];
            __syncthreads();  // dS complete
            dq_row.add_scaled_rows(ds_tile + row * kScoreStride, 1, k_tile, stride, kTile, part, hs);
        } else {  // the thread holds its row's dS of every key, in key order
            dq_row.add_scaled_rows(ds, k_tile, stride, part, hs);
        }
    }
    // A query row's threads read q_tile at their own row only, in the loop; with no key tile (a span's
    // queries that see no key) the barrier orders the writes after every thread's loads.
    __syncthreads();
    dq_row.write_scaled(score_scale, q_tile + row * stride, part, hs);
    __syncthreads();
    store_tile(dq + size_t(b) * span.q_seq * dq_stride + h * hs, size_t(dq_stride), q_tile, q0, Tq, hs, accumulate);
}

// ---------------------------------------------------------------------------------------------
// Merging two attentions of the same queries over disjoint sets of keys (context parallelism's ring
// steps, parallel/context.h): each result is normalized over its own keys, and its lse is the log of
// its softmax denominator, so over the union lse = log(e^lse1 + e^lse2) and out = e^(lse1 - lse) out1
// + e^(lse2 - lse) out2 (the online softmax's rescaling, Milakov & Gimelshein 2018; Liu et al. 2023,
// "Ring Attention"). In place into (out, lse), in FP32 (the ring rounds its sum to floatX once, at the
// end); query-side layouts as in AttentionSpan (rows [0, Tq) of sequences q_seq apart). One thread per
// (b, t, h) row, 16-byte vectors along the head.
static __global__ void attention_merge_kernel(float* out, float* lse, const float* part_out, const float* part_lse, int B,
                                              int Tq, int q_seq, int C, int NH) {
    using Pack = Packed128<float>;
    const size_t row = size_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (b, t, h)
    if (row >= size_t(B) * Tq * NH) return;
    const int hs = C / NH, h = int(row % NH), t = int(row / NH % Tq), b = int(row / NH / Tq);
    const size_t lse_at = (size_t(b) * NH + h) * q_seq + t, out_at = (size_t(b) * q_seq + t) * C + size_t(h) * hs;
    const float a = lse[lse_at], c = part_lse[lse_at];
    const float m = fmaxf(a, c);  // both finite: every query of a span sees a key
    const float merged = m + logf(expf(a - m) + expf(c - m));
    const float wa = expf(a - merged), wc = expf(c - merged);
    for (int d = 0; d < hs; d += Pack::size) {
        const Pack x = load128(out + out_at + d), y = load128(part_out + out_at + d);
        Pack v;
        for (int k = 0; k < Pack::size; ++k) v[k] = wa * x[k] + wc * y[k];
        store128(out + out_at + d, v);
    }
    lse[lse_at] = merged;
}

// ---------------------------------------------------------------------------------------------
// Host side

inline std::string attention_requirements(int C, int NH) {
    using attention_detail::kMaxHeadSize;
    using attention_detail::kVec;
    if (C < 1 || NH < 1)
        return "attention: C = " + std::to_string(C) + " and NH = " + std::to_string(NH) + " must be positive";
    if (C % NH != 0) return "attention: C = " + std::to_string(C) + " is not divisible by NH = " + std::to_string(NH);
    const int hs = C / NH;
    if (hs % kVec != 0)
        return "attention: head size C/NH = " + std::to_string(hs) + " is not a multiple of " + std::to_string(kVec);
    if (hs > kMaxHeadSize)
        return "attention: head size C/NH = " + std::to_string(hs) + " exceeds the supported maximum " +
               std::to_string(kMaxHeadSize);
    return "";
}

inline size_t attention_backward_scratch_floats(int B, int T, int NH) { return size_t(B) * T * NH; }

namespace attention_detail {

inline void check_sizes(const char* launcher, int B, int T, int C, int NH) {
    std::string problem = attention_requirements(C, NH);
    if (problem.empty() && (B < 1 || T < 1))
        problem = "attention: B = " + std::to_string(B) + " and T = " + std::to_string(T) + " must be positive";
    require_supported(launcher, problem);
}

// Calls f(std::integral_constant<int, HS_MAX>) with the smallest HS_MAX in {32, 64, 128} >= hs.
template <typename F> void dispatch_head_size(int hs, F&& f) {
    if (hs <= 32) f(std::integral_constant<int, 32>{});
    else if (hs <= 64) f(std::integral_constant<int, 64>{});
    else f(std::integral_constant<int, 128>{});
}

// The threads sharing a row (see the top of the file) where the kernels run: a thread a row when the
// CPU emulator executes them (one_thread_rows_exist), else 4, also when the emulator only records
// launches for a GPU's roofline (dev/roofline.cu).
inline int simt_row_threads(int hs) { return kernels_run_on_cpu() && one_thread_rows_exist(hs) ? 1 : 4; }

// The launchers' row split: `requested` (1 or 4; tests run both), or 0 for simt_row_threads.
inline int resolve_row_threads(const char* launcher, int hs, int requested) {
    if (requested == 0) return simt_row_threads(hs);
    if (requested != 1 && requested != 4)
        require_supported(launcher, "attention: row_threads = " + std::to_string(requested) + " must be 0 (automatic), 1 or 4");
    if (requested == 1 && !one_thread_rows_exist(hs))
        require_supported(launcher, kEmulatedDevice ? "attention: row_threads = 1 takes head sizes up to " +
                                                          std::to_string(kMaxHeadSizeOneThreadRows) + ", got " + std::to_string(hs)
                                                    : std::string("attention: row_threads = 1 exists in the CPU build only"));
    return requested;
}

// Calls f(integral_constant HS_MAX, integral_constant ROW_THREADS) for head size hs and a resolved row
// split; the one-thread kernels are instantiated only where one_thread_rows_exist.
template <typename F> void dispatch_kernel_shape(int hs, int row_threads, F&& f) {
    dispatch_head_size(hs, [&](auto hs_max) {
        if constexpr (one_thread_rows_exist(decltype(hs_max)::value)) {
            if (row_threads == 1) return f(hs_max, std::integral_constant<int, 1>{});
        }
        f(hs_max, std::integral_constant<int, 4>{});
    });
}

// Work of one (b, h) for the launch costs: the query-key pairs the span's mask keeps (T(T+1)/2 for
// causal attention), and the pairs of the 32 x 32 tiles the kernels sweep (every tile with a kept pair,
// masked entries included: the P V and dS K products run over whole tiles).
inline double kept_pairs(const AttentionSpan& s) {
    double pairs = 0;
    for (int t = 0; t < s.Tq; ++t) pairs += std::min(s.Tk, t + s.key_lead + 1);
    return pairs;
}
inline double swept_pairs(const AttentionSpan& s) {
    double tiles = 0;
    for (int q0 = 0; q0 < s.Tq; q0 += kTile) tiles += span_key_tiles(q0, s);
    return double(kTile) * kTile * tiles;
}

// "" when the span fits its arrays and the kernels' masks (see AttentionSpan), else why not.
inline std::string span_problem(const AttentionSpan& s) {
    const auto str = [](int v) { return std::to_string(v); };
    if (s.Tq < 1 || s.Tk < 1) return "attention span: Tq = " + str(s.Tq) + " and Tk = " + str(s.Tk) + " must be positive";
    if (s.q_seq < s.Tq || s.kv_seq < s.Tk)
        return "attention span: sequence strides q_seq = " + str(s.q_seq) + ", kv_seq = " + str(s.kv_seq) + " are below Tq = " +
               str(s.Tq) + ", Tk = " + str(s.Tk);
    if (s.key_lead < 0) return "attention span: key_lead = " + str(s.key_lead) + " would leave queries without keys";
    return "";
}

// Dynamic shared memory beyond the default 48 KB must be opted into per kernel.
template <auto Kernel> void allow_smem(size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace attention_detail

// Queries of `q` against the keys and values at `kv` (v = k + C) over `span` (see AttentionSpan):
// out (floatX, or float for context parallelism's merges; rows C apart) and lse for the span's
// queries. doc_start: (B, T) document starts for document masking (the causal span only), or null.
// row_threads: threads sharing a row, 1 or 4 (the same bits either way), or 0 for simt_row_threads.
template <typename Out>
void attention_forward(Out* out, float* lse, const floatX* q, const floatX* kv, AttentionSpan span, int B, int C,
                       int NH, cudaStream_t stream, const int* doc_start = nullptr, int row_threads = 0) {
    using namespace attention_detail;
    check_sizes("attention_forward", B, std::max(span.Tq, span.Tk), C, NH);
    require_supported("attention_forward", span_problem(span));
    span.key_lead = std::min(span.key_lead, span.Tk);  // every key already; keeps the kernels' sums in int
    const int hs = C / NH;
    row_threads = resolve_row_threads("attention_forward", hs, row_threads);
    const dim3 grid(ceil_div(span.Tq, kTile), NH, B);
    const size_t smem = forward_smem_floats(hs, row_threads) * sizeof(float);
    // Per (b, h): a scaled q.k dot for each kept pair; per swept pair the online softmax (max,
    // subtract, exp, add) and a p * v row update. Bytes: q, k and v read once, out and lse written
    // once; each key tile is re-read by every query tile that sees it (from L2, not counted). With
    // document masking these are upper bounds: the pairs and tiles skipped depend on the data.
    const double heads = double(B) * NH, X = sizeof(floatX);
    const double q_elems = double(B) * span.Tq * C, k_elems = double(B) * span.Tk * C;
    const KernelCost cost{heads * (kept_pairs(span) * (2.0 * hs + 1) + swept_pairs(span) * (2.0 * hs + 4)),
                          (q_elems + 2.0 * k_elems) * X + q_elems * sizeof(Out) + heads * span.Tq * sizeof(float)};
    dispatch_kernel_shape(hs, row_threads, [&](auto hs_max, auto rows) {
        constexpr int kRowThreads = decltype(rows)::value;
        constexpr auto kernel = attention_forward_kernel<decltype(hs_max)::value, kRowThreads, Out>;
        allow_smem<kernel>(smem);
        launch<kernel>(cost, grid, dim3(block_threads<kRowThreads>), smem, stream, out, lse, q, kv, doc_start, span, C, NH);
    });
}

// Causal self-attention of B rows of T tokens: qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T).
inline void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                              cudaStream_t stream, const int* doc_start = nullptr, int row_threads = 0) {
    attention_forward<floatX>(out, lse, qkv, qkv + C, causal_span(T, C), B, C, NH, stream, doc_start, row_threads);
}

// D = rowsum(dout * out) per (b, h, t) into D (B, NH, T): the first step of both backward passes
// (SIMT and tensor-core). One fma per element; dout and out read, D written. staged: -1 for this
// build's form (through shared memory on a GPU, direct in the CPU emulator), else 1 or 0 (tests).
inline void attention_backward_rowdot(float* D, const floatX* dout, const floatX* out, int B, int T, int C, int NH,
                                      cudaStream_t stream, int staged = -1) {
    const double btc = double(B) * T * C, rows = double(B) * T * NH;
    const KernelCost cost{2.0 * btc, 2.0 * btc * sizeof(floatX) + rows * sizeof(float)};
    const size_t rows_total = size_t(B) * T * NH;
    if (staged == -1 ? !kernels_run_on_cpu() : staged != 0)
        launch<attention_backward_rowdot_kernel<true>>(cost, dim3(ceil_div(rows_total, kRowdotRows)), dim3(kRowdotRows),
                                                       rowdot_smem_bytes(C / NH), stream, D, dout, out, B, T, C, NH);
    else
        launch<attention_backward_rowdot_kernel<false>>(cost, dim3(ceil_div(rows_total, kRowdotDirectRows)),
                                                        dim3(kRowdotDirectRows), 0, stream, D, dout, out, B, T, C, NH);
}

// The gradients of attention_forward over `span`, given the forward pass's lse and D = rowsum(dout *
// out) of the span's queries (attention_backward_rowdot): dq (rows dq_stride apart) and dk, dv at dkv
// (dv = dk + C, rows dkv_stride apart), floatX or float (context parallelism's sums), written, or with
// `accumulate` added to what they hold. key_gradients_done, if given, is recorded on `stream` once dk
// and dv are complete, before dq's kernel: context parallelism sends them on while dq is computed.
// row_threads as in attention_forward.
template <typename Grad>
void attention_backward(Grad* dq, int dq_stride, Grad* dkv, int dkv_stride, const floatX* dout, const floatX* q,
                        const floatX* kv, const float* lse, const float* D, AttentionSpan span, int B, int C, int NH,
                        cudaStream_t stream, const int* doc_start = nullptr, bool accumulate = false,
                        cudaEvent_t key_gradients_done = nullptr, int row_threads = 0) {
    using namespace attention_detail;
    check_sizes("attention_backward", B, std::max(span.Tq, span.Tk), C, NH);
    require_supported("attention_backward", span_problem(span));
    span.key_lead = std::min(span.key_lead, span.Tk);
    const int hs = C / NH;
    row_threads = resolve_row_threads("attention_backward", hs, row_threads);
    const double heads = double(B) * NH, X = sizeof(floatX);
    const double q_elems = double(B) * span.Tq * C, k_elems = double(B) * span.Tk * C;
    const double row_floats = heads * span.Tq * sizeof(float);  // lse or D
    const size_t dkdv_smem = dkdv_smem_floats(hs, row_threads) * sizeof(float);
    const size_t dq_smem = dq_smem_floats(hs, row_threads) * sizeof(float);
    // Per kept pair both kernels recompute p (a q.k dot, scale, subtract, exp) and dS (a dout.v
    // dot, subtract, multiply); per swept pair dK/dV add two rows (dS q and p dout), dQ one (dS k).
    // Bytes: q, k, v, dout, lse and D read once, the gradients written once (and read once more when
    // accumulated); the kernels re-read the tiles of the other side once per tile (from L2, not counted).
    const double kept = kept_pairs(span), swept = swept_pairs(span), G = sizeof(Grad) * (accumulate ? 2.0 : 1.0);
    const KernelCost dkdv_cost{heads * (kept * (4.0 * hs + 5) + swept * 4.0 * hs),
                               (2.0 * q_elems + 2.0 * k_elems) * X + 2.0 * row_floats + 2.0 * k_elems * G};
    const KernelCost dq_cost{heads * (kept * (4.0 * hs + 5) + swept * 2.0 * hs),
                             (2.0 * q_elems + 2.0 * k_elems) * X + 2.0 * row_floats + q_elems * G};
    dispatch_kernel_shape(hs, row_threads, [&](auto hs_max, auto rows) {
        constexpr int kHsMax = decltype(hs_max)::value, kRowThreads = decltype(rows)::value;
        constexpr auto dkdv_kernel = attention_backward_dkdv_kernel<kHsMax, kRowThreads, Grad>;
        constexpr auto dq_kernel = attention_backward_dq_kernel<kHsMax, kRowThreads, Grad>;
        allow_smem<dkdv_kernel>(dkdv_smem);
        allow_smem<dq_kernel>(dq_smem);
        const dim3 block(block_threads<kRowThreads>);
        launch<dkdv_kernel>(dkdv_cost, dim3(ceil_div(span.Tk, kTile), NH, B), block, dkdv_smem, stream, dkv, dkv_stride, dout, q,
                            kv, lse, D, doc_start, span, C, NH, accumulate);
        if (key_gradients_done) CUDA_CHECK(cudaEventRecord(key_gradients_done, stream));
        launch<dq_kernel>(dq_cost, dim3(ceil_div(span.Tq, kTile), NH, B), block, dq_smem, stream, dq, dq_stride, dout, q, kv,
                          lse, D, doc_start, span, C, NH, accumulate);
    });
}

// Causal self-attention's backward: dqkv (B, T, 3C) from dout, with scratch for D (B, NH, T).
inline void attention_backward(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv,
                               const floatX* out, const float* lse, int B, int T, int C, int NH,
                               cudaStream_t stream, const int* doc_start = nullptr, int row_threads = 0) {
    attention_detail::check_sizes("attention_backward", B, T, C, NH);
    float* D = scratch;  // (B, NH, T)
    attention_backward_rowdot(D, dout, out, B, T, C, NH, stream);
    attention_backward(dqkv, 3 * C, dqkv + C, 3 * C, dout, qkv, qkv + C, lse, D, causal_span(T, C), B, C, NH, stream,
                       doc_start, false, nullptr, row_threads);
}

// (out, lse) of the span's queries merged with (part_out, part_lse) of the same queries over other keys;
// query-side pointers already at the span's first query (see attention_merge_kernel).
inline void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int B, int Tq, int q_seq,
                            int C, int NH, cudaStream_t stream) {
    attention_detail::check_sizes("attention_merge", B, Tq, C, NH);
    constexpr int kMergeBlock = 128;
    const double rows = double(B) * Tq * NH, elems = double(B) * Tq * C;
    // Per row 2 exps, a log and 2 more exps; per element 2 multiplies and an add. Bytes: both outputs
    // read, one written; both lse read, one written.
    launch<attention_merge_kernel>(KernelCost{5.0 * rows + 3.0 * elems, 3.0 * elems * sizeof(float) + 3.0 * rows * sizeof(float)},
                                   dim3(ceil_div(size_t(rows), kMergeBlock)), dim3(kMergeBlock), 0, stream, out, lse, part_out,
                                   part_lse, B, Tq, q_seq, C, NH);
}

// Compiled once in the CPU build (see COMPILED_ONCE in cuda_common.h): both outputs of each launcher.
#ifdef COMPILED_ONCE
COMPILED_ONCE void attention_forward<floatX>(floatX*, float*, const floatX*, const floatX*, AttentionSpan, int, int, int,
                                             cudaStream_t, const int*, int);
COMPILED_ONCE void attention_backward<floatX>(floatX*, int, floatX*, int, const floatX*, const floatX*, const floatX*,
                                              const float*, const float*, AttentionSpan, int, int, int, cudaStream_t,
                                              const int*, bool, cudaEvent_t, int);
#ifndef PRECISION_FP32  // else floatX is float: the lines above
COMPILED_ONCE void attention_forward<float>(float*, float*, const floatX*, const floatX*, AttentionSpan, int, int, int,
                                            cudaStream_t, const int*, int);
COMPILED_ONCE void attention_backward<float>(float*, int, float*, int, const floatX*, const floatX*, const floatX*,
                                             const float*, const float*, AttentionSpan, int, int, int, cudaStream_t,
                                             const int*, bool, cudaEvent_t, int);
#endif
#endif
