// Causal multi-head self-attention on tensor cores: FlashAttention-2 (Dao 2023, "FlashAttention-2",
// Algorithms 1 and 2) on mma.sync m16n8k16 with bf16 operands and FP32 accumulation
// (kernels/tensor_core.cuh). Same launcher arguments, layouts and results as the SIMT kernels of
// attention.cuh: qkv (B, T, 3C), out (B, T, C), lse (B, NH, T) float, dqkv written (not
// accumulated), backward scratch D = rowsum(dO * O) of (B, NH, T) floats, computed by
// attention.cuh's rowdot kernel.
//
// A block is 4 warps; each warp owns 16-row fragments (queries in the forward and dQ kernels, keys
// in the dK/dV kernel): two in the forward up to head size 64 (128-query blocks, as FlashAttention-2),
// one otherwise. It keeps their score tiles, softmax state and output accumulators in registers,
// in the mma accumulator layout. The accumulator of a 16 x 16k score tile is, register for
// register, the A operand of the next product (P V, dS K, ...), so P and dS never touch shared
// memory. The streamed operand (K and V tiles, or Q and dO tiles for dK/dV) is double-buffered in
// shared memory with cp.async; ldmatrix feeds every B operand (.trans where the product needs the
// tile's rows as its k dimension). Key tiles after a query tile's last query are never loaded.
// No atomics: dK/dV iterate over query tiles per key block, dQ over key tiles per query block.
//
// Document masking (doc_start non-null; attention.cuh's rules and helpers): query t sees key k only
// when doc_start[t] <= k <= t. The forward and dQ kernels start at the key tile of their block's
// first document start, the dK/dV kernel stops before the first query whose document starts after
// its block's last key; what is left is masked elementwise (each query row by its first visible key,
// each key row by its end of visible queries).
//
// __launch_bounds__(128, 2): without the minimum-blocks hint ptxas spilled the hs-128 forward
// kernel on sm_80 at 168 registers; with it the kernels use 93-248 registers and never spill.
//
// Only the BF16 build runs these kernels (floatX = bf16); attention_tc_requirements says so
// otherwise. Head sizes 16, 32, 64 and 128 (compile-time, so fragment arrays stay in registers).
#pragma once

#include <string>
#include <type_traits>

#include "attention.cuh"
#include "tensor_core.cuh"

namespace attention_tc_detail {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;                  // the m of m16n8k16: rows a warp owns
constexpr int kBlockRows = kWarps * kWarpRows; // queries per block (forward, dQ), keys per block (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;  // softmax in base 2: exp(x) = exp2(x log2 e)
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory rows hold hs bf16 and 8 more, so the 8 rows an ldmatrix reads start on
// different 16-byte bank groups.
template <int HS> constexpr int kLd = HS + 8;
// Rows per streamed tile: 64, or 32 for hs 128, where two 64-wide fragments (scores, dP) next to
// the hs-wide accumulators would exceed the register budget.
template <int HS> constexpr int kForwardKeys = 64;
// The forward kernel's 16-row fragments per warp: two up to hs 64 (FlashAttention-2's 128-query
// blocks: every K and V fragment a warp loads with ldmatrix feeds two MMAs, which halves the
// shared-memory reads per query and the K/V tiles loaded per query), one at hs 128, where the second
// fragment's accumulators would not fit the register budget.
template <int HS> constexpr int kForwardFrags = HS <= 64 ? 2 : 1;
template <int HS> constexpr int kForwardRows = kWarps * kWarpRows * kForwardFrags<HS>;  // queries per block
template <int HS> constexpr int kDqKeys = HS >= 128 ? 32 : 64;
template <int HS> constexpr int kDkdvQueries = HS >= 128 ? 32 : 64;

template <int HS> constexpr size_t forward_smem_bytes() {
    return size_t(kForwardRows<HS> + 4 * kForwardKeys<HS>) * kLd<HS> * sizeof(bf16);
}
template <int HS> constexpr size_t dq_smem_bytes() {
    return size_t(2 * kBlockRows + 4 * kDqKeys<HS>) * kLd<HS> * sizeof(bf16);
}
template <int HS> constexpr size_t dkdv_smem_bytes() {
    return size_t(2 * kBlockRows + 4 * kDkdvQueries<HS>) * kLd<HS> * sizeof(bf16) + 4 * kDkdvQueries<HS> * sizeof(float);
}

// Rows [row0, row0 + kRows) of one head (HS values at src + t * src_stride for position t) into
// shared memory (rows of kLd<HS>) by cp.async, 16 bytes each; rows at or beyond T become zeros,
// so masked scores never meet a NaN. Joins the calling thread's current cp.async group.
// A thread copies the same 16-byte column of every kRowStep-th row, so its source offset is one
// multiply at the start and an add per row (not a 64-bit multiply per chunk).
template <int HS, int kRows>
__device__ inline void load_rows_async(bf16* dst, const bf16* src, size_t src_stride, int row0, int T) {
    constexpr int kChunks = HS / 8;
    static_assert(kThreads % kChunks == 0, "a thread keeps one column");
    constexpr int kRowStep = kThreads / kChunks;
    const int first = int(threadIdx.x) / kChunks, c = (int(threadIdx.x) % kChunks) * 8;
    size_t offset = size_t(row0 + first) * src_stride + c;  // formed into a pointer only for rows below T
    const size_t step = size_t(kRowStep) * src_stride;
    for (int r = first; r < kRows; r += kRowStep, offset += step) {
        const bool valid = row0 + r < T;
        cp_async_16_or_zero(dst + r * kLd<HS> + c, src + (valid ? offset : size_t(c)), valid);
    }
}

// acc (16 x N) += A B^T, both operands row-major in shared memory with K columns: A is the warp's
// 16 rows at a, B is N rows at b. (S = Q K^T, dP = dO V^T, and their transposes.)
template <int N, int K>
__device__ inline void mma_a_bt(float (&acc)[N / 8][4], const bf16* a, const bf16* b, int ld) {
    const int lane = int(threadIdx.x) % 32;
    TC_UNROLL
    for (int k0 = 0; k0 < K; k0 += 16) {
        // Matrices: rows 0-7 / 8-15 of columns k0.. , then of columns k0+8.. (the A fragment order).
        uint32_t af[4];
        ldmatrix_x4(af, a + (lane % 16) * ld + k0 + (lane / 16) * 8);
        TC_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            // Matrices: rows 8n.. columns k0.. and k0+8.., then rows 8n+8.. (B fragments of n, n+1).
            uint32_t bf[4];
            ldmatrix_x4(bf, b + (8 * n + lane % 8 + (lane / 16) * 8) * ld + k0 + (lane / 8 % 2) * 8);
            mma_m16n8k16_bf16(acc[n], af, bf, acc[n]);
            mma_m16n8k16_bf16(acc[n + 1], af, bf + 2, acc[n + 1]);
        }
    }
}

