// Execution semantics every kernel relies on: warp collectives, barriers, shared memory,
// atomics, grid/block indexing. Portable: on a GPU the same file checks the hardware, so a
// disagreement between emu/ and the GPU shows up as a failure of `make test-gpu`.
//
// Expected values come from the CUDA C++ Programming Guide's wording ("Warp Shuffle Functions",
// "Warp Vote Functions", "Synchronization Functions"), computed independently of emu/'s
// implementation (which follows the PTX shfl.sync clamp/segment-mask formulas).
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "kernels/common.cuh"

// ---------------------------------------------------------------------------------------------
// Warp shuffles

enum ShuffleKind { kIdx, kUp, kDown, kXor };

// Each thread shuffles its linear id + 1000 * blockIdx.x; `operand` is the source lane, delta or
// lane mask; mask is the warp's existing lanes.
__global__ void shuffle_kernel(int* out, int kind, int operand, int width) {
    int tid = threadIdx.x;
    int warp_first = tid & ~31;
    int lanes = min(32, int(blockDim.x) - warp_first);
    unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    int v = tid + 1000 * int(blockIdx.x);
    int r = 0;
    if (kind == kIdx) r = __shfl_sync(mask, v, operand, width);
    if (kind == kUp) r = __shfl_up_sync(mask, v, unsigned(operand), width);
    if (kind == kDown) r = __shfl_down_sync(mask, v, unsigned(operand), width);
    if (kind == kXor) r = __shfl_xor_sync(mask, v, operand, width);
    out[blockIdx.x * blockDim.x + tid] = r;
}

// The source lane per the Programming Guide; returns -1 where the result is the caller's own.
static int guide_source_lane(int kind, int lane, int operand, int width) {
    int seg = lane / width * width;
    switch (kind) {
        case kIdx: return seg + (operand % width);                              // srcLane modulo width
        case kUp: return (lane - seg) >= operand ? lane - operand : -1;         // no wrap below the segment
        case kDown: return (lane - seg) + operand < width ? lane + operand : -1; // no wrap above the segment
        case kXor: {
            int src = lane ^ operand;  // later groups give the caller's own value; earlier ones are readable
            return src / width <= lane / width ? src : -1;
        }
    }
    return -1;
}

TEST_CASE("warp shuffles match the Programming Guide for every width, including partial warps") {
    const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
    for (int block : {32, 64, 48, 7}) {  // 48 and 7: the last warp is partial
        const int grid = 2;
        DeviceBuffer<int> out(size_t(grid) * block);
        for (int kind : {kIdx, kUp, kDown, kXor}) {
            for (int width : {1, 2, 4, 8, 16, 32}) {
                for (int operand : {0, 1, 3, 5, 8, 17, 31}) {
                    if (kind == kXor && operand >= 32) continue;
                    out.fill_bytes(0);
                    launch<shuffle_kernel>(dim3(grid), dim3(block), 0, nullptr, out.ptr, kind, operand, width);
                    std::vector<int> r = out.download();
                    for (int b = 0; b < grid; ++b) {
                        for (int t = 0; t < block; ++t) {
                            int lane = t % 32, warp_first = t - lane;
                            int lanes = std::min(32, block - warp_first);
                            int src = guide_source_lane(kind, lane, operand, width);
                            if (src >= lanes) continue;  // reading a lane that does not exist: undefined
                            int expect = (src < 0 ? t : warp_first + src) + 1000 * b;
                            INFO(names[kind] << " block " << block << " width " << width << " operand " << operand
                                             << " thread " << t);
                            REQUIRE(r[size_t(b) * block + t] == expect);
                        }
                    }
                }
            }
        }
    }
}

// Shuffles move 64-bit and floating-point values bit-exactly.
__global__ void shuffle_types_kernel(double* d_out, float* f_out, unsigned long long* u_out) {
    int lane = threadIdx.x;
    double d = 1.0 / (lane + 3);
    float f = -0.1f * float(lane);
    unsigned long long u = 0x0123456789abcdefull * unsigned(lane + 1);
    d_out[lane] = __shfl_xor_sync(0xffffffffu, d, 5);
    f_out[lane] = __shfl_down_sync(0xffffffffu, f, 2);
    u_out[lane] = __shfl_sync(0xffffffffu, u, 31 - lane);
}

