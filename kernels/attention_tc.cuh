// Causal multi-head self-attention on tensor cores: FlashAttention-2 (Dao 2023, "FlashAttention-2",
// Algorithms 1 and 2) on mma.sync m16n8k16 with bf16 operands and FP32 accumulation
// (kernels/tensor_core.cuh). Same launcher arguments, layouts and results as the SIMT kernels of
// attention.cuh: qkv (B, T, 3C), out (B, T, C), lse (B, NH, T) float, dqkv written, backward scratch
// D = rowsum(dO * O) of (B, NH, T) floats, computed by attention.cuh's rowdot kernel. And, like them,
// over a span (AttentionSpan: queries [0, Tq) against keys [0, Tk), query t seeing key k <= t +
// key_lead; query- and key-side arrays apart), out, dq and dk|dv in floatX or float and the gradients
// written or accumulated: context parallelism's ring steps (parallel/context.h).
//
// A block is 4 warps; each warp owns 16-row fragments (queries in the forward and dQ kernels, keys
// in the dK/dV kernel): two in the forward up to head size 64 (128-query blocks, as FlashAttention-2),
// one otherwise. It keeps their score tiles, softmax state and output accumulators in registers,
// in the mma accumulator layout. The accumulator of a 16 x 16k score tile is, register for
// register, the A operand of the next product (P V, dS K, ...), so P and dS never touch shared
// memory. The streamed operand (K and V tiles, or Q and dO tiles for dK/dV) is double-buffered in
// shared memory with cp.async; ldmatrix feeds every B operand (.trans where the product needs the
// tile's rows as its k dimension). Key tiles after the last key a query tile's last query sees are
// never loaded.
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

#include <algorithm>
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

// The fused backward (attention_tc_backward_fused_kernel): 8 warps of 16 keys each, so that a block's
// 128 keys halve, against 64, the float dQ partial sums written and read back per FLOP; query tiles as
// the dK/dV kernel streams them. dQ's share of a tile pair (kDkdvQueries x HS) is split over the warps:
// 16-query fragments, then column parts of kFusedDqCols.
constexpr int kFusedWarps = 8;
constexpr int kFusedThreads = 32 * kFusedWarps;
constexpr int kFusedKeys = kFusedWarps * kWarpRows;  // keys per block
template <int HS> constexpr int kFusedDqCols = HS / (kFusedWarps / (kDkdvQueries<HS> / kWarpRows));
template <int HS> constexpr int kFusedLdDs = kDkdvQueries<HS> + 8;  // dS^T rows in shared memory: queries + 8
// K and V buffers: two (the next key block loads during the current one's last tile pair), one at hs
// 128, where two would take 191 KB of shared memory, above an A100's 163 KB (sm_80 is built too).
template <int HS> constexpr int kFusedKvBuffers = HS >= 128 ? 1 : 2;
// Blocks of the fused kernel an SM holds: one. At head size 64 its 159,776 bytes of shared memory and its
// 244 registers a thread (`make kernel-report`) each leave no room for a second. A block per (b, h), all
// of equal work without documents, would run in whole waves (dev/roofline.h charges them): 400 blocks at
// d48, B=16 take 4 waves of 132 for the work of 3.03.
constexpr int kFusedBlocksPerSm = 1;

// The heads past the last whole wave (d48, B=16: 400 mod 132 = 4) would leave all but a few SMs idle
// for a whole wave. Instead the rows of the batch that hold them are split, each head over `groups`
// blocks (up to kFusedMaxGroups) that each walk a pair of key blocks of equal work (key blocks p and
// n-1-p of n see 2(n+1) query tiles of 64 between them), when their rounds end the grid sooner: at d48,
// B=16, 15 rows (375 heads) take 3 waves, then the last row's 25 heads run as 100 quarter blocks, 3.25
// waves for the work of 3.03 (93% busy, 76% before). dK and dV stay each key block's own; dQ's float
// partial sums are kept per group and added in group order by attention_tc_fused_dq_combine_kernel. The grid is
// shaped for kFusedWaveSlots, an H100's (and H200's) 132 SMs, on every GPU and in the emulator, so that
// which heads are split, and dQ's bits, do not depend on the machine. Without documents only: with them
// a group's later key blocks can reach queries its first did not, and the blocks are unequal anyway.
constexpr int kFusedWaveSlots = 132 * kFusedBlocksPerSm;
constexpr int kFusedMaxGroups = 4;
constexpr int kCombineThreads = 128;  // attention_tc_fused_dq_combine_kernel's block
// In whole rows of the batch (grids (1, NH, rows) and (groups, NH, rows), no index divided in a kernel).
struct FusedGrid {
    int whole_rows = 0;  // rows 0 .. whole_rows-1: a block per (b, h), all its key blocks
    int split_rows = 0;  // the rows after them: `groups` blocks per (b, h)
    int groups = 1;
    // The split heads' sets of scratch, one per group: T floats of D each, then (16-byte aligned)
    // T x hs floats of dQ sums each.
    size_t split_sets(int NH) const { return size_t(split_rows) * NH * groups; }
    size_t split_d_floats(int NH, int T) const { return (split_sets(NH) * T + 3) / 4 * 4; }
};
// The key block a fused backward block walks after k0 (T: none): a whole head's next, or for group
// blockIdx.x of a split head its last, n-1-group, once. (Recomputed from blockIdx.x at each use: the
// group's last key block held in a register, or a lambda capturing it, spilled on sm_80 or sm_90.)
template <bool kSplitHeads> __device__ inline int fused_next_key_block(int k0, int T) {
    const int last_k0 = ((T + kFusedKeys - 1) / kFusedKeys - 1 - int(blockIdx.x)) * kFusedKeys;
    return kSplitHeads ? (k0 < last_k0 ? last_k0 : T) : k0 + kFusedKeys;
}
// wave_slots: the blocks a wave holds (kFusedWaveSlots; the tests shape grids of a few heads with less).
// Group g of a split head walks key blocks g and n-1-g of n (the middle one of an odd n alone), so a head
// splits into ceil(n/2) groups, when that is at most kFusedMaxGroups (T <= 1024: past it the sets of sums
// would grow with T).
inline FusedGrid fused_grid_plan(int B, int NH, int T, bool documents, int wave_slots = kFusedWaveSlots) {
    const int groups = (int(ceil_div(T, kFusedKeys)) + 1) / 2;
    const FusedGrid whole{B, 0, 1};
    const int tail = (B * NH) % wave_slots;  // the heads of the last, partial wave
    if (documents || groups < 2 || groups > kFusedMaxGroups || tail == 0) return whole;
    const int split_rows = int(ceil_div(tail, NH));  // the rows that hold them
    // In waves: the whole rows' (the last one charged whole), then the groups' rounds (1/groups of a wave
    // each), against B rows' whole waves.
    const int whole_waves = int(ceil_div((B - split_rows) * NH, wave_slots));
    const int split_rounds = int(ceil_div(split_rows * NH * groups, wave_slots));
    if (whole_waves * groups + split_rounds >= int(ceil_div(B * NH, wave_slots)) * groups) return whole;
    return {B - split_rows, split_rows, groups};
}

template <int HS> constexpr size_t forward_smem_bytes() {
    return size_t(kForwardRows<HS> + 4 * kForwardKeys<HS>) * kLd<HS> * sizeof(bf16);
}
template <int HS> constexpr size_t dq_smem_bytes() {
    return size_t(2 * kBlockRows + 4 * kDqKeys<HS>) * kLd<HS> * sizeof(bf16);
}
template <int HS> constexpr size_t dkdv_smem_bytes() {
    return size_t(2 * kBlockRows + 4 * kDkdvQueries<HS>) * kLd<HS> * sizeof(bf16) + 4 * kDkdvQueries<HS> * sizeof(float);
}
template <int HS> constexpr size_t fused_smem_bytes() {
    return (size_t(2 * kFusedKvBuffers<HS> * kFusedKeys + 6 * kDkdvQueries<HS>) * kLd<HS> + size_t(kFusedKeys) * kFusedLdDs<HS> +
            size_t(kFusedWarps) * kWarpRows * kLd<kFusedDqCols<HS>>) * sizeof(bf16) +
           4 * kDkdvQueries<HS> * sizeof(float) + kFusedWarps * sizeof(int) + kFusedWarps * kFusedDqCols<HS> * sizeof(float);
}

// Rows [row0, row0 + kRows) of one head (HS values at src + t * src_stride for position t) into
// shared memory (rows of kLd<HS>) by cp.async, 16 bytes each; rows at or beyond T become zeros,
// so masked scores never meet a NaN. Joins the calling thread's current cp.async group.
// A thread copies the same 16-byte column of every kRowStep-th row, so its source offset is one
// multiply at the start and an add per row (not a 64-bit multiply per chunk).
// kBlockThreads: the block's threads, which share the rows.
template <int HS, int kRows, int kBlockThreads = kThreads>
__device__ inline void load_rows_async(bf16* dst, const bf16* src, size_t src_stride, int row0, int T) {
    constexpr int kChunks = HS / 8;
    static_assert(kBlockThreads % kChunks == 0, "a thread keeps one column");
    constexpr int kRowStep = kBlockThreads / kChunks;
    const int first = int(threadIdx.x) / kChunks, c = (int(threadIdx.x) % kChunks) * 8;
    size_t offset = size_t(row0 + first) * src_stride + c;  // formed into a pointer only for rows below T
    const size_t step = size_t(kRowStep) * src_stride;
    for (int r = first; r < kRows; r += kRowStep, offset += step) {
        const bool valid = row0 + r < T;
        cp_async_16_or_zero(dst + r * kLd<HS> + c, src + (valid ? offset : size_t(c)), valid);
    }
}

// scale * acc (the warp's 16 x HS accumulator) to those of its 16 rows that lie below T at dst (row r
// at dst + (row0 + r) * dst_stride), written, or with `accumulate` added to what dst holds; 16 bytes
// per access.
//  - bf16: staged in the warp's 16 shared-memory rows at `rows` (only this warp may use them), then
//    copied out 8 values at a time (accumulated: the staged bf16 added to dst's and rounded again).
//  - float (context parallelism's partial outputs and sums): straight from the registers. Lanes t and
//    t^1 of a quad swap halves with one shuffle per value pair, so that each lane holds four adjacent
//    columns of one row: even t those of row g (its own c0, c1 and its neighbour's), odd t those of
//    row g + 8 (its neighbour's c2, c3 and its own).
template <int HS, typename Dst>
__device__ inline void store_warp_rows(Dst* dst, size_t dst_stride, bf16* rows, const float (&acc)[HS / 8][4],
                                       const float (&scale)[2], int row0, int T, bool accumulate = false) {
    const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    if constexpr (std::is_same_v<Dst, float>) {
        const bool odd = (t & 1) != 0;
        const int row = row0 + g + (odd ? 8 : 0), col = 2 * (t & ~1);
        const float s = odd ? scale[1] : scale[0];
        float* to = row < T ? dst + size_t(row) * dst_stride + col : nullptr;  // rows at or beyond T: not stored
        FULL_UNROLL
        for (int n = 0; n < HS / 8; ++n) {
            const float lo = __shfl_xor_sync(0xffffffffu, odd ? acc[n][0] : acc[n][2], 1);
            const float hi = __shfl_xor_sync(0xffffffffu, odd ? acc[n][1] : acc[n][3], 1);
            Packed128<float> v;
            v[0] = s * (odd ? lo : acc[n][0]);
            v[1] = s * (odd ? hi : acc[n][1]);
            v[2] = s * (odd ? acc[n][2] : lo);
            v[3] = s * (odd ? acc[n][3] : hi);
            if (row < T) {
                if (accumulate) {
                    const Packed128<float> before = load128(to + 8 * n);
                    for (int k = 0; k < 4; ++k) v[k] += before[k];
                }
                store128(to + 8 * n, v);
            }
        }
    } else {
        FULL_UNROLL
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
            if (row0 + r >= T) continue;
            bf16* to = dst + size_t(row0 + r) * dst_stride + c;
            Packed128<bf16> v = load128(rows + r * kLd<HS> + c);
            if (accumulate) {
                const Packed128<bf16> before = load128(to);
                for (int k = 0; k < Packed128<bf16>::size; ++k) v[k] = from_float<bf16>(to_float(before[k]) + to_float(v[k]));
            }
            store128(to, v);
        }
    }
}

