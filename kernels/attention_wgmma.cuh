// Causal attention forward on sm_90a warpgroup MMA (wgmma.mma_async, kernels/tensor_core.cuh), head
// size 64: FlashAttention-2's forward (Dao 2023, Algorithm 1) with FlashAttention-3's operand paths
// (Shah et al. 2024, "FlashAttention-3"): S = Q K^T with both operands in shared memory (the SS form,
// m64n128k16), O += P V with P from registers (the RS form, m64n64k16), so neither S nor P touches
// shared memory and no operand goes through ldmatrix. Same launcher contract, layouts and results as
// attention_tc_forward (kernels/attention_tc.cuh): out (floatX, or float for context parallelism's
// merges), lse (B, NH, Tq), over a span (AttentionSpan), with document masking.
//
// A block is two warpgroups (256 threads), 64 query rows each (128 a block, as the mma.sync kernel);
// a key tile is 128 keys. Q, K and V rows are 128 bytes at hs 64: each tile is stored in the 128-byte
// swizzle (row r's 16-byte chunk c at 128 r + 16 (c ^ r % 8)), which is at once the K-major layout of
// Q and K and the N-major layout of V for the descriptors, so V needs no transpose. K and V are
// double-buffered with cp.async, as in the mma.sync kernel (TMA is not emulated).
//
// The instructions are warpgroup-wide, so what they compute is decided per warpgroup: the key tiles
// none of its 64 rows sees are skipped, and P V skips the 16-key slices past its last row's last key
// (or before its first row's document). S is computed for the whole tile (m64n128), and masked per
// warp where the masks cut it.
//
// Not yet here (FlashAttention-3's other two parts): the ping-pong schedule of the two warpgroups'
// softmax against each other's products, and the intra-warpgroup overlap of one tile's softmax with
// the next tile's S. Each product waits for itself (wait_group 0); the warp schedulers overlap the
// two warpgroups only as they happen to.
//
// The GPU form needs sm_90a (nvcc -gencode arch=compute_90a,code=sm_90a); nothing in the trainer
// calls it yet (attention_wgmma_forward's tests and benchmark do), so the training binary's
// architectures are unchanged.
#pragma once

#include <string>

#include "attention_tc.cuh"
#include "tensor_core.cuh"