TEST_CASE("shuffles move doubles, floats and 64-bit integers exactly") {
    DeviceBuffer<double> d(32);
    DeviceBuffer<float> f(32);
    DeviceBuffer<unsigned long long> u(32);
    launch<shuffle_types_kernel>(dim3(1), dim3(32), 0, nullptr, d.ptr, f.ptr, u.ptr);
    auto dh = d.download();
    auto fh = f.download();
    auto uh = u.download();
    for (int l = 0; l < 32; ++l) {
        REQUIRE(dh[l] == 1.0 / ((l ^ 5) + 3));
        REQUIRE(fh[l] == (l + 2 < 32 ? -0.1f * float(l + 2) : -0.1f * float(l)));
        REQUIRE(uh[l] == 0x0123456789abcdefull * unsigned(31 - l + 1));
    }
}

// ---------------------------------------------------------------------------------------------
// Votes and __syncwarp

__global__ void vote_kernel(unsigned* ballot, int* any, int* all, int modulus) {
    int tid = threadIdx.x;
    int warp_first = tid & ~31;
    int lanes = min(32, int(blockDim.x) - warp_first);
    unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    int pred = (tid % modulus) == 0;
    ballot[tid] = __ballot_sync(mask, pred);
    any[tid] = __any_sync(mask, pred);
    all[tid] = __all_sync(mask, pred);
}

TEST_CASE("ballot, any and all over full and partial warps") {
    for (int block : {32, 50, 96}) {
        for (int modulus : {1, 2, 3, 64}) {
            DeviceBuffer<unsigned> ballot(block);
            DeviceBuffer<int> any(block), all(block);
            launch<vote_kernel>(dim3(1), dim3(block), 0, nullptr, ballot.ptr, any.ptr, all.ptr, modulus);
            auto b = ballot.download();
            auto a = any.download();
            auto l = all.download();
            for (int t = 0; t < block; ++t) {
                int first = t & ~31, lanes = std::min(32, block - first);
                unsigned expect = 0;
                for (int i = 0; i < lanes; ++i)
                    if ((first + i) % modulus == 0) expect |= 1u << i;
                unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
                INFO("block " << block << " modulus " << modulus << " thread " << t);
                REQUIRE(b[t] == expect);
                REQUIRE(a[t] == (expect != 0));
                REQUIRE(l[t] == (expect == mask));
            }
        }
    }
}

// Lanes publish through shared memory; __syncwarp orders the writes before the reads.
__global__ void syncwarp_kernel(int* out) {
    __shared__ int slots[64];
    int tid = threadIdx.x;
    slots[tid] = tid * tid;
    __syncwarp();
    out[tid] = slots[(tid & ~31) + ((tid + 7) & 31)];
}

TEST_CASE("__syncwarp makes lane writes visible within the warp") {
    DeviceBuffer<int> out(64);
    launch<syncwarp_kernel>(dim3(1), dim3(64), 0, nullptr, out.ptr);
    auto r = out.download();
    for (int t = 0; t < 64; ++t) {
        int src = (t & ~31) + ((t + 7) & 31);
        REQUIRE(r[t] == src * src);
    }
}

// ---------------------------------------------------------------------------------------------
// Block reductions through shared memory

// Sum of x over each block's slice: warp shuffles, then one value per warp in shared memory.
__global__ void block_sum_kernel(const float* x, float* out, int n_per_block) {
    __shared__ float warp_sums[32];
    const float* slice = x + size_t(blockIdx.x) * n_per_block;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) s += slice[i];
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (warp == 0) {
        int nwarps = int(blockDim.x) / 32;
        s = lane < nwarps ? warp_sums[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
        if (lane == 0) out[blockIdx.x] = s;
    }
}

// Classic tree reduction in shared memory (block size a power of two).
__global__ void tree_sum_kernel(const float* x, float* out, int n) {
    __shared__ float buf[1024];
    int t = threadIdx.x;
    float s = 0.0f;
    for (int i = t; i < n; i += blockDim.x) s += x[i];
    buf[t] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) buf[t] += buf[t + stride];
        __syncthreads();
    }
    if (t == 0) *out = buf[0];
}

