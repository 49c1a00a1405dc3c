// What only the emulator does: schedule orders that expose races, shared-memory poisoning,
// deadlock detection, the H100's launch limits, lazy fibers, and device-memory accounting.
// (No GPU build: these test emu/ itself.)
#include "test_util.h"

#include "kernels/common.cuh"

#include <cmath>
#include <set>

namespace {

struct ScheduleGuard {  // restores the schedule the suite was started with
    cuemu::Schedule saved = cuemu::schedule();
    ~ScheduleGuard() { cuemu::set_schedule(saved, 12345); }
};

const cuemu::Schedule kOrders[] = {cuemu::Schedule::forward, cuemu::Schedule::reverse, cuemu::Schedule::random};
const char* kOrderNames[] = {"forward", "reverse", "random"};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Race exposure

// Block sum by tree reduction; `with_barrier` = 0 drops the __syncthreads between the steps.
__global__ void tree_sum_kernel(const float* x, float* out, int with_barrier) {
    __shared__ float buf[256];
    int t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) buf[t] += buf[t + stride];
        if (with_barrier) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}

// Neighbour exchange through shared memory; `with_barrier` = 0 reads before the neighbour wrote.
__global__ void neighbour_kernel(const float* x, float* out, int with_barrier) {
    __shared__ float buf[256];
    int t = threadIdx.x;
    buf[t] = x[t];
    if (with_barrier) __syncthreads();
    out[t] = buf[(t + 1) % blockDim.x];
}

TEST_CASE("a missing __syncthreads is wrong under some schedule order; its fixed twin under none") {
    ScheduleGuard guard;
    cuemu::set_check_mode(true);
    const int blocks = 4, threads = 256;
    std::vector<float> x(size_t(blocks) * threads);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17);
    DeviceBuffer<float> dx(x), out(blocks), out_n(threads);
    std::vector<float> expect(blocks, 0.0f);
    for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < threads; ++t) expect[b] += x[size_t(b) * threads + t];

    int tree_wrong = 0, neighbour_wrong = 0;
    for (int o = 0; o < 3; ++o) {
        cuemu::set_schedule(kOrders[o], 777);
        INFO("order " << kOrderNames[o]);
        launch<tree_sum_kernel>(dim3(blocks), dim3(threads), 0, nullptr, dx.ptr, out.ptr, 1);
        REQUIRE(out.download() == expect);
        launch<tree_sum_kernel>(dim3(blocks), dim3(threads), 0, nullptr, dx.ptr, out.ptr, 0);
        tree_wrong += out.download() != expect;

        launch<neighbour_kernel>(dim3(1), dim3(threads), 0, nullptr, dx.ptr, out_n.ptr, 1);
        auto good = out_n.download();
        for (int t = 0; t < threads; ++t) REQUIRE(good[t] == x[(t + 1) % threads]);
        launch<neighbour_kernel>(dim3(1), dim3(threads), 0, nullptr, dx.ptr, out_n.ptr, 0);
        auto bad = out_n.download();
        bool wrong = false;
        for (int t = 0; t < threads; ++t) wrong |= !(bad[t] == x[(t + 1) % threads]);
        neighbour_wrong += wrong;
    }
    CHECK(tree_wrong >= 1);
    CHECK(neighbour_wrong >= 1);
}

// Which order did the threads of a block run in? Each takes a ticket after a barrier.
__global__ void ticket_kernel(int* tickets) {
    __shared__ int next;
    if (threadIdx.x == 0) next = 0;
    __syncthreads();
    tickets[threadIdx.x] = atomicAdd(&next, 1);
}