// The qkv bias gradient's share of a block's rows: column sums of `kTiles` tiles of kRows staged bf16
// rows (the values store_warp_rows wrote, still in shared memory: tile i at staged + i * tile_stride,
// row r at + r * ld), rows at or beyond T (from row0) left out, to sums[i * section + c] for c < HS. Every
// thread of the block (kBlockThreads) calls it (it has barriers), after the stores; `area` is
// kBlockThreads * 8 floats of shared memory no one reads any more. Each thread adds one 16-byte column
// group over its group of rows, then a thread per column adds the row groups in order: the same sums at
// every schedule, no atomics.
template <int HS, int kTiles, int kRows = kBlockRows, int kBlockThreads = kThreads>
__device__ inline void sum_staged_columns(float* sums, size_t section, const bf16* staged, size_t tile_stride, float* area,
                                          int row0, int T) {
    constexpr int ld = kLd<HS>, kChunks = HS / 8, kTileThreads = kBlockThreads / kTiles;
    constexpr int kGroups = kTileThreads / kChunks, kGroupRows = kRows / kGroups;
    static_assert(kBlockThreads % kTiles == 0 && kTileThreads % kChunks == 0 && kRows % kGroups == 0, "whole groups");
    const int tile = int(threadIdx.x) / kTileThreads, local = int(threadIdx.x) % kTileThreads;
    const int chunk = local % kChunks, group = local / kChunks, rows = min(kRows, T - row0);
    __syncthreads();  // every warp's staged rows
    float acc[8] = {};
    for (int r = group * kGroupRows; r < min(rows, (group + 1) * kGroupRows); ++r) {
        float values[8];
        unpack_floats(values, load128(staged + size_t(tile) * tile_stride + r * ld + chunk * 8));
        LANE_LOOP
        for (int i = 0; i < 8; ++i) acc[i] += values[i];
    }
    float* mine = area + (tile * kGroups + group) * HS + chunk * 8;
    for (int i = 0; i < 8; ++i) mine[i] = acc[i];
    __syncthreads();
    for (int c = int(threadIdx.x); c < kTiles * HS; c += kBlockThreads) {
        float sum = 0.0f;
        for (int g = 0; g < kGroups; ++g) sum += area[((c / HS) * kGroups + g) * HS + c % HS];
        sums[size_t(c / HS) * section + c % HS] = sum;
    }
}

// A key-row warp's tile pair (dK/dV and fused kernels): from S^T (in p) and dP^T (in ds), both 16 keys
// x kQueries in the accumulator layout, P = exp(S / sqrt(hs) - lse) and dS = P (dP - D), lse in base 2
// and D of the tile's queries at lse_rows and d_rows. With `test_each` (a warp-uniform flag: the masks
// cut the tile) query q0 + col sees this lane's key pair only from first_query (its first key's first
// query; + 8 for the second key) up to key_query_end; masked entries get P = 0, dS = 0.
template <int kQueries>
__device__ inline void key_scores_to_grads(float (&p)[kQueries / 8][4], float (&ds)[kQueries / 8][4], bool test_each, int q0,
                                           int first_query, const int (&key_query_end)[2], const float* lse_rows,
                                           const float* d_rows, float scale_log2) {
    const int lane = int(threadIdx.x) % 32;
    if (test_each) {
        FULL_UNROLL
        for (int n = 0; n < kQueries / 8; ++n) {
            FULL_UNROLL
            for (int i = 0; i < 4; ++i) {
                const int col = 8 * n + 2 * (lane % 4) + (i & 1), query = q0 + col;
                const bool visible = first_query + 8 * (i / 2) <= query && query < key_query_end[i / 2];
                p[n][i] = visible ? exp2_ftz(fmaf(p[n][i], scale_log2, -lse_rows[col])) : 0.0f;
                ds[n][i] = p[n][i] * (ds[n][i] - d_rows[col]);
            }
        }
    } else {
        FULL_UNROLL
        for (int n = 0; n < kQueries / 8; ++n) {
            FULL_UNROLL
            for (int i = 0; i < 4; ++i) {
                const int col = 8 * n + 2 * (lane % 4) + (i & 1);
                p[n][i] = exp2_ftz(fmaf(p[n][i], scale_log2, -lse_rows[col]));
                ds[n][i] = p[n][i] * (ds[n][i] - d_rows[col]);
            }
        }
    }
}

// acc += the float rows at src (row r at src + (row0 + r) * src_stride) that store_warp_rows<HS, float>
// wrote, with its 16-byte loads and its pairing of lanes t and t^1 (each keeps its own two values of a
// row and takes its neighbour's); rows at or beyond T add nothing.
template <int HS>
__device__ inline void add_warp_rows(float (&acc)[HS / 8][4], const float* src, size_t src_stride, int row0, int T) {
    const int lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    const bool odd = (t & 1) != 0;
    const int row = row0 + g + (odd ? 8 : 0), col = 2 * (t & ~1);
    const float* from = row < T ? src + size_t(row) * src_stride + col : nullptr;
    FULL_UNROLL
    for (int n = 0; n < HS / 8; ++n) {
        const Packed128<float> v = row < T ? load128(from + 8 * n) : Packed128<float>::filled(0.0f);
        const float lo = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[2], 1);
        const float hi = __shfl_xor_sync(0xffffffffu, odd ? v[1] : v[3], 1);
        acc[n][0] += odd ? lo : v[0];
        acc[n][1] += odd ? hi : v[1];
        acc[n][2] += odd ? v[2] : lo;
        acc[n][3] += odd ? v[3] : hi;
    }
}

}  // namespace attention_tc_detail

// ---------------------------------------------------------------------------------------------
// Forward: grid (query blocks, NH, B). Per key tile: S = q k^T / sqrt(hs) (masked where key >
// query + key_lead), m' = max(m, rowmax S), P = exp(S - m'), l' = l exp(m - m') + rowsum P,
// O' = O exp(m - m') + P V; at the end O / l and lse = m + log l (FlashAttention-2, Algorithm 1).
// A row that sees no key of the span (documents under context parallelism) gets out 0, lse -inf.

