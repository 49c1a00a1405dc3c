// Tensor-core and asynchronous-copy instructions on the CPU (declared in cuda_emu.h).
//
// mma.sync and ldmatrix are warp collectives (warp_exchange): every lane brings its fragment or
// row address, and the lane that arrives last computes the whole warp's result. Fragment layouts
// follow the PTX ISA: "Matrix Fragments for mma.m16n8k16 with floating point type" and
// "Warp-level matrix load instruction: ldmatrix" (figure "ldmatrix fragment layout for one 8x8
// Matrix with 16-bit elements"), with groupID = laneid >> 2 and threadID_in_group = laneid % 4.
//
// The warp tile products (kernels/tensor_core.cuh: a warp's fragments times a shared-memory tile,
// tens of ldmatrix and mma.sync) are one collective each here, unless CUEMU_TENSOR_CORE=instructions:
// the same operand elements, the same products added in the same order (accumulate_products, shared
// with mma.sync), so the same bits.
//
// cp.async completes late on purpose: the destination is poisoned (0xFF bytes: NaN in bf16 and
// float) when the copy is issued and written when cp.async.wait_group retires its group, so a
// kernel that reads it too early reads NaN, as a GPU would read stale data.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cuemu {

namespace {

constexpr unsigned kFullWarp = 0xffffffffu;

float bf16_bits_to_float(uint32_t bits16) { return from_bits<float>(uint64_t(bits16 & 0xffffu) << 16); }
// Element `half` (0: low, the lower-indexed element; 1: high) of a .b32 register holding two b16.
uint32_t half_of(uint32_t reg, int half) { return half ? reg >> 16 : reg & 0xffffu; }

thread_local std::string problem_text;  // the message a combine function returns

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ----

struct MmaFragments {
    uint32_t a[4], b[2];
    float c[4];
};

// D (m x n, row stride ldd) += A (m x k) B (k x n), m a multiple of 4 and n of 8: each element adds
// its products one after another in k order, in float. The one routine behind mma.sync and the tile
// products, so that both compile to the same arithmetic (a product of two bf16 is exact in float, so
// the fused multiply-add the compiler makes of it rounds as the add alone would, except where the
// product underflows). A block of 4 rows x W columns stays in vector registers across the k loop:
// four independent chains of fused multiply-adds, each B row loaded once for the four. The order
// within each element is unchanged.
template <int W> inline void accumulate_block(float* __restrict__ d, int ldd, const float* __restrict__ a, int lda,
                                              const float* __restrict__ b, int ldb, int k) {
    typedef float Vec [[gnu::vector_size(W * sizeof(float)), gnu::aligned(4)]];  // W floats, any alignment
    constexpr int R = 4;
    Vec acc[R];
    for (int r = 0; r < R; ++r) std::memcpy(&acc[r], d + size_t(r) * size_t(ldd), sizeof(Vec));
    for (int kk = 0; kk < k; ++kk) {
        Vec b_row;
        std::memcpy(&b_row, b + size_t(kk) * size_t(ldb), sizeof(Vec));
        for (int r = 0; r < R; ++r) acc[r] += a[size_t(r) * size_t(lda) + size_t(kk)] * b_row;
    }
    for (int r = 0; r < R; ++r) std::memcpy(d + size_t(r) * size_t(ldd), &acc[r], sizeof(Vec));
}
[[gnu::noinline]] void accumulate_products(float* D, int ldd, const float* A, int lda, const float* B, int ldb, int m,
                                           int n, int k) {
    for (int i = 0; i < m; i += 4) {
        float* d = D + size_t(i) * size_t(ldd);
        const float* a = A + size_t(i) * size_t(lda);
        int j = 0;
        for (; j + 16 <= n; j += 16) accumulate_block<16>(d + j, ldd, a, lda, B + j, ldb, k);
        for (; j < n; j += 8) accumulate_block<8>(d + j, ldd, a, lda, B + j, ldb, k);
    }
}

std::atomic<uint64_t> mmas_run{0};  // mma_count()

const char* mma_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    if (members != kFullWarp) return "mma.sync needs all 32 lanes of the warp";
    mmas_run.fetch_add(1, std::memory_order_relaxed);
    float A[16][16], B[16][8], D[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const auto& f = *static_cast<const MmaFragments*>(inputs[lane]);
        const int group = lane >> 2, tig = lane % 4;
        for (int i = 0; i < 8; ++i) {  // a0..a7: rows groupID (+8 for a2, a3, a6, a7), cols 2 tig + (i & 1) (+8 for i >= 4)
            const int row = group + ((i & 2) ? 8 : 0), col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = bf16_bits_to_float(half_of(f.a[i / 2], i & 1));
        }
        for (int i = 0; i < 4; ++i) {  // b0..b3: rows 2 tig + (i & 1) (+8 for i >= 2), col groupID
            const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
            B[row][group] = bf16_bits_to_float(half_of(f.b[i / 2], i & 1));
        }
        for (int i = 0; i < 4; ++i)  // c0..c3: rows groupID (+8 for i >= 2), cols 2 tig + (i & 1)
            D[group + (i >= 2 ? 8 : 0)][tig * 2 + (i & 1)] = f.c[i];
    }
    // Products of bf16 values are exact in float; they are added to c one after another in k order,
    // in float. (The hardware's internal order and precision are unspecified; tests allow for that.)
    accumulate_products(&D[0][0], 8, &A[0][0], 16, &B[0][0], 8, 16, 8, 16);
    for (int lane = 0; lane < 32; ++lane) {
        float* d = static_cast<float*>(outputs[lane]);
        const int group = lane >> 2, tig = lane % 4;
        for (int i = 0; i < 4; ++i) d[i] = D[group + (i >= 2 ? 8 : 0)][tig * 2 + (i & 1)];
    }
    return nullptr;
}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 ----

