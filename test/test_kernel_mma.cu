// The tensor-core wrappers (kernels/tensor_core.cuh): mma.sync m16n8k16 bf16, ldmatrix x1/x2/x4
// with and without .trans, cp.async with commit/wait groups. Inputs are index-encoded (an
// element's value names its row and column, exactly representable), so a lane or register
// mapped wrongly is reported as the element it got. The expected layouts are written out here
// from the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type", "Warp-level
// matrix load instruction: ldmatrix"), independently of the emulator's code.
// precision: BF16 only (nothing here uses floatX: an FP32 twin would repeat the same test).
#include "test_util.h"

#include "kernels/tensor_core.cuh"

#include <cmath>
#include <random>
#include <string>

namespace {

using bf16 = __nv_bfloat16;

float bf16_value(float x) { return __bfloat162float(__float2bfloat16(x)); }

std::string at(int row, int col) { return "[" + std::to_string(row) + "][" + std::to_string(col) + "]"; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32

__device__ inline uint32_t bf16_pair(bf16 lo, bf16 hi) {
    return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

// One warp: every lane gathers its fragments of A (16x16 row-major), B (16x8, B[k][n] at
// b[k * 8 + n]) and C (16x8) with the ISA's formulas, and scatters D the same way.
__global__ void mma_kernel(float* d, const bf16* a, const bf16* b, const float* c) {
    const int lane = int(threadIdx.x), g = lane >> 2, t = lane % 4;
    auto A = [&](int row, int col) { return a[row * 16 + col]; };
    auto B = [&](int row, int col) { return b[row * 8 + col]; };
    const uint32_t af[4] = {bf16_pair(A(g, 2 * t), A(g, 2 * t + 1)), bf16_pair(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
                            bf16_pair(A(g, 2 * t + 8), A(g, 2 * t + 9)),
                            bf16_pair(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9))};
    const uint32_t bf[2] = {bf16_pair(B(2 * t, g), B(2 * t + 1, g)), bf16_pair(B(2 * t + 8, g), B(2 * t + 9, g))};
    float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    mma_m16n8k16_bf16(acc, af, bf, acc);  // d aliasing c, as kernels use it
    d[g * 8 + 2 * t] = acc[0];
    d[g * 8 + 2 * t + 1] = acc[1];
    d[(g + 8) * 8 + 2 * t] = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

namespace {

std::vector<float> run_mma(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
    std::vector<bf16> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = __float2bfloat16(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = __float2bfloat16(b[i]);
    DeviceBuffer<bf16> da(a16), db(b16);
    DeviceBuffer<float> dc(c), dd(16 * 8);
    dd.fill_bytes(0xFF);
    launch<mma_kernel>(dim3(1), dim3(32), 0, nullptr, dd.ptr, da.ptr, db.ptr, dc.ptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return dd.download();
}

}  // namespace

TEST_CASE("mma m16n8k16: each lane's A, B and C fragments land where the PTX ISA says") {
    // A[r][k] = 16 r + k (0..255: exact in bf16). D = A E with E[k][n] = (k == n + 8 half)
    // copies columns 8 half .. 8 half + 7 of A into D, so D[r][n] must be 16 r + n + 8 half.
    std::vector<float> a(256), zero_c(128, 0.0f);
    for (int i = 0; i < 256; ++i) a[i] = float(i);
    for (int half = 0; half < 2; ++half) {
        std::vector<float> select(128, 0.0f);
        for (int n = 0; n < 8; ++n) select[(n + 8 * half) * 8 + n] = 1.0f;
        const std::vector<float> d = run_mma(a, select, zero_c);
        for (int r = 0; r < 16; ++r)
            for (int n = 0; n < 8; ++n) {
                const float got = d[r * 8 + n], want = float(16 * r + n + 8 * half);
                INFO("D" << at(r, n) << " should be A" << at(r, n + 8 * half) << " but holds "
                         << (got >= 0 && got < 256 && got == std::floor(got) ? "A" + at(int(got) / 16, int(got) % 16)
                                                                             : std::to_string(got)));
                CHECK(got == want);
            }
    }
    // B[k][n] = 8 k + n (0..127); D = I B with the 16x16 identity gives D = B.
    std::vector<float> identity(256, 0.0f), b(128);
    for (int k = 0; k < 16; ++k) identity[k * 16 + k] = 1.0f;
    for (int i = 0; i < 128; ++i) b[i] = float(i);
    const std::vector<float> d = run_mma(identity, b, zero_c);
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 8; ++n) {
            const float got = d[k * 8 + n];
            INFO("D" << at(k, n) << " should be B" << at(k, n) << " but holds "
                     << (got >= 0 && got < 128 && got == std::floor(got) ? "B" + at(int(got) / 8, int(got) % 8)
                                                                         : std::to_string(got)));
            CHECK(got == float(8 * k + n));
        }
    // C[m][n] = 8 m + n + 0.25 with A = B = 0: D = C.
    std::vector<float> c(128);
    for (int i = 0; i < 128; ++i) c[i] = float(i) + 0.25f;
    const std::vector<float> dc = run_mma(std::vector<float>(256, 0.0f), std::vector<float>(128, 0.0f), c);
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            const float got = dc[m * 8 + n];
            INFO("D" << at(m, n) << " should be C" << at(m, n) << " but holds C"
                     << at(int(got - 0.25f) / 8, int(got - 0.25f) % 8));
            CHECK(got == c[m * 8 + n]);
        }
}

TEST_CASE("mma m16n8k16 computes A B + C in FP32 against a double reference") {
    std::mt19937 rng(7);
    SECTION("small integers: every product and partial sum is exact") {
        std::uniform_int_distribution<int> small(-20, 20);
        std::vector<float> a(256), b(128), c(128);
        for (auto& x : a) x = float(small(rng));
        for (auto& x : b) x = float(small(rng));
        for (auto& x : c) x = float(small(rng) * 100);
        const std::vector<float> d = run_mma(a, b, c);
        for (int m = 0; m < 16; ++m)
            for (int n = 0; n < 8; ++n) {
                double ref = c[m * 8 + n];
                for (int k = 0; k < 16; ++k) ref += double(a[m * 16 + k]) * b[k * 8 + n];
                INFO("D" << at(m, n));
                CHECK(double(d[m * 8 + n]) == ref);
            }
    }
    SECTION("random bf16 inputs, accumulating twice into random C") {
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        std::vector<float> a(256), b(128), c(128);
        for (auto& x : a) x = bf16_value(uniform(rng) * 4.0f);
        for (auto& x : b) x = bf16_value(uniform(rng));
        for (auto& x : c) x = uniform(rng) * 8.0f;
        const std::vector<float> d1 = run_mma(a, b, c);
        const std::vector<float> d2 = run_mma(a, b, d1);  // D = A B + (A B + C)
        for (int m = 0; m < 16; ++m)
            for (int n = 0; n < 8; ++n) {
                double dot = 0.0, magnitude = std::abs(double(c[m * 8 + n]));
                for (int k = 0; k < 16; ++k) {
                    dot += double(a[m * 16 + k]) * b[k * 8 + n];
                    magnitude += std::abs(double(a[m * 16 + k]) * b[k * 8 + n]);
                }
                // bf16 products are exact in FP32; 16 FP32 additions in some order lose at most
                // 16 * 2^-24 of the sum of magnitudes (the emulator adds in k order; the hardware's
                // order and internal precision are unspecified, so allow 16x that: 2^-20).
                const double tol = std::ldexp(magnitude, -20);
                INFO("D" << at(m, n));
                CHECK(std::abs(double(d1[m * 8 + n]) - (c[m * 8 + n] + dot)) <= tol);
                CHECK(std::abs(double(d2[m * 8 + n]) - (c[m * 8 + n] + 2 * dot)) <= 3 * tol);
            }
    }
}

// ---------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16

namespace {

// Element (row, col) of matrix i holds 0x1000 + 64 i + 8 row + col; padding holds kPad.
constexpr uint16_t kPad = 0xDEAD;
uint16_t code(int matrix, int row, int col) { return uint16_t(0x1000 + 64 * matrix + 8 * row + col); }
std::string decode(uint16_t v) {
    if (v == kPad) return "padding";
    if (v < 0x1000 || v >= 0x1100) return "garbage " + std::to_string(v);
    const int x = v - 0x1000;
    return "matrix " + std::to_string(x / 64) + " element" + at(x % 64 / 8, x % 8);
}

// Rows are 32 bytes apart (8 elements, then 8 of padding) and the matrices interleaved, in
// reverse: row r of matrix i is smem row 4 r + 3 - i. So only per-lane addresses find them.
constexpr int kSmemRowElems = 16;
__host__ __device__ inline int smem_row(int matrix, int row) { return 4 * row + 3 - matrix; }

}  // namespace

template <int kCount, bool kTrans> __global__ void ldmatrix_kernel(uint32_t* out) {
    DYNAMIC_SHARED(uint16_t, smem);  // 32 rows of kSmemRowElems
    const int lane = int(threadIdx.x);
    for (int i = lane; i < 32 * kSmemRowElems; i += 32) {
        const int srow = i / kSmemRowElems, col = i % kSmemRowElems;
        smem[i] = col < 8 ? uint16_t(0x1000 + 64 * (3 - srow % 4) + 8 * (srow / 4) + col) : kPad;
    }
    __syncwarp();
    // Lanes beyond the 8 kCount that are read point at some other row, which must not matter.
    const int matrix = lane / 8 < kCount ? lane / 8 : 3 - lane / 8, row = lane / 8 < kCount ? lane % 8 : 7 - lane % 8;
    const uint16_t* address = smem + smem_row(matrix, row) * kSmemRowElems;
    uint32_t r[4] = {0, 0, 0, 0};
    if constexpr (kCount == 1) kTrans ? ldmatrix_x1_trans(r, address) : ldmatrix_x1(r, address);
    if constexpr (kCount == 2) kTrans ? ldmatrix_x2_trans(r, address) : ldmatrix_x2(r, address);
    if constexpr (kCount == 4) kTrans ? ldmatrix_x4_trans(r, address) : ldmatrix_x4(r, address);
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

template <int kCount, bool kTrans> void check_ldmatrix() {
    INFO("ldmatrix .x" << kCount << (kTrans ? ".trans" : ""));
    DeviceBuffer<uint32_t> out(32 * 4);
    launch<ldmatrix_kernel<kCount, kTrans>>(dim3(1), dim3(32), 32 * kSmemRowElems * sizeof(uint16_t), nullptr,
                                            out.ptr);
    const std::vector<uint32_t> r = out.download();
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane % 4;
        for (int i = 0; i < kCount; ++i) {
            for (int half = 0; half < 2; ++half) {
                // Register i: matrix i, row g, cols 2t, 2t+1; transposed: col g, rows 2t, 2t+1.
                const uint16_t want = kTrans ? code(i, 2 * t + half, g) : code(i, g, 2 * t + half);
                const uint16_t got = uint16_t(r[lane * 4 + i] >> (16 * half));
                INFO("lane " << lane << " register " << i << (half ? " high" : " low") << " half: expected "
                             << decode(want) << ", got " << decode(got));
                CHECK(got == want);
            }
        }
    }
}

TEST_CASE("ldmatrix x1, x2, x4, plain and .trans: every lane gets the elements the PTX ISA names") {
    check_ldmatrix<1, false>();
    check_ldmatrix<2, false>();
    check_ldmatrix<4, false>();
    check_ldmatrix<1, true>();
    check_ldmatrix<2, true>();
    check_ldmatrix<4, true>();
}

// ldmatrix feeding mma the way the attention kernels do: A from a row-major tile (x4), B = K^T
// from rows of K (x2) and B = V from rows of V (x2.trans); D = A K^T and D = A V.
__global__ void ldmatrix_mma_kernel(float* d_kt, float* d_v, const bf16* a, const bf16* k, const bf16* v) {
    DYNAMIC_SHARED(bf16, smem);
    constexpr int ld = 24;  // padded rows (48 bytes: 16-byte aligned)
    bf16* sa = smem;            // [16][ld]
    bf16* sk = sa + 16 * ld;    // [8][ld]: K rows (n = 8 keys, k = 16 dims)
    bf16* sv = sk + 8 * ld;     // [16][ld]: V rows (k = 16 keys, n = 8 dims)
    const int lane = int(threadIdx.x), g = lane >> 2, t = lane % 4;
    for (int i = lane; i < 16 * 16; i += 32) sa[i / 16 * ld + i % 16] = a[i];
    for (int i = lane; i < 8 * 16; i += 32) sk[i / 16 * ld + i % 16] = k[i];
    for (int i = lane; i < 16 * 8; i += 32) sv[i / 8 * ld + i % 8] = v[i];
    __syncwarp();
    uint32_t af[4], kf[2], vf[2];
    ldmatrix_x4(af, sa + (lane % 16) * ld + (lane / 16) * 8);
    ldmatrix_x2(kf, sk + (lane % 8) * ld + ((lane / 8) % 2) * 8);
    ldmatrix_x2_trans(vf, sv + (lane % 16) * ld);
    float acc[4] = {0, 0, 0, 0}, acc_v[4] = {0, 0, 0, 0};
    mma_m16n8k16_bf16(acc, af, kf, acc);
    mma_m16n8k16_bf16(acc_v, af, vf, acc_v);
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        d_kt[row * 8 + col] = acc[i];
        d_v[row * 8 + col] = acc_v[i];
    }
}

TEST_CASE("ldmatrix fragments feed mma: A K^T from K's rows, A V from V's rows transposed") {
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> small(-8, 8);
    std::vector<bf16> a(256), k(128), v(128);
    for (auto& x : a) x = __float2bfloat16(float(small(rng)));
    for (auto& x : k) x = __float2bfloat16(float(small(rng)));
    for (auto& x : v) x = __float2bfloat16(float(small(rng)));
    DeviceBuffer<bf16> da(a), dk(k), dv(v);
    DeviceBuffer<float> d_kt(128), d_v(128);
    launch<ldmatrix_mma_kernel>(dim3(1), dim3(32), (16 + 8 + 16) * 24 * sizeof(bf16), nullptr, d_kt.ptr, d_v.ptr,
                                da.ptr, dk.ptr, dv.ptr);
    const std::vector<float> got_kt = d_kt.download(), got_v = d_v.download();
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            double ref_kt = 0, ref_v = 0;  // small integers: exact
            for (int j = 0; j < 16; ++j) {
                ref_kt += double(__bfloat162float(a[m * 16 + j])) * __bfloat162float(k[n * 16 + j]);
                ref_v += double(__bfloat162float(a[m * 16 + j])) * __bfloat162float(v[j * 8 + n]);
            }
            INFO("D" << at(m, n));
            CHECK(double(got_kt[m * 8 + n]) == ref_kt);
            CHECK(double(got_v[m * 8 + n]) == ref_v);
        }
}

// ---------------------------------------------------------------------------------------------
// Warp tile products (mma_a_bt, mma_p_b, mma_at_b and the _rows forms): one warp's 16 F rows
// against a shared-memory tile, as the attention kernels call them, against a double reference; in
// the emulator also as one collective (the default) against the instructions, bit for bit.

// Dense (16 F x N) row-major floats to and from one lane's fragments (accumulator layout): element i of
// tile j of fragment f is row 16 f + g (+8 for c2, c3), column 8 j + 2 t (+1 for c1, c3).
__device__ inline int fragment_element(int N, int f, int j, int i) {
    const int lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane % 4;
    return (16 * f + g + (i >= 2 ? 8 : 0)) * N + 8 * j + 2 * t + (i & 1);
}
template <int F, int N> __device__ inline void load_fragments(float (&acc)[F][N / 8][4], const float* dense) {
    for (int f = 0; f < F; ++f)
        for (int j = 0; j < N / 8; ++j)
            for (int i = 0; i < 4; ++i) acc[f][j][i] = dense[fragment_element(N, f, j, i)];
}
template <int F, int N> __device__ inline void store_fragments(float* dense, const float (&acc)[F][N / 8][4]) {
    for (int f = 0; f < F; ++f)
        for (int j = 0; j < N / 8; ++j)
            for (int i = 0; i < 4; ++i) dense[fragment_element(N, f, j, i)] = acc[f][j][i];
}

// Shared memory: the first operand's rows (rows_a of ld_a), then B's rows (rows_b of ld_b), copied
// from global memory as they are. `a` is null for p_b (P comes from registers: p, 16 F x K dense).
enum class TileForm { a_bt, p_b, at_b };
template <TileForm kForm, int F, int N, int K>
__global__ void tile_product_kernel(float* acc_out, const float* acc_in, const float* p_in, const bf16* a, int rows_a,
                                    int ld_a, const bf16* b, int rows_b, int ld_b, const int* live, int live_begin,
                                    int live_end) {
    DYNAMIC_SHARED(bf16, smem);
    bf16* sa = smem;
    bf16* sb = smem + rows_a * ld_a;
    for (int i = int(threadIdx.x); i < rows_a * ld_a; i += 32) sa[i] = a[i];
    for (int i = int(threadIdx.x); i < rows_b * ld_b; i += 32) sb[i] = b[i];
    __syncwarp();
    float acc[F][N / 8][4], p[F][K / 8][4];
    load_fragments<F, N>(acc, acc_in);
    if constexpr (kForm == TileForm::a_bt) {
        if constexpr (F == 1) mma_a_bt<N, K>(acc[0], sa, sb, ld_b, live_begin, live_end);
        else mma_a_bt_rows<F, N, K>(acc, sa, sb, ld_b, live_begin, live_end);
    } else if constexpr (kForm == TileForm::p_b) {
        load_fragments<F, K>(p, p_in);
        if constexpr (F == 1) mma_p_b<N, K>(acc[0], p[0], sb, ld_b, live_begin, live_end);
        else mma_p_b_rows<F, N, K>(acc, p, sb, ld_b, live_begin, live_end);
    } else {
        mma_at_b<N, K>(acc[0], sa, ld_a, sb, ld_b, live, live_begin, live_end);
    }
    store_fragments<F, N>(acc_out, acc);
}

namespace {

// Operands and reference of one product: A (16 F x K) and B (K x N) as the reference reads them.
struct TileCase {
    std::vector<float> acc, p;   // dense C (16 F x N); P (16 F x K) for p_b
    std::vector<bf16> a, b;      // the shared-memory images
    int rows_a = 0, ld_a = 0, rows_b = 0, ld_b = 0;
    std::vector<int> live;       // at_b: k blocks of 16 taking part
    int live_begin = 0, live_end = 0;  // the live range: of n (a_bt), of k (p_b, at_b)
    // Whether the product takes k, and computes column n.
    bool takes_k(int k) const { return live[k / 16] && (a_bt_range || (k >= live_begin && k < live_end)); }
    bool computes_column(int n) const { return !a_bt_range || (n >= live_begin && n < live_end); }
    bool a_bt_range = false;
};

// live: at_b's k blocks taking part (empty: all); range: the live range (empty: the whole n or k).
template <TileForm kForm, int F, int N, int K>
TileCase make_tile_case(std::mt19937& rng, std::vector<int> live = {}, std::pair<int, int> range = {0, -1}) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    TileCase c;
    c.a_bt_range = kForm == TileForm::a_bt;
    c.live_begin = range.first, c.live_end = range.second < 0 ? (kForm == TileForm::a_bt ? N : K) : range.second;
    c.acc.resize(size_t(16 * F * N));
    for (float& x : c.acc) x = normal(rng);
    c.live = live.empty() ? std::vector<int>(K / 16, 1) : live;
    // ld: the row plus 8 elements of padding, as the kernels lay out their tiles (16-byte aligned rows).
    if (kForm == TileForm::a_bt) {
        c.rows_a = 16 * F, c.ld_a = K + 8, c.rows_b = N, c.ld_b = K + 8;  // B^T's rows: n rows of k
    } else {
        c.rows_b = K, c.ld_b = N + 8;  // B's rows: k rows of n
        if (kForm == TileForm::p_b) {
            c.p.resize(size_t(16 * F * K));
            for (float& x : c.p) x = normal(rng);  // rounded to bf16 by the product
        } else {
            c.rows_a = K, c.ld_a = 16 + 8;  // A^T's rows: k rows of the 16 A rows
        }
    }
    c.a.resize(size_t(c.rows_a) * c.ld_a);
    c.b.resize(size_t(c.rows_b) * c.ld_b);
    for (bf16& x : c.a) x = __float2bfloat16(normal(rng));
    for (bf16& x : c.b) x = __float2bfloat16(normal(rng));
    // The k blocks a product skips hold NaN in both operands (at_b's A^T and B rows, p_b's P columns and
    // B rows), and so do the B^T rows of the columns an a_bt leaves: a product that read them would show it.
    if (kForm == TileForm::a_bt) {
        for (int n = 0; n < N; ++n)
            if (!c.computes_column(n))
                for (int j = 0; j < c.ld_b; ++j) c.b[size_t(n) * c.ld_b + j] = __float2bfloat16(NAN);
    } else {
        for (int kk = 0; kk < K; ++kk) {
            if (c.takes_k(kk)) continue;
            if (kForm == TileForm::at_b)
                for (int j = 0; j < c.ld_a; ++j) c.a[size_t(kk) * c.ld_a + j] = __float2bfloat16(NAN);
            else
                for (int m = 0; m < 16 * F; ++m) c.p[size_t(m) * K + kk] = NAN;
            for (int j = 0; j < c.ld_b; ++j) c.b[size_t(kk) * c.ld_b + j] = __float2bfloat16(NAN);
        }
    }
    return c;
}

template <TileForm kForm, int F, int N, int K> std::vector<float> run_tile_product(const TileCase& c) {
    DeviceBuffer<float> acc_in(c.acc), acc_out(c.acc.size()), p(c.p.empty() ? std::vector<float>(1) : c.p);
    DeviceBuffer<bf16> a(c.a.empty() ? std::vector<bf16>(1) : c.a), b(c.b);
    DeviceBuffer<int> live(c.live);
    acc_out.fill_bytes(0xFF);
    const size_t smem = (c.a.size() + c.b.size()) * sizeof(bf16);
    launch<tile_product_kernel<kForm, F, N, K>>(dim3(1), dim3(32), smem, nullptr, acc_out.ptr, acc_in.ptr, p.ptr, a.ptr,
                                                c.rows_a, c.ld_a, b.ptr, c.rows_b, c.ld_b, live.ptr, c.live_begin, c.live_end);
    CUDA_CHECK(cudaDeviceSynchronize());
    return acc_out.download();
}

// C + A B in double: the products are exact, so the FP32 sums may differ only by their roundings,
// at most K of them, each within 2^-24 of a partial sum bounded by sum |terms|.
template <TileForm kForm, int F, int N, int K> void check_tile_reference(const TileCase& c, const std::vector<float>& got) {
    auto A = [&](int m, int k) -> double {
        if (kForm == TileForm::a_bt) return __bfloat162float(c.a[size_t(m) * c.ld_a + k]);
        if (kForm == TileForm::p_b) return bf16_value(c.p[size_t(m) * K + k]);
        return __bfloat162float(c.a[size_t(k) * c.ld_a + m]);
    };
    auto B = [&](int k, int n) -> double {
        if (kForm == TileForm::a_bt) return __bfloat162float(c.b[size_t(n) * c.ld_b + k]);
        return __bfloat162float(c.b[size_t(k) * c.ld_b + n]);
    };
    for (int m = 0; m < 16 * F; ++m)
        for (int n = 0; n < N; ++n) {
            double ref = c.acc[size_t(m) * N + n], magnitude = std::fabs(ref);
            for (int k = 0; k < K && c.computes_column(n); ++k) {
                if (!c.takes_k(k)) continue;
                ref += A(m, k) * B(k, n);
                magnitude += std::fabs(A(m, k) * B(k, n));
            }
            const double g = got[size_t(m) * N + n];
            INFO("D" << at(m, n) << ": " << g << " against " << ref);
            CHECK(std::fabs(g - ref) <= (K + 1) * 0x1p-24 * magnitude);  // false for NaN
        }
}

template <TileForm kForm, int F, int N, int K>
void check_tile_product(uint32_t seed, std::vector<int> live = {}, std::pair<int, int> range = {0, -1}) {
    CAPTURE(int(kForm), F, N, K, seed, range.first, range.second);
    std::mt19937 rng(seed);
    const TileCase c = make_tile_case<kForm, F, N, K>(rng, live, range);
    const std::vector<float> got = run_tile_product<kForm, F, N, K>(c);
    check_tile_reference<kForm, F, N, K>(c, got);
#ifndef __CUDACC__
    // The emulator's two ways: got came from the default (one collective); now the instructions.
    REQUIRE(cuemu::tensor_core_mode() == cuemu::TensorCoreMode::tiles);
    cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::instructions);
    const std::vector<float> by_instructions = run_tile_product<kForm, F, N, K>(c);
    cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::tiles);
    check_tile_reference<kForm, F, N, K>(c, by_instructions);
    CHECK(bitwise_equal(got, by_instructions));
#endif
}

}  // namespace