TEST_CASE("block reductions through shared memory") {
    const int blocks = 5, n = 1000;  // n: not a multiple of any block size below
    std::vector<float> x(size_t(blocks) * n);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6);  // small integers: exact sums
    DeviceBuffer<float> dx(x), out(blocks);
    for (int block : {32, 96, 256, 1024}) {
        launch<block_sum_kernel>(dim3(blocks), dim3(block), 0, nullptr, dx.ptr, out.ptr, n);
        auto r = out.download();
        for (int b = 0; b < blocks; ++b) {
            double expect = std::accumulate(x.begin() + size_t(b) * n, x.begin() + size_t(b + 1) * n, 0.0);
            INFO("block size " << block << " block " << b);
            REQUIRE(r[b] == float(expect));
        }
    }
    for (int block : {1, 2, 64, 512, 1024}) {
        launch<tree_sum_kernel>(dim3(1), dim3(block), 0, nullptr, dx.ptr, out.ptr, n);
        float r = out.download()[0];
        REQUIRE(r == float(std::accumulate(x.begin(), x.begin() + n, 0.0)));
    }
}

__global__ void syncthreads_predicates_kernel(int* out, int modulus) {
    int pred = (threadIdx.x % modulus) == 0;
    int count = __syncthreads_count(pred);
    int all = __syncthreads_and(pred);
    int any = __syncthreads_or(pred);
    if (threadIdx.x == blockDim.x - 1) {
        out[0] = count;
        out[1] = all;
        out[2] = any;
    }
}

TEST_CASE("__syncthreads_count, _and and _or") {
    DeviceBuffer<int> out(3);
    for (int modulus : {1, 3, 1000}) {
        const int block = 100;
        launch<syncthreads_predicates_kernel>(dim3(1), dim3(block), 0, nullptr, out.ptr, modulus);
        auto r = out.download();
        int expect = (block + modulus - 1) / modulus;
        REQUIRE(r[0] == expect);
        REQUIRE(r[1] == (expect == block));
        REQUIRE(r[2] == (expect > 0));
    }
}

// ---------------------------------------------------------------------------------------------
// A tiled shared-memory matmul (C = A B, row-major), with partial tiles.

constexpr int kTile = 16;

__global__ void tiled_matmul_kernel(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[kTile][kTile];
    __shared__ float Bs[kTile][kTile + 1];  // padded, as one would against bank conflicts
    int row = blockIdx.y * kTile + threadIdx.y;
    int col = blockIdx.x * kTile + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += kTile) {
        int ak = k0 + threadIdx.x, bk = k0 + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[size_t(row) * K + ak] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[size_t(bk) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < kTile; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[size_t(row) * N + col] = acc;
}

TEST_CASE("tiled shared-memory matmul with partial tiles") {
    const int M = 37, N = 29, K = 45;
    std::vector<float> a(size_t(M) * K), b(size_t(K) * N);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 11) - 5) / 4.0f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 13) - 6) / 8.0f;
    DeviceBuffer<float> da(a), db(b), dc(size_t(M) * N);
    launch<tiled_matmul_kernel>(dim3(ceil_div(N, kTile), ceil_div(M, kTile)), dim3(kTile, kTile), 0, nullptr, da.ptr,
                                db.ptr, dc.ptr, M, N, K);
    auto c = dc.download();
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double expect = 0;
            for (int k = 0; k < K; ++k) expect += double(a[size_t(i) * K + k]) * b[size_t(k) * N + j];
            // Inputs are multiples of 1/32 with small numerators: every partial sum is exact in FP32.
            REQUIRE(c[size_t(i) * N + j] == float(expect));
        }
}

// ---------------------------------------------------------------------------------------------
// Dynamic shared memory