template <int kCount, bool kTrans>
const char* ldmatrix_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    if (members != kFullWarp) return "ldmatrix needs all 32 lanes of the warp";
    uint16_t rows[4][8][8];  // [matrix][row][col]
    // Lanes 8 i .. 8 i + 7 address the rows of matrix i; the addresses of the other lanes are unused.
    for (int lane = 0; lane < 8 * kCount; ++lane) {
        const void* row = *static_cast<const void* const*>(inputs[lane]);
        if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
            char where[32];
            std::snprintf(where, sizeof where, "%p", row);
            problem_text = "lane " + std::to_string(lane) + " gives row address " + where + ", not 16-byte aligned";
            return problem_text.c_str();
        }
        std::memcpy(rows[lane / 8][lane % 8], row, 16);
    }
    for (int lane = 0; lane < 32; ++lane) {
        uint32_t* r = static_cast<uint32_t*>(outputs[lane]);
        const int group = lane >> 2, tig = lane % 4;
        for (int i = 0; i < kCount; ++i) {
            // Plain: row groupID, columns 2 tig and 2 tig + 1. Transposed (column-major): column
            // groupID of rows 2 tig and 2 tig + 1.
            const uint16_t lo = kTrans ? rows[i][2 * tig][group] : rows[i][group][2 * tig];
            const uint16_t hi = kTrans ? rows[i][2 * tig + 1][group] : rows[i][group][2 * tig + 1];
            r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
    }
    return nullptr;
}

// ---- warp tile products (kernels/tensor_core.cuh's mma_a_bt, mma_p_b, mma_at_b) ----

struct TileLane {
    TileProduct product;
    const float* p;  // p_b: this lane's P fragments
};

bool same_product(const TileProduct& x, const TileProduct& y) {
    return x.operands == y.operands && x.frags == y.frags && x.n == y.n && x.k == y.k && x.a == y.a && x.ld_a == y.ld_a &&
           x.b == y.b && x.ld_b == y.ld_b && x.live == y.live && x.live_begin == y.live_begin && x.live_end == y.live_end;
}

// Lane `lane`'s accumulator-layout element i of tile j of fragment f: row and column in the
// fragments' (16 frags) x (8 tiles) matrix (PTX ISA m16n8k16 figures: c0, c1 / c2, c3 = row
// groupID / groupID + 8, columns 2 tig and 2 tig + 1).
inline int fragment_row(int lane, int f, int i) { return 16 * f + (lane >> 2) + ((i & 2) ? 8 : 0); }
inline int fragment_col(int lane, int j, int i) { return 8 * j + 2 * (lane & 3) + (i & 1); }