TEST_CASE("schedule orders: forward, reverse and a seeded random permutation") {
    ScheduleGuard guard;
    const int n = 64;
    DeviceBuffer<int> tickets(n);
    auto run = [&](cuemu::Schedule s, uint64_t seed) {
        cuemu::set_schedule(s, seed);
        launch<ticket_kernel>(dim3(1), dim3(n), 0, nullptr, tickets.ptr);
        return tickets.download();
    };
    auto fwd = run(cuemu::Schedule::forward, 0);
    auto rev = run(cuemu::Schedule::reverse, 0);
    auto rnd1 = run(cuemu::Schedule::random, 42);
    auto rnd2 = run(cuemu::Schedule::random, 42);
    auto rnd3 = run(cuemu::Schedule::random, 43);
    for (int t = 0; t < n; ++t) {
        REQUIRE(fwd[t] == t);
        REQUIRE(rev[t] == n - 1 - t);
    }
    REQUIRE(std::set<int>(rnd1.begin(), rnd1.end()).size() == size_t(n));  // a permutation
    REQUIRE(rnd1 == rnd2);                                                  // reproducible for a seed
    REQUIRE(rnd1 != rnd3);
    REQUIRE(rnd1 != fwd);
    REQUIRE(rnd1 != rev);
}

// ---------------------------------------------------------------------------------------------
// Shared memory poisoning

__global__ void read_uninitialized_shared(float* out) {
    __shared__ float static_buf[64];
    DYNAMIC_SHARED(float, dynamic_buf);
    out[threadIdx.x] = static_buf[threadIdx.x];
    out[64 + threadIdx.x] = dynamic_buf[threadIdx.x];
    static_buf[threadIdx.x] = 1.0f;  // what the next block would otherwise see
    dynamic_buf[threadIdx.x] = 1.0f;
}

TEST_CASE("check mode fills static and dynamic shared memory with NaN at every block start") {
    cuemu::set_check_mode(true);
    DeviceBuffer<float> out(128);
    for (int blocks : {1, 3}) {
        launch<read_uninitialized_shared>(dim3(blocks), dim3(64), 64 * sizeof(float), nullptr, out.ptr);
        for (float v : out.download()) REQUIRE(std::isnan(v));
    }
}

// ---------------------------------------------------------------------------------------------
// Deadlocks and divergent collectives are errors, not hangs