// acc (16 x N) += P B: P (16 x K) is an accumulator-layout fragment (p[j] holds columns 8j..8j+7),
// rounded to bf16; B is K rows of N columns in shared memory at b, read transposed by ldmatrix.
// (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.)
template <int N, int K>
__device__ inline void mma_p_b(float (&acc)[N / 8][4], const float (&p)[K / 8][4], const bf16* b, int ld) {
    const int lane = int(threadIdx.x) % 32;
    TC_UNROLL
    for (int k = 0; k < K / 16; ++k) {
        // Accumulator tiles 2k and 2k+1 are, register for register, the A fragment of columns
        // 16k..16k+15 (PTX ISA m16n8k16 figures: c0,c1 / c2,c3 = rows g / g+8, as a0,a1 / a2,a3).
        const uint32_t af[4] = {pack_bf16x2(p[2 * k][0], p[2 * k][1]), pack_bf16x2(p[2 * k][2], p[2 * k][3]),
                                pack_bf16x2(p[2 * k + 1][0], p[2 * k + 1][1]),
                                pack_bf16x2(p[2 * k + 1][2], p[2 * k + 1][3])};
        TC_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            // Matrices: rows 16k.. / 16k+8.. of columns 8n.., then of columns 8n+8.. (transposed).
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (16 * k + lane % 16) * ld + 8 * n + (lane / 16) * 8);
            mma_m16n8k16_bf16(acc[n], af, bf, acc[n]);
            mma_m16n8k16_bf16(acc[n + 1], af, bf + 2, acc[n + 1]);
        }
    }
}

// mma_a_bt for F row fragments at once: fragment f's 16 rows at a + 16 f ld, acc[f] += A_f B^T. Each
// B fragment is loaded once for all F (FlashAttention-2's reuse across a warp's rows).
template <int F, int N, int K>
__device__ inline void mma_a_bt_rows(float (&acc)[F][N / 8][4], const bf16* a, const bf16* b, int ld) {
    const int lane = int(threadIdx.x) % 32;
    TC_UNROLL
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[F][4];
        TC_UNROLL
        for (int f = 0; f < F; ++f) ldmatrix_x4(af[f], a + (16 * f + lane % 16) * ld + k0 + (lane / 16) * 8);
        TC_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            uint32_t bf[4];
            ldmatrix_x4(bf, b + (8 * n + lane % 8 + (lane / 16) * 8) * ld + k0 + (lane / 8 % 2) * 8);
            TC_UNROLL
            for (int f = 0; f < F; ++f) {
                mma_m16n8k16_bf16(acc[f][n], af[f], bf, acc[f][n]);
                mma_m16n8k16_bf16(acc[f][n + 1], af[f], bf + 2, acc[f][n + 1]);
            }
        }
    }
}