const char* tile_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    if (members != kFullWarp) return "a tile product (ldmatrix and mma.sync) needs all 32 lanes of the warp";
    const TileProduct& t = static_cast<const TileLane*>(inputs[0])->product;
    for (int lane = 1; lane < 32; ++lane)
        if (!same_product(static_cast<const TileLane*>(inputs[lane])->product, t)) {
            problem_text = "lane " + std::to_string(lane) + " gives other operands, shapes or strides than lane 0 (they must be warp-uniform)";
            return problem_text.c_str();
        }
    if (t.frags < 1 || t.n < 8 || t.n % 8 != 0 || t.k < 16 || t.k % 16 != 0) {
        problem_text = "shape " + std::to_string(t.frags) + " x 16 x " + std::to_string(t.n) + " x " + std::to_string(t.k) +
                       " is not whole m16n8k16 tiles";
        return problem_text.c_str();
    }
    // ldmatrix reads rows of 8 elements at 16-byte aligned addresses: the base and the row stride.
    // (p_b's A comes from registers.)
    auto misaligned = [](const char* name, const __nv_bfloat16* base, int ld) -> const char* {
        if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && ld % 8 == 0) return nullptr;
        char where[32];
        std::snprintf(where, sizeof where, "%p", static_cast<const void*>(base));
        problem_text = std::string(name) + " at " + where + " with a row stride of " + std::to_string(ld) +
                       " elements: ldmatrix row addresses would not be 16-byte aligned";
        return problem_text.c_str();
    };
    if (const char* problem = t.operands == TileOperands::p_b ? nullptr : misaligned("A", t.a, t.ld_a)) return problem;
    if (const char* problem = misaligned("B", t.b, t.ld_b)) return problem;
    const int live_extent = t.operands == TileOperands::a_bt ? t.n : t.k;  // what the live range runs over
    if (t.live_begin < 0 || t.live_begin > t.live_end || t.live_end > live_extent || t.live_begin % 16 != 0 ||
        t.live_end % 16 != 0) {
        problem_text = "live range [" + std::to_string(t.live_begin) + ", " + std::to_string(t.live_end) + ") is not whole 16-blocks of " +
                       std::string(t.operands == TileOperands::a_bt ? "n = " : "k = ") + std::to_string(live_extent);
        return problem_text.c_str();
    }
    const int m = 16 * t.frags, n = t.n, tiles_n = n / 8;
    // a_bt: the columns computed; the others keep the accumulators' values.
    const int col_begin = t.operands == TileOperands::a_bt ? t.live_begin : 0;
    const int col_end = t.operands == TileOperands::a_bt ? t.live_end : n;
    // The k blocks that take part (p_b and at_b: those in the live range; at_b also skips those with
    // live == 0, reading neither operand there).
    thread_local std::vector<int> blocks;
    blocks.clear();
    for (int i = 0; i < t.k / 16; ++i) {
        const bool in_range = t.operands == TileOperands::a_bt || (16 * i >= t.live_begin && 16 * i < t.live_end);
        if (in_range && (t.operands != TileOperands::at_b || t.live[i])) blocks.push_back(i);
    }
    const int k = 16 * int(blocks.size());
    thread_local std::vector<float> A, B, D;
    A.resize(size_t(m) * size_t(k));
    B.resize(size_t(k) * size_t(n));
    D.resize(size_t(m) * size_t(n));
    for (int lane = 0; lane < 32; ++lane) {
        const float* acc = static_cast<const float*>(outputs[lane]);
        for (int f = 0; f < t.frags; ++f)
            for (int j = 0; j < tiles_n; ++j)
                for (int i = 0; i < 4; ++i)
                    D[size_t(fragment_row(lane, f, i)) * n + fragment_col(lane, j, i)] = acc[(f * tiles_n + j) * 4 + i];
    }
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
        const int k0 = 16 * blocks[bi];  // the block's first k in the operands, 16 bi in A and B here
        for (int kk = 0; kk < 16; ++kk) {
            float* brow = &B[(16 * bi + size_t(kk)) * size_t(n)];
            if (t.operands == TileOperands::a_bt) {
                for (int j = col_begin; j < col_end; ++j) brow[j] = __bfloat162float(t.b[size_t(j) * size_t(t.ld_b) + size_t(k0 + kk)]);
            } else {
                const __nv_bfloat16* src = t.b + size_t(k0 + kk) * size_t(t.ld_b);
                for (int j = 0; j < n; ++j) brow[j] = __bfloat162float(src[j]);
            }
        }
        if (t.operands == TileOperands::a_bt) {
            for (int r = 0; r < m; ++r)
                for (int kk = 0; kk < 16; ++kk)
                    A[size_t(r) * k + 16 * bi + kk] = __bfloat162float(t.a[size_t(r) * size_t(t.ld_a) + size_t(k0 + kk)]);
        } else if (t.operands == TileOperands::at_b) {
            for (int kk = 0; kk < 16; ++kk)
                for (int r = 0; r < m; ++r)
                    A[size_t(r) * k + 16 * bi + kk] = __bfloat162float(t.a[size_t(k0 + kk) * size_t(t.ld_a) + size_t(r)]);
        }
    }
    if (t.operands == TileOperands::p_b) {  // the blocks of the live range, contiguous: column c of P at c - live_begin
        const int tiles_k = t.k / 8;
        for (int lane = 0; lane < 32; ++lane) {
            const float* p = static_cast<const TileLane*>(inputs[lane])->p;
            for (int f = 0; f < t.frags; ++f)
                for (int j = t.live_begin / 8; j < t.live_end / 8; ++j)
                    for (int i = 0; i < 4; ++i)
                        A[size_t(fragment_row(lane, f, i)) * k + fragment_col(lane, j, i) - t.live_begin] =
                            __bfloat162float(__float2bfloat16_rn(p[(f * tiles_k + j) * 4 + i]));
        }
    }
    mmas_run.fetch_add(uint64_t(t.frags) * uint64_t((col_end - col_begin) / 8) * blocks.size(), std::memory_order_relaxed);
    if (k > 0 && col_end > col_begin)
        accumulate_products(D.data() + col_begin, n, A.data(), k, B.data() + col_begin, n, m, col_end - col_begin, k);
    for (int lane = 0; lane < 32; ++lane) {
        float* acc = static_cast<float*>(outputs[lane]);
        for (int f = 0; f < t.frags; ++f)
            for (int j = 0; j < tiles_n; ++j)
                for (int i = 0; i < 4; ++i)
                    acc[(f * tiles_n + j) * 4 + i] = D[size_t(fragment_row(lane, f, i)) * n + fragment_col(lane, j, i)];
    }
    return nullptr;
}