TEST_CASE("warp tile products: A B^T, P B and A^T B (with skipped k blocks) against a double reference") {
#ifndef __CUDACC__
    // CUEMU_TENSOR_CORE=instructions (a test configuration) runs the instructions throughout.
    const cuemu::TensorCoreMode mode = cuemu::tensor_core_mode();
    cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::tiles);
#endif
    check_tile_product<TileForm::a_bt, 1, 64, 64>(1);   // S = Q K^T at hs 64, 64 keys
    check_tile_product<TileForm::a_bt, 1, 32, 128>(2);  // hs 128, 32 keys
    check_tile_product<TileForm::a_bt, 2, 64, 32>(3);   // two row fragments (the forward's 128 queries)
    check_tile_product<TileForm::p_b, 1, 64, 64>(4);    // O += P V
    check_tile_product<TileForm::p_b, 1, 128, 32>(5);   // hs 128
    check_tile_product<TileForm::p_b, 2, 16, 64>(6);    // two row fragments, hs 16
    check_tile_product<TileForm::at_b, 1, 32, 64>(7);                  // dQ += dS K, every block
    check_tile_product<TileForm::at_b, 1, 16, 64>(8, {1, 0, 1, 0});    // masked key blocks skipped
    check_tile_product<TileForm::at_b, 1, 8, 32>(9, {0, 1});           // one n tile (hs 16's dQ parts)
    check_tile_product<TileForm::at_b, 1, 32, 32>(10, {0, 0});         // nothing live: C unchanged
    // Live ranges, as the attention kernels pass a causal mask's diagonal tiles: the other columns of
    // an A B^T keep C, the other k of a P B or A^T B add nothing (their operands NaN).
    check_tile_product<TileForm::a_bt, 1, 64, 64>(11, {}, {0, 32});    // the forward's first warps
    check_tile_product<TileForm::a_bt, 1, 64, 64>(12, {}, {16, 64});   // the key kernels' S^T from a warp's keys
    check_tile_product<TileForm::a_bt, 2, 64, 32>(13, {}, {16, 48});
    check_tile_product<TileForm::a_bt, 1, 32, 16>(14, {}, {16, 16});   // nothing: C unchanged
    check_tile_product<TileForm::p_b, 1, 64, 64>(15, {}, {0, 48});
    check_tile_product<TileForm::p_b, 2, 16, 64>(16, {}, {32, 64});
    check_tile_product<TileForm::p_b, 1, 128, 32>(17, {}, {16, 32});
    check_tile_product<TileForm::at_b, 1, 16, 128>(18, {1, 0, 1, 1, 1, 1, 1, 1}, {0, 80});  // dQ: live warps, up to its queries
    check_tile_product<TileForm::at_b, 1, 8, 32>(19, {}, {0, 16});