// mma_p_b for F row fragments at once: acc[f] += P_f B, each B fragment loaded once for all F.
template <int F, int N, int K>
__device__ inline void mma_p_b_rows(float (&acc)[F][N / 8][4], const float (&p)[F][K / 8][4], const bf16* b, int ld) {
    const int lane = int(threadIdx.x) % 32;
    TC_UNROLL
    for (int k = 0; k < K / 16; ++k) {
        uint32_t af[F][4];
        TC_UNROLL
        for (int f = 0; f < F; ++f) {
            af[f][0] = pack_bf16x2(p[f][2 * k][0], p[f][2 * k][1]);
            af[f][1] = pack_bf16x2(p[f][2 * k][2], p[f][2 * k][3]);
            af[f][2] = pack_bf16x2(p[f][2 * k + 1][0], p[f][2 * k + 1][1]);
            af[f][3] = pack_bf16x2(p[f][2 * k + 1][2], p[f][2 * k + 1][3]);
        }
        TC_UNROLL
        for (int n = 0; n < N / 8; n += 2) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, b + (16 * k + lane % 16) * ld + 8 * n + (lane / 16) * 8);
            TC_UNROLL
            for (int f = 0; f < F; ++f) {
                mma_m16n8k16_bf16(acc[f][n], af[f], bf, acc[f][n]);
                mma_m16n8k16_bf16(acc[f][n + 1], af[f], bf + 2, acc[f][n + 1]);
            }
        }
    }
}

// scale * acc (the warp's 16 x HS accumulator) as bf16 into its 16 shared-memory rows at rows, then
// those of the 16 rows that lie below T to dst (row r at dst + (row0 + r) * dst_stride), 16 bytes
// at a time. Only this warp may use the rows.
template <int HS>
__device__ inline void store_warp_rows(bf16* dst, size_t dst_stride, bf16* rows, const float (&acc)[HS / 8][4],
                                       const float (&scale)[2], int row0, int T) {
    const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    TC_UNROLL
    for (int n = 0; n < HS / 8; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(rows + g * kLd<HS> + 8 * n + 2 * t) =
            __floats2bfloat162_rn(acc[n][0] * scale[0], acc[n][1] * scale[0]);
        *reinterpret_cast<__nv_bfloat162*>(rows + (g + 8) * kLd<HS> + 8 * n + 2 * t) =
            __floats2bfloat162_rn(acc[n][2] * scale[1], acc[n][3] * scale[1]);
    }
    __syncwarp();
    constexpr int kChunks = HS / 8;
    for (int i = lane; i < kWarpRows * kChunks; i += 32) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        if (row0 + r < T) store128(dst + size_t(row0 + r) * dst_stride + c, load128(rows + r * kLd<HS> + c));
    }
}

}  // namespace attention_tc_detail

// ---------------------------------------------------------------------------------------------
// Forward: grid (query blocks, NH, B). Per key tile: S = q k^T / sqrt(hs) (masked where key >
// query), m' = max(m, rowmax S), P = exp(S - m'), l' = l exp(m - m') + rowsum P,
// O' = O exp(m - m') + P V; at the end O / l and lse = m + log l (FlashAttention-2, Algorithm 1).