TensorCoreMode mode_from_environment() {
    const char* v = std::getenv("CUEMU_TENSOR_CORE");
    if (!v || std::string(v) == "tiles") return TensorCoreMode::tiles;
    if (std::string(v) == "instructions") return TensorCoreMode::instructions;
    std::fprintf(stderr, "cuemu: CUEMU_TENSOR_CORE: expected tiles or instructions, got '%s'\n", v);
    std::exit(EXIT_FAILURE);
}
std::atomic<TensorCoreMode>& current_mode() {
    static std::atomic<TensorCoreMode> mode{mode_from_environment()};
    return mode;
}

// ---- cp.async: per thread of the running block, the copies not yet committed and the groups ----

struct PendingCopy {
    unsigned char* dst;
    int bytes;
    unsigned char data[16];
};

// A thread's copies in issue order: those before group_ends.back() are committed, group g ending
// at group_ends[g]; retired ones (before `retired`) have landed. Emptied when all have landed, so
// the vectors keep their capacity and a block allocates nothing after its first groups.
struct ThreadCopies {
    std::vector<PendingCopy> copies;
    std::vector<size_t> group_ends;  // oldest first, from group `first_group` on
    size_t first_group = 0, retired = 0;
    void clear() {
        copies.clear();
        group_ends.clear();
        first_group = retired = 0;
    }
};

struct BlockCopies {
    uint64_t serial = 0;  // block_serial() of the block the state belongs to
    std::vector<ThreadCopies> threads;
};
thread_local BlockCopies block_copies;

// Copies still pending when a block ends target its shared memory, which ends with it: the next
// block on this OS thread starts from empty queues.
ThreadCopies& this_threads_copies() {
    const uint64_t serial = block_serial();
    const size_t nthreads = size_t(blockDim.x) * blockDim.y * blockDim.z;
    if (block_copies.serial != serial) {
        block_copies.serial = serial;
        block_copies.threads.resize(nthreads);
        for (ThreadCopies& t : block_copies.threads) t.clear();
    }
    const size_t linear = threadIdx.x + size_t(blockDim.x) * (threadIdx.y + size_t(blockDim.y) * threadIdx.z);
    return block_copies.threads[linear];
}

// ---- wgmma.mma_async (sm_90a), warp by warp ----
//
// Shared-memory matrix descriptors (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start
// address, 16-29 the leading-dimension byte offset (LBO), 32-45 the stride-dimension byte offset
// (SBO), each in 16-byte units; 49-51 the base offset; 62-63 the swizzle mode (0 none, 1 128-byte,
// 2 64-byte, 3 32-byte). The canonical layouts, for element (mn, k) of an operand's 16-deep K slice
// in bf16, with W the 16-byte chunks of a swizzle row (1 unswizzled, 2, 4, 8 for 32, 64, 128 bytes):
//   K-major,  unswizzled: 16 (mn % 8) + SBO (mn / 8) + 2 (k % 8) + LBO (k / 8)   (core matrices: 8 rows of 16 bytes)
//   K-major,  swizzled:   16 W (mn % 8) + SBO (mn / 8) + 2 k                     (8 rows of 16 W bytes to an atom)
//   MN-major, unswizzled: 2 (mn % 8) + SBO (mn / 8) + 16 (k % 8) + LBO (k / 8)
//   MN-major, swizzled:   2 (mn % 8W) + LBO (mn / 8W) + 16 W (k % 8) + SBO (k / 8)
// from the start address; swizzled, the address's 16-byte chunk bits [4, 4 + log2 W) are then XORed
// with its bits [7, 7 + log2 W) (cute/atom/mma_traits_sm90_gmma.hpp writes these layouts as CuTe's
// Swizzle<log2 W, 4, 3> o ((8, m), (T, 2)) and so on; dev/check_mma_layouts.py compares the two).
// The swizzle is taken from the address, as advancing a descriptor by 32 bytes along K within a
// swizzle row requires; the base-offset field (for atoms that do not start at a multiple of 128 W
// bytes) is not emulated: a descriptor with one, or whose start lies past an atom's first row, is an
// error here.