__global__ void divergent_barrier_kernel(float* out) {
    if (threadIdx.x < 5) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Only the first block deadlocks; the blocks after it are fine.
__global__ void first_block_deadlocks_kernel(float* out) {
    if (blockIdx.x == 0 && threadIdx.x < 5) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void exited_lane_shuffle_kernel(float* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void mask_without_caller_kernel(float* out) {
    out[threadIdx.x] = __shfl_sync(0x1u, 1.0f, 0);  // lanes other than 0 call with a mask that excludes them
}

__global__ void fine_kernel(float* out) {
    __syncthreads();
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, float(threadIdx.x), 1);
}

TEST_CASE("a barrier some threads never reach is reported as an error, and the executor recovers") {
    DeviceBuffer<float> out(64);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    REQUIRE(try_launch<divergent_barrier_kernel>(dim3(2), dim3(64), 0, nullptr, out.ptr) == cudaErrorLaunchFailure);
    REQUIRE(try_launch<exited_lane_shuffle_kernel>(dim3(1), dim3(32), 0, nullptr, out.ptr) == cudaErrorLaunchFailure);
    {  // one OS thread, so the deadlocked block is not the last it runs: the runner must not go on past it
        const int os_threads = cuemu::threads();
        cuemu::set_threads(1);
        const cudaError_t err = try_launch<first_block_deadlocks_kernel>(dim3(4), dim3(64), 0, nullptr, out.ptr);
        cuemu::set_threads(os_threads);
        REQUIRE(err == cudaErrorLaunchFailure);
    }
    REQUIRE(try_launch<mask_without_caller_kernel>(dim3(1), dim3(32), 0, nullptr, out.ptr) == cudaErrorLaunchFailure);
    // cudaGetLastError reports the launch error once, then resets (the error is not sticky).
    REQUIRE(try_launch<divergent_barrier_kernel>(dim3(1), dim3(64), 0, nullptr, out.ptr) == cudaErrorLaunchFailure);
    REQUIRE(cudaPeekAtLastError() == cudaSuccess);  // try_launch already read it
    // The executor still runs correct kernels afterwards (abandoned fibers were cleaned up).
    for (int i = 0; i < 3; ++i) {
        REQUIRE(try_launch<fine_kernel>(dim3(4), dim3(64), 0, nullptr, out.ptr) == cudaSuccess);
        auto r = out.download();
        for (int t = 0; t < 64; ++t) REQUIRE(r[t] == float((t % 32) < 31 ? t + 1 : t));
    }
}

// warp_xor_chain (kernels/common.cuh) is one emulated collective: in a partial warp it reads the
// missing lanes as NaN bits, as the shuffles it stands for do; lanes of one warp that meet at it
// and at a plain shuffle are divergent collectives, as two different shuffles would be.
__global__ void partial_warp_chain_kernel(float* out) {
    const float v = float(threadIdx.x);
    float shuffled = v;
    for (int o = 16; o > 0; o >>= 1) shuffled += __shfl_xor_sync(0xffffffffu, shuffled, o);
    out[2 * threadIdx.x] = warp_xor_chain<AddOp, 16, 8, 4, 2, 1>(v);
    out[2 * threadIdx.x + 1] = shuffled;
}

__global__ void chain_beside_shuffle_kernel(float* out) {
    const float v = float(threadIdx.x);
    out[threadIdx.x] = threadIdx.x < 16 ? warp_sum(v) : __shfl_xor_sync(0xffffffffu, v, 1);
}

TEST_CASE("warp_xor_chain in a partial warp reads missing lanes as the shuffles do; mixed with a shuffle it is an error") {
    ScheduleGuard guard;
    constexpr int kThreads = 40;  // the second warp has 8 lanes
    for (int o = 0; o < 3; ++o) {
        DYNAMIC_SECTION(kOrderNames[o]) {
            cuemu::set_schedule(kOrders[o], 31);
            DeviceBuffer<float> out(2 * kThreads);
            launch<partial_warp_chain_kernel>(dim3(1), dim3(kThreads), 0, nullptr, out.ptr);
            const auto r = out.download();
            for (int t = 0; t < 32; ++t) REQUIRE(r[2 * t] == 496.0f);  // 0 + 1 + ... + 31, exact
            for (int t = 32; t < kThreads; ++t) {
                REQUIRE(std::isnan(r[2 * t]));
                REQUIRE(float_bits(r[2 * t]) == float_bits(r[2 * t + 1]));
            }
            REQUIRE(try_launch<chain_beside_shuffle_kernel>(dim3(1), dim3(32), 0, nullptr, out.ptr) ==
                    cudaErrorLaunchFailure);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Launch limits of an H100

__global__ void empty_kernel() {}

TEST_CASE("launches an H100 would refuse are refused") {
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1025), 0, nullptr) == cudaErrorInvalidConfiguration);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(32, 33), 0, nullptr) == cudaErrorInvalidConfiguration);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1, 1, 65), 0, nullptr) == cudaErrorInvalidConfiguration);
    REQUIRE(try_launch<empty_kernel>(dim3(1, 65536), dim3(1), 0, nullptr) == cudaErrorInvalidConfiguration);
    REQUIRE(try_launch<empty_kernel>(dim3(0), dim3(1), 0, nullptr) == cudaErrorInvalidConfiguration);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1024), 0, nullptr) == cudaSuccess);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1), 48 * 1024, nullptr) == cudaSuccess);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1), 48 * 1024 + 1, nullptr) == cudaErrorInvalidValue);
    REQUIRE(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) == cudaSuccess);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1), 100 * 1024, nullptr) == cudaSuccess);
    REQUIRE(try_launch<empty_kernel>(dim3(1), dim3(1), 100 * 1024 + 1, nullptr) == cudaErrorInvalidValue);
    REQUIRE(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
            cudaErrorInvalidValue);
    cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// Lazy fibers: threads that never block run as plain calls