template <int HS>
static __global__ void __launch_bounds__(attention_tc_detail::kThreads, 2)
    attention_tc_forward_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, const int* doc_start, int T,
                                int C, int NH) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kKeys = kForwardKeys<HS>, F = kForwardFrags<HS>, kRows = kForwardRows<HS>;
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kRows;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

    DYNAMIC_SHARED(bf16, smem);
    bf16* q_tile = smem;                        // [kRows][ld]; at the end each warp's output
    bf16* k_tiles = q_tile + kRows * ld;        // [2][kKeys][ld]
    bf16* v_tiles = k_tiles + 2 * kKeys * ld;   // [2][kKeys][ld]

    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * T : nullptr;
    const int first_tile = attention_detail::first_key_tile(doc_row, q0, kKeys);
    const int key_tiles = (min(q0 + kRows, T) + kKeys - 1) / kKeys;  // up to the block's last query
    load_rows_async<HS, kRows>(q_tile, q_src, stride, q0, T);
    load_rows_async<HS, kKeys>(k_tiles + (first_tile % 2) * kKeys * ld, k_src, stride, first_tile * kKeys, T);
    load_rows_async<HS, kKeys>(v_tiles + (first_tile % 2) * kKeys * ld, v_src, stride, first_tile * kKeys, T);
    cp_async_commit();

    // The softmax runs in base 2 with the scale folded into the exponent (FlashAttention-2): maxima
    // are taken over the raw scores, and p = 2^(s scale_log2 - m scale_log2) is one FFMA and one
    // ex2.approx.ftz per score.
    const float scale_log2 = kLog2e / sqrtf(float(HS));
    // The warp owns F fragments of 16 rows, from warp_row0; this lane's rows in fragment f are
    // row0[f] and row0[f] + 8.
    const int warp_row0 = q0 + warp * F * kWarpRows;
    int row0[F], first_key[F][2];
    TC_UNROLL
    for (int f = 0; f < F; ++f) {
        row0[f] = warp_row0 + f * kWarpRows + lane / 4;
        first_key[f][0] = attention_detail::first_visible_key(doc_row, row0[f], T);
        first_key[f][1] = attention_detail::first_visible_key(doc_row, row0[f] + 8, T);
    }
    // Only tiles the masks cut need the per-score tests (FlashAttention-2 masks only the diagonal
    // block): a tile is visible in full to the warp's rows when its last key is at or before the
    // warp's first row and its first key at or after every row's first visible key.
    // A tile that none of the warp's rows sees (past its last row, or before every row's document)
    // is skipped by the warp: with 128-row blocks the block's key tiles reach past the first warps'
    // rows, and a block can span documents.
    int lane_first_key = 0, lane_min_first_key = T;
    TC_UNROLL
    for (int f = 0; f < F; ++f) {
        lane_first_key = max(lane_first_key, max(first_key[f][0], first_key[f][1]));
        lane_min_first_key = min(lane_min_first_key, min(first_key[f][0], first_key[f][1]));
    }
    const int warp_first_key = int(warp_max(float(lane_first_key)));             // exact: keys < 2^24
    const int warp_min_first_key = int(-warp_max(-float(lane_min_first_key)));  // the minimum
    const int warp_last_row = warp_row0 + F * kWarpRows - 1;
    float o[F][HS / 8][4] = {};
    float m[F][2], l[F][2];  // l: this lane's share of the row sums
    TC_UNROLL
    for (int f = 0; f < F; ++f) m[f][0] = m[f][1] = -INFINITY, l[f][0] = l[f][1] = 0.0f;
    for (int kt = first_tile; kt < key_tiles; ++kt) {
        if (kt + 1 < key_tiles) {  // prefetch the next tile into the other buffer
            const int next = (kt + 1) % 2;
            load_rows_async<HS, kKeys>(k_tiles + next * kKeys * ld, k_src, stride, (kt + 1) * kKeys, T);
            load_rows_async<HS, kKeys>(v_tiles + next * kKeys * ld, v_src, stride, (kt + 1) * kKeys, T);
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of tile kt are done
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // everyone's are
        const bf16* k_tile = k_tiles + (kt % 2) * kKeys * ld;
        const bf16* v_tile = v_tiles + (kt % 2) * kKeys * ld;
        // Warp-uniform; the one barrier below stays outside the branch.
        if (kt * kKeys <= warp_last_row && kt * kKeys + kKeys - 1 >= warp_min_first_key) {
            float s[F][kKeys / 8][4] = {};
            mma_a_bt_rows<F, kKeys, HS>(s, q_tile + warp * F * kWarpRows * ld, k_tile, ld);
            float tile_max[F][2];
            TC_UNROLL
            for (int f = 0; f < F; ++f) tile_max[f][0] = tile_max[f][1] = -INFINITY;
            if (kt * kKeys + kKeys - 1 > warp_row0 || kt * kKeys < warp_first_key) {  // warp-uniform
                TC_UNROLL
                for (int f = 0; f < F; ++f) {
                    TC_UNROLL
                    for (int n = 0; n < kKeys / 8; ++n) {
                        TC_UNROLL
                        for (int i = 0; i < 4; ++i) {
                            const int key = kt * kKeys + 8 * n + 2 * (lane % 4) + (i & 1);
                            if (!(first_key[f][i / 2] <= key && key <= row0[f] + 8 * (i / 2))) s[f][n][i] = -INFINITY;
                            tile_max[f][i / 2] = fmaxf(tile_max[f][i / 2], s[f][n][i]);
                        }
                    }
                }
            } else {
                TC_UNROLL
                for (int f = 0; f < F; ++f) {
                    TC_UNROLL
                    for (int n = 0; n < kKeys / 8; ++n) {
                        TC_UNROLL
                        for (int i = 0; i < 4; ++i) tile_max[f][i / 2] = fmaxf(tile_max[f][i / 2], s[f][n][i]);
                    }
                }
            }
            // A row's fully masked tile after its first visible key gives correction 1 and P = 0. Before
            // it (a document that starts later in the block) m stays -inf: exponents relative to 0 then
            // keep P = 0 and o = l = 0 (exp2(-inf - -inf) would be NaN).
            TC_UNROLL
            for (int f = 0; f < F; ++f) {
                float correction[2], m_ref_scaled[2];
                TC_UNROLL
                for (int r = 0; r < 2; ++r) {
                    const float m_new = fmaxf(m[f][r], attention_detail::row_max(tile_max[f][r]));
                    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
                    m_ref_scaled[r] = m_ref * scale_log2;
                    correction[r] = exp2_ftz((m[f][r] - m_ref) * scale_log2);  // 0 on the row's first tile (m = -inf)
                    m[f][r] = m_new;
                    l[f][r] *= correction[r];
                }
                TC_UNROLL
                for (int n = 0; n < kKeys / 8; ++n) {
                    TC_UNROLL
                    for (int i = 0; i < 4; ++i) {
                        s[f][n][i] = exp2_ftz(fmaf(s[f][n][i], scale_log2, -m_ref_scaled[i / 2]));
                        l[f][i / 2] += s[f][n][i];
                    }
                }
                TC_UNROLL
                for (int n = 0; n < HS / 8; ++n) {
                    TC_UNROLL
                    for (int i = 0; i < 4; ++i) o[f][n][i] *= correction[i / 2];
                }
            }
            mma_p_b_rows<F, HS, kKeys>(o, s, v_tile, ld);
        }
        __syncthreads();  // tile kt's buffers are refilled by the next iteration's prefetch
    }

    TC_UNROLL
    for (int f = 0; f < F; ++f) {
        float inv_l[2];
        TC_UNROLL
        for (int r = 0; r < 2; ++r) {
            l[f][r] = attention_detail::row_sum(l[f][r]);
            inv_l[r] = 1.0f / l[f][r];
            const int row = row0[f] + 8 * r;
            if (lane % 4 == 0 && row < T)
                lse[(size_t(b) * NH + h) * T + row] = fmaf(m[f][r], scale_log2, log2f(l[f][r])) * kLn2;
        }
        // The warp's own q rows (only it read them) stage the output.
        store_warp_rows<HS>(out + size_t(b) * T * C + h * HS, size_t(C), q_tile + (warp * F + f) * kWarpRows * ld, o[f],
                            inv_l, warp_row0 + f * kWarpRows, T);
    }
}