struct SmemDescriptor {
    uint32_t start, leading, stride;  // bytes
    int chunks;                       // W: 16-byte chunks of a swizzle row; 1 unswizzled
};

const char* decode_descriptor(uint64_t desc, const char* which, SmemDescriptor& out) {
    out.start = uint32_t(desc & 0x3fff) << 4;
    out.leading = uint32_t((desc >> 16) & 0x3fff) << 4;
    out.stride = uint32_t((desc >> 32) & 0x3fff) << 4;
    const unsigned base_offset = unsigned((desc >> 49) & 7), mode = unsigned(desc >> 62);
    static constexpr int kChunks[4] = {1, 8, 4, 2};
    out.chunks = kChunks[mode];
    if (base_offset != 0) {
        problem_text = std::string(which) + " descriptor has base offset " + std::to_string(base_offset) + " (not emulated: start swizzle atoms at multiples of their size)";
        return problem_text.c_str();
    }
    if (out.chunks > 1 && ((out.start >> 7) & unsigned(out.chunks - 1)) != 0) {
        problem_text = std::string(which) + " descriptor starts at " + std::to_string(out.start) + ", past the first row of a " +
                       std::to_string(128 * out.chunks) + "-byte swizzle atom (that needs the base offset, not emulated)";
        return problem_text.c_str();
    }
    return nullptr;
}

// The shared-window byte address of element (mn, k) of a descriptor's operand (see above).
uint32_t operand_address(const SmemDescriptor& d, bool mn_major, int mn, int k) {
    const uint32_t W = uint32_t(d.chunks), m = uint32_t(mn), kk = uint32_t(k);
    uint32_t address;
    if (W == 1) {
        address = mn_major ? 2 * (m % 8) + d.stride * (m / 8) + 16 * (kk % 8) + d.leading * (kk / 8)
                           : 16 * (m % 8) + d.stride * (m / 8) + 2 * (kk % 8) + d.leading * (kk / 8);
    } else {
        address = mn_major ? 2 * (m % (8 * W)) + d.leading * (m / (8 * W)) + 16 * W * (kk % 8) + d.stride * (kk / 8)
                           : 16 * W * (m % 8) + d.stride * (m / 8) + 2 * kk;
    }
    address += d.start;
    return W == 1 ? address : address ^ (((address >> 7) & (W - 1)) << 4);
}

struct WgmmaLane {
    WgmmaOperands op;
    unsigned warp;  // the lane's warp in the block
};

// A shared-memory element an instruction read, to compare at its wait (a GPU may read it any time
// up to then: writing it before is a race).
struct OperandRead {
    uint32_t address;
    uint16_t bits;
};

struct PendingWgmma {
    float* d[32];                    // each lane's accumulators
    std::vector<float> result;       // 32 lanes x n / 2
    std::vector<OperandRead> reads;  // the shared-memory elements it read
    int n;
    size_t group;                    // its commit group; kUncommitted until wgmma.commit_group
};
constexpr size_t kUncommitted = ~size_t(0);

struct WarpWgmma {
    std::vector<PendingWgmma> pending;  // issue order
    size_t groups_committed = 0, groups_retired = 0;
    bool fenced = false;  // a wgmma.fence since the last wgmma.wait_group
};
struct BlockWgmma {
    uint64_t serial = 0;
    std::vector<WarpWgmma> warps;
};
thread_local BlockWgmma block_wgmma;

WarpWgmma& warp_wgmma(unsigned warp) {
    const uint64_t serial = block_serial();
    const size_t nwarps = (size_t(blockDim.x) * blockDim.y * blockDim.z + 31) / 32;
    if (block_wgmma.serial != serial) {  // a new block: what an earlier one left in flight died with it
        block_wgmma.serial = serial;
        block_wgmma.warps.assign(nwarps, WarpWgmma{});
    }
    return block_wgmma.warps[warp];
}

unsigned this_warp() {
    return unsigned((threadIdx.x + size_t(blockDim.x) * (threadIdx.y + size_t(blockDim.y) * threadIdx.z)) / 32);
}

constexpr uint32_t kInFlightBits = 0xffffffffu;  // what accumulators in flight hold: NaN

// The lane's accumulators must still hold the in-flight NaN: a kernel that wrote them while the
// instruction ran has a race on a GPU.
const char* check_in_flight(const PendingWgmma& p, const char* when) {
    for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < p.n / 2; ++i)
            if (to_bits(p.d[lane][i]) != kInFlightBits) {
                problem_text = "lane " + std::to_string(lane) + " wrote accumulator " + std::to_string(i) +
                               " of a wgmma.mma_async in flight (" + when + ")";
                return problem_text.c_str();
            }
    return nullptr;
}

