// The warpgroup MMA wrappers (kernels/tensor_core.cuh): wgmma.mma_async m64n64k16 and m64n128k16
// (bf16, f32 accumulators) in the SS form (A and B from shared memory) and the RS form (A from
// registers), with B, and A in the SS form, in each of the eight canonical shared-memory layouts
// (K- or MN-major; unswizzled, 32-, 64- and 128-byte swizzle), four k slices chained into one
// accumulator, and the emulator's checks of the asynchronous rules.
//
// Where an element lies is written here from the PTX ISA's description of the layouts ("Shared
// Memory Matrix Layout": core matrices of 8 rows of 16 bytes; swizzle atoms of 8 rows of 32, 64 or
// 128 bytes whose 16-byte chunks are permuted by XOR with the row, 1, 2 or 4 rows sharing one
// pattern), in rows and chunks; the emulator computes addresses from address bits instead. The
// register layouts (D like N / 8 mma.m16n8k16 accumulator tiles per warp, A like its A fragment)
// are those of CUTLASS's CLayout_64xN and ALayout_64x16 (dev/check_mma_layouts.py compares ours).
// Inputs are small integers, so every sum is exact and the result is compared exactly.
//
// On a GPU this needs sm_90 (the build compiles it for sm_90a alone) and reports itself skipped
// elsewhere.
// precision: BF16 only (nothing here uses floatX)
// gpu arch: sm_90a
#include "test_util.h"

#include "kernels/tensor_core.cuh"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

namespace {

using bf16 = __nv_bfloat16;

constexpr int kK = 64;       // the depth of the product: four wgmma k slices of 16
constexpr int kRows = 128;   // two warpgroups of 64 rows

// An operand tile in shared memory: a layout, its descriptor strides, and each k slice's first
// byte from the tile's start.
struct OperandTile {
    uint32_t swizzle;  // SmemSwizzle
    uint32_t leading_bytes, stride_bytes;
    uint32_t slice_offset[kK / 16];
    uint32_t row_block_offset;  // where rows (A: M) 64.. begin, for the second warpgroup
    uint32_t bytes;             // the tile's size (a multiple of 1024)
};

// 16-byte chunks of a swizzle row: 1 (unswizzled), 2, 4, 8.
int chunks_of(SmemSwizzle s) {
    switch (s) {
        case SmemSwizzle::none: return 1;
        case SmemSwizzle::bytes32: return 2;
        case SmemSwizzle::bytes64: return 4;
        case SmemSwizzle::bytes128: return 8;
    }
    return 0;
}
const char* name_of(SmemSwizzle s) {
    switch (s) {
        case SmemSwizzle::none: return "unswizzled";
        case SmemSwizzle::bytes32: return "32-byte swizzle";
        case SmemSwizzle::bytes64: return "64-byte swizzle";
        case SmemSwizzle::bytes128: return "128-byte swizzle";
    }
    return "?";
}

// A tile of `mn` rows (of M or N) by kK of K, stored in a layout; `byte_of` says where element
// (row, k) lies. Swizzle atoms (8 rows of 16 W bytes of the contiguous dimension) follow one another
// along their rows' dimension first (MN when K-major, K when MN-major); unswizzled core matrices
// (8 x 16 bytes) K-block first when mn_major, else MN-block first, so that LBO and SBO differ.
struct TileLayout {
    SmemSwizzle swizzle;
    bool mn_major;
    int mn;