__global__ void elementwise_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

TEST_CASE("threads that never block cost no context switch of their own") {
    const int n = 1 << 16, threads = 256, blocks = n / threads;
    DeviceBuffer<float> x(n);
    x.fill_bytes(0);
    const int os_threads = cuemu::threads();
    cuemu::set_threads(1);
    auto before = cuemu::executor_stats();
    launch<elementwise_kernel>(dim3(blocks), dim3(threads), 0, nullptr, x.ptr, n);
    auto after = cuemu::executor_stats();
    cuemu::set_threads(os_threads);
    REQUIRE(after.fibers_started - before.fibers_started == uint64_t(n));
    // Two switches per launch (into the runner and back), whatever the number of blocks: the
    // runner goes on to the next block itself.
    REQUIRE(after.switches - before.switches == 2ull);
    for (float v : x.download()) REQUIRE(v == 1.0f);
}

// Some threads block and others do not, in a 1D and a 3D block: each thread still runs exactly
// once, with its own threadIdx, and a collective's lanes still meet (the runner's loop gives back
// the threads it claimed after one that blocks).
__global__ void some_threads_block_kernel(int* runs, unsigned* seen) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = t % 32;
    unsigned value = t;
    if (lane % 3 == 1) value = __shfl_sync(0x92492492u, t, 4, 32);  // lanes 1, 4, 7, ...: lane 4's index
    if (lane == 31) __syncwarp(0x80000000u);                          // alone: blocks and resumes at once
    const size_t i = size_t(blockIdx.x) * blockDim.x * blockDim.y * blockDim.z + t;
    runs[i] += 1;
    seen[i] = value;
}