const char* wgmma_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    if (members != kFullWarp) return "wgmma.mma_async needs all 32 lanes of the warp";
    const WgmmaLane& first = *static_cast<const WgmmaLane*>(inputs[0]);
    const WgmmaOperands& op = first.op;
    for (int lane = 1; lane < 32; ++lane) {
        const WgmmaOperands& o = static_cast<const WgmmaLane*>(inputs[lane])->op;
        if (o.n != op.n || o.a_from_shared != op.a_from_shared || o.a_mn_major != op.a_mn_major || o.b_mn_major != op.b_mn_major ||
            o.accumulate != op.accumulate || o.b_desc != op.b_desc || (op.a_from_shared && o.a_desc != op.a_desc)) {
            problem_text = "lane " + std::to_string(lane) + " gives other descriptors, shape or flags than lane 0 (they must be warp-uniform)";
            return problem_text.c_str();
        }
    }
    if (op.n < 8 || op.n > 256 || op.n % 8 != 0) {
        problem_text = "m64n" + std::to_string(op.n) + "k16 is not a wgmma shape (n: 8 to 256 in steps of 8)";
        return problem_text.c_str();
    }
    const size_t nthreads = size_t(blockDim.x) * blockDim.y * blockDim.z;
    if (nthreads % 128 != 0) {
        problem_text = "a block of " + std::to_string(nthreads) + " threads is not whole warpgroups of 128";
        return problem_text.c_str();
    }
    WarpWgmma& state = warp_wgmma(first.warp);
    if (!state.fenced)
        return "wgmma.mma_async without a wgmma.fence since the warp's last wgmma.wait_group (or the kernel's start)";
    SmemDescriptor a_desc{}, b_desc{};
    if (const char* problem = decode_descriptor(op.b_desc, "B", b_desc)) return problem;
    if (op.a_from_shared)
        if (const char* problem = decode_descriptor(op.a_desc, "A", a_desc)) return problem;
    const unsigned char* window = static_cast<const unsigned char*>(dynamic_shared_memory());
    const size_t window_bytes = dynamic_shared_bytes();
    PendingWgmma p;
    p.n = op.n;
    p.group = kUncommitted;
    const char* out_of_range = nullptr;
    auto read = [&](uint32_t address) {
        if (size_t(address) + 2 > window_bytes) {
            problem_text = "an operand element at shared address " + std::to_string(address) + " lies past the launch's " +
                           std::to_string(window_bytes) + " bytes of dynamic shared memory";
            out_of_range = problem_text.c_str();
            return 0.0f;
        }
        uint16_t bits;
        std::memcpy(&bits, window + address, 2);
        p.reads.push_back({address, bits});
        return bf16_bits_to_float(bits);
    };
    const int n = op.n;
    thread_local std::vector<float> B, D;
    float A[16][16];
    B.resize(size_t(16) * size_t(n));
    D.resize(size_t(16) * size_t(n));
    for (int k = 0; k < 16; ++k)
        for (int j = 0; j < n; ++j) B[size_t(k) * size_t(n) + size_t(j)] = read(operand_address(b_desc, op.b_mn_major, j, k));
    if (op.a_from_shared) {
        const int row0 = 16 * int(first.warp % 4);  // this warp's rows of the warpgroup's 64
        for (int r = 0; r < 16; ++r)
            for (int k = 0; k < 16; ++k) A[r][k] = read(operand_address(a_desc, op.a_mn_major, row0 + r, k));
    } else {
        for (int lane = 0; lane < 32; ++lane) {  // the mma.m16n8k16 A fragment (cuda_emu.h)
            const uint32_t* a = static_cast<const WgmmaLane*>(inputs[lane])->op.a_regs;
            for (int i = 0; i < 8; ++i)
                A[(lane >> 2) + ((i & 2) ? 8 : 0)][2 * (lane % 4) + (i & 1) + (i >= 4 ? 8 : 0)] = bf16_bits_to_float(half_of(a[i / 2], i & 1));
        }
    }
    if (out_of_range) return out_of_range;
    // C: zeros, or the accumulators; where an earlier instruction on the same registers is still in
    // flight, its result (the GPU orders wgmma.mma_async on the same accumulators).
    for (int lane = 0; lane < 32; ++lane) {
        float* d = static_cast<float*>(outputs[lane]);
        p.d[lane] = d;
        const float* c = d;
        for (auto it = state.pending.rbegin(); it != state.pending.rend(); ++it)
            if (it->d[lane] == d) {
                if (it->n != n) return "a wgmma.mma_async of another shape on accumulators in flight";
                if (const char* problem = check_in_flight(*it, "at a later wgmma.mma_async on them")) return problem;
                c = &it->result[size_t(lane) * size_t(n / 2)];
                break;
            }
        for (int v = 0; v < n / 2; ++v)
            D[size_t(fragment_row(lane, 0, v % 4)) * size_t(n) + size_t(fragment_col(lane, v / 4, v % 4))] = op.accumulate ? c[v] : 0.0f;
    }
    accumulate_products(D.data(), n, &A[0][0], 16, B.data(), n, 16, n, 16);
    mmas_run.fetch_add(uint64_t(n / 8), std::memory_order_relaxed);
    p.result.resize(size_t(32) * size_t(n / 2));
    for (int lane = 0; lane < 32; ++lane)
        for (int v = 0; v < n / 2; ++v) {
            p.result[size_t(lane) * size_t(n / 2) + size_t(v)] =
                D[size_t(fragment_row(lane, 0, v % 4)) * size_t(n) + size_t(fragment_col(lane, v / 4, v % 4))];
            p.d[lane][v] = from_bits<float>(kInFlightBits);
        }
    state.pending.push_back(std::move(p));
    return nullptr;
}