    int W() const { return chunks_of(swizzle); }
    // The contiguous dimension's extent of an atom, in elements.
    int atom_run() const { return 8 * W(); }
    uint32_t byte_of(int row, int k) const {
        const int w = W();
        if (w == 1) {  // core matrices of 8 x 8 elements, 128 bytes, one after another
            const int mn_blocks = mn / 8, k_blocks = kK / 8;
            if (!mn_major) {  // a core matrix is 8 rows (mn) of 8 k
                const int block = (row / 8) + mn_blocks * (k / 8);
                return uint32_t(128 * block + 16 * (row % 8) + 2 * (k % 8));
            }
            const int block = (k / 8) + k_blocks * (row / 8);  // 8 rows (k) of 8 mn
            return uint32_t(128 * block + 16 * (k % 8) + 2 * (row % 8));
        }
        // The atom's rows run along the other dimension: 8 of them, each 16 W bytes of the contiguous one.
        const int contiguous = mn_major ? row : k, across = mn_major ? k : row;
        const int across_atoms = (mn_major ? kK : mn) / 8;
        const int atom = (across / 8) + across_atoms * (contiguous / atom_run());
        const int r = across % 8, chunk = (contiguous % atom_run()) / 8;
        const int stored_chunk = chunk ^ (r * w / 8);  // 8 / W rows share a pattern
        return uint32_t(128 * w * atom + 16 * w * r + 16 * stored_chunk + 2 * (contiguous % 8));
    }
    uint32_t bytes() const { return uint32_t(2 * mn * kK); }
    // The descriptor's strides and each slice's start, from the same arrangement.
    OperandTile tile() const {
        OperandTile t{};
        t.swizzle = uint32_t(swizzle);
        t.bytes = bytes();
        const int w = W();
        if (w == 1) {
            const uint32_t mn_step = mn_major ? 128u * (kK / 8) : 128u, k_step = mn_major ? 128u : 128u * uint32_t(mn / 8);
            // K-major: SBO steps 8 rows of MN, LBO 8 of K; MN-major: SBO steps 8 of MN, LBO 8 of K.
            t.stride_bytes = mn_step;
            t.leading_bytes = k_step;
        } else if (!mn_major) {
            t.stride_bytes = 128u * uint32_t(w);  // the next 8 rows (mn): the next atom
            t.leading_bytes = 16;                 // unused (the PTX ISA: assumed 1)
        } else {
            t.stride_bytes = 128u * uint32_t(w);                         // the next 8 k: the next atom
            t.leading_bytes = 128u * uint32_t(w) * uint32_t(kK / 8);     // the next 8 W of mn
        }
        // A slice's start is its element (0, 16 s) (row 0 of an atom: its chunks are not permuted).
        for (int s = 0; s < kK / 16; ++s) t.slice_offset[s] = byte_of(0, 16 * s);
        t.row_block_offset = mn > 64 ? byte_of(64, 0) : 0;
        return t;
    }
};

std::string at(int row, int col) { return "[" + std::to_string(row) + "][" + std::to_string(col) + "]"; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The kernel: two warpgroups; warpgroup g computes rows 64 g.. of D = A B (+ C) over kK.

// tiles: A's tile bytes (SS) then B's, copied to 1024-byte aligned shared memory. a (RS): A row-major
// (kRows x kK). c: C row-major (kRows x N), added when accumulate_c. d: D row-major.
template <int N, bool kSS, bool kAMnMajor, bool kBMnMajor>
__global__ void wgmma_kernel(float* d, const unsigned char* tiles, OperandTile a_tile, OperandTile b_tile, const bf16* a,
                             const float* c, int accumulate_c) {
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char* smem = smem_raw + ((1024 - shared_address(smem_raw) % 1024) % 1024);
    const uint32_t a_bytes = kSS ? a_tile.bytes : 0, total = a_bytes + b_tile.bytes;
    for (uint32_t i = 16 * threadIdx.x; i < total; i += 16 * blockDim.x)
        *reinterpret_cast<uint4*>(smem + i) = *reinterpret_cast<const uint4*>(tiles + i);
    fence_proxy_async_shared();
    __syncthreads();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, group = warp / 4;
    const int g = lane >> 2, t = lane % 4;
    const int row0 = 64 * group + 16 * (warp % 4);
    auto row_of = [&](int v) { return row0 + g + ((v & 2) ? 8 : 0); };  // CLayout_64xN, per warp
    auto col_of = [&](int v) { return 8 * (v / 4) + 2 * t + (v & 1); };
    float acc[N / 2];
    for (int v = 0; v < N / 2; ++v) acc[v] = accumulate_c ? c[row_of(v) * N + col_of(v)] : 0.0f;
    // RS: every slice's A fragment before the fence (ALayout_64x16: a[0] row g, k 2t and 2t + 1;
    // a[1] row g + 8; a[2], a[3] k + 8). Registers written between two wgmmas would need a fence of
    // their own (ptxas inserts one, "warpgroup.arrive is injected").
    uint32_t af[kK / 16][4];
    for (int s = 0; s < kK / 16; ++s) {
        auto pair = [&](int row, int k) {
            return kSS ? 0u
                       : uint32_t(__bfloat16_as_ushort(a[row * kK + 16 * s + k])) |
                             (uint32_t(__bfloat16_as_ushort(a[row * kK + 16 * s + k + 1])) << 16);
        };
        af[s][0] = pair(row0 + g, 2 * t);
        af[s][1] = pair(row0 + g + 8, 2 * t);
        af[s][2] = pair(row0 + g, 2 * t + 8);
        af[s][3] = pair(row0 + g + 8, 2 * t + 8);
    }
    wgmma_fence_operands(acc);
    wgmma_fence();
    const unsigned char* a_base = smem + (group ? a_tile.row_block_offset : 0);
    const unsigned char* b_base = smem + a_bytes;
    for (int s = 0; s < kK / 16; ++s) {
        const uint64_t b_desc = wgmma_descriptor(b_base + b_tile.slice_offset[s], SmemSwizzle(b_tile.swizzle),
                                                 b_tile.leading_bytes, b_tile.stride_bytes);
        const bool accumulate = s > 0 || accumulate_c;
        if constexpr (kSS) {
            const uint64_t a_desc = wgmma_descriptor(a_base + a_tile.slice_offset[s], SmemSwizzle(a_tile.swizzle),
                                                     a_tile.leading_bytes, a_tile.stride_bytes);
            wgmma_m64k16_ss<N, kAMnMajor, kBMnMajor>(acc, a_desc, b_desc, accumulate);
        } else {
            wgmma_m64k16_rs<N, kBMnMajor>(acc, af[s], b_desc, accumulate);
        }
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operands(acc);
    for (int v = 0; v < N / 2; ++v) d[row_of(v) * N + col_of(v)] = acc[v];
}

namespace {

// Stores a (mn x kK, row-major values) in a layout; every other byte of the tile holds NaN bits.
std::vector<unsigned char> store_tile(const std::vector<float>& values, const TileLayout& layout) {
    std::vector<unsigned char> bytes(layout.bytes(), 0xFF);
    std::vector<bool> used(layout.bytes() / 2, false);
    for (int row = 0; row < layout.mn; ++row)
        for (int k = 0; k < kK; ++k) {
            const uint32_t at_byte = layout.byte_of(row, k);
            if (at_byte + 2 > layout.bytes() || used[at_byte / 2]) {  // the layout must be one to one, inside the tile
                INFO("element " << at(row, k) << " at byte " << at_byte);
                REQUIRE(false);
            }
            used[at_byte / 2] = true;
            const uint16_t bits = bf16_bits(__float2bfloat16(values[size_t(row) * kK + size_t(k)]));
            std::memcpy(&bytes[at_byte], &bits, 2);
        }
    return bytes;
}

template <int N, bool kSS, bool kAMnMajor, bool kBMnMajor>
void check_wgmma(SmemSwizzle a_swizzle, SmemSwizzle b_swizzle, bool accumulate_c, uint32_t seed) {
    const TileLayout a_layout{a_swizzle, kAMnMajor, kRows}, b_layout{b_swizzle, kBMnMajor, N};
    const int n_columns = N;
    CAPTURE(n_columns, kSS, kAMnMajor, kBMnMajor, name_of(a_swizzle), name_of(b_swizzle), accumulate_c, seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-8, 8);
    std::vector<float> a(kRows * kK), bt(N * kK), c(kRows * N);  // bt: B^T, N x kK
    for (auto& x : a) x = float(small(rng));
    for (auto& x : bt) x = float(small(rng));
    for (auto& x : c) x = float(small(rng) * 64);
    std::vector<unsigned char> tiles;
    if (kSS) tiles = store_tile(a, a_layout);
    const std::vector<unsigned char> b_bytes = store_tile(bt, b_layout);
    tiles.insert(tiles.end(), b_bytes.begin(), b_bytes.end());
    std::vector<bf16> a16(a.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = __float2bfloat16(a[i]);
    DeviceBuffer<unsigned char> dtiles(tiles);
    DeviceBuffer<bf16> da(a16);
    DeviceBuffer<float> dc(c), dd(kRows * N);
    dd.fill_bytes(0xFF);
    const size_t smem = tiles.size() + 1024;  // room to align the tiles to 1024 bytes
    launch<wgmma_kernel<N, kSS, kAMnMajor, kBMnMajor>>(dim3(1), dim3(256), smem, nullptr, dd.ptr, dtiles.ptr, a_layout.tile(),
                                                         b_layout.tile(), da.ptr, dc.ptr, int(accumulate_c));
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> d = dd.download();
    int wrong = 0;
    for (int m = 0; m < kRows; ++m)
        for (int n = 0; n < N; ++n) {
            double ref = accumulate_c ? c[size_t(m) * N + size_t(n)] : 0.0;
            for (int k = 0; k < kK; ++k) ref += double(a[size_t(m) * kK + size_t(k)]) * bt[size_t(n) * kK + size_t(k)];
            if (double(d[size_t(m) * N + size_t(n)]) != ref && ++wrong <= 4) {
                INFO("D" << at(m, n) << " = " << d[size_t(m) * N + size_t(n)] << ", expected " << ref);
                CHECK(false);
            }
        }
    CHECK(wrong == 0);
}

constexpr SmemSwizzle kSwizzles[] = {SmemSwizzle::none, SmemSwizzle::bytes32, SmemSwizzle::bytes64, SmemSwizzle::bytes128};

template <int N, bool kBMnMajor> void check_all_a_forms(SmemSwizzle b_swizzle, uint32_t seed) {
    check_wgmma<N, false, false, kBMnMajor>(SmemSwizzle::none, b_swizzle, seed % 2 == 0, seed);
    for (SmemSwizzle a_swizzle : kSwizzles) {
        check_wgmma<N, true, false, kBMnMajor>(a_swizzle, b_swizzle, seed % 2 == 1, seed + 1);
        check_wgmma<N, true, true, kBMnMajor>(a_swizzle, b_swizzle, seed % 2 == 0, seed + 2);
    }
}

}  // namespace

TEST_CASE("wgmma m64n64k16 and m64n128k16: SS and RS forms, every canonical layout, four k slices chained, exact") {
    skip_unless_hopper();
    uint32_t seed = 1;
    for (SmemSwizzle b_swizzle : kSwizzles) {
        check_all_a_forms<64, false>(b_swizzle, seed += 3);
        check_all_a_forms<64, true>(b_swizzle, seed += 3);
        check_all_a_forms<128, false>(b_swizzle, seed += 3);
        check_all_a_forms<128, true>(b_swizzle, seed += 3);
    }
}

TEST_CASE("the test's layouts: each tile's descriptor strides and slice starts are what its element map says") {
    // The kernel trusts tile() for the descriptors and byte_of for the data: they must agree on the
    // first element of every 8 x 8 block, the places the descriptor fields name.
    for (SmemSwizzle s : kSwizzles)
        for (bool mn_major : {false, true})
            for (int mn : {64, 128}) {
                const TileLayout layout{s, mn_major, mn};
                const OperandTile t = layout.tile();
                CAPTURE(name_of(s), mn_major, mn);
                for (int slice = 0; slice < kK / 16; ++slice) CHECK(t.slice_offset[slice] == layout.byte_of(0, 16 * slice));
                if (chunks_of(s) == 1) {
                    CHECK(layout.byte_of(8, 0) == t.stride_bytes);
                    CHECK(layout.byte_of(0, 8) == t.leading_bytes);
                } else if (!mn_major) {
                    CHECK(layout.byte_of(8, 0) == t.stride_bytes);
                } else {
                    CHECK(layout.byte_of(0, 8) == t.stride_bytes);
                    if (mn > 8 * chunks_of(s)) CHECK(layout.byte_of(8 * chunks_of(s), 0) == t.leading_bytes);
                }
                CHECK(t.bytes % 1024 == 0);
            }
}

#ifndef __CUDACC__
// ---------------------------------------------------------------------------------------------
// The emulator's checks of the asynchronous rules (undefined behaviour on a GPU, so not run there).

namespace {

enum class Misuse { none, no_fence, no_fence_after_wait, rewrite_operand, write_accumulator, read_early, divergent_desc, offset_start };

// One warpgroup, B 64 x 64 K-major unswizzled from zeros-and-ones, RS with A = ones: each D element
// is the count of ones in its B column. Then one misuse.
__global__ void wgmma_misuse_kernel(float* out, int misuse) {
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char* smem = smem_raw + ((1024 - shared_address(smem_raw) % 1024) % 1024);
    bf16* b = reinterpret_cast<bf16*>(smem);
    for (int i = int(threadIdx.x); i < 64 * 16; i += int(blockDim.x)) b[i] = __float2bfloat16(float(i % 3 == 0));
    __syncthreads();
    const uint32_t ones = 0x3f803f80u;  // two bf16 1.0
    const uint32_t af[4] = {ones, ones, ones, ones};
    float acc[32];
    for (float& x : acc) x = 0.0f;
    uint32_t start = 0;
    if (Misuse(misuse) == Misuse::divergent_desc && threadIdx.x == 5) start = 128;
    const uint64_t desc = wgmma_descriptor(smem + start, SmemSwizzle::none, 128 * 8, 128);
    if (Misuse(misuse) != Misuse::no_fence) wgmma_fence();
    wgmma_m64k16_rs<64, false>(acc, af, desc, false);
    wgmma_commit_group();
    if (Misuse(misuse) == Misuse::rewrite_operand && threadIdx.x == 0) b[3] = __float2bfloat16(7.0f);
    if (Misuse(misuse) == Misuse::write_accumulator && threadIdx.x == 0) acc[2] = 1.0f;
    if (Misuse(misuse) == Misuse::read_early) out[threadIdx.x] = acc[0];  // NaN in the emulator
    wgmma_wait_group<0>();
    if (Misuse(misuse) != Misuse::read_early) out[threadIdx.x] = acc[0];
    if (Misuse(misuse) == Misuse::no_fence_after_wait) {
        wgmma_m64k16_rs<64, false>(acc, af, desc, true);
        wgmma_commit_group();
        wgmma_wait_group<0>();
    }
    if (Misuse(misuse) == Misuse::offset_start) {
        wgmma_fence();
        const uint64_t inside = wgmma_descriptor(smem + 128, SmemSwizzle::bytes128, 16, 1024);
        wgmma_m64k16_rs<64, false>(acc, af, inside, true);
        wgmma_commit_group();
        wgmma_wait_group<0>();
    }
}

// Two groups in flight into two accumulators; wait_group 1 retires the older only.
__global__ void wgmma_two_groups_kernel(float* out) {
    DYNAMIC_SHARED(unsigned char, smem);
    bf16* b = reinterpret_cast<bf16*>(smem);
    for (int i = int(threadIdx.x); i < 64 * 16; i += int(blockDim.x)) b[i] = __float2bfloat16(1.0f);
    __syncthreads();
    const uint32_t ones = 0x3f803f80u;
    const uint32_t af[4] = {ones, ones, ones, ones};
    float first[32], second[32];
    const uint64_t desc = wgmma_descriptor(smem, SmemSwizzle::none, 128 * 8, 128);
    wgmma_fence();
    wgmma_m64k16_rs<64, false>(first, af, desc, false);
    wgmma_commit_group();
    wgmma_m64k16_rs<64, false>(second, af, desc, false);
    wgmma_m64k16_rs<64, false>(second, af, desc, true);  // chained on accumulators in flight
    wgmma_commit_group();
    wgmma_wait_group<1>();
    out[3 * threadIdx.x] = first[0];
    out[3 * threadIdx.x + 1] = second[0];  // still in flight: NaN
    wgmma_wait_group<0>();
    out[3 * threadIdx.x + 2] = second[0];
}

}  // namespace

TEST_CASE("emulator: wgmma's accumulators read NaN until their group is waited for; wait_group 1 keeps the newest") {
    DeviceBuffer<float> out(3 * 128);
    launch<wgmma_two_groups_kernel>(dim3(1), dim3(128), 64 * 16 * 2, nullptr, out.ptr);
    const std::vector<float> got = out.download();
    for (int t = 0; t < 128; ++t) {
        CAPTURE(t);
        CHECK(got[3 * t] == 16.0f);
        CHECK(std::isnan(got[3 * t + 1]));
        CHECK(got[3 * t + 2] == 32.0f);
    }
    DeviceBuffer<float> early(128);
    launch<wgmma_misuse_kernel>(dim3(1), dim3(128), 64 * 16 * 2 + 1024, nullptr, early.ptr, int(Misuse::read_early));
    for (float x : early.download()) CHECK(std::isnan(x));
    launch<wgmma_misuse_kernel>(dim3(1), dim3(128), 64 * 16 * 2 + 1024, nullptr, early.ptr, int(Misuse::none));
    // A lane's acc[0] is column n = 2 (lane % 4) of D: B's elements (n, k), K-major with SBO 128 and
    // LBO 1024 bytes, are b[8 n + k % 8 + 512 (k / 8)] (n < 8), ones where that index is a multiple of 3.
    const std::vector<float> got_none = early.download();
    for (int t = 0; t < 128; ++t) {
        const int n = 2 * (t % 4);
        float expected = 0.0f;
        for (int k = 0; k < 16; ++k) expected += float((8 * n + k % 8 + 512 * (k / 8)) % 3 == 0);
        CAPTURE(t);
        CHECK(got_none[t] == expected);
    }
}

TEST_CASE("emulator: a wgmma without a fence, with operands or accumulators touched in flight, or with divergent or unemulated descriptors fails the launch") {
    DeviceBuffer<float> out(256);
    const size_t smem = 64 * 16 * 2 + 1024;
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (Misuse m : {Misuse::no_fence, Misuse::no_fence_after_wait, Misuse::rewrite_operand, Misuse::write_accumulator,
                     Misuse::divergent_desc, Misuse::offset_start}) {
        CAPTURE(int(m));
        CHECK(try_launch<wgmma_misuse_kernel>(dim3(1), dim3(128), smem, nullptr, out.ptr, int(m)) == cudaErrorLaunchFailure);
        cudaGetLastError();
    }
    // Not whole warpgroups.
    CHECK(try_launch<wgmma_misuse_kernel>(dim3(1), dim3(96), smem, nullptr, out.ptr, int(Misuse::none)) == cudaErrorLaunchFailure);
    cudaGetLastError();
    CHECK(try_launch<wgmma_misuse_kernel>(dim3(1), dim3(128), smem, nullptr, out.ptr, int(Misuse::none)) == cudaSuccess);
}
#endif