#ifndef __CUDACC__
    cuemu::set_tensor_core_mode(mode);
#endif
}

// ---------------------------------------------------------------------------------------------
// cp.async with commit and wait groups

// 64 threads copy two 1 KB halves of src into shared memory as two groups (chunks of the second
// half with index % 5 == 4 zero-filled instead), wait for the first, publish it with a barrier and
// read it all (other threads' chunks too), then the same for the second.
__global__ void cp_async_kernel(uint32_t* out, const uint32_t* src) {
    DYNAMIC_SHARED(uint32_t, smem);  // 512 words
    const int t = int(threadIdx.x);
    cp_async_16(smem + 4 * t, src + 4 * t);
    cp_async_commit();
    cp_async_16_or_zero(smem + 256 + 4 * t, src + 256 + 4 * t, t % 5 != 4);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    out += blockIdx.x * 512;
    for (int i = t; i < 256; i += 64) out[i] = smem[255 - i];
    cp_async_wait<0>();
    __syncthreads();
    for (int i = t; i < 256; i += 64) out[256 + i] = smem[256 + 255 - i];
}

TEST_CASE("cp.async: groups complete at wait_group, and src-size 0 zero-fills") {
    std::vector<uint32_t> src(512);
    for (int i = 0; i < 512; ++i) src[i] = 0x10000u + uint32_t(i);
    DeviceBuffer<uint32_t> dsrc(src), out(3 * 512);
    out.fill_bytes(0);
    launch<cp_async_kernel>(dim3(3), dim3(64), 512 * sizeof(uint32_t), nullptr, out.ptr, dsrc.ptr);
    const std::vector<uint32_t> got = out.download();
    for (int i = 0; i < 3 * 512; ++i) {
        const int j = i % 512, word = j < 256 ? 255 - j : 256 + 255 - (j - 256);
        const bool zeroed = word >= 256 && ((word - 256) / 4) % 5 == 4;
        INFO("block " << i / 512 << ", shared word " << word);
        CHECK(got[i] == (zeroed ? 0u : src[word]));
    }
}