const char* wgmma_fence_combine(const void* const inputs[32], void* const[32], unsigned members) {
    if (members != kFullWarp) return "wgmma.fence needs all 32 lanes of the warp";
    warp_wgmma(*static_cast<const unsigned*>(inputs[0])).fenced = true;
    return nullptr;
}

const char* wgmma_commit_combine(const void* const inputs[32], void* const[32], unsigned members) {
    if (members != kFullWarp) return "wgmma.commit_group needs all 32 lanes of the warp";
    WarpWgmma& state = warp_wgmma(*static_cast<const unsigned*>(inputs[0]));
    for (PendingWgmma& p : state.pending)
        if (p.group == kUncommitted) p.group = state.groups_committed;
    ++state.groups_committed;  // possibly empty, as on a GPU
    return nullptr;
}

struct WaitLane {
    unsigned warp;
    int pending;
};

const char* wgmma_wait_combine(const void* const inputs[32], void* const[32], unsigned members) {
    if (members != kFullWarp) return "wgmma.wait_group needs all 32 lanes of the warp";
    const WaitLane& w = *static_cast<const WaitLane*>(inputs[0]);
    WarpWgmma& state = warp_wgmma(w.warp);
    const size_t keep = size_t(w.pending < 0 ? 0 : w.pending);
    if (state.groups_committed - state.groups_retired > keep) state.groups_retired = state.groups_committed - keep;
    const unsigned char* window = static_cast<const unsigned char*>(dynamic_shared_memory());
    auto retiring = [&](const PendingWgmma& p) { return p.group != kUncommitted && p.group < state.groups_retired; };
    for (const PendingWgmma& p : state.pending) {  // all checked before any result lands (chains share registers)
        if (!retiring(p)) continue;
        for (const OperandRead& r : p.reads) {
            uint16_t bits;
            std::memcpy(&bits, window + r.address, 2);
            if (bits != r.bits) {
                problem_text = "shared address " + std::to_string(r.address) + ", an operand of a wgmma.mma_async in flight, was written before its wgmma.wait_group";
                return problem_text.c_str();
            }
        }
        if (const char* problem = check_in_flight(p, "before its wgmma.wait_group")) return problem;
    }
    std::vector<PendingWgmma> still;
    for (PendingWgmma& p : state.pending) {  // in issue order: the last of a chain lands last
        if (!retiring(p)) {
            still.push_back(std::move(p));
            continue;
        }
        for (int lane = 0; lane < 32; ++lane)
            std::memcpy(p.d[lane], &p.result[size_t(lane) * size_t(p.n / 2)], sizeof(float) * size_t(p.n / 2));
    }
    // A later instruction on the same accumulators is still in flight: they read as in flight again.
    for (const PendingWgmma& p : still)
        for (int lane = 0; lane < 32; ++lane)
            for (int v = 0; v < p.n / 2; ++v) p.d[lane][v] = from_bits<float>(kInFlightBits);
    state.pending = std::move(still);
    state.fenced = false;  // what the warp does with the results next needs a fence before the next wgmma
    return nullptr;
}

}  // namespace

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    MmaFragments in;
    std::memcpy(in.a, a, sizeof in.a);
    std::memcpy(in.b, b, sizeof in.b);
    std::memcpy(in.c, c, sizeof in.c);
    float out[4];
    warp_exchange(kFullWarp, &in, out, mma_combine, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
    std::memcpy(d, out, sizeof out);
}