// Reverses each block's slice through dynamic shared memory of n floats.
__global__ void reverse_kernel(const float* in, float* out, int n) {
    DYNAMIC_SHARED(float, buf);
    const float* src = in + size_t(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = src[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[size_t(blockIdx.x) * n + i] = buf[n - 1 - i];
}

TEST_CASE("dynamic shared memory, including above 48 KB after opting in") {
    for (int n : {1, 33, 1000, 20000}) {  // 20000 floats = 80 KB: needs the attribute
        size_t smem = size_t(n) * sizeof(float);
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        const int blocks = 3;
        std::vector<float> x(size_t(blocks) * n);
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
        DeviceBuffer<float> din(x), dout(x.size());
        launch<reverse_kernel>(dim3(blocks), dim3(128), smem, nullptr, din.ptr, dout.ptr, n);
        auto r = dout.download();
        for (int b = 0; b < blocks; ++b)
            for (int i = 0; i < n; ++i) REQUIRE(r[size_t(b) * n + i] == x[size_t(b) * n + (n - 1 - i)]);
    }
}

// ---------------------------------------------------------------------------------------------
// Atomics

__global__ void atomics_kernel(int* counter, float* fsum, int* imax, unsigned* umin, unsigned long long* cas_counter,
                               int* exch) {
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(counter, 1);
    atomicAdd(fsum, float(id % 8));  // small integers: the float sum is exact in any order
    atomicMax(imax, (id * 37) % 1009);
    atomicMin(umin, unsigned(5000 - id % 4096));
    // An increment built from compare-and-swap, as kernels do for unsupported atomic types.
    unsigned long long old = *cas_counter, assumed;
    do {
        assumed = old;
        old = atomicCAS(cas_counter, assumed, assumed + 2);
    } while (old != assumed);
    atomicExch(exch, 7);
}

TEST_CASE("atomics: int/float add, max, min, CAS loop, exchange across blocks") {
    const int blocks = 40, threads = 256, n = blocks * threads;
    DeviceBuffer<int> counter(1), imax(1), exch(1);
    DeviceBuffer<float> fsum(1);
    DeviceBuffer<unsigned> umin(1);
    DeviceBuffer<unsigned long long> cas(1);
    counter.fill_bytes(0);
    fsum.fill_bytes(0);
    imax.fill_bytes(0);
    umin.upload({0xffffffffu});
    cas.fill_bytes(0);
    exch.fill_bytes(0);
    launch<atomics_kernel>(dim3(blocks), dim3(threads), 0, nullptr, counter.ptr, fsum.ptr, imax.ptr, umin.ptr, cas.ptr,
                           exch.ptr);
    REQUIRE(counter.download()[0] == n);
    double fexpect = 0;
    int mexpect = 0;
    unsigned uexpect = 0xffffffffu;
    for (int id = 0; id < n; ++id) {
        fexpect += id % 8;
        mexpect = std::max(mexpect, (id * 37) % 1009);
        uexpect = std::min(uexpect, unsigned(5000 - id % 4096));
    }
    REQUIRE(fsum.download()[0] == float(fexpect));
    REQUIRE(imax.download()[0] == mexpect);
    REQUIRE(umin.download()[0] == uexpect);
    REQUIRE(cas.download()[0] == 2ull * n);
    REQUIRE(exch.download()[0] == 7);
}

// ---------------------------------------------------------------------------------------------
// 2D/3D grids and blocks

__global__ void index_kernel(int* visits, int* coords, int nx, int ny) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    int linear = (z * ny + y) * nx + x;
    atomicAdd(&visits[linear], 1);
    coords[3 * linear + 0] = int(gridDim.x * 1000000 + blockDim.x * 1000 + threadIdx.x);
    coords[3 * linear + 1] = int(gridDim.y * 1000000 + blockDim.y * 1000 + threadIdx.y);
    coords[3 * linear + 2] = int(gridDim.z * 1000000 + blockDim.z * 1000 + threadIdx.z);
}

TEST_CASE("2D and 3D grids and blocks visit every thread once with the right indices") {
    struct Shape {
        dim3 grid, block;
    };
    for (Shape s : {Shape{dim3(3, 2, 1), dim3(8, 4, 1)}, Shape{dim3(2, 3, 4), dim3(4, 2, 3)},
                    Shape{dim3(1, 1, 5), dim3(1, 1, 64)}, Shape{dim3(2, 2, 2), dim3(5, 7, 3)}}) {
        int nx = int(s.grid.x * s.block.x), ny = int(s.grid.y * s.block.y), nz = int(s.grid.z * s.block.z);
        size_t n = size_t(nx) * ny * nz;
        DeviceBuffer<int> visits(n), coords(3 * n);
        visits.fill_bytes(0);
        launch<index_kernel>(s.grid, s.block, 0, nullptr, visits.ptr, coords.ptr, nx, ny);
        auto v = visits.download();
        auto c = coords.download();
        for (int z = 0; z < nz; ++z)
            for (int y = 0; y < ny; ++y)
                for (int x = 0; x < nx; ++x) {
                    size_t i = (size_t(z) * ny + y) * nx + x;
                    REQUIRE(v[i] == 1);
                    REQUIRE(c[3 * i + 0] == int(s.grid.x * 1000000 + s.block.x * 1000 + x % s.block.x));
                    REQUIRE(c[3 * i + 1] == int(s.grid.y * 1000000 + s.block.y * 1000 + y % s.block.y));
                    REQUIRE(c[3 * i + 2] == int(s.grid.z * 1000000 + s.block.z * 1000 + z % s.block.z));
                }
    }
}

// ---------------------------------------------------------------------------------------------
// Intrinsics the kernels use

__global__ void intrinsics_kernel(float* f, int* i) {
    f[0] = rsqrtf(4.0f);
    f[1] = __fdividef(1.0f, 8.0f);
    f[2] = __saturatef(1.5f);
    f[3] = __saturatef(-0.5f);
    f[4] = __int_as_float(__float_as_int(-2.5f));
    f[5] = __uint_as_float(0x3f800000u);
    f[6] = __expf(0.0f);
    f[7] = __logf(1.0f);
    f[8] = __bfloat162float(__float2bfloat16(1.0f + 1.0f / 512.0f));  // ties to even: rounds to 1
    f[9] = __bfloat162float(__float2bfloat16(1.0f + 3.0f / 512.0f));  // ties to even: rounds up
    i[0] = __popc(0xF0F0u);
    i[1] = __clz(1);
    i[2] = __ffs(8);
    i[3] = int(__brev(1u) >> 31);
    i[4] = max(3, -7);
    i[5] = min(3, -7);
}

TEST_CASE("math and bit intrinsics, bf16 rounding") {
    DeviceBuffer<float> f(10);
    DeviceBuffer<int> i(6);
    launch<intrinsics_kernel>(dim3(1), dim3(1), 0, nullptr, f.ptr, i.ptr);
    auto fh = f.download();
    auto ih = i.download();
    REQUIRE(fh[0] == Approx(0.5f).epsilon(1e-6));  // rsqrtf: 2 ulp on the GPU
    REQUIRE(fh[1] == Approx(0.125f).epsilon(1e-6));
    REQUIRE(fh[2] == 1.0f);
    REQUIRE(fh[3] == 0.0f);
    REQUIRE(fh[4] == -2.5f);
    REQUIRE(fh[5] == 1.0f);
    REQUIRE(fh[6] == Approx(1.0f).epsilon(1e-6));
    REQUIRE(std::fabs(fh[7]) < 1e-6f);
    REQUIRE(fh[8] == 1.0f);
    REQUIRE(fh[9] == 1.0f + 4.0f / 512.0f);
    REQUIRE(ih[0] == 8);
    REQUIRE(ih[1] == 31);
    REQUIRE(ih[2] == 4);
    REQUIRE(ih[3] == 1);
    REQUIRE(ih[4] == 3);
    REQUIRE(ih[5] == -7);
}

// ---------------------------------------------------------------------------------------------
// The kernels' warp helpers (kernels/common.cuh). warp_xor_chain is one collective in the CPU
// build; it must give, bit for bit, what its chain of __shfl_xor_sync gives. The values span
// magnitudes so that another order of additions would round differently.

constexpr int kXorChainThreads = 128;
__global__ void xor_chain_kernel(float* chain, float* shuffles, const float* x) {
    const int t = threadIdx.x;
    const float v = x[t];
    chain[4 * t + 0] = warp_xor_chain<AddOp, 16, 8, 4, 2, 1>(v);
    chain[4 * t + 1] = warp_xor_chain<AddOp, 1, 2>(v);
    chain[4 * t + 2] = warp_xor_chain<MaxOp, 16, 8, 4, 2, 1>(v);
    chain[4 * t + 3] = warp_sum(v);
    float pair[2] = {v, -2.0f * v};  // warp_sum_each: each as warp_sum gives it
    warp_sum_each(pair);
    chain[4 * kXorChainThreads + 2 * t] = pair[0];
    chain[4 * kXorChainThreads + 2 * t + 1] = pair[1];
    shuffles[4 * kXorChainThreads + 2 * t] = warp_sum(v);
    shuffles[4 * kXorChainThreads + 2 * t + 1] = warp_sum(-2.0f * v);
    float a = v, b = v, c = v;
    for (int o = 16; o > 0; o >>= 1) a = a + __shfl_xor_sync(0xffffffffu, a, o);
    for (int o = 1; o <= 2; o <<= 1) b = b + __shfl_xor_sync(0xffffffffu, b, o);
    for (int o = 16; o > 0; o >>= 1) c = fmaxf(c, __shfl_xor_sync(0xffffffffu, c, o));
    shuffles[4 * t + 0] = a;
    shuffles[4 * t + 1] = b;
    shuffles[4 * t + 2] = c;
    shuffles[4 * t + 3] = a;
}

TEST_CASE("warp_xor_chain, warp_sum and warp_sum_each give their shuffle chains' bits in every lane") {
    constexpr int kThreads = kXorChainThreads;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::vector<float> x(kThreads);
    for (int t = 0; t < kThreads; ++t) x[t] = std::ldexp(mantissa(rng), int(rng() % 40) - 20);
    // Warp 0: 1 and 31 quarter-ulps of 1. Added in lane order each is rounded away; the butterfly
    // pairs them up first, so its sum exceeds 1.
    for (int t = 0; t < 32; ++t) x[t] = t == 0 ? 1.0f : std::ldexp(1.0f, -25);
    DeviceBuffer<float> in(x), chain(6 * kThreads), shuffles(6 * kThreads);
    launch<xor_chain_kernel>(dim3(1), dim3(kThreads), 0, nullptr, chain.ptr, shuffles.ptr, in.ptr);
    const auto got = chain.download(), want = shuffles.download();
    for (int i = 0; i < 6 * kThreads; ++i) {
        INFO((i < 4 * kThreads ? "thread " : "pair, thread ") << (i < 4 * kThreads ? i / 4 : (i - 4 * kThreads) / 2) << " form "
                                                               << (i < 4 * kThreads ? i % 4 : i % 2));
        REQUIRE(std::isfinite(want[i]));
        REQUIRE(float_bits(got[i]) == float_bits(want[i]));
    }
    // The orders differ: summed in lane order, warp 0 gives 1; the butterfly gives more.
    REQUIRE(std::accumulate(x.begin(), x.begin() + 32, 0.0f) == 1.0f);
    REQUIRE(want[0] > 1.0f);
}

// from_float<__nv_bfloat16>'s host form (branch-free, used by the CPU build's kernels) against
// cuda_bf16.hpp's host __float2bfloat16: every sign and exponent, random mantissas, the ties,
// infinities and NaNs.
TEST_CASE("from_float<bf16> rounds like __float2bfloat16, NaN included") {
    std::mt19937 rng(5);
    std::vector<uint32_t> patterns = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC00000u,
                                      0x7FFFFFFFu, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x00008000u, 0x00018000u};
    for (int i = 0; i < (1 << 20); ++i) patterns.push_back(rng());
    for (uint32_t bits : patterns) {
        const float x = float_from_bits(bits);
        INFO("x bits " << std::hex << bits);
        REQUIRE(bf16_bits(from_float<__nv_bfloat16>(x)) == bf16_bits(__float2bfloat16(x)));
    }
}