namespace attention_wgmma_detail {

using bf16 = __nv_bfloat16;

constexpr int kHS = 64;                           // head size: one 128-byte swizzle row per q, k or v row
constexpr int kRowBytes = 2 * kHS;
constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kGroupRows = 64;                    // the m of wgmma: a warpgroup's query rows
constexpr int kRows = kGroupRows * kWarpgroups;   // queries per block
constexpr int kKeys = 128;                        // keys per tile: S is m64n128 per warpgroup
constexpr int kSwizzleAtomBytes = 8 * kRowBytes;  // 8 rows of the 128-byte swizzle: the descriptors' SBO
constexpr size_t kQBytes = size_t(kRows) * kRowBytes, kKvTileBytes = size_t(kKeys) * kRowBytes;
// Q, two K and two V tiles, and room to start them at a multiple of 1024 bytes (the swizzle atoms).
constexpr size_t kSmemBytes = kQBytes + 4 * kKvTileBytes + 1024;

// kRowsToLoad rows of 64 bf16 from src (rows src_stride apart) from row0 into the 128-byte swizzle at
// dst (1024-byte aligned); rows at or beyond T are zero-filled. Joins this thread's cp.async group. A
// thread copies the same chunk of every 32nd row: one multiply at the start, an add per row.
template <int kRowsToLoad>
__device__ inline void load_swizzled_rows_async(unsigned char* dst, const bf16* src, size_t src_stride, int row0, int T) {
    constexpr int kChunks = kRowBytes / 16, kRowStep = kThreads / kChunks;
    const int first = int(threadIdx.x) / kChunks, c = int(threadIdx.x) % kChunks;
    size_t offset = size_t(row0 + first) * src_stride + size_t(8 * c);  // a pointer only for rows below T
    const size_t step = size_t(kRowStep) * src_stride;
    for (int r = first; r < kRowsToLoad; r += kRowStep, offset += step) {
        const bool valid = row0 + r < T;
        cp_async_16_or_zero(dst + r * kRowBytes + 16 * (c ^ (r % 8)), src + (valid ? offset : size_t(8 * c)), valid);
    }
}

// Descriptors of a swizzled tile: the 16-deep k slice `slice` of rows that are K-major operands (Q as
// A, K as B: k along the row, 32 bytes a slice), or of V as the N-major B of P V (k = the tile's keys,
// 16 rows a slice; N = 64 is one 128-byte atom wide, so LBO, the step to the next 64 of N, is unused).
__device__ inline uint64_t k_major_slice(const unsigned char* tile, int slice) {
    return wgmma_descriptor(tile + 32 * slice, SmemSwizzle::bytes128, 16, kSwizzleAtomBytes);
}
__device__ inline uint64_t n_major_slice(const unsigned char* tile, int slice) {
    return wgmma_descriptor(tile + 16 * slice * kRowBytes, SmemSwizzle::bytes128, 16, kSwizzleAtomBytes);
}

// The (query, key) pairs of S and of P V per (b, h) over a span, as the warpgroups compute them: every
// tile up to the one holding the warpgroup's last row's last key, S whole, P V up to that key in
// 16-key slices (warpgroups past Tq too; with documents, upper bounds).
struct ForwardPairs {
    double s = 0, pv = 0;
};
inline ForwardPairs forward_pairs(const AttentionSpan& span) {
    ForwardPairs pairs;
    for (int q0 = 0; q0 < span.Tq; q0 += kRows) {
        const int key_tiles = attention_detail::span_key_tiles(q0, span, kRows, kKeys);
        for (int r0 = q0; r0 < q0 + kRows; r0 += kGroupRows) {
            const int last_key = std::min(r0 + kGroupRows - 1 + span.key_lead, span.Tk - 1);
            for (int kt = 0; kt < key_tiles && kt * kKeys <= last_key; ++kt) {
                pairs.s += double(kGroupRows) * kKeys;
                pairs.pv += double(kGroupRows) * live_end_through(last_key, kt * kKeys, kKeys);
            }
        }
    }
    return pairs;
}

}  // namespace attention_wgmma_detail

// ---------------------------------------------------------------------------------------------
// Grid (query blocks, NH, B). Per key tile: S = q k^T / sqrt(hs) (masked where key > query + key_lead,
// or before the query's document), m' = max(m, rowmax S), P = exp(S - m'), l' = l exp(m - m') +
// rowsum P, O' = O exp(m - m') + P V; at the end O / l and lse = m + log l. A row that sees no key
// of the span gets out 0, lse -inf.