void ldmatrix(uint32_t* r, int count, bool trans, const void* row_address) {
    // One combine function per form, so lanes that disagree on the form are reported as divergent.
    static constexpr WarpExchangeFn kForms[2][3] = {
        {ldmatrix_combine<1, false>, ldmatrix_combine<2, false>, ldmatrix_combine<4, false>},
        {ldmatrix_combine<1, true>, ldmatrix_combine<2, true>, ldmatrix_combine<4, true>}};
    static constexpr const char* kNames[2][3] = {
        {"ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x4.shared.b16"},
        {"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"}};
    const int form = count == 1 ? 0 : count == 2 ? 1 : 2;
    if (count != 1 && count != 2 && count != 4) kernel_error("ldmatrix: .x" + std::to_string(count) + " is not x1, x2 or x4");
    uint32_t out[4] = {0, 0, 0, 0};
    warp_exchange(kFullWarp, &row_address, out, kForms[trans][form], kNames[trans][form]);
    std::memcpy(r, out, sizeof(uint32_t) * size_t(count == 1 || count == 2 ? count : 4));
}

bool warp_tile_product(const TileProduct& product, float* acc, const float* p) {
    if (current_mode().load(std::memory_order_relaxed) == TensorCoreMode::instructions) return false;
    const TileLane lane{product, p};
    warp_exchange(kFullWarp, &lane, acc, tile_combine, "a warp tile product (ldmatrix and mma.sync m16n8k16)");
    return true;
}
uint64_t mma_count() { return mmas_run.load(std::memory_order_relaxed); }
void set_tensor_core_mode(TensorCoreMode mode) { current_mode().store(mode, std::memory_order_relaxed); }
TensorCoreMode tensor_core_mode() { return current_mode().load(std::memory_order_relaxed); }

void cp_async(void* smem, const void* gmem, int bytes, int src_bytes) {
    if ((bytes != 4 && bytes != 8 && bytes != 16) || src_bytes < 0 || src_bytes > bytes) {
        kernel_error("cp.async: cp-size " + std::to_string(bytes) + " with src-size " + std::to_string(src_bytes) +
                     " (cp-size must be 4, 8 or 16, src-size at most cp-size)");
        return;
    }
    if (reinterpret_cast<uintptr_t>(smem) % bytes != 0 || reinterpret_cast<uintptr_t>(gmem) % bytes != 0) {
        kernel_error("cp.async: addresses must be aligned to the " + std::to_string(bytes) + "-byte copy size");
        return;
    }
    PendingCopy copy{static_cast<unsigned char*>(smem), bytes, {}};
    if (src_bytes > 0) std::memcpy(copy.data, gmem, size_t(src_bytes));
    std::memset(smem, 0xFF, size_t(bytes));  // indeterminate until the copy completes
    this_threads_copies().copies.push_back(copy);
}

void cp_async_commit() {
    ThreadCopies& t = this_threads_copies();
    t.group_ends.push_back(t.copies.size());  // possibly empty: an empty group is trivially complete
}

void cp_async_wait(int max_pending) {
    ThreadCopies& t = this_threads_copies();
    const size_t keep = size_t(max_pending < 0 ? 0 : max_pending);
    while (t.group_ends.size() - t.first_group > keep) {
        for (const size_t end = t.group_ends[t.first_group++]; t.retired < end; ++t.retired) {
            const PendingCopy& copy = t.copies[t.retired];
            std::memcpy(copy.dst, copy.data, size_t(copy.bytes));
        }
    }
    // Nothing in flight, committed or not. Groups still counted then are empty and the oldest: a
    // later wait would retire them first, so forgetting them changes what no wait does.
    if (t.retired == t.copies.size()) t.clear();
}

uint32_t shared_window_address(const void* p) {
    const unsigned char* base = static_cast<const unsigned char*>(dynamic_shared_memory());
    const unsigned char* q = static_cast<const unsigned char*>(p);
    if (q < base || q > base + dynamic_shared_bytes()) {
        kernel_error("a shared-memory address for a wgmma descriptor is not in the launch's dynamic shared memory "
                     "(the emulator's descriptors address only that)");
        return 0;
    }
    return uint32_t(q - base);
}

void wgmma_mma_async(const WgmmaOperands& op, float* d) {
    const WgmmaLane lane{op, this_warp()};
    warp_exchange(kFullWarp, &lane, d, wgmma_combine, "wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16");
}
void wgmma_fence() {
    const unsigned warp = this_warp();
    warp_exchange(kFullWarp, &warp, nullptr, wgmma_fence_combine, "wgmma.fence.sync.aligned");
}
void wgmma_commit_group() {
    const unsigned warp = this_warp();
    warp_exchange(kFullWarp, &warp, nullptr, wgmma_commit_combine, "wgmma.commit_group.sync.aligned");
}
void wgmma_wait_group(int pending) {
    const WaitLane lane{this_warp(), pending};
    warp_exchange(kFullWarp, &lane, nullptr, wgmma_wait_combine, "wgmma.wait_group.sync.aligned");
}

}  // namespace cuemu