// pack_floats / unpack_floats (kernels/common.cuh): the CPU build's vector forms give, lane by lane,
// the bits of from_float / to_float, in both element types, over the same patterns as above.
TEST_CASE("pack_floats and unpack_floats are from_float and to_float lane by lane") {
    std::mt19937 rng(6);
    std::vector<uint32_t> patterns = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC00000u,
                                      0x7FFFFFFFu, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x00008000u, 0x00018000u};
    for (int i = 0; i < (1 << 16); ++i) patterns.push_back(rng());
    constexpr int kBf16 = Packed128<__nv_bfloat16>::size, kFloat = Packed128<float>::size;
    for (size_t i = 0; i + kBf16 <= patterns.size(); i += 3) {  // overlapping windows: every pattern in every lane
        float in[kBf16], back[kBf16];
        for (int k = 0; k < kBf16; ++k) in[k] = float_from_bits(patterns[i + k]);
        const Packed128<__nv_bfloat16> packed = pack_floats<__nv_bfloat16>(in);
        unpack_floats(back, packed);
        for (int k = 0; k < kBf16; ++k) {
            INFO("x bits " << std::hex << patterns[i + k] << " in lane " << k);
            REQUIRE(bf16_bits(packed[k]) == bf16_bits(from_float<__nv_bfloat16>(in[k])));
            REQUIRE(float_bits(back[k]) == float_bits(to_float(packed[k])));
        }
        float in4[kFloat], back4[kFloat];
        for (int k = 0; k < kFloat; ++k) in4[k] = in[k];
        unpack_floats(back4, pack_floats<float>(in4));
        for (int k = 0; k < kFloat; ++k) REQUIRE(float_bits(back4[k]) == float_bits(in4[k]));
    }
}