#ifndef __CUDACC__
// What only the emulator can promise: a read before the copy's group is waited for sees NaN
// (poison), never the data; and copies a block leaves pending do not land in the next block.

__global__ void early_read_kernel(float* out, const float* src) {
    DYNAMIC_SHARED(float, smem);  // 2 x 4 floats per thread
    const int t = int(threadIdx.x);
    cp_async_16(smem + 4 * t, src + 4 * t);
    out[4 * t] = smem[4 * t];  // no wait at all
    cp_async_commit();
    cp_async_16(smem + 128 + 4 * t, src + 128 + 4 * t);
    cp_async_commit();
    cp_async_wait<1>();  // the first group only
    out[4 * t + 1] = smem[4 * t];
    out[4 * t + 2] = smem[128 + 4 * t];  // still pending
    cp_async_wait<0>();
    out[4 * t + 3] = smem[128 + 4 * t];
}

TEST_CASE("emulator: reading a cp.async destination before its wait_group reads NaN") {
    std::vector<float> src(256);
    for (int i = 0; i < 256; ++i) src[i] = float(i);
    DeviceBuffer<float> dsrc(src), out(128);
    launch<early_read_kernel>(dim3(2), dim3(32), 256 * sizeof(float), nullptr, out.ptr, dsrc.ptr);
    const std::vector<float> got = out.download();
    for (int t = 0; t < 32; ++t) {
        INFO("thread " << t);
        CHECK(std::isnan(got[4 * t]));
        CHECK(got[4 * t + 1] == src[4 * t]);
        CHECK(std::isnan(got[4 * t + 2]));
        CHECK(got[4 * t + 3] == src[128 + 4 * t]);
    }
}