template <typename Out>
static __global__ void __launch_bounds__(attention_wgmma_detail::kThreads, 1)
    attention_wgmma_forward_kernel(Out* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* kv,
                                   const int* doc_start, AttentionSpan span, int C, int NH) {
    using namespace attention_wgmma_detail;
    constexpr int HS = kHS;
    const int Tq = span.Tq, Tk = span.Tk, lead = span.key_lead;
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kRows;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    // The warp and warpgroup taken from lane 0, so that ptxas sees them (and all that derives from them)
    // as uniform: wgmmas under a branch it thinks divergent are serialized (C7520).
    const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), lane = int(threadIdx.x) % 32, group = warp / 4;

    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char* q_tile = smem_raw + (1024 - shared_address(smem_raw) % 1024) % 1024;  // [kRows rows]
    unsigned char* k_tiles = q_tile + kQBytes;                                             // [2][kKeys rows]
    unsigned char* v_tiles = k_tiles + 2 * kKvTileBytes;                                   // [2][kKeys rows]

    const size_t q_stride = 3 * size_t(C), kv_stride = size_t(span.kv_stride);
    const bf16* q_src = q + size_t(b) * span.q_seq * q_stride + h * HS;
    const bf16* k_src = kv + size_t(b) * span.kv_seq * kv_stride + h * HS;
    const bf16* v_src = k_src + C;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    const int first_tile = attention_detail::first_key_tile(doc_row, q0, kKeys);
    const int key_tiles = attention_detail::span_key_tiles(q0, span, kRows, kKeys);  // up to the block's last query's
    load_swizzled_rows_async<kRows>(q_tile, q_src, q_stride, q0, Tq);
    load_swizzled_rows_async<kKeys>(k_tiles + (first_tile % 2) * kKvTileBytes, k_src, kv_stride, first_tile * kKeys, Tk);
    load_swizzled_rows_async<kKeys>(v_tiles + (first_tile % 2) * kKvTileBytes, v_src, kv_stride, first_tile * kKeys, Tk);
    cp_async_commit();

    // Base 2 with the scale folded into the exponent, as attention_tc_forward_kernel.
    const float scale_log2 = attention_tc_detail::kLog2e / sqrtf(float(HS));
    // The warpgroup's rows from group_row0; the warp's 16 from warp_row0; this lane's row0 and row0 + 8
    // (the accumulator layout: s[4 j + i] is row row0 + 8 (i / 2), key 8 j + 2 (lane % 4) + i % 2).
    const int group_row0 = q0 + group * kGroupRows, warp_row0 = group_row0 + 16 * (warp % 4);
    const int row0 = warp_row0 + lane / 4;
    const int first_key[2] = {attention_detail::first_visible_key(doc_row, row0, Tq),
                              attention_detail::first_visible_key(doc_row, row0 + 8, Tq)};
    // Per warp, as the mma.sync kernel: whether a tile needs the per-score tests.
    const int warp_first_key = int(warp_max(float(max(first_key[0], first_key[1]))));        // exact: keys < 2^24
    const int warp_first_last_key = min(warp_row0 + lead, Tk - 1);
    // Per warpgroup (the instructions' unit): the tiles and P V slices its rows see. Document starts
    // never decrease along a row, so its first row (if below Tq) has the smallest first key.
    const int group_min_first_key = __shfl_sync(0xffffffffu, attention_detail::first_visible_key(doc_row, group_row0, Tq), 0);
    const int group_last_last_key = min(group_row0 + kGroupRows - 1 + lead, Tk - 1);
    float o[HS / 2] = {};  // m64n64 accumulators: o[4 j + i], columns 8 j.. of the lane's rows
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's share of the row sums
    for (int kt = first_tile; kt < key_tiles; ++kt) {
        if (kt + 1 < key_tiles) {  // prefetch the next tile into the other buffers
            const int next = (kt + 1) % 2;
            load_swizzled_rows_async<kKeys>(k_tiles + next * kKvTileBytes, k_src, kv_stride, (kt + 1) * kKeys, Tk);
            load_swizzled_rows_async<kKeys>(v_tiles + next * kKvTileBytes, v_src, kv_stride, (kt + 1) * kKeys, Tk);
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of tile kt are done
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async_shared();  // the copies (generic proxy) before the wgmmas (async proxy) read them
        __syncthreads();            // everyone's are
        const unsigned char* k_tile = k_tiles + (kt % 2) * kKvTileBytes;
        const unsigned char* v_tile = v_tiles + (kt % 2) * kKvTileBytes;
        // Warpgroup-uniform; the barriers stay outside the branch.
        if (kt * kKeys <= group_last_last_key && kt * kKeys + kKeys - 1 >= group_min_first_key) {
            float s[kKeys / 2];
            wgmma_fence();
            FULL_UNROLL
            for (int slice = 0; slice < HS / 16; ++slice)
                wgmma_m64k16_ss<kKeys, false, false>(s, k_major_slice(q_tile + group * kGroupRows * kRowBytes, slice),
                                                     k_major_slice(k_tile, slice), slice > 0);
            wgmma_commit_group();
            wgmma_wait_group<0>();
            wgmma_fence_operands(s);
            float tile_max[2] = {-INFINITY, -INFINITY};
            if (kt * kKeys + kKeys - 1 > warp_first_last_key || kt * kKeys < warp_first_key) {  // warp-uniform
                FULL_UNROLL
                for (int v = 0; v < kKeys / 2; ++v) {
                    const int r = (v % 4) / 2, key = kt * kKeys + 8 * (v / 4) + 2 * (lane % 4) + v % 2;
                    const bool visible = first_key[r] <= key && key - lead <= row0 + 8 * r && key < Tk;
                    if (!visible) s[v] = -INFINITY;
                    tile_max[r] = fmaxf(tile_max[r], s[v]);
                }
            } else {
                FULL_UNROLL
                for (int v = 0; v < kKeys / 2; ++v) tile_max[(v % 4) / 2] = fmaxf(tile_max[(v % 4) / 2], s[v]);
            }
            // As attention_tc_forward_kernel: a fully masked tile after the row's first visible key gives
            // correction 1 and P = 0; before it m stays -inf, and exponents relative to 0 keep P = 0.
            float correction[2], m_ref_scaled[2];
            FULL_UNROLL
            for (int r = 0; r < 2; ++r) {
                const float m_new = fmaxf(m[r], attention_detail::row_max(tile_max[r]));
                const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
                m_ref_scaled[r] = m_ref * scale_log2;
                correction[r] = exp2_ftz((m[r] - m_ref) * scale_log2);
                m[r] = m_new;
                l[r] *= correction[r];
            }
            FULL_UNROLL
            for (int v = 0; v < kKeys / 2; ++v) {
                s[v] = exp2_ftz(fmaf(s[v], scale_log2, -m_ref_scaled[(v % 4) / 2]));
                l[(v % 4) / 2] += s[v];
            }
            FULL_UNROLL
            for (int v = 0; v < HS / 2; ++v) o[v] *= correction[(v % 4) / 2];
            // P's 16-key slice k is, register for register, the A fragment of accumulator tiles 2k and
            // 2k + 1 (as mma_p_b's); the slices outside the warpgroup's live keys hold P = 0 and are skipped.
            uint32_t p[kKeys / 16][4];
            FULL_UNROLL
            for (int k = 0; k < kKeys / 16; ++k)
                FULL_UNROLL
                for (int i = 0; i < 4; ++i) p[k][i] = pack_bf16x2(s[8 * k + 2 * i], s[8 * k + 2 * i + 1]);
            const int live_begin = live_begin_from(group_min_first_key, kt * kKeys, kKeys);
            const int live_end = live_end_through(group_last_last_key, kt * kKeys, kKeys);
            FULL_UNROLL
            for (int k = 0; k < kKeys / 16; ++k) wgmma_fence_operands(p[k]);  // P and the rescaled O before the fence
            wgmma_fence_operands(o);
            if (live_begin == 0 && live_end == kKeys) {  // a whole tile: no branch between the wgmmas
                wgmma_fence();  // in the branch: ptxas wants it in the wgmmas' block
                FULL_UNROLL
                for (int k = 0; k < kKeys / 16; ++k) wgmma_m64k16_rs<HS, true>(o, p[k], n_major_slice(v_tile, k), true);
            } else {  // a tile a mask cuts (ptxas fences each wgmma here: C7519)
                wgmma_fence();
                FULL_UNROLL
                for (int k = 0; k < kKeys / 16; ++k)
                    if (16 * k >= live_begin && 16 * k < live_end) wgmma_m64k16_rs<HS, true>(o, p[k], n_major_slice(v_tile, k), true);
            }
            wgmma_commit_group();
            wgmma_wait_group<0>();
            wgmma_fence_operands(o);
        }
        __syncthreads();  // tile kt's buffers are refilled by the next iteration's prefetch
    }
    if (first_tile >= key_tiles) {  // no tile: nothing ordered the q rows' loads before the staging below
        cp_async_wait<0>();
        __syncthreads();
    }

    float inv_l[2];
    FULL_UNROLL
    for (int r = 0; r < 2; ++r) {
        l[r] = attention_detail::row_sum(l[r]);
        inv_l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        const int row = row0 + 8 * r;
        if (lane % 4 == 0 && row < Tq)
            lse[(size_t(b) * NH + h) * span.q_seq + row] =
                l[r] > 0.0f ? fmaf(m[r], scale_log2, log2f(l[r])) * attention_tc_detail::kLn2 : -INFINITY;
    }
    // The output is staged through the K buffers, which no one reads any more, 16 padded rows a warp.
    float o_tiles[HS / 8][4];
    FULL_UNROLL
    for (int v = 0; v < HS / 2; ++v) o_tiles[v / 4][v % 4] = o[v];
    bf16* staging = reinterpret_cast<bf16*>(k_tiles) + warp * attention_tc_detail::kWarpRows * attention_tc_detail::kLd<HS>;
    attention_tc_detail::store_warp_rows<HS>(out + size_t(b) * span.q_seq * C + h * HS, size_t(C), staging, o_tiles, inv_l,
                                             warp_row0, Tq);
}