// ---------------------------------------------------------------------------------------------
// Backward (FlashAttention-2, Algorithm 2, as two atomic-free kernels): with P = exp(S - lse),
// dV = P^T dO, dP = dO V^T, dS = P * (dP - D) where D = rowsum(dO * O), dQ = dS K / sqrt(hs),
// dK = dS^T Q / sqrt(hs).

// dK, dV: grid (key blocks, NH, B). Each warp owns 16 keys and streams the query tiles at or after
// the key block (the ones the causal mask lets see it) up to the first query whose document starts
// after the block's last key, computing S^T = K Q^T and dP^T = V dO^T.
template <int HS>
static __global__ void __launch_bounds__(attention_tc_detail::kThreads, 2)
    attention_tc_backward_dkdv_kernel(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                      const float* lse, const float* D, const int* doc_start, int T, int C, int NH) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kQueries = kDkdvQueries<HS>;
    const int k0 = int(blockIdx.x) * kBlockRows;  // the first key blocks see the most queries: first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

    DYNAMIC_SHARED(bf16, smem);
    bf16* k_tile = smem;                          // [kBlockRows][ld]; at the end dK
    bf16* v_tile = k_tile + kBlockRows * ld;      // [kBlockRows][ld]; at the end dV
    bf16* q_tiles = v_tile + kBlockRows * ld;     // [2][kQueries][ld]
    bf16* dout_tiles = q_tiles + 2 * kQueries * ld;  // [2][kQueries][ld]
    float* lse_rows = reinterpret_cast<float*>(dout_tiles + 2 * kQueries * ld);  // [2][kQueries], base 2
    float* d_rows = lse_rows + 2 * kQueries;                                    // [2][kQueries]

    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* dout_src = dout + size_t(b) * T * C + h * HS;
    const float* lse_src = lse + (size_t(b) * NH + h) * T;
    const float* d_src = D + (size_t(b) * NH + h) * T;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * T : nullptr;
    // Query tile `tile` (positions k0 + tile * kQueries ..) into buffer tile % 2: q and dO by cp.async
    // (the caller commits), lse and D by plain loads (published by the next __syncthreads).
    auto load_query_tile = [&](int tile) {
        const int q0 = k0 + tile * kQueries, buf = tile % 2;
        load_rows_async<HS, kQueries>(q_tiles + buf * kQueries * ld, q_src, stride, q0, T);
        load_rows_async<HS, kQueries>(dout_tiles + buf * kQueries * ld, dout_src, size_t(C), q0, T);
        const int r = int(threadIdx.x) % kQueries;
        if (int(threadIdx.x) < kQueries) lse_rows[buf * kQueries + r] = q0 + r < T ? lse_src[q0 + r] * kLog2e : 0.0f;
        else if (int(threadIdx.x) < 2 * kQueries) d_rows[buf * kQueries + r] = q0 + r < T ? d_src[q0 + r] : 0.0f;
    };
    load_rows_async<HS, kBlockRows>(k_tile, q_src + C, stride, k0, T);
    load_rows_async<HS, kBlockRows>(v_tile, q_src + 2 * C, stride, k0, T);
    load_query_tile(0);
    cp_async_commit();

    const float scale = 1.0f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;
    const int key0 = k0 + warp * kWarpRows + lane / 4;  // this lane's keys: key0 and key0 + 8
    // Where the queries that see each of them end (<= T; T without document masking).
    const int key_query_end[2] = {attention_detail::visible_query_end(doc_row, min(key0, T), key0, T),
                                  attention_detail::visible_query_end(doc_row, min(key0 + 8, T), key0 + 8, T)};
    // Tiles the masks do not cut skip the per-score tests: every query of the tile at or after the
    // warp's last key and before the first end of visible queries among its keys.
    const int warp_key0 = k0 + warp * kWarpRows;
    const int warp_query_end = int(-warp_max(-float(min(key_query_end[0], key_query_end[1]))));  // the minimum
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    const int query_end = attention_detail::visible_query_end(doc_row, k0, min(k0 + kBlockRows, T) - 1, T);
    const int query_tiles = (query_end - k0 + kQueries - 1) / kQueries;
    for (int tile = 0; tile < query_tiles; ++tile) {
        if (tile + 1 < query_tiles) {
            load_query_tile(tile + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int q0 = k0 + tile * kQueries, buf = tile % 2;
        const bf16* q_tile = q_tiles + buf * kQueries * ld;
        const bf16* dout_tile = dout_tiles + buf * kQueries * ld;

        float p[kQueries / 8][4] = {}, ds[kQueries / 8][4] = {};  // transposed: [key][query]
        mma_a_bt<kQueries, HS>(p, k_tile + warp * kWarpRows * ld, q_tile, ld);
        mma_a_bt<kQueries, HS>(ds, v_tile + warp * kWarpRows * ld, dout_tile, ld);
        if (q0 < warp_key0 + kWarpRows - 1 || q0 + kQueries > warp_query_end) {  // warp-uniform
            TC_UNROLL
            for (int n = 0; n < kQueries / 8; ++n) {
                TC_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const int col = 8 * n + 2 * (lane % 4) + (i & 1), query = q0 + col;
                    const bool visible = key0 + 8 * (i / 2) <= query && query < key_query_end[i / 2];
                    p[n][i] = visible ? exp2_ftz(fmaf(p[n][i], scale_log2, -lse_rows[buf * kQueries + col])) : 0.0f;
                    ds[n][i] = p[n][i] * (ds[n][i] - d_rows[buf * kQueries + col]);
                }
            }
        } else {
            TC_UNROLL
            for (int n = 0; n < kQueries / 8; ++n) {
                TC_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const int col = 8 * n + 2 * (lane % 4) + (i & 1);
                    p[n][i] = exp2_ftz(fmaf(p[n][i], scale_log2, -lse_rows[buf * kQueries + col]));
                    ds[n][i] = p[n][i] * (ds[n][i] - d_rows[buf * kQueries + col]);
                }
            }
        }
        mma_p_b<HS, kQueries>(dv, p, dout_tile, ld);
        mma_p_b<HS, kQueries>(dk, ds, q_tile, ld);
        __syncthreads();  // buffer `buf` is refilled by the next iteration's prefetch
    }
    const float dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
    bf16* head_dst = dqkv + size_t(b) * T * stride + h * HS;
    store_warp_rows<HS>(head_dst + C, stride, k_tile + warp * kWarpRows * ld, dk, dk_scale, warp_key0, T);
    store_warp_rows<HS>(head_dst + 2 * C, stride, v_tile + warp * kWarpRows * ld, dv, dv_scale, warp_key0, T);
}