// Block 0 leaves a committed copy unwaited; block 1 (on the same OS thread) must not receive it.
__global__ void pending_at_exit_kernel(float* out, const float* src) {
    DYNAMIC_SHARED(float, smem);
    if (blockIdx.x == 0) {
        cp_async_16(smem, src);
        cp_async_commit();
        return;
    }
    smem[0] = -1.0f;
    cp_async_wait<0>();
    out[0] = smem[0];
}

TEST_CASE("emulator: cp.async copies pending when a block exits die with its shared memory") {
    const int threads = cuemu::threads();
    cuemu::set_threads(1);  // both blocks on one OS thread, one after the other
    DeviceBuffer<float> dsrc(std::vector<float>{5.0f, 6.0f, 7.0f, 8.0f}), out(1);
    launch<pending_at_exit_kernel>(dim3(2), dim3(1), 16, nullptr, out.ptr, dsrc.ptr);
    cuemu::set_threads(threads);
    CHECK(out.download()[0] == -1.0f);
}

__global__ void misaligned_ldmatrix_kernel(uint32_t* out) {
    DYNAMIC_SHARED(uint16_t, smem);
    uint32_t r[1];
    ldmatrix_x1(r, smem + 8 * (threadIdx.x % 8) + (threadIdx.x == 5 ? 1 : 0));
    out[threadIdx.x] = r[0];
}