// expf_each (kernels/common.cuh): within a few ulp of the double exp (CUDA's expf: 2 ulp; the CPU
// build's libmvec expf is not correctly rounded either), and a value's result does not depend on
// where in the chunk it stands or on the chunk's length (the CPU build pads the last group of 8).
__global__ void expf_each_kernel(float* out8, float* out4, float* out12, const float* x) {
    float a[8], b[4], c[12], ea[8], eb[4], ec[12];
    for (int k = 0; k < 8; ++k) a[k] = x[k];
    for (int k = 0; k < 4; ++k) b[k] = x[7 - k];
    for (int k = 0; k < 12; ++k) c[k] = x[k % 8];
    expf_each(ea, a);
    expf_each(eb, b);
    expf_each(ec, c);
    for (int k = 0; k < 8; ++k) out8[k] = ea[k];
    for (int k = 0; k < 4; ++k) out4[k] = eb[k];
    for (int k = 0; k < 12; ++k) out12[k] = ec[k];
}

TEST_CASE("expf_each is expf to a few ulp, whatever the value's place in the chunk") {
    const std::vector<float> x = {-87.0f, -20.5f, -1.0f, -1e-3f, 0.0f, 0.6931472f, 10.25f, 88.0f};
    DeviceBuffer<float> in(x), out8(8), out4(4), out12(12);
    launch<expf_each_kernel>(dim3(1), dim3(1), 0, nullptr, out8.ptr, out4.ptr, out12.ptr, in.ptr);
    const auto e8 = out8.download(), e4 = out4.download(), e12 = out12.download();
    for (int k = 0; k < 8; ++k) {
        INFO("x = " << x[k]);
        const double want = std::exp(double(x[k]));
        REQUIRE(std::isfinite(e8[k]));
        REQUIRE(std::fabs(e8[k] - want) <= 4.0 * double(std::nextafter(float(want), INFINITY) - float(want)));
        REQUIRE(float_bits(e12[k]) == float_bits(e8[k]));
        REQUIRE(float_bits(e12[8 + k % 4]) == float_bits(e8[k % 4]));
    }
    for (int k = 0; k < 4; ++k) REQUIRE(float_bits(e4[k]) == float_bits(e8[7 - k]));
}

// warp_max has fmaxf's NaN rule (IEEE maxNum: a NaN operand gives the other one), which the CPU
// build's max_number spells as a compare and select: a NaN lane does not win.
__global__ void warp_max_nan_kernel(float* out) {
    const float v = threadIdx.x == 5 ? __int_as_float(0x7fc00000) : float(threadIdx.x % 29);
    out[threadIdx.x] = warp_max(v);
}

TEST_CASE("warp_max ignores a NaN lane, as fmaxf does") {
    DeviceBuffer<float> out(32);
    launch<warp_max_nan_kernel>(dim3(1), dim3(32), 0, nullptr, out.ptr);
    for (float r : out.download()) REQUIRE(r == 28.0f);
}