TEST_CASE("threads that block mid-block and threads that do not each run once, under every order") {
    ScheduleGuard guard;
    for (const dim3 block : {dim3(96), dim3(8, 3, 4)}) {
        const unsigned per_block = block.x * block.y * block.z, blocks = 5;
        for (int o = 0; o < 3; ++o) {
            DYNAMIC_SECTION(kOrderNames[o] << " block " << block.x << "x" << block.y << "x" << block.z) {
                cuemu::set_schedule(kOrders[o], 7);
                DeviceBuffer<int> runs(per_block * blocks);
                DeviceBuffer<unsigned> seen(per_block * blocks);
                runs.fill_bytes(0);
                auto before = cuemu::executor_stats();
                launch<some_threads_block_kernel>(dim3(blocks), block, 0, nullptr, runs.ptr, seen.ptr);
                auto after = cuemu::executor_stats();
                REQUIRE(after.fibers_started - before.fibers_started == uint64_t(per_block) * blocks);
                const auto r = runs.download();
                const auto v = seen.download();
                for (unsigned i = 0; i < per_block * blocks; ++i) {
                    const unsigned t = i % per_block, lane = t % 32;
                    REQUIRE(r[i] == 1);
                    REQUIRE(v[i] == (lane % 3 == 1 ? t - lane + 4 : t));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Device memory accounting

TEST_CASE("cudaMalloc/cudaFree keep exact current and peak byte counts") {
    auto base = cuemu::memory_stats();
    cuemu::reset_peak_memory();
    void *a, *b;
    REQUIRE(cudaMalloc(&a, 1000) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, 333) == cudaSuccess);
    auto s1 = cuemu::memory_stats();
    REQUIRE(s1.current_bytes == base.current_bytes + 1333);
    REQUIRE(s1.peak_bytes == base.current_bytes + 1333);
    REQUIRE(s1.allocations == base.allocations + 2);
    REQUIRE(cudaFree(a) == cudaSuccess);
    auto s2 = cuemu::memory_stats();
    REQUIRE(s2.current_bytes == base.current_bytes + 333);
    REQUIRE(s2.peak_bytes == base.current_bytes + 1333);
    cuemu::reset_peak_memory();
    REQUIRE(cuemu::memory_stats().peak_bytes == base.current_bytes + 333);
    size_t free_bytes, total_bytes;
    REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
    REQUIRE(free_bytes == total_bytes - s2.current_bytes);
    REQUIRE(cudaFree(b) == cudaSuccess);
    REQUIRE(cudaFree(reinterpret_cast<void*>(0x1000)) == cudaErrorInvalidValue);  // not an allocation
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    void* huge;
    REQUIRE(cudaMalloc(&huge, total_bytes + 1) == cudaErrorMemoryAllocation);
    cudaGetLastError();
}

TEST_CASE("events measure elapsed host time; device properties describe the emulator") {
    cudaEvent_t start, stop;
    REQUIRE(cudaEventCreate(&start) == cudaSuccess);
    REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
    REQUIRE(cudaEventRecord(start, nullptr) == cudaSuccess);
    DeviceBuffer<float> x(1 << 20);
    x.fill_bytes(0);
    launch<elementwise_kernel>(dim3(4096), dim3(256), 0, nullptr, x.ptr, 1 << 20);
    REQUIRE(cudaEventRecord(stop, nullptr) == cudaSuccess);
    float ms = -1;
    REQUIRE(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
    REQUIRE(ms > 0.0f);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaDeviceProp p;
    REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
    REQUIRE(p.maxThreadsPerBlock == 1024);
    REQUIRE(p.sharedMemPerBlock == 48 * 1024);
    REQUIRE(p.sharedMemPerBlockOptin == 227 * 1024);
    REQUIRE(p.multiProcessorCount == cuemu::threads());
    int count = 0, dev = -1;
    REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
    REQUIRE(count == 1);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
    REQUIRE(dev == 0);
    REQUIRE(cudaSetDevice(1) == cudaErrorInvalidDevice);
    REQUIRE(std::string(cudaGetErrorString(cudaErrorInvalidDevice)) == "invalid device ordinal");
    cudaGetLastError();
}

TEST_CASE("large fills and copies, split over the CPU's threads, write every byte and no other") {
    // Past the size from which they run on several threads (emu/runtime.cpp), and not a multiple of
    // the slices' 4 KB granule, so that the last slice is a partial one.
    const size_t n = (size_t(4) << 20) + 3 * 4096 + 123;
    unsigned char *a, *b;
    REQUIRE(cudaMalloc(&a, n + 2) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, n) == cudaSuccess);
    std::vector<unsigned char> host(n + 2);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(i * 7 + 3);
    REQUIRE(cudaMemcpy(a, host.data(), n + 2, cudaMemcpyHostToDevice) == cudaSuccess);

    // The fill covers a[1, n + 1): the guard bytes a[0] and a[n + 1] keep their values.
    REQUIRE(cudaMemset(a + 1, 0xA5, n) == cudaSuccess);
    std::vector<unsigned char> got(n + 2);
    REQUIRE(cudaMemcpy(got.data(), a, n + 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(got[0] == host[0]);
    CHECK(got[n + 1] == host[n + 1]);
    size_t wrong = 0;
    for (size_t i = 1; i <= n; ++i) wrong += got[i] != 0xA5;
    CHECK(wrong == 0);

    // A device-to-device copy of distinct bytes arrives whole and in place.
    REQUIRE(cudaMemcpy(a, host.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice) == cudaSuccess);
    std::vector<unsigned char> copied(n);
    REQUIRE(cudaMemcpy(copied.data(), b, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += copied[i] != host[i];
    CHECK(wrong == 0);

    // Overlapping ranges (cudaMemcpy leaves them undefined; the emulator moves them like memmove).
    REQUIRE(cudaMemcpy(a + 4096, a, n - 4096, cudaMemcpyDeviceToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(copied.data(), a, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    wrong = 0;
    for (size_t i = 4096; i < n; ++i) wrong += copied[i] != host[i - 4096];
    CHECK(wrong == 0);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess);
}