// dQ: grid (query blocks, NH, B). Each warp owns 16 queries and streams the key tiles the causal
// and document masks let them see, as the forward pass does.
template <int HS>
static __global__ void __launch_bounds__(attention_tc_detail::kThreads, 2)
    attention_tc_backward_dq_kernel(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                    const float* lse, const float* D, const int* doc_start, int T, int C, int NH) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kKeys = kDqKeys<HS>;
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBlockRows;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

    DYNAMIC_SHARED(bf16, smem);
    bf16* q_tile = smem;                             // [kBlockRows][ld]; at the end dQ
    bf16* dout_tile = q_tile + kBlockRows * ld;      // [kBlockRows][ld]
    bf16* k_tiles = dout_tile + kBlockRows * ld;     // [2][kKeys][ld]
    bf16* v_tiles = k_tiles + 2 * kKeys * ld;        // [2][kKeys][ld]

    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* v_src = q_src + 2 * C;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * T : nullptr;
    const int first_tile = attention_detail::first_key_tile(doc_row, q0, kKeys);
    const int key_tiles = (min(q0 + kBlockRows, T) + kKeys - 1) / kKeys;
    load_rows_async<HS, kBlockRows>(q_tile, q_src, stride, q0, T);
    load_rows_async<HS, kBlockRows>(dout_tile, dout + size_t(b) * T * C + h * HS, size_t(C), q0, T);
    load_rows_async<HS, kKeys>(k_tiles + (first_tile % 2) * kKeys * ld, k_src, stride, first_tile * kKeys, T);
    load_rows_async<HS, kKeys>(v_tiles + (first_tile % 2) * kKeys * ld, v_src, stride, first_tile * kKeys, T);
    cp_async_commit();

    const float scale = 1.0f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;
    const int row0 = q0 + warp * kWarpRows + lane / 4;  // this lane's rows: row0 and row0 + 8
    float lse_log2[2], d_row[2];  // rows beyond T are masked below; their values do not matter
    int first_key[2];
    TC_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        lse_log2[r] = row < T ? lse[(size_t(b) * NH + h) * T + row] * kLog2e : 0.0f;
        d_row[r] = row < T ? D[(size_t(b) * NH + h) * T + row] : 0.0f;
        first_key[r] = attention_detail::first_visible_key(doc_row, row, T);
    }
    // Tiles the masks do not cut skip the per-score tests, as in the forward pass; a warp with rows
    // past T always tests (those rows are masked whole).
    const int warp_row0 = q0 + warp * kWarpRows;
    const int warp_first_key = int(warp_max(float(max(first_key[0], first_key[1]))));
    const bool warp_rows_in_range = warp_row0 + kWarpRows <= T;
    float dq[HS / 8][4] = {};
    for (int kt = first_tile; kt < key_tiles; ++kt) {
        if (kt + 1 < key_tiles) {
            const int next = (kt + 1) % 2;
            load_rows_async<HS, kKeys>(k_tiles + next * kKeys * ld, k_src, stride, (kt + 1) * kKeys, T);
            load_rows_async<HS, kKeys>(v_tiles + next * kKeys * ld, v_src, stride, (kt + 1) * kKeys, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* k_tile = k_tiles + (kt % 2) * kKeys * ld;
        const bf16* v_tile = v_tiles + (kt % 2) * kKeys * ld;

        float ds[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
        mma_a_bt<kKeys, HS>(ds, q_tile + warp * kWarpRows * ld, k_tile, ld);  // S first
        mma_a_bt<kKeys, HS>(dp, dout_tile + warp * kWarpRows * ld, v_tile, ld);
        if (!warp_rows_in_range || kt * kKeys + kKeys - 1 > warp_row0 || kt * kKeys < warp_first_key) {  // warp-uniform
            TC_UNROLL
            for (int n = 0; n < kKeys / 8; ++n) {
                TC_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const int key = kt * kKeys + 8 * n + 2 * (lane % 4) + (i & 1), row = row0 + 8 * (i / 2);
                    const bool visible = first_key[i / 2] <= key && key <= row && row < T;
                    const float p = visible ? exp2_ftz(fmaf(ds[n][i], scale_log2, -lse_log2[i / 2])) : 0.0f;
                    ds[n][i] = p * (dp[n][i] - d_row[i / 2]);
                }
            }
        } else {
            TC_UNROLL
            for (int n = 0; n < kKeys / 8; ++n) {
                TC_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const float p = exp2_ftz(fmaf(ds[n][i], scale_log2, -lse_log2[i / 2]));
                    ds[n][i] = p * (dp[n][i] - d_row[i / 2]);
                }
            }
        }
        mma_p_b<HS, kKeys>(dq, ds, k_tile, ld);
        __syncthreads();
    }
    const float dq_scale[2] = {scale, scale};
    store_warp_rows<HS>(dqkv + size_t(b) * T * stride + h * HS, stride, q_tile + warp * kWarpRows * ld, dq, dq_scale,
                        q0 + warp * kWarpRows, T);
}