static_assert(8 * attention_tc_detail::kWarpRows * attention_tc_detail::kLd<64> * sizeof(__nv_bfloat16) <=
                  2 * attention_wgmma_detail::kKvTileBytes,
              "the output's staging fits in the K buffers");

// ---------------------------------------------------------------------------------------------
// Launchers

// What attention_wgmma_forward cannot do with these shapes ("" when it can): the BF16 build, head size
// 64, and what attention_tc_forward needs.
inline std::string attention_wgmma_requirements(int B, int T, int C, int NH) {
    const std::string tc = attention_tc_requirements(B, T, C, NH);
    if (!tc.empty()) return tc;
    if (C / NH != attention_wgmma_detail::kHS)
        return "the wgmma attention takes head size " + std::to_string(attention_wgmma_detail::kHS) + ", not " +
               std::to_string(C / NH);
    return "";
}

// attention_tc_forward's span form on wgmma (sm_90a; see the top of the file).
template <typename Out>
inline void attention_wgmma_forward(Out* out, float* lse, const floatX* q, const floatX* kv, AttentionSpan span, int B, int C,
                                    int NH, cudaStream_t stream, const int* doc_start = nullptr) {
    using namespace attention_wgmma_detail;
    require_supported("attention_wgmma_forward", attention_wgmma_requirements(B, std::max(span.Tq, span.Tk), C, NH));
    require_supported("attention_wgmma_forward", attention_detail::span_problem(span));
    span.key_lead = std::min(span.key_lead, span.Tk);
    if constexpr (std::is_same_v<floatX, bf16>) {
        constexpr auto kernel = attention_wgmma_forward_kernel<Out>;
        attention_detail::allow_smem<kernel>(kSmemBytes);
        const ForwardPairs pairs = forward_pairs(span);
        const double BNH = double(B) * NH, bf = sizeof(bf16);
        const double q_elems = double(B) * span.Tq * C, k_elems = double(B) * span.Tk * C;
        const KernelCost cost{BNH * (pairs.s + pairs.pv) * 2.0 * kHS,
                              (q_elems + 2 * k_elems) * bf + q_elems * sizeof(Out) + BNH * span.Tq * sizeof(float),
                              WorkKind::tensor_cores};
        launch<kernel>(cost, dim3(ceil_div(span.Tq, kRows), NH, B), dim3(kThreads), kSmemBytes, stream, out, lse, q, kv,
                       doc_start, span, C, NH);
    }
}

// Causal self-attention of B rows of T tokens, as attention_tc_forward's: qkv (B, T, 3C) -> out (B, T,
// C), lse (B, NH, T); doc_start as there.
inline void attention_wgmma_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                    cudaStream_t stream, const int* doc_start = nullptr) {
    attention_wgmma_forward<floatX>(out, lse, qkv, qkv + C, causal_span(T, C), B, C, NH, stream, doc_start);
}