__global__ void partial_warp_mma_kernel(float* out) {
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0};
    mma_m16n8k16_bf16(c, a, b, c);
    out[threadIdx.x] = c[0];
}

__global__ void divergent_ldmatrix_kernel(uint32_t* out) {
    DYNAMIC_SHARED(uint16_t, smem);
    uint32_t r[2];
    if (threadIdx.x < 16) ldmatrix_x2(r, smem);
    else ldmatrix_x2_trans(r, smem);
    out[threadIdx.x] = r[0];
}

__global__ void mma_meets_shuffle_kernel(float* out) {
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) mma_m16n8k16_bf16(c, a, b, c);
    else c[0] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    out[threadIdx.x] = c[0];
}

// A tile product whose lanes give different operand addresses (lane 3's B one row on), and one whose
// row stride is not a whole 16 bytes (ldmatrix's row alignment).
__global__ void divergent_tile_product_kernel(float* out) {
    DYNAMIC_SHARED(bf16, smem);
    float acc[2][4] = {};
    mma_a_bt<16, 16>(acc, smem, smem + 16 * 24 + (threadIdx.x == 3 ? 24 : 0), 24);
    out[threadIdx.x] = acc[0][0];
}
__global__ void misaligned_tile_product_kernel(float* out) {
    DYNAMIC_SHARED(bf16, smem);
    float acc[2][4] = {};
    mma_a_bt<16, 16>(acc, smem, smem + 16 * 20, 20);
    out[threadIdx.x] = acc[0][0];
}
// A live range that is not whole 16-blocks (the instructions skip pairs of n tiles, k blocks of 16).
__global__ void partial_live_range_tile_product_kernel(float* out) {
    DYNAMIC_SHARED(bf16, smem);
    float acc[2][4] = {};
    mma_a_bt<16, 16>(acc, smem, smem + 16 * 24, 24, 0, 8);
    out[threadIdx.x] = acc[0][0];
}