template <int HS, typename Out>
static __global__ void __launch_bounds__(attention_tc_detail::kThreads, 2)
    attention_tc_forward_kernel(Out* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* kv,
                                const int* doc_start, AttentionSpan span, int C, int NH) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kKeys = kForwardKeys<HS>, F = kForwardFrags<HS>, kRows = kForwardRows<HS>;
    const int Tq = span.Tq, Tk = span.Tk, lead = span.key_lead;
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kRows;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

    DYNAMIC_SHARED(bf16, smem);
    bf16* q_tile = smem;                        // [kRows][ld]; at the end each warp's output
    bf16* k_tiles = q_tile + kRows * ld;        // [2][kKeys][ld]
    bf16* v_tiles = k_tiles + 2 * kKeys * ld;   // [2][kKeys][ld]

    const size_t q_stride = 3 * size_t(C), kv_stride = size_t(span.kv_stride);
    const bf16* q_src = q + size_t(b) * span.q_seq * q_stride + h * HS;
    const bf16* k_src = kv + size_t(b) * span.kv_seq * kv_stride + h * HS;
    const bf16* v_src = k_src + C;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    const int first_tile = attention_detail::first_key_tile(doc_row, q0, kKeys);
    const int key_tiles = attention_detail::span_key_tiles(q0, span, kRows, kKeys);  // up to the block's last query's
    load_rows_async<HS, kRows>(q_tile, q_src, q_stride, q0, Tq);
    load_rows_async<HS, kKeys>(k_tiles + (first_tile % 2) * kKeys * ld, k_src, kv_stride, first_tile * kKeys, Tk);
    load_rows_async<HS, kKeys>(v_tiles + (first_tile % 2) * kKeys * ld, v_src, kv_stride, first_tile * kKeys, Tk);
    cp_async_commit();

    // The softmax runs in base 2 with the scale folded into the exponent (FlashAttention-2): maxima
    // are taken over the raw scores, and p = 2^(s scale_log2 - m scale_log2) is one FFMA and one
    // ex2.approx.ftz per score.
    const float scale_log2 = kLog2e / sqrtf(float(HS));
    // The warp owns F fragments of 16 rows, from warp_row0; this lane's rows in fragment f are
    // row0[f] and row0[f] + 8.
    const int warp_row0 = q0 + warp * F * kWarpRows;
    int row0[F], first_key[F][2];
    FULL_UNROLL
    for (int f = 0; f < F; ++f) {
        row0[f] = warp_row0 + f * kWarpRows + lane / 4;
        first_key[f][0] = attention_detail::first_visible_key(doc_row, row0[f], Tq);
        first_key[f][1] = attention_detail::first_visible_key(doc_row, row0[f] + 8, Tq);
    }
    // Only tiles the masks cut need the per-score tests (FlashAttention-2 masks only the diagonal
    // block): a tile is visible in full to the warp's rows when its last key is at or before the
    // last key the warp's first row sees (row + key_lead, below Tk) and its first key at or after
    // every row's first visible key.
    // A tile that none of the warp's rows sees (past its last row's last key, or before every row's
    // document) is skipped by the warp: with 128-row blocks the block's key tiles reach past the first
    // warps' rows, and a block can span documents.
    int lane_first_key = 0, lane_min_first_key = Tk;
    FULL_UNROLL
    for (int f = 0; f < F; ++f) {
        lane_first_key = max(lane_first_key, max(first_key[f][0], first_key[f][1]));
        lane_min_first_key = min(lane_min_first_key, min(first_key[f][0], first_key[f][1]));
    }
    const int warp_first_key = int(warp_max(float(lane_first_key)));             // exact: keys < 2^24
    const int warp_min_first_key = int(-warp_max(-float(lane_min_first_key)));  // the minimum
    const int warp_first_last_key = min(warp_row0 + lead, Tk - 1);                 // of its first row
    const int warp_last_last_key = min(warp_row0 + F * kWarpRows - 1 + lead, Tk - 1);  // of its last
    float o[F][HS / 8][4] = {};
    float m[F][2], l[F][2];  // l: this lane's share of the row sums
    FULL_UNROLL
    for (int f = 0; f < F; ++f) m[f][0] = m[f][1] = -INFINITY, l[f][0] = l[f][1] = 0.0f;
    for (int kt = first_tile; kt < key_tiles; ++kt) {
        if (kt + 1 < key_tiles) {  // prefetch the next tile into the other buffer
            const int next = (kt + 1) % 2;
            load_rows_async<HS, kKeys>(k_tiles + next * kKeys * ld, k_src, kv_stride, (kt + 1) * kKeys, Tk);
            load_rows_async<HS, kKeys>(v_tiles + next * kKeys * ld, v_src, kv_stride, (kt + 1) * kKeys, Tk);
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of tile kt are done
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // everyone's are
        const bf16* k_tile = k_tiles + (kt % 2) * kKeys * ld;
        const bf16* v_tile = v_tiles + (kt % 2) * kKeys * ld;
        // Warp-uniform; the one barrier below stays outside the branch.
        if (kt * kKeys <= warp_last_last_key && kt * kKeys + kKeys - 1 >= warp_min_first_key) {
            // The tile's keys up to the warp's last row's last key, and from its rows' first visible key,
            // in blocks of 16: the products skip the rest (at hs 64, half of a diagonal tile for a warp whose
            // 32 rows are the tile's first), whose scores the tests below mask and whose P is 0.
            const int live_begin = live_begin_from(warp_min_first_key, kt * kKeys, kKeys);
            const int live_end = live_end_through(warp_last_last_key, kt * kKeys, kKeys);
            float s[F][kKeys / 8][4] = {};
            with_live_range<kKeys>(live_begin, live_end, [&](int begin, int end) {
                mma_a_bt_rows<F, kKeys, HS>(s, q_tile + warp * F * kWarpRows * ld, k_tile, ld, begin, end);
            });
            float tile_max[F][2];
            FULL_UNROLL
            for (int f = 0; f < F; ++f) tile_max[f][0] = tile_max[f][1] = -INFINITY;
            if (kt * kKeys + kKeys - 1 > warp_first_last_key || kt * kKeys < warp_first_key) {  // warp-uniform
                FULL_UNROLL
                for (int f = 0; f < F; ++f) {
                    FULL_UNROLL
                    for (int n = 0; n < kKeys / 8; ++n) {
                        FULL_UNROLL
                        for (int i = 0; i < 4; ++i) {
                            const int key = kt * kKeys + 8 * n + 2 * (lane % 4) + (i & 1);
                            const bool visible = first_key[f][i / 2] <= key && key - lead <= row0[f] + 8 * (i / 2) && key < Tk;
                            if (!visible) s[f][n][i] = -INFINITY;
                            tile_max[f][i / 2] = fmaxf(tile_max[f][i / 2], s[f][n][i]);
                        }
                    }
                }
            } else {
                FULL_UNROLL
                for (int f = 0; f < F; ++f) {
                    FULL_UNROLL
                    for (int n = 0; n < kKeys / 8; ++n) {
                        FULL_UNROLL
                        for (int i = 0; i < 4; ++i) tile_max[f][i / 2] = fmaxf(tile_max[f][i / 2], s[f][n][i]);
                    }
                }
            }
            // A row's fully masked tile after its first visible key gives correction 1 and P = 0. Before
            // it (a document that starts later in the block) m stays -inf: exponents relative to 0 then
            // keep P = 0 and o = l = 0 (exp2(-inf - -inf) would be NaN).
            FULL_UNROLL
            for (int f = 0; f < F; ++f) {
                float correction[2], m_ref_scaled[2];
                FULL_UNROLL
                for (int r = 0; r < 2; ++r) {
                    const float m_new = fmaxf(m[f][r], attention_detail::row_max(tile_max[f][r]));
                    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
                    m_ref_scaled[r] = m_ref * scale_log2;
                    correction[r] = exp2_ftz((m[f][r] - m_ref) * scale_log2);  // 0 on the row's first tile (m = -inf)
                    m[f][r] = m_new;
                    l[f][r] *= correction[r];
                }
                FULL_UNROLL
                for (int n = 0; n < kKeys / 8; ++n) {
                    FULL_UNROLL
                    for (int i = 0; i < 4; ++i) {
                        s[f][n][i] = exp2_ftz(fmaf(s[f][n][i], scale_log2, -m_ref_scaled[i / 2]));
                        l[f][i / 2] += s[f][n][i];
                    }
                }
                FULL_UNROLL
                for (int n = 0; n < HS / 8; ++n) {
                    FULL_UNROLL
                    for (int i = 0; i < 4; ++i) o[f][n][i] *= correction[i / 2];
                }
            }
            with_live_range<kKeys>(live_begin, live_end,
                                   [&](int begin, int end) { mma_p_b_rows<F, HS, kKeys>(o, s, v_tile, ld, begin, end); });
        }
        __syncthreads();  // tile kt's buffers are refilled by the next iteration's prefetch
    }
    // A span's query block may see no key tile at all (documents under context parallelism): then no
    // barrier of the loop ordered the q rows' loads, by every thread, before a warp stages its output.
    if (first_tile >= key_tiles) {
        cp_async_wait<0>();
        __syncthreads();
    }

    FULL_UNROLL
    for (int f = 0; f < F; ++f) {
        float inv_l[2];
        FULL_UNROLL
        for (int r = 0; r < 2; ++r) {
            l[f][r] = attention_detail::row_sum(l[f][r]);
            inv_l[r] = l[f][r] > 0.0f ? 1.0f / l[f][r] : 0.0f;
            const int row = row0[f] + 8 * r;
            if (lane % 4 == 0 && row < Tq)
                lse[(size_t(b) * NH + h) * span.q_seq + row] =
                    l[f][r] > 0.0f ? fmaf(m[f][r], scale_log2, log2f(l[f][r])) * kLn2 : -INFINITY;
        }
        // The warp's own q rows (only it read them) stage a bf16 output.
        store_warp_rows<HS>(out + size_t(b) * span.q_seq * C + h * HS, size_t(C), q_tile + (warp * F + f) * kWarpRows * ld,
                            o[f], inv_l, warp_row0 + f * kWarpRows, Tq);
    }
}

// ---------------------------------------------------------------------------------------------
// Backward (FlashAttention-2, Algorithm 2, as two atomic-free kernels): with P = exp(S - lse),
// dV = P^T dO, dP = dO V^T, dS = P * (dP - D) where D = rowsum(dO * O), dQ = dS K / sqrt(hs),
// dK = dS^T Q / sqrt(hs).