// ---------------------------------------------------------------------------------------------
// Host side

// "" when the tensor-core kernels support these sizes (the BF16 build, head size 16, 32, 64 or
// 128), else a one-line reason.
inline std::string attention_tc_requirements(int B, int T, int C, int NH) {
    if constexpr (!std::is_same_v<floatX, __nv_bfloat16>) {
        return "attention tc: needs the BF16 build (floatX = bf16); use --attention simt";
    }
    if (B < 1 || T < 1 || C < 1 || NH < 1)
        return "attention tc: B = " + std::to_string(B) + ", T = " + std::to_string(T) + ", C = " + std::to_string(C) +
               " and NH = " + std::to_string(NH) + " must be positive";
    if (C % NH != 0)
        return "attention tc: C = " + std::to_string(C) + " is not divisible by NH = " + std::to_string(NH);
    const int hs = C / NH;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128)
        return "attention tc: head size C/NH = " + std::to_string(hs) + " is not supported (16, 32, 64 or 128)";
    return "";
}

inline size_t attention_tc_backward_scratch_floats(int B, int T, int NH) { return size_t(B) * T * NH; }

namespace attention_tc_detail {

// Calls f(std::integral_constant<int, hs>) for a supported head size (checked before).
template <typename F> void dispatch_head_size(int hs, F&& f) {
    switch (hs) {
        case 16: f(std::integral_constant<int, 16>{}); break;
        case 32: f(std::integral_constant<int, 32>{}); break;
        case 64: f(std::integral_constant<int, 64>{}); break;
        default: f(std::integral_constant<int, 128>{}); break;
    }
}

// Tile pairs a kernel computes per (b, h): for each block of kBlockRows rows, the streamed tiles
// of `tile` rows it visits (those the causal mask does not hide entirely).
inline double query_block_key_tiles(int T, int tile) {  // dQ
    double pairs = 0;
    for (int q0 = 0; q0 < T; q0 += kBlockRows) pairs += ceil_div(std::min(q0 + kBlockRows, T), tile);
    return pairs;
}
// Forward: each warp's rows times the key tiles it computes (up to its last row; a warp skips the
// tiles of its block that lie past its rows).
inline double forward_row_tiles(int T, int tile, int warp_rows) {
    double row_tiles = 0;
    for (int r0 = 0; r0 < T; r0 += warp_rows) row_tiles += double(warp_rows) * ceil_div(std::min(r0 + warp_rows, T), tile);
    return row_tiles;
}
inline double key_block_query_tiles(int T, int tile) {  // dK/dV
    double pairs = 0;
    for (int k0 = 0; k0 < T; k0 += kBlockRows) pairs += ceil_div(T - k0, tile);
    return pairs;
}

// The element type is a template parameter so that the FP32 build never instantiates the bf16
// kernels (the launchers refuse it before getting here).
template <typename T>
void forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream, const int* doc_start) {
    if constexpr (std::is_same_v<T, bf16>) {
        const int hs = C / NH;
        const double BNH = double(B) * NH, BTC = double(B) * Tn * C, bf = sizeof(bf16);
        dispatch_head_size(hs, [&](auto hs_constant) {
            constexpr int HS = decltype(hs_constant)::value;
            constexpr auto kernel = attention_tc_forward_kernel<HS>;
            constexpr size_t smem = forward_smem_bytes<HS>();
            attention_detail::allow_smem<kernel>(smem);
            // Matmul FLOPs executed: S = Q K^T and P V, 2 * tile * hs each per row and key tile.
            const double row_tiles = forward_row_tiles(Tn, kForwardKeys<HS>, kForwardFrags<HS> * kWarpRows);
            const KernelCost cost{BNH * row_tiles * 4.0 * kForwardKeys<HS> * HS,
                                  3 * BTC * bf + BTC * bf + BNH * Tn * sizeof(float), WorkKind::tensor_cores};
            launch<kernel>(cost, dim3(ceil_div(Tn, kForwardRows<HS>), NH, B), dim3(kThreads), smem, stream, out, lse,
                           qkv, doc_start, Tn, C, NH);
        });
    }
}