TEST_CASE("emulator: a tile product's lanes must agree on its operands, its rows be 16-byte aligned, its live range whole blocks") {
    const cuemu::TensorCoreMode mode = cuemu::tensor_core_mode();
    DeviceBuffer<float> out(32);
    const size_t smem = 48 * 24 * sizeof(bf16);
    // One collective: it sees the lanes disagree. (The instructions would read lane 3's row instead.)
    cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::tiles);
    CHECK(try_launch<divergent_tile_product_kernel>(dim3(1), dim3(32), smem, nullptr, out.ptr) == cudaErrorLaunchFailure);
    CHECK(try_launch<misaligned_tile_product_kernel>(dim3(1), dim3(32), smem, nullptr, out.ptr) == cudaErrorLaunchFailure);
    CHECK(try_launch<partial_live_range_tile_product_kernel>(dim3(1), dim3(32), smem, nullptr, out.ptr) == cudaErrorLaunchFailure);
    cuemu::set_tensor_core_mode(cuemu::TensorCoreMode::instructions);
    CHECK(try_launch<divergent_tile_product_kernel>(dim3(1), dim3(32), smem, nullptr, out.ptr) == cudaSuccess);
    CHECK(try_launch<misaligned_tile_product_kernel>(dim3(1), dim3(32), smem, nullptr, out.ptr) == cudaErrorLaunchFailure);
    cuemu::set_tensor_core_mode(mode);
}

TEST_CASE("emulator: misaligned ldmatrix rows, partial-warp mma and divergent forms fail the launch") {
    DeviceBuffer<uint32_t> out(64);
    DeviceBuffer<float> outf(64);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    CHECK(try_launch<misaligned_ldmatrix_kernel>(dim3(1), dim3(32), 256, nullptr, out.ptr) == cudaErrorLaunchFailure);
    CHECK(try_launch<partial_warp_mma_kernel>(dim3(1), dim3(40), 0, nullptr, outf.ptr) == cudaErrorLaunchFailure);
    CHECK(try_launch<divergent_ldmatrix_kernel>(dim3(1), dim3(32), 256, nullptr, out.ptr) == cudaErrorLaunchFailure);
    CHECK(try_launch<mma_meets_shuffle_kernel>(dim3(1), dim3(32), 0, nullptr, outf.ptr) == cudaErrorLaunchFailure);
    CHECK(try_launch<partial_warp_mma_kernel>(dim3(2), dim3(64), 0, nullptr, outf.ptr) == cudaSuccess);
}
#endif