// dK, dV: grid (key blocks, NH, B). Each warp owns 16 keys and streams the query tiles from the first
// query that sees the key block (k0 - key_lead; causal: k0) up to the first query whose document
// starts after the block's last key, computing S^T = K Q^T and dP^T = V dO^T.
template <int HS, typename Grad>
static __global__ void __launch_bounds__(attention_tc_detail::kThreads, 2)
    attention_tc_backward_dkdv_kernel(Grad* dkv, int dkv_stride, const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                      const __nv_bfloat16* kv, const float* lse, const float* D, const int* doc_start,
                                      AttentionSpan span, int C, int NH, bool accumulate, float* qkv_bias_partials) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kQueries = kDkdvQueries<HS>;
    const int Tq = span.Tq, Tk = span.Tk, lead = span.key_lead;
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

    const size_t q_stride = 3 * size_t(C), kv_stride = size_t(span.kv_stride);
    const bf16* q_src = q + size_t(b) * span.q_seq * q_stride + h * HS;
    const bf16* k_src = kv + size_t(b) * span.kv_seq * kv_stride + h * HS;
    const bf16* dout_src = dout + size_t(b) * span.q_seq * C + h * HS;
    const float* lse_src = lse + (size_t(b) * NH + h) * span.q_seq;
    const float* d_src = D + (size_t(b) * NH + h) * span.q_seq;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    // The first query that may see key k (k - key_lead), within [0, Tq]: where the searches start.
    const auto first_query = [&](int key) { return min(max(key - lead, 0), Tq); };
    const int query_begin = first_query(k0);
    // Query tile `tile` (queries query_begin + tile * kQueries ..) into buffer tile % 2: q and dO by
    // cp.async (the caller commits), lse and D by plain loads (published by the next __syncthreads).
    auto load_query_tile = [&](int tile) {
        const int q0 = query_begin + tile * kQueries, buf = tile % 2;
        load_rows_async<HS, kQueries>(q_tiles + buf * kQueries * ld, q_src, q_stride, q0, Tq);
        load_rows_async<HS, kQueries>(dout_tiles + buf * kQueries * ld, dout_src, size_t(C), q0, Tq);
        const int r = int(threadIdx.x) % kQueries;
        if (int(threadIdx.x) < kQueries) lse_rows[buf * kQueries + r] = q0 + r < Tq ? lse_src[q0 + r] * kLog2e : 0.0f;
        else if (int(threadIdx.x) < 2 * kQueries) d_rows[buf * kQueries + r] = q0 + r < Tq ? d_src[q0 + r] : 0.0f;
    };
    load_rows_async<HS, kBlockRows>(k_tile, k_src, kv_stride, k0, Tk);
    load_rows_async<HS, kBlockRows>(v_tile, k_src + C, kv_stride, k0, Tk);
    load_query_tile(0);
    cp_async_commit();

    const float scale = 1.0f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;
    const int key0 = k0 + warp * kWarpRows + lane / 4;  // this lane's keys: key0 and key0 + 8
    // Where the queries that see each of them end (<= Tq; Tq without document masking).
    const int key_query_end[2] = {attention_detail::visible_query_end(doc_row, first_query(key0), key0, Tq),
                                  attention_detail::visible_query_end(doc_row, first_query(key0 + 8), key0 + 8, Tq)};
    // Tiles the masks do not cut skip the per-score tests: every query of the tile sees the warp's last
    // key (query + key_lead at or after it) and comes before the first end of visible queries among its keys.
    const int warp_key0 = k0 + warp * kWarpRows;
    const int warp_query_end = int(-warp_max(-float(min(key_query_end[0], key_query_end[1]))));  // the minimum
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    const int query_end = attention_detail::visible_query_end(doc_row, query_begin, min(k0 + kBlockRows, Tk) - 1, Tq);
    const int queries = max(query_end - query_begin, 0);  // none: a span's keys that no query sees
    const int query_tiles = (queries + kQueries - 1) / kQueries;
    for (int tile = 0; tile < query_tiles; ++tile) {
        if (tile + 1 < query_tiles) {
            load_query_tile(tile + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int q0 = query_begin + tile * kQueries, buf = tile % 2;
        const bf16* q_tile = q_tiles + buf * kQueries * ld;
        const bf16* dout_tile = dout_tiles + buf * kQueries * ld;

        // The tile's queries from the first that sees the warp's first key, in blocks of 16: the
        // products skip the earlier ones (masked: P = 0, dS = 0), a diagonal tile's first blocks.
        const int live_begin = live_begin_from(warp_key0 - lead, q0, kQueries);
        float p[kQueries / 8][4] = {}, ds[kQueries / 8][4] = {};  // transposed: [key][query]
        with_live_range<kQueries>(live_begin, kQueries, [&](int begin, int end) {
            mma_a_bt<kQueries, HS>(p, k_tile + warp * kWarpRows * ld, q_tile, ld, begin, end);
            mma_a_bt<kQueries, HS>(ds, v_tile + warp * kWarpRows * ld, dout_tile, ld, begin, end);
        });
        key_scores_to_grads<kQueries>(p, ds, q0 + lead < warp_key0 + kWarpRows - 1 || q0 + kQueries > warp_query_end, q0,
                                      key0 - lead, key_query_end, lse_rows + buf * kQueries, d_rows + buf * kQueries,
                                      scale_log2);
        with_live_range<kQueries>(live_begin, kQueries, [&](int begin, int end) {
            mma_p_b<HS, kQueries>(dv, p, dout_tile, ld, begin, end);
            mma_p_b<HS, kQueries>(dk, ds, q_tile, ld, begin, end);
        });
        __syncthreads();  // buffer `buf` is refilled by the next iteration's prefetch
    }
    // A span's keys that no query sees ran no loop iteration: order every thread's loads of the k and v
    // rows before a warp stages its results there.
    if (query_tiles == 0) {
        cp_async_wait<0>();
        __syncthreads();
    }
    const float dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
    Grad* head_dst = dkv + size_t(b) * span.kv_seq * dkv_stride + h * HS;
    store_warp_rows<HS>(head_dst, size_t(dkv_stride), k_tile + warp * kWarpRows * ld, dk, dk_scale, warp_key0, Tk,
                        accumulate);
    store_warp_rows<HS>(head_dst + C, size_t(dkv_stride), v_tile + warp * kWarpRows * ld, dv, dv_scale, warp_key0, Tk,
                        accumulate);
    // The k and v bias gradients' column sums of the block's rows: its chunk's partial row (3C: q, k, v).
    static_assert(2 * kQueries * ld * sizeof(bf16) >= kThreads * 8 * sizeof(float), "the query tiles hold the sums' area");
    if (qkv_bias_partials != nullptr)
        sum_staged_columns<HS, 2>(qkv_bias_partials + (size_t(b) * gridDim.x + blockIdx.x) * 3 * C + C + h * HS, size_t(C),
                                  k_tile, size_t(kBlockRows) * ld, reinterpret_cast<float*>(q_tiles), k0, Tk);
}

// dQ: grid (query blocks, NH, B). Each warp owns 16 queries and streams the key tiles the causal
// and document masks let them see, as the forward pass does.
template <int HS, typename Grad>
static __global__ void __launch_bounds__(attention_tc_detail::kThreads, 2)
    attention_tc_backward_dq_kernel(Grad* dq, int dq_stride, const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                    const __nv_bfloat16* kv, const float* lse, const float* D, const int* doc_start,
                                    AttentionSpan span, int C, int NH, bool accumulate, float* qkv_bias_partials) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kKeys = kDqKeys<HS>;
    const int Tq = span.Tq, Tk = span.Tk, lead = span.key_lead;
    const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBlockRows;  // longest causal rows first
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

    DYNAMIC_SHARED(bf16, smem);
    bf16* q_tile = smem;                             // [kBlockRows][ld]; at the end dQ
    bf16* dout_tile = q_tile + kBlockRows * ld;      // [kBlockRows][ld]
    bf16* k_tiles = dout_tile + kBlockRows * ld;     // [2][kKeys][ld]
    bf16* v_tiles = k_tiles + 2 * kKeys * ld;        // [2][kKeys][ld]

    const size_t q_stride = 3 * size_t(C), kv_stride = size_t(span.kv_stride);
    const bf16* q_src = q + size_t(b) * span.q_seq * q_stride + h * HS;
    const bf16* k_src = kv + size_t(b) * span.kv_seq * kv_stride + h * HS;
    const bf16* v_src = k_src + C;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * span.q_seq : nullptr;
    const int first_tile = attention_detail::first_key_tile(doc_row, q0, kKeys);
    const int key_tiles = attention_detail::span_key_tiles(q0, span, kBlockRows, kKeys);
    load_rows_async<HS, kBlockRows>(q_tile, q_src, q_stride, q0, Tq);
    load_rows_async<HS, kBlockRows>(dout_tile, dout + size_t(b) * span.q_seq * C + h * HS, size_t(C), q0, Tq);
    load_rows_async<HS, kKeys>(k_tiles + (first_tile % 2) * kKeys * ld, k_src, kv_stride, first_tile * kKeys, Tk);
    load_rows_async<HS, kKeys>(v_tiles + (first_tile % 2) * kKeys * ld, v_src, kv_stride, first_tile * kKeys, Tk);
    cp_async_commit();

    const float scale = 1.0f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;
    const int row0 = q0 + warp * kWarpRows + lane / 4;  // this lane's rows: row0 and row0 + 8
    float lse_log2[2], d_row[2];  // rows beyond Tq are masked below; their values do not matter
    int first_key[2];
    FULL_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        lse_log2[r] = row < Tq ? lse[(size_t(b) * NH + h) * span.q_seq + row] * kLog2e : 0.0f;
        d_row[r] = row < Tq ? D[(size_t(b) * NH + h) * span.q_seq + row] : 0.0f;
        first_key[r] = attention_detail::first_visible_key(doc_row, row, Tq);
    }
    // Tiles the masks do not cut skip the per-score tests, as in the forward pass; a warp with rows
    // past Tq always tests (those rows are masked whole).
    const int warp_row0 = q0 + warp * kWarpRows;
    const int warp_first_key = int(warp_max(float(max(first_key[0], first_key[1]))));
    const int warp_first_last_key = min(warp_row0 + lead, Tk - 1);  // the last key its first row sees
    const int warp_last_last_key = min(warp_row0 + kWarpRows - 1 + lead, Tk - 1);  // and its last row
    const bool warp_rows_in_range = warp_row0 + kWarpRows <= Tq;
    float dq_acc[HS / 8][4] = {};
    for (int kt = first_tile; kt < key_tiles; ++kt) {
        if (kt + 1 < key_tiles) {
            const int next = (kt + 1) % 2;
            load_rows_async<HS, kKeys>(k_tiles + next * kKeys * ld, k_src, kv_stride, (kt + 1) * kKeys, Tk);
            load_rows_async<HS, kKeys>(v_tiles + next * kKeys * ld, v_src, kv_stride, (kt + 1) * kKeys, Tk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* k_tile = k_tiles + (kt % 2) * kKeys * ld;
        const bf16* v_tile = v_tiles + (kt % 2) * kKeys * ld;

        // The tile's keys up to the warp's last row's last key, in blocks of 16: the products skip the
        // rest (masked: P = 0, dS = 0), on the diagonal tile all but the warp's own 16 keys and those before.
        const int live_end = live_end_through(warp_last_last_key, kt * kKeys, kKeys);
        float ds[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
        with_live_range<kKeys>(0, live_end, [&](int begin, int end) {
            mma_a_bt<kKeys, HS>(ds, q_tile + warp * kWarpRows * ld, k_tile, ld, begin, end);  // S first
            mma_a_bt<kKeys, HS>(dp, dout_tile + warp * kWarpRows * ld, v_tile, ld, begin, end);
        });
        if (!warp_rows_in_range || kt * kKeys + kKeys - 1 > warp_first_last_key || kt * kKeys < warp_first_key) {  // warp-uniform
            FULL_UNROLL
            for (int n = 0; n < kKeys / 8; ++n) {
                FULL_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const int key = kt * kKeys + 8 * n + 2 * (lane % 4) + (i & 1), row = row0 + 8 * (i / 2);
                    const bool visible = first_key[i / 2] <= key && key - lead <= row && key < Tk && row < Tq;
                    const float p = visible ? exp2_ftz(fmaf(ds[n][i], scale_log2, -lse_log2[i / 2])) : 0.0f;
                    ds[n][i] = p * (dp[n][i] - d_row[i / 2]);
                }
            }
        } else {
            FULL_UNROLL
            for (int n = 0; n < kKeys / 8; ++n) {
                FULL_UNROLL
                for (int i = 0; i < 4; ++i) {
                    const float p = exp2_ftz(fmaf(ds[n][i], scale_log2, -lse_log2[i / 2]));
                    ds[n][i] = p * (dp[n][i] - d_row[i / 2]);
                }
            }
        }
        with_live_range<kKeys>(0, live_end,
                               [&](int begin, int end) { mma_p_b<HS, kKeys>(dq_acc, ds, k_tile, ld, begin, end); });
        __syncthreads();
    }
    if (first_tile >= key_tiles) {  // queries that see no key of the span: as in the forward pass
        cp_async_wait<0>();
        __syncthreads();
    }
    const float dq_scale[2] = {scale, scale};
    store_warp_rows<HS>(dq + size_t(b) * span.q_seq * dq_stride + h * HS, size_t(dq_stride), q_tile + warp * kWarpRows * ld,
                        dq_acc, dq_scale, warp_row0, Tq, accumulate);
    // The q bias gradient's column sums of the block's rows, into its chunk's partial row (3C: q, k, v).
    static_assert(2 * kKeys * ld * sizeof(bf16) >= kThreads * 8 * sizeof(float), "the key tiles hold the sums' area");
    if (qkv_bias_partials != nullptr)
        sum_staged_columns<HS, 1>(qkv_bias_partials + (size_t(b) * gridDim.x + q0 / kBlockRows) * 3 * C + h * HS, size_t(C),
                                  q_tile, size_t(kBlockRows) * ld, reinterpret_cast<float*>(k_tiles), q0, Tq);
}

// Fused backward (attention_tc_backward with AttentionTcBackward::fused), causal self-attention with or
// without documents: blocks of 8 warps, one per (b, h), or for fused_grid_plan's split rows one per pair
// of key blocks. A block walks its 128-key blocks in order (a split head's group its two); each warp owns
// 16 keys and streams the query tiles that see them, as the dK/dV kernel does.
// Per tile pair it computes S^T and dP^T once, then dV and dK, then dQ's share dS K from dS^T staged in
// shared memory: 5 products where the split kernels run 7 (FlashAttention-2, Algorithm 2, whose dQ
// atomics are replaced here). Deterministic without atomics: a query tile's dQ is summed over the key
// blocks, in their order, in float rows of the scratch that only this block touches, each row always by
// the same thread. The first key block to reach a tile writes them (queries [0, touched_end) have been
// reached: every key block starts at its diagonal query tile, so the reached tiles are a prefix), and
// the diagonal block, the last that any of the tile's queries sees, adds its share, scales and writes
// dQ in bf16 (a split head's group leaves its sums to attention_tc_fused_dq_combine_kernel). The scratch
// needs no clearing. K and V are double-buffered up to hs 64, so the next key
// block's K, V and first query tile load during the current block's last tile pair.
// D = rowsum(dO * O) is computed here, not by the row-dot kernel: at a query tile's first visit its O
// rows load with q and dO (double-buffered too), the tile's first kQueries threads each sum one row in
// the row-dot kernel's order (attention_detail::row_dot: the same bits, so dK and dV stay the split
// kernels' exactly), publish it with one more barrier and write it to the scratch's D, which the later
// visits read back. That saves the row-dot kernel's pass over dO and O and its launch; O is read once
// here instead, while the kernel is bound by its products.
// With qkv_bias_partials (not null), the block also sums the columns of the bf16 gradients it writes,
// the qkv bias gradient's share of each 128-row chunk (a partial row of 3C floats per chunk, this head's
// q, k and v columns): dK and dV from their staged rows at the key block's end (sum_staged_columns), dQ
// from each warp's staged final rows, added per warp and column in shared memory over the key block's
// query tiles (the diagonal block is the last for every query in it, so a chunk's dQ rows are all final
// within its key block), then over the warps in order. No atomics: the same sums at every schedule.
// Why 128 keys (8 warps) a block: with 64 (4 warps, the dK/dV kernel's block) a d12 layer at B=64
// writes and reads back 3.0 GB of partial sums instead of 1.4 GB, 1.13 ms at the roofline's 2.68 TB/s
// against 1.15 ms of compute (1.41 GB: 0.53 ms); 256 keys (16 warps of ~250-register threads) would
// not fit the register file.
template <int HS, bool kSplitHeads>
static __global__ void __launch_bounds__(attention_tc_detail::kFusedThreads, attention_tc_detail::kFusedBlocksPerSm)
    attention_tc_backward_fused_kernel(__nv_bfloat16* dqkv, float* dq_partial, const __nv_bfloat16* dout,
                                       const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse, float* D,
                                       const int* doc_start, int T, int C, int NH, float* qkv_bias_partials,
                                       int first_row, float* split_dq_partial, float* split_D) {
    using namespace attention_tc_detail;
    constexpr int ld = kLd<HS>, kQueries = kDkdvQueries<HS>, kKeys = kFusedKeys, ld_ds = kFusedLdDs<HS>;
    constexpr int kDqCols = kFusedDqCols<HS>, kDqFrags = kQueries / kWarpRows, kKvBuffers = kFusedKvBuffers<HS>;
    // The block's head and key blocks (fused_grid_plan): grid (1, NH, rows) without kSplitHeads, the
    // head whole: k0 = 0, kKeys, ... below T. With it, grid (groups, NH, rows from first_row), group
    // blockIdx.x: k0 = group kKeys, then (n-1-group) kKeys (once if the same; fused_next_key_block),
    // with its own dQ partial sums and D rows (split_dq_partial, split_D: set split_set of each), its dQ
    // left to the combining kernel. (The whole heads' instantiation keeps the loop it always had: a head
    // index divided out of blockIdx.x, or the loop's stride and end in registers, spilled it on sm_90.)
    const int h = int(blockIdx.y), b = (kSplitHeads ? first_row : 0) + int(blockIdx.z);
    const int group = kSplitHeads ? int(blockIdx.x) : 0;
    const int split_set = (int(blockIdx.z) * NH + h) * int(gridDim.x) + group;
    const int first_k0 = group * kKeys;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

    DYNAMIC_SHARED(bf16, smem);
    bf16* k_tiles = smem;                                 // [kKvBuffers][kKeys][ld]; at a key block's end its dK
    bf16* v_tiles = k_tiles + kKvBuffers * kKeys * ld;    // [kKvBuffers][kKeys][ld]; at a key block's end its dV
    bf16* q_tiles = v_tiles + kKvBuffers * kKeys * ld;    // [2][kQueries][ld]
    bf16* dout_tiles = q_tiles + 2 * kQueries * ld;  // [2][kQueries][ld]
    bf16* out_tiles = dout_tiles + 2 * kQueries * ld;  // [2][kQueries][ld]: O, loaded for D at a tile's first visit
    bf16* ds_tile = out_tiles + 2 * kQueries * ld;   // [kKeys][ld_ds]: the tile pair's dS^T, bf16
    bf16* dq_rows = ds_tile + kKeys * ld_ds;         // [kFusedWarps][kWarpRows][kLd<kDqCols>]: final dQ, staged
    float* lse_rows = reinterpret_cast<float*>(dq_rows + kFusedWarps * kWarpRows * kLd<kDqCols>);  // [2][kQueries]
    float* d_rows = lse_rows + 2 * kQueries;                                                       // [2][kQueries]
    int* warp_live = reinterpret_cast<int*>(d_rows + 2 * kQueries);  // [kFusedWarps]: the tile pair reaches its keys
    float* dq_column_sums = reinterpret_cast<float*>(warp_live + kFusedWarps);  // [kFusedWarps][kDqCols]: qkv bias sums
    static_assert(size_t(kKeys) * ld_ds * sizeof(bf16) >= kFusedThreads * 8 * sizeof(float), "dS^T holds the sums' area");

    const size_t stride = 3 * size_t(C);
    const bf16* q_src = qkv + size_t(b) * T * stride + h * HS;
    const bf16* k_src = q_src + C;
    const bf16* dout_src = dout + size_t(b) * T * C + h * HS;
    const bf16* out_src = out + size_t(b) * T * C + h * HS;
    const float* lse_src = lse + (size_t(b) * NH + h) * T;
    float* d_src = kSplitHeads ? split_D + size_t(split_set) * T : D + (size_t(b) * NH + h) * T;
    bf16* grad_dst = dqkv + size_t(b) * T * stride + h * HS;
    const int* doc_row = doc_start != nullptr ? doc_start + size_t(b) * T : nullptr;
    // This warp's share of each tile's dQ: queries [dq_row, dq_row + 16) of the tile, columns
    // [dq_col, dq_col + kDqCols); its partial sums at dq_sums (rows HS floats apart).
    const int dq_row = (warp % kDqFrags) * kWarpRows, dq_col = (warp / kDqFrags) * kDqCols;
    float* dq_sums = (kSplitHeads ? split_dq_partial + size_t(split_set) * T * HS
                                  : dq_partial + (size_t(b) * NH + h) * T * HS) + dq_col;
    bf16* dq_stage = dq_rows + warp * kWarpRows * kLd<kDqCols>;

    const float scale = 1.0f / sqrtf(float(HS)), scale_log2 = scale * kLog2e;
    const float dq_scale[2] = {scale, scale}, dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
    // The query tile from q0 into buffer buf (q and dO by cp.async, joining the caller's group, and at
    // its first visit O; lse by plain loads, published by the next __syncthreads), and key block k0's K
    // and V into buffer kv_buf. D = rowsum(dO * O) is this kernel's: computed at a tile's first visit
    // (from its staged dO and O, rowdot's order, attention_detail::row_dot) and written to the scratch;
    // at later visits read back by load_query_d once that visit's first-visit writes are behind a barrier.
    auto load_query_tile = [&](int q0, int buf, bool first_visit) {
        load_rows_async<HS, kQueries, kFusedThreads>(q_tiles + buf * kQueries * ld, q_src, stride, q0, T);
        load_rows_async<HS, kQueries, kFusedThreads>(dout_tiles + buf * kQueries * ld, dout_src, size_t(C), q0, T);
        if (first_visit) load_rows_async<HS, kQueries, kFusedThreads>(out_tiles + buf * kQueries * ld, out_src, size_t(C), q0, T);
        const int r = int(threadIdx.x) % kQueries;
        if (int(threadIdx.x) < kQueries) lse_rows[buf * kQueries + r] = q0 + r < T ? lse_src[q0 + r] * kLog2e : 0.0f;
    };
    auto load_query_d = [&](int q0, int buf) {
        const int r = int(threadIdx.x) - kQueries;
        if (r >= 0 && r < kQueries) d_rows[buf * kQueries + r] = q0 + r < T ? d_src[q0 + r] : 0.0f;
    };
    auto load_key_block = [&](int k0, int kv_buf) {
        load_rows_async<HS, kKeys, kFusedThreads>(k_tiles + kv_buf * kKeys * ld, k_src, stride, k0, T);
        load_rows_async<HS, kKeys, kFusedThreads>(v_tiles + kv_buf * kKeys * ld, k_src + C, stride, k0, T);
    };
    load_key_block(first_k0, 0);
    load_query_tile(first_k0, 0, true);
    cp_async_commit();
    for (int i = int(threadIdx.x); i < kFusedWarps * kDqCols; i += kFusedThreads) dq_column_sums[i] = 0.0f;
    int touched_end = 0;  // queries with partial sums in the scratch: [first_k0, touched_end), block-uniform
    int tiles_before = 0;  // query tiles of the earlier key blocks: the query buffers alternate across blocks
    for (int k0 = first_k0, kv_buf = 0; k0 < T;
         k0 = fused_next_key_block<kSplitHeads>(k0, T), kv_buf = (kv_buf + 1) % kKvBuffers) {
        if (kKvBuffers == 1 && k0 > first_k0) {  // one K/V buffer: loaded once the previous block is done with it
            load_key_block(k0, 0);
            load_query_tile(k0, tiles_before % 2, k0 >= touched_end);
            if (k0 < touched_end) load_query_d(k0, tiles_before % 2);
            cp_async_commit();
        }
        bf16* k_tile = k_tiles + kv_buf * kKeys * ld;
        bf16* v_tile = v_tiles + kv_buf * kKeys * ld;

        const int key0 = k0 + warp * kWarpRows + lane / 4;  // this lane's keys: key0 and key0 + 8
        const int key_query_end[2] = {attention_detail::visible_query_end(doc_row, min(key0, T), key0, T),
                                      attention_detail::visible_query_end(doc_row, min(key0 + 8, T), key0 + 8, T)};
        const int warp_key0 = k0 + warp * kWarpRows;
        const int warp_query_end = int(-warp_max(-float(min(key_query_end[0], key_query_end[1]))));  // the minimum
        const int warp_query_last_end = int(warp_max(float(max(key_query_end[0], key_query_end[1]))));
        const int query_end = attention_detail::visible_query_end(doc_row, k0, min(k0 + kKeys, T) - 1, T);
        const int query_tiles = (query_end - k0 + kQueries - 1) / kQueries;  // >= 1: key k0 sees query k0
        float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
        for (int tile = 0; tile < query_tiles; ++tile) {
            const int q0 = k0 + tile * kQueries, buf = (tiles_before + tile) % 2;
            const bool first = q0 >= touched_end;  // the tile's first visit (block-uniform)
            // Prefetch this block's next query tile, or at its last (two K/V buffers) the next key
            // block's K, V and first query tile: the other K/V buffers were last read, and staged, before
            // the barrier that ended the previous key block. The next tile's first visit is now if no
            // earlier block and no tile of this one reached it (for the next block's, touched_end as this
            // block leaves it).
            const bool in_block = tile + 1 < query_tiles;
            const bool prefetch = in_block || (kKvBuffers == 2 && fused_next_key_block<kSplitHeads>(k0, T) < T);
            const int next_q0 = in_block ? q0 + kQueries : fused_next_key_block<kSplitHeads>(k0, T);
            const bool next_first = next_q0 >= (in_block ? touched_end : k0 + query_tiles * kQueries);
            if (prefetch) {
                if (!in_block) load_key_block(fused_next_key_block<kSplitHeads>(k0, T), kv_buf ^ 1);
                load_query_tile(next_q0, buf ^ 1, next_first);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const bf16* q_tile = q_tiles + buf * kQueries * ld;
            const bf16* dout_tile = dout_tiles + buf * kQueries * ld;
            if (first) {  // D of the tile's queries: for this and every later visit
                const int r = int(threadIdx.x);
                if (r < kQueries) {
                    const float d = q0 + r < T ? attention_detail::row_dot(dout_tile + r * ld, out_tiles + buf * kQueries * ld + r * ld, HS)
                                               : 0.0f;
                    d_rows[buf * kQueries + r] = d;
                    if (q0 + r < T) d_src[q0 + r] = d;
                }
                __syncthreads();  // the tile's D rows are in
            }

            // A warp whose keys no query of the tile sees (all after the tile's last query, past T, or
            // past the last query of their documents) skips the pair: the 64 queries before a block's
            // second half, and the split kernels' skipped tiles (NaN in another document stays out).
            const bool live = warp_key0 < T && q0 + kQueries > warp_key0 && q0 < warp_query_last_end;  // warp-uniform
            if (lane == 0) warp_live[warp] = live;
            if (live) {
                // The tile's queries from the warp's first key on, in blocks of 16: the products skip the
                // earlier ones (masked: P = 0, dS = 0, still stored to dS^T for dQ), a diagonal tile's first.
                const int live_begin = live_begin_from(warp_key0, q0, kQueries);
                float p[kQueries / 8][4] = {}, ds[kQueries / 8][4] = {};  // transposed: [key][query]
                with_live_range<kQueries>(live_begin, kQueries, [&](int begin, int end) {
                    mma_a_bt<kQueries, HS>(p, k_tile + warp * kWarpRows * ld, q_tile, ld, begin, end);
                    mma_a_bt<kQueries, HS>(ds, v_tile + warp * kWarpRows * ld, dout_tile, ld, begin, end);
                });
                key_scores_to_grads<kQueries>(p, ds, q0 < warp_key0 + kWarpRows - 1 || q0 + kQueries > warp_query_end, q0,
                                              key0, key_query_end, lse_rows + buf * kQueries, d_rows + buf * kQueries,
                                              scale_log2);
                // dS^T to shared memory for dQ, rounded to bf16 as the dK product rounds it.
                FULL_UNROLL
                for (int n = 0; n < kQueries / 8; ++n) {
                    bf16* row = ds_tile + (warp * kWarpRows + lane / 4) * ld_ds + 8 * n + 2 * (lane % 4);
                    *reinterpret_cast<uint32_t*>(row) = pack_bf16x2(ds[n][0], ds[n][1]);
                    *reinterpret_cast<uint32_t*>(row + 8 * ld_ds) = pack_bf16x2(ds[n][2], ds[n][3]);
                }
                with_live_range<kQueries>(live_begin, kQueries, [&](int begin, int end) {
                    mma_p_b<HS, kQueries>(dv, p, dout_tile, ld, begin, end);
                    mma_p_b<HS, kQueries>(dk, ds, q_tile, ld, begin, end);
                });
            }
            __syncthreads();  // every live warp's dS^T rows are in

            // The live warps' keys (16-key blocks) up to this warp's last dQ query. The product's k blocks
            // already test `live` one by one, so the range adds no branch of its own (no with_live_range).
            float dq[kDqCols / 8][4] = {};
            mma_at_b<kDqCols, kKeys>(dq, ds_tile + dq_row, ld_ds, k_tile + dq_col, ld, warp_live, 0,
                                     live_end_through(q0 + dq_row + kWarpRows - 1, k0, kKeys));
            // The diagonal block of a whole head: no later key block sees these queries.
            const bool last = !kSplitHeads && q0 + kQueries <= k0 + kKeys;
            if (last) {
                if (!first) add_warp_rows<kDqCols>(dq, dq_sums, size_t(HS), q0 + dq_row, T);
                store_warp_rows<kDqCols>(grad_dst + dq_col, stride, dq_stage, dq, dq_scale, q0 + dq_row, T);
                // The bias sums of the rows just written, still staged (store_warp_rows synced the warp).
                if (qkv_bias_partials != nullptr)
                    for (int c = lane; c < kDqCols; c += 32) {
                        float sum = 0.0f;
                        for (int r = 0; r < min(kWarpRows, T - (q0 + dq_row)); ++r) sum += to_float(dq_stage[r * kLd<kDqCols> + c]);
                        dq_column_sums[warp * kDqCols + c] += sum;
                    }
            } else {
                const float unscaled[2] = {1.0f, 1.0f};
                store_warp_rows<kDqCols>(dq_sums, size_t(HS), nullptr, dq, unscaled, q0 + dq_row, T, !first);
            }
            // The next tile's D, if an earlier visit (perhaps this one) computed it: the writes are behind
            // the barrier after them, and this one publishes the rows.
            if (prefetch && !next_first) load_query_d(next_q0, buf ^ 1);
            __syncthreads();  // buffer `buf` is refilled by the next prefetch, ds_tile and k_tile rewritten
        }
        touched_end = k0 + query_tiles * kQueries;  // never less than before: a later key block's queries end no earlier
        tiles_before += query_tiles;
        store_warp_rows<HS>(grad_dst + C, stride, k_tile + warp * kWarpRows * ld, dk, dk_scale, warp_key0, T);
        store_warp_rows<HS>(grad_dst + 2 * C, stride, v_tile + warp * kWarpRows * ld, dv, dv_scale, warp_key0, T);
        if (qkv_bias_partials != nullptr) {  // this chunk's partial row (3C: q, k, v); dS^T is free for the area
            float* chunk_row = qkv_bias_partials + (size_t(b) * ((T + kKeys - 1) / kKeys) + k0 / kKeys) * 3 * C;
            sum_staged_columns<HS, 2, kKeys, kFusedThreads>(chunk_row + C + h * HS, size_t(C), k_tile, size_t(v_tile - k_tile),
                                                            reinterpret_cast<float*>(ds_tile), k0, T);
            // Past its barriers every warp's dQ sums of the chunk are in: the query fragments' in order.
            for (int c = int(threadIdx.x); c < HS; c += kFusedThreads) {
                float sum = 0.0f;
                for (int f = 0; f < kDqFrags; ++f) {
                    float& part = dq_column_sums[((c / kDqCols) * kDqFrags + f) * kDqCols + c % kDqCols];
                    sum += part;
                    part = 0.0f;  // for the next key block's queries
                }
                if (!kSplitHeads) chunk_row[h * HS + c] = sum;  // a split head's: the combining kernel's
            }
        }
        __syncthreads();  // the staged dK, dV rows are read before K and V are loaded into these buffers again
    }
}

// The split heads' dQ (fused_grid_plan), after the fused kernel: grid (chunks of kFusedKeys rows, NH,
// split rows of the batch, from first_row). Each row's float partial sums from the groups that reached it
// (group g's walk starts at key block g, so rows from g * kFusedKeys on) are added in group order, scaled
// by 1/sqrt(hs), rounded to bf16 and written to dqkv's q columns; a thread takes 8 columns (16-byte loads
// and stores) of every kRowLanes-th row of the chunk. With qkv_bias_partials, the column sums of the rounded rows, per
// thread in row order, then over the threads in order, into the chunk's partial row (3C: the fused
// kernel wrote these heads' k and v parts and left the q part). No atomics: the same bits at every schedule.
template <int HS>
static __global__ void __launch_bounds__(attention_tc_detail::kCombineThreads)
    attention_tc_fused_dq_combine_kernel(__nv_bfloat16* dqkv, const float* split_dq_partial, int first_row, int groups,
                                         int T, int C, int NH, float* qkv_bias_partials) {
    using namespace attention_tc_detail;
    constexpr int kColChunks = HS / 8, kRowLanes = kCombineThreads / kColChunks;
    __shared__ float column_sums[kRowLanes][HS];
    const int chunk = int(blockIdx.x), h = int(blockIdx.y), b = first_row + int(blockIdx.z);
    const int split_head = int(blockIdx.z) * NH + h;
    const int col = (int(threadIdx.x) % kColChunks) * 8, row_lane = int(threadIdx.x) / kColChunks;
    const int reached = min(groups, chunk + 1);  // block-uniform
    const float scale = 1.0f / sqrtf(float(HS));
    const float* partial = split_dq_partial + size_t(split_head) * groups * T * HS + col;
    bf16* dq_dst = dqkv + size_t(b) * T * 3 * C + h * HS + col;
    float sums[8] = {};
    for (int t = chunk * kFusedKeys + row_lane; t < min(T, (chunk + 1) * kFusedKeys); t += kRowLanes) {
        float dq[8] = {};
        ROLLED_LOOP
        for (int g = 0; g < reached; ++g) {
            const float* row = partial + (size_t(g) * T + t) * HS;
            const Packed128<float> lo = load128(row), hi = load128(row + 4);
            FULL_UNROLL
            for (int k = 0; k < 4; ++k) dq[k] += lo[k], dq[4 + k] += hi[k];
        }
        FULL_UNROLL
        for (int k = 0; k < 8; ++k) dq[k] *= scale;
        const Packed128<bf16> rounded = pack_floats<bf16>(dq);
        store128(dq_dst + size_t(t) * 3 * C, rounded);
        float written[8];
        unpack_floats(written, rounded);
        FULL_UNROLL
        for (int k = 0; k < 8; ++k) sums[k] += written[k];
    }
    if (qkv_bias_partials == nullptr) return;  // block-uniform
    FULL_UNROLL
    for (int k = 0; k < 8; ++k) column_sums[row_lane][col + k] = sums[k];
    __syncthreads();
    for (int c = int(threadIdx.x); c < HS; c += kCombineThreads) {
        float sum = 0.0f;
        for (int lane = 0; lane < kRowLanes; ++lane) sum += column_sums[lane][c];
        qkv_bias_partials[(size_t(b) * gridDim.x + chunk) * 3 * C + h * HS + c] = sum;  // chunks: gridDim.x
    }
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

// The causal backward's kernels (train_gpt's --attention-backward): split, the dK/dV and dQ kernels
// (7 products per tile pair, S and dP computed twice), or fused, one kernel (5 products) that sums dQ
// in float scratch rows. Both deterministic.
enum class AttentionTcBackward { split, fused };

// The causal backward's scratch: D (B, NH, T), and for the fused kernel dQ's float partial sums
// (B, NH, T, hs) after it, 16-byte aligned; then, with the qkv bias sums, their partial rows
// (attention_tc_qkv_bias_chunks(B, T, how) rows of 3C floats, one per block of rows: the split kernels'
// 64, the fused kernel's 128 keys) at attention_tc_qkv_bias_offset.
inline size_t attention_tc_dq_sums_offset(int B, int T, int NH) { return (size_t(B) * T * NH + 3) / 4 * 4; }
inline int attention_tc_qkv_bias_chunks(int B, int T, AttentionTcBackward how = AttentionTcBackward::split) {
    return B * int(ceil_div(T, how == AttentionTcBackward::fused ? attention_tc_detail::kFusedKeys : attention_tc_detail::kBlockRows));
}
inline size_t attention_tc_qkv_bias_offset(int B, int T, int C, int NH, AttentionTcBackward how) {
    return attention_tc_dq_sums_offset(B, T, NH) + (how == AttentionTcBackward::fused ? size_t(B) * T * C : 0);
}
// The fused kernel's split heads (attention_tc_detail::fused_grid_plan) keep their own D rows and dQ sums
// (FusedGrid::split_sets), after the rest, 16-byte aligned. Sized for the plan without documents, the
// most any call of these sizes needs.
inline size_t attention_tc_fused_split_offset(int B, int T, int C, int NH, bool qkv_bias_sums) {
    const AttentionTcBackward fused = AttentionTcBackward::fused;
    const size_t before = qkv_bias_sums ? attention_tc_qkv_bias_offset(B, T, C, NH, fused) +
                                              size_t(attention_tc_qkv_bias_chunks(B, T, fused)) * 3 * C
                                        : attention_tc_qkv_bias_offset(B, T, C, NH, fused);
    return (before + 3) / 4 * 4;
}
inline size_t attention_tc_fused_split_floats(int B, int T, int C, int NH, int wave_slots) {
    const attention_tc_detail::FusedGrid g = attention_tc_detail::fused_grid_plan(B, NH, T, false, wave_slots);
    return g.split_d_floats(NH, T) + g.split_sets(NH) * T * size_t(C / NH);
}
// fused_wave_slots: as attention_tc_backward's.
inline size_t attention_tc_backward_scratch_floats(int B, int T, int C, int NH,
                                                   AttentionTcBackward how = AttentionTcBackward::split,
                                                   bool qkv_bias_sums = false,
                                                   int fused_wave_slots = attention_tc_detail::kFusedWaveSlots) {
    if (how == AttentionTcBackward::fused)
        return attention_tc_fused_split_offset(B, T, C, NH, qkv_bias_sums) +
               attention_tc_fused_split_floats(B, T, C, NH, fused_wave_slots);
    if (qkv_bias_sums)
        return attention_tc_qkv_bias_offset(B, T, C, NH, how) + size_t(attention_tc_qkv_bias_chunks(B, T, how)) * 3 * C;
    return size_t(B) * T * NH;
}

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

// The (query, key) pairs each kernel's products take per (b, h) over a span (causal: causal_span(T,
// C)), as its warps skip them: the tiles the masks do not hide entirely, and of a tile cut by the causal
// mask the live range of 16-blocks (live_end_through, live_begin_from; kernels/tensor_core.cuh) that
// the warp passes its products. With documents, upper bounds (what is skipped depends on the data).
// The query kernels (forward, dQ): each warp's rows times the keys up to its last row's last key, in its
// block's key tiles (warps past Tq too: they compute, and store nothing). The forward's warps skip the
// tiles past that key; the dQ kernel's run them with an empty live range: no pairs either way.
inline double query_row_keys(const AttentionSpan& s, int tile, int warp_rows, int block_rows) {
    double pairs = 0;
    for (int q0 = 0; q0 < s.Tq; q0 += block_rows) {
        const int key_tiles = attention_detail::span_key_tiles(q0, s, block_rows, tile);
        for (int r0 = q0; r0 < q0 + block_rows; r0 += warp_rows) {
            const int last_key = std::min(r0 + warp_rows - 1 + s.key_lead, s.Tk - 1);
            for (int kt = 0; kt < key_tiles && kt * tile <= last_key; ++kt)
                pairs += double(warp_rows) * live_end_through(last_key, kt * tile, tile);
        }
    }
    return pairs;
}
// dK/dV: each warp's 16 keys times the queries of the block's query tiles from the first that sees its
// first key.
inline double dkdv_key_queries(const AttentionSpan& s, int tile) {
    double pairs = 0;
    for (int k0 = 0; k0 < s.Tk; k0 += kBlockRows) {
        const int query_begin = std::min(std::max(k0 - s.key_lead, 0), s.Tq);
        for (int q0 = query_begin; q0 < s.Tq; q0 += tile)
            for (int key = k0; key < k0 + kBlockRows; key += kWarpRows)
                pairs += double(kWarpRows) * (tile - live_begin_from(key - s.key_lead, q0, tile));
    }
    return pairs;
}

// Fused, per (b, h): the tile pairs of kFusedKeys keys by kDkdvQueries queries, and the products'
// (query, key) pairs: each live warp's 16 keys times the tile's queries from its first key on (S^T,
// dP^T, dV, dK), and each 16-query dQ fragment times the live warps' keys up to its last query (causal,
// documents not counted).
template <int HS> double fused_key_block_query_tiles(int T) {
    double pairs = 0;
    for (int k0 = 0; k0 < T; k0 += kFusedKeys) pairs += ceil_div(T - k0, kDkdvQueries<HS>);
    return pairs;
}
struct FusedProductPairs {
    double per_warp = 0, dq = 0;  // (query, key) pairs of the 4 per-warp products, and of dQ's
};
template <int HS> FusedProductPairs fused_product_pairs(int T) {
    constexpr int kQueries = kDkdvQueries<HS>;
    FusedProductPairs pairs;
    for (int k0 = 0; k0 < T; k0 += kFusedKeys)
        for (int q0 = k0; q0 < T; q0 += kQueries)
            for (int key = k0; key < std::min(T, k0 + kFusedKeys); key += kWarpRows) {
                if (key >= q0 + kQueries) continue;  // the warp skips the pair
                pairs.per_warp += double(kWarpRows) * (kQueries - live_begin_from(key, q0, kQueries));
                for (int row = q0; row < q0 + kQueries; row += kWarpRows)
                    pairs.dq += key - k0 < live_end_through(row + kWarpRows - 1, k0, kFusedKeys) ? double(kWarpRows) * kWarpRows : 0.0;
            }
    return pairs;
}

inline void check_span(const char* launcher, const AttentionSpan& span, int B, int C, int NH) {
    require_supported(launcher, attention_tc_requirements(B, std::max(span.Tq, span.Tk), C, NH));
    require_supported(launcher, attention_detail::span_problem(span));
}

// The element type X is a template parameter so that the FP32 build never instantiates the bf16
// kernels (the launchers refuse it before getting here).
template <typename X, typename Out>
void forward(Out* out, float* lse, const X* q, const X* kv, AttentionSpan span, int B, int C, int NH, cudaStream_t stream,
             const int* doc_start) {
    if constexpr (std::is_same_v<X, bf16>) {
        const int hs = C / NH;
        const double BNH = double(B) * NH, bf = sizeof(bf16);
        const double q_elems = double(B) * span.Tq * C, k_elems = double(B) * span.Tk * C;
        dispatch_head_size(hs, [&](auto hs_constant) {
            constexpr int HS = decltype(hs_constant)::value;
            constexpr auto kernel = attention_tc_forward_kernel<HS, Out>;
            constexpr size_t smem = forward_smem_bytes<HS>();
            attention_detail::allow_smem<kernel>(smem);
            // Matmul FLOPs executed: S = Q K^T and P V, 2 * hs each per (row, key) pair computed.
            const double pairs = query_row_keys(span, kForwardKeys<HS>, kForwardFrags<HS> * kWarpRows, kForwardRows<HS>);
            const KernelCost cost{BNH * pairs * 4.0 * HS,
                                  (q_elems + 2 * k_elems) * bf + q_elems * sizeof(Out) + BNH * span.Tq * sizeof(float),
                                  WorkKind::tensor_cores};
            launch<kernel>(cost, dim3(ceil_div(span.Tq, kForwardRows<HS>), NH, B), dim3(kThreads), smem, stream, out, lse,
                           q, kv, doc_start, span, C, NH);
        });
    }
}

template <typename X, typename Grad>
void backward(Grad* dq, int dq_stride, Grad* dkv, int dkv_stride, const X* dout, const X* q, const X* kv, const float* lse,
              const float* D, AttentionSpan span, int B, int C, int NH, cudaStream_t stream, const int* doc_start,
              bool accumulate, cudaEvent_t key_gradients_done, float* qkv_bias_partials) {
    // The bias sums read the bf16 rows the kernels stage in shared memory before writing them (float
    // gradients are stored from the registers), and an accumulated gradient is not the rows' alone; their
    // partial rows are laid out for dqkv's (B, T, 3C): one query and key block per 64 rows.
    if (qkv_bias_partials != nullptr) {
        require_supported("attention_tc_backward", !std::is_same_v<Grad, bf16> || accumulate
                                                       ? "attention: the qkv bias sums need bf16 gradients written, not accumulated"
                                                       : "");
        require_supported("attention_tc_backward",
                          span.Tq != span.Tk || dq_stride != 3 * C || dkv_stride != 3 * C || dkv != dq + C
                              ? "attention: the qkv bias sums need dqkv's rows (B, T, 3C): as many queries as keys"
                              : "");
    }
    if constexpr (std::is_same_v<X, bf16>) {
        const int hs = C / NH;
        const double BNH = double(B) * NH, bf = sizeof(bf16), G = sizeof(Grad) * (accumulate ? 2.0 : 1.0);
        const double q_elems = double(B) * span.Tq * C, k_elems = double(B) * span.Tk * C;
        const double row_floats = BNH * span.Tq * sizeof(float);  // one of lse or D
        dispatch_head_size(hs, [&](auto hs_constant) {
            constexpr int HS = decltype(hs_constant)::value;
            constexpr auto dkdv_kernel = attention_tc_backward_dkdv_kernel<HS, Grad>;
            constexpr auto dq_kernel = attention_tc_backward_dq_kernel<HS, Grad>;
            constexpr size_t dkdv_smem = dkdv_smem_bytes<HS>(), dq_smem = dq_smem_bytes<HS>();
            attention_detail::allow_smem<dkdv_kernel>(dkdv_smem);
            attention_detail::allow_smem<dq_kernel>(dq_smem);
            // Each reads q, k, v, dO, lse and D once; dK/dV computes S^T, dP^T, dV and dK (4
            // products), dQ computes S, dP and dQ (3), 2 * hs FLOPs each per (query, key) pair computed;
            // each writes its gradients (and reads them once more when accumulating).
            // With document masking these are upper bounds (the tiles skipped depend on the data).
            // With the qkv bias sums, each block writes its rows' column sums (a float per column).
            const double reads = (2 * q_elems + 2 * k_elems) * bf + 2 * row_floats;
            const double sums = qkv_bias_partials ? sizeof(float) : 0.0;
            const KernelCost dkdv_cost{BNH * dkdv_key_queries(span, kDkdvQueries<HS>) * 8.0 * HS,
                                       reads + 2 * k_elems * G + 2 * k_elems / kBlockRows * sums, WorkKind::tensor_cores};
            const KernelCost dq_cost{BNH * query_row_keys(span, kDqKeys<HS>, kWarpRows, kBlockRows) * 6.0 * HS,
                                     reads + q_elems * G + q_elems / kBlockRows * sums, WorkKind::tensor_cores};
            launch<dkdv_kernel>(dkdv_cost, dim3(ceil_div(span.Tk, kBlockRows), NH, B), dim3(kThreads), dkdv_smem, stream,
                                dkv, dkv_stride, dout, q, kv, lse, D, doc_start, span, C, NH, accumulate, qkv_bias_partials);
            if (key_gradients_done) CUDA_CHECK(cudaEventRecord(key_gradients_done, stream));
            launch<dq_kernel>(dq_cost, dim3(ceil_div(span.Tq, kBlockRows), NH, B), dim3(kThreads), dq_smem, stream, dq,
                              dq_stride, dout, q, kv, lse, D, doc_start, span, C, NH, accumulate, qkv_bias_partials);
        });
    }
}

template <typename X>
void backward_fused(X* dqkv, float* scratch, const X* dout, const X* qkv, const X* out, const float* lse, int B, int T, int C,
                    int NH, cudaStream_t stream, const int* doc_start, float* qkv_bias_partials, float* split_scratch,
                    int wave_slots) {
    if constexpr (std::is_same_v<X, bf16>) {
        const int hs = C / NH;
        float* D = scratch;  // written by the kernel
        float* dq_sums = scratch + attention_tc_dq_sums_offset(B, T, NH);
        const FusedGrid grid = fused_grid_plan(B, NH, T, doc_start != nullptr, wave_slots);
        float* split_D = split_scratch;
        float* split_dq_sums = split_scratch + grid.split_d_floats(NH, T);
        dispatch_head_size(hs, [&](auto hs_constant) {
            constexpr int HS = decltype(hs_constant)::value;
            constexpr auto whole_kernel = attention_tc_backward_fused_kernel<HS, false>;
            constexpr auto split_kernel = attention_tc_backward_fused_kernel<HS, true>;
            constexpr size_t smem = fused_smem_bytes<HS>();
            attention_detail::allow_smem<whole_kernel>(smem);
            attention_detail::allow_smem<split_kernel>(smem);
            // 2 * hs FLOPs per (query, key) pair of each product (fused_product_pairs). Bytes: q, k, v,
            // dO, O, lse and D read, D, dq, dk, dv written, and dQ's float partial sums written and read
            // back at every tile pair but a query tile's first (written only) and its last (read only): an
            // upper bound on what reaches memory, as the sums of the tiles a block revisits soonest stay in
            // L2. With the qkv bias sums, a partial row of 3C floats per 128-row chunk. Each launch its
            // heads' share; a split head's groups do its tile pairs between them.
            const double elems = double(T) * HS, pairs = fused_key_block_query_tiles<HS>(T);
            const double tile_floats = double(kDkdvQueries<HS>) * HS;
            const FusedProductPairs products = fused_product_pairs<HS>(T);
            const auto cost_of = [&](int heads) {
                const double H = heads;
                return KernelCost{H * (4 * products.per_warp + products.dq) * 2.0 * HS,
                                  H * (8 * elems * sizeof(bf16) + 3.0 * T * sizeof(float) +
                                       (2 * pairs - 2.0 * ceil_div(T, kDkdvQueries<HS>)) * tile_floats * sizeof(float) +
                                       (qkv_bias_partials ? double(ceil_div(T, kFusedKeys)) * 3 * HS * sizeof(float) : 0.0)),
                                  WorkKind::tensor_cores, doc_start ? 0 : kFusedBlocksPerSm};
            };
            if (grid.whole_rows > 0)
                launch<whole_kernel>(cost_of(grid.whole_rows * NH), dim3(1, NH, grid.whole_rows), dim3(kFusedThreads), smem,
                                     stream, dqkv, dq_sums, dout, qkv, out, lse, D, doc_start, T, C, NH, qkv_bias_partials, 0,
                                     split_dq_sums, split_D);
            if (grid.split_rows == 0) return;
            launch<split_kernel>(cost_of(grid.split_rows * NH), dim3(grid.groups, NH, grid.split_rows), dim3(kFusedThreads),
                                 smem, stream, dqkv, dq_sums, dout, qkv, out, lse, D, doc_start, T, C, NH, qkv_bias_partials,
                                 grid.whole_rows, split_dq_sums, split_D);
            // The combining pass: each split row's groups' sums read (group g from chunk g on), dQ written.
            const int chunks = int(ceil_div(T, kFusedKeys));
            double reached_rows = 0;
            for (int c = 0; c < chunks; ++c)
                reached_rows += double(std::min(grid.groups, c + 1)) * (std::min(T, (c + 1) * kFusedKeys) - c * kFusedKeys);
            const double heads = double(grid.split_rows) * NH;
            const KernelCost combine_cost{heads * reached_rows * HS,
                                          heads * (reached_rows * HS * sizeof(float) + double(T) * HS * sizeof(bf16) +
                                                   (qkv_bias_partials ? double(chunks) * HS * sizeof(float) : 0.0))};
            launch<attention_tc_fused_dq_combine_kernel<HS>>(combine_cost, dim3(chunks, NH, grid.split_rows), dim3(kCombineThreads),
                                                             0, stream, dqkv, split_dq_sums, grid.whole_rows, grid.groups, T, C, NH,
                                                             qkv_bias_partials);
        });
    }
}

}  // namespace attention_tc_detail

// Queries of `q` against the keys and values at `kv` (v = k + C) over `span` (see AttentionSpan in
// attention.cuh), as attention_forward's span form: out floatX, or float for context parallelism's
// merges (rows C apart), and lse of the span's queries. doc_start: each query's first visible key, or null.
template <typename Out>
inline void attention_tc_forward(Out* out, float* lse, const floatX* q, const floatX* kv, AttentionSpan span, int B, int C,
                                 int NH, cudaStream_t stream, const int* doc_start = nullptr) {
    attention_tc_detail::check_span("attention_tc_forward", span, B, C, NH);
    span.key_lead = std::min(span.key_lead, span.Tk);  // every key already; keeps the kernels' sums in int
    attention_tc_detail::forward(out, lse, q, kv, span, B, C, NH, stream, doc_start);
}

// Causal self-attention of B rows of T tokens: qkv (B, T, 3C) -> out (B, T, C), lse (B, NH, T).
// doc_start: (B, T) document starts for document masking (host/documents.h), or null (causal only).
inline void attention_tc_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                 cudaStream_t stream, const int* doc_start = nullptr) {
    require_supported("attention_tc_forward", attention_tc_requirements(B, T, C, NH));
    attention_tc_forward<floatX>(out, lse, qkv, qkv + C, causal_span(T, C), B, C, NH, stream, doc_start);
}

// The gradients of attention_tc_forward over `span`, as attention_backward's span form: from the forward
// pass's lse and D = rowsum(dout * out) (attention_backward_rowdot), dq (rows dq_stride apart) and dk,
// dv at dkv (dv = dk + C, rows dkv_stride apart), floatX or float, written, or with `accumulate` added;
// key_gradients_done, if given, recorded once dk and dv are complete (before dq's kernel).
template <typename Grad>
inline void attention_tc_backward(Grad* dq, int dq_stride, Grad* dkv, int dkv_stride, const floatX* dout, const floatX* q,
                                  const floatX* kv, const float* lse, const float* D, AttentionSpan span, int B, int C,
                                  int NH, cudaStream_t stream, const int* doc_start = nullptr, bool accumulate = false,
                                  cudaEvent_t key_gradients_done = nullptr, float* qkv_bias_partials = nullptr) {
    attention_tc_detail::check_span("attention_tc_backward", span, B, C, NH);
    span.key_lead = std::min(span.key_lead, span.Tk);
    attention_tc_detail::backward(dq, dq_stride, dkv, dkv_stride, dout, q, kv, lse, D, span, B, C, NH, stream, doc_start,
                                  accumulate, key_gradients_done, qkv_bias_partials);
}

// Causal self-attention's backward: dqkv (B, T, 3C) from dout, with scratch of
// attention_tc_backward_scratch_floats(B, T, C, NH, how, qkv_bias_sums, fused_wave_slots) floats (D, and the
// fused kernel's dQ sums; fused_wave_slots: the blocks a wave of its grid holds, attention_tc_detail::
// fused_grid_plan; tests pass fewer to split heads of small grids). With qkv_bias_sums, the kernels also
// sum the columns of the dqkv rows they write, a partial row of 3C floats per block of rows (the split kernels' 64, the fused kernel's 128); returns where in the
// scratch those attention_tc_qkv_bias_chunks(B, T, how) rows are (for bias_grad_add_partials,
// kernels/matmul.cuh), else null.
// They save the qkv matmul's bias gradient its pass over dqkv (3C x B*T bf16 read: at d12, B=64, 302 MB a
// layer, 0.12 ms at 2.6 TB/s).
inline const float* attention_tc_backward(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv,
                                          const floatX* out, const float* lse, int B, int T, int C, int NH,
                                          cudaStream_t stream, const int* doc_start = nullptr,
                                          AttentionTcBackward how = AttentionTcBackward::split, bool qkv_bias_sums = false,
                                          int fused_wave_slots = attention_tc_detail::kFusedWaveSlots) {
    require_supported("attention_tc_backward", attention_tc_requirements(B, T, C, NH));
    require_supported("attention_tc_backward", fused_wave_slots < 1 ? "attention: fused_wave_slots must be positive" : "");
    float* D = scratch;  // (B, NH, T)
    float* bias_partials = qkv_bias_sums ? scratch + attention_tc_qkv_bias_offset(B, T, C, NH, how) : nullptr;
    if (how == AttentionTcBackward::fused) {  // D is the fused kernel's own
        attention_tc_detail::backward_fused(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream, doc_start, bias_partials,
                                            scratch + attention_tc_fused_split_offset(B, T, C, NH, qkv_bias_sums),
                                            fused_wave_slots);
        return bias_partials;
    }
    attention_backward_rowdot(D, dout, out, B, T, C, NH, stream);
    attention_tc_backward<floatX>(dqkv, 3 * C, dqkv + C, 3 * C, dout, qkv, qkv + C, lse, D, causal_span(T, C), B, C, NH, stream,
                                  doc_start, false, nullptr, bias_partials);
    return bias_partials;
}

// Compiled once in the CPU build (see COMPILED_ONCE in cuda_common.h): both outputs of each launcher.
#ifdef COMPILED_ONCE
COMPILED_ONCE void attention_tc_detail::forward<floatX, floatX>(floatX*, float*, const floatX*, const floatX*, AttentionSpan,
                                                                int, int, int, cudaStream_t, const int*);
COMPILED_ONCE void attention_tc_detail::backward<floatX, floatX>(floatX*, int, floatX*, int, const floatX*, const floatX*,
                                                                 const floatX*, const float*, const float*, AttentionSpan, int,
                                                                 int, int, cudaStream_t, const int*, bool, cudaEvent_t, float*);
COMPILED_ONCE void attention_tc_detail::backward_fused<floatX>(floatX*, float*, const floatX*, const floatX*, const floatX*,
                                                               const float*, int, int, int, int, cudaStream_t, const int*,
                                                               float*, float*, int);
#ifndef PRECISION_FP32  // else floatX is float: the lines above
COMPILED_ONCE void attention_tc_detail::forward<floatX, float>(float*, float*, const floatX*, const floatX*, AttentionSpan,
                                                               int, int, int, cudaStream_t, const int*);
COMPILED_ONCE void attention_tc_detail::backward<floatX, float>(float*, int, float*, int, const floatX*, const floatX*,
                                                                const floatX*, const float*, const float*, AttentionSpan, int,
                                                                int, int, cudaStream_t, const int*, bool, cudaEvent_t, float*);
#endif
#endif