template <typename T>
void backward(T* dqkv, float* scratch, const T* dout, const T* qkv, const T* out, const float* lse, int B, int Tn,
              int C, int NH, cudaStream_t stream, const int* doc_start) {
    if constexpr (std::is_same_v<T, bf16>) {
        const int hs = C / NH;
        const double BNH = double(B) * NH, BTC = double(B) * Tn * C, bf = sizeof(bf16);
        const double row_floats = BNH * Tn * sizeof(float);  // one of lse or D
        float* D = scratch;
        attention_backward_rowdot(D, dout, out, B, Tn, C, NH, stream);
        dispatch_head_size(hs, [&](auto hs_constant) {
            constexpr int HS = decltype(hs_constant)::value;
            constexpr auto dkdv_kernel = attention_tc_backward_dkdv_kernel<HS>;
            constexpr auto dq_kernel = attention_tc_backward_dq_kernel<HS>;
            constexpr size_t dkdv_smem = dkdv_smem_bytes<HS>(), dq_smem = dq_smem_bytes<HS>();
            attention_detail::allow_smem<dkdv_kernel>(dkdv_smem);
            attention_detail::allow_smem<dq_kernel>(dq_smem);
            const dim3 grid(ceil_div(Tn, kBlockRows), NH, B);
            // Each reads q, k, v, dO, lse and D once; dK/dV computes S^T, dP^T, dV and dK (4
            // products), dQ computes S, dP and dQ (3), 2 * 64 * tile * hs FLOPs each per tile pair.
            // With document masking these are upper bounds (the tiles skipped depend on the data).
            const double reads = 4 * BTC * bf + 2 * row_floats;
            const KernelCost dkdv_cost{BNH * key_block_query_tiles(Tn, kDkdvQueries<HS>) * 8.0 * kBlockRows *
                                           kDkdvQueries<HS> * HS,
                                       reads + 2 * BTC * bf, WorkKind::tensor_cores};
            const KernelCost dq_cost{BNH * query_block_key_tiles(Tn, kDqKeys<HS>) * 6.0 * kBlockRows * kDqKeys<HS> * HS,
                                     reads + BTC * bf, WorkKind::tensor_cores};
            launch<dkdv_kernel>(dkdv_cost, grid, dim3(kThreads), dkdv_smem, stream, dqkv, dout, qkv, lse, D, doc_start,
                                Tn, C, NH);
            launch<dq_kernel>(dq_cost, grid, dim3(kThreads), dq_smem, stream, dqkv, dout, qkv, lse, D, doc_start, Tn, C,
                              NH);
        });
    }
}

}  // namespace attention_tc_detail

// doc_start: (B, T) document starts for document masking (host/documents.h), or null (causal only).
inline void attention_tc_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                 cudaStream_t stream, const int* doc_start = nullptr) {
    require_supported("attention_tc_forward", attention_tc_requirements(B, T, C, NH));
    attention_tc_detail::forward(out, lse, qkv, B, T, C, NH, stream, doc_start);
}

inline void attention_tc_backward(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv,
                                  const floatX* out, const float* lse, int B, int T, int C, int NH,
                                  cudaStream_t stream, const int* doc_start = nullptr) {
    require_supported("attention_tc_backward", attention_tc_requirements(B, T, C, NH));
    attention_tc_detail::backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream, doc_start);
}
