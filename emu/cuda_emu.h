// CUDA on the CPU: what nvcc would supply to device code, for the g++ build.
//
// The real CUDA headers stay the contract: cuda_runtime.h, cuda_bf16.h, cublasLt.h and nccl.h
// declare the API, and emu/*.cpp define it. This header adds the device-side builtins
// (threadIdx & co., __syncthreads, warp collectives, atomics, intrinsics) and the executor
// entry point that the launch wrapper in kernels/cuda_common.h calls.
//
// Execution model (emu/executor.cpp): a launch runs every block; a block runs on one OS thread
// and its threads are fibers that switch only at barriers and warp collectives. Between two
// such points a thread runs alone, in the order CUEMU_SCHEDULE picks.
#pragma once

#ifdef __CUDACC__
#error "emu/cuda_emu.h is the g++ build's CUDA; nvcc builds use the real toolkit"
#endif

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Qualifiers. The CUDA headers already define __global__/__device__/__host__ as nothing under
// g++. Shared memory is per block; a block's fibers all live on one OS thread and blocks run one
// after another there, so thread-local storage is exactly block-shared storage. The named
// section lets the executor find every static __shared__ variable and poison it per block.

#undef __shared__
#define __shared__ __attribute__((section("cuemu_shared"))) thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// Dynamic shared memory: `DYNAMIC_SHARED(float, smem);` declares `float* smem` pointing at the
// launch's dynamic shared memory (16-byte aligned, as on the GPU).
#define DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::cuemu::dynamic_shared_memory())

// ---------------------------------------------------------------------------------------------
// Built-in variables: rewritten by the executor at every fiber switch.

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace cuemu {

// ---- executor ----

// A range of memory an operation reads or writes, for the race detector (see "Race detection").
struct MemoryAccess {
    const void* address;
    size_t bytes;       // ignored when to_label_end
    bool writes;        // false: only read
    bool to_label_end;  // a kernel's pointer argument: from address to the end of its labeled range
};

struct KernelLaunch {
    const char* name;                         // for error messages
    const void* func;                         // identifies the kernel (cudaFuncSetAttribute)
    dim3 grid, block;
    size_t dynamic_smem;
    cudaStream_t stream;
    void (*run_threads)(const void* params);  // starts the block's threads (cuemu::run_threads)
    const void* params;                       // the kernel's argument tuple
    const MemoryAccess* pointers = nullptr;   // its pointer arguments (race detection only)
    int pointer_count = 0;
};

bool racecheck_enabled();  // race detection on and record-only mode off

// The memory a kernel argument may reach: a pointer to const is read, any other pointer read and
// written. A struct passed by value is scanned for pointer-sized words that hold device
// addresses (read and written): the emulator cannot see its field types.
template <typename T> constexpr int pointer_slots() {
    if constexpr (std::is_pointer_v<T>) return 1;
    else if constexpr (std::is_class_v<T> && std::is_trivially_copyable_v<T>) return int(sizeof(T) / sizeof(void*));
    else return 0;
}
template <typename Tuple> struct tuple_pointer_slots;
template <typename... P> struct tuple_pointer_slots<std::tuple<P...>> {
    static constexpr int value = (0 + ... + pointer_slots<P>());
};
template <typename T> void add_kernel_pointers(const T& value, MemoryAccess*& out) {
    if constexpr (std::is_pointer_v<T>) {
        *out++ = {static_cast<const void*>(value), 0, !std::is_const_v<std::remove_pointer_t<T>>, true};
    } else if constexpr (pointer_slots<T>() > 0) {
        for (int i = 0; i < pointer_slots<T>(); ++i) {
            const void* word;
            std::memcpy(&word, reinterpret_cast<const char*>(&value) + i * sizeof(void*), sizeof word);
            *out++ = {word, 0, true, true};
        }
    }
}

// Runs a whole launch synchronously. Returns cudaSuccess or the error also recorded for
// cudaGetLastError (invalid configuration, deadlock, ...).
cudaError_t launch_kernel(const KernelLaunch& launch);

// Stream capture (emu/graph.cpp): while `stream` is captured, an operation issued on it is
// recorded as `replay`, a closure that issues it again (true: it succeeded), instead of running.
bool capturing(cudaStream_t stream);
cudaError_t capture(cudaStream_t stream, const char* name, std::function<bool()> replay);

// The threads of the running block not yet started, where a kernel's own loop (run_threads) reads
// them without a call into the executor. The executor sets them per block; only a thread that
// reaches a barrier or warp collective gets a fiber (`current`). The OS thread's blocks run one
// after another, so this is per OS thread.
struct ThreadStarts {
    unsigned next = 0;                // position in the start order of the next thread to start
    unsigned count = 0;               // threads in the block
    const unsigned* order = nullptr;  // the start order; null: 0, 1, 2, ...
    bool ready_waiting = false;       // a fiber released by a barrier or collective runs before new threads
    void* current = nullptr;          // the running thread's fiber; null while it has none (it never blocked)
};
inline thread_local ThreadStarts thread_starts;
void thread_returned_after_blocking();  // the running thread, which has a fiber, has returned

// Starts the block's threads one after another, each a plain call of the kernel (inlined where g++
// chooses): a thread that never blocks costs a turn of the inner loop, whose only store is
// threadIdx.x. The loop claims every thread left to start at once. A thread that blocks gets a
// fiber on this loop's stack, and the executor gives back the threads claimed after it (sets
// `next` to its position + 1) for a new loop on another stack; nothing else changes threadIdx or
// `next` without that. Once the blocked thread returns here, this loop claims afresh.
template <auto Kernel, typename Params> void run_threads(const void* p) {
    const Params params = *static_cast<const Params*>(p);  // a copy no store of the loop can alias
    ThreadStarts& s = thread_starts;
    const unsigned dim_x = blockDim.x, dim_y = blockDim.y;  // the block's, set with thread_starts
    const bool one_dimensional = dim_y == 1 && blockDim.z == 1;  // threadIdx.x is the linear index
    while (s.next < s.count && !s.ready_waiting) {
        unsigned i = s.next;
        const unsigned end = s.count;
        s.next = end;
        if (one_dimensional && !s.order) {
            threadIdx = uint3{i, 0, 0};
            for (; i < end && !s.current; ++i) {
                threadIdx.x = i;
                std::apply(Kernel, params);
            }
        } else {
            for (; i < end && !s.current; ++i) {
                const unsigned t = s.order ? s.order[i] : i;
                threadIdx = uint3{t % dim_x, t / dim_x % dim_y, t / (dim_x * dim_y)};
                std::apply(Kernel, params);
            }
        }
        if (s.current) thread_returned_after_blocking();
    }
}

template <typename F> struct kernel_params;
template <typename... P> struct kernel_params<void (*)(P...)> {
    using tuple = std::tuple<std::decay_t<P>...>;
};

template <auto Kernel, typename... Args>
cudaError_t launch(const char* name, dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream,
                   Args&&... args) {
    using Params = typename kernel_params<decltype(Kernel)>::tuple;
    static_assert(std::tuple_size_v<Params> == sizeof...(Args), "wrong number of kernel arguments");
    const Params params(std::forward<Args>(args)...);
    KernelLaunch l{name, reinterpret_cast<const void*>(Kernel), grid, block, dynamic_smem, stream, run_threads<Kernel, Params>,
                   &params};
    if (capturing(stream)) {  // the arguments copied now, as <<<>>> copies them into the graph node
        auto saved = std::make_shared<const Params>(params);
        return capture(stream, name, [=] {
            return std::apply([&](const auto&... a) { return launch<Kernel>(name, grid, block, dynamic_smem, stream, a...); },
                              *saved) == cudaSuccess;
        });
    }
    constexpr int slots = tuple_pointer_slots<Params>::value;
    MemoryAccess pointers[slots > 0 ? slots : 1];
    if (slots > 0 && racecheck_enabled()) {
        MemoryAccess* out = pointers;
        std::apply([&](const auto&... p) { (add_kernel_pointers(p, out), ...); }, params);
        l.pointers = pointers;
        l.pointer_count = int(out - pointers);
    }
    return launch_kernel(l);
}

void* dynamic_shared_memory();

// Barriers and warp collectives (called through the CUDA-named wrappers below).
int block_barrier(int op, int predicate);  // op: 0 plain, 1 count, 2 and, 3 or
enum class WarpOp : int { sync, shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, exchange };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int operand, int width);

// ---- schedule and checking controls (also settable by CUEMU_* environment variables) ----

enum class Schedule : int { forward, reverse, random };
void set_schedule(Schedule s, uint64_t seed);
Schedule schedule();
void set_check_mode(bool poison_shared);  // CUEMU_CHECK=1: NaN-fill shared memory per block
void set_threads(int n);                  // CUEMU_THREADS: OS threads that run blocks
int threads();

// ---- device memory accounting ----

struct MemoryStats {
    size_t current_bytes, peak_bytes, allocations;
};
MemoryStats memory_stats();
void reset_peak_memory();

// ---- statistics for benchmarks ----
struct ExecutorStats {
    uint64_t fibers_started, switches, launches;
};
ExecutorStats executor_stats();
// Times the host waited, or may have waited, for the device, as it would with a GPU:
// cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy, and cudaMemcpyAsync
// to or from pageable host memory (into it, the call returns only once the copy is done; out of it,
// "the driver may synchronize with the stream" to stage it: CUDA Runtime API, "API synchronization
// behavior"). With cudaMallocHost memory on the host side, cudaMemcpyAsync does not wait.
// Work runs synchronously here, so this is the only way a test sees where a GPU would stall.
uint64_t host_waits();

template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp collectives move at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}
template <typename T> inline T from_bits(uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

}  // namespace cuemu

// cuda_runtime.h declares its C++ convenience overloads (taking the kernel itself rather than
// `const void*`) only under nvcc; the ones the project uses, with the same meaning:
template <typename T> inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// ---------------------------------------------------------------------------------------------
// Synchronization and warp collectives, with the semantics of the CUDA C++ Programming Guide
// ("Synchronization Functions", "Warp Shuffle Functions", "Warp Vote Functions").

inline void __syncthreads() { cuemu::block_barrier(0, 0); }
inline int __syncthreads_count(int predicate) { return cuemu::block_barrier(1, predicate); }
inline int __syncthreads_and(int predicate) { return cuemu::block_barrier(2, predicate); }
inline int __syncthreads_or(int predicate) { return cuemu::block_barrier(3, predicate); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    cuemu::warp_collective(cuemu::WarpOp::sync, mask, 0, 0, warpSize);
}

template <typename T> inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
    return cuemu::from_bits<T>(
        cuemu::warp_collective(cuemu::WarpOp::shfl_idx, mask, cuemu::to_bits(var), src_lane, width));
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return cuemu::from_bits<T>(
        cuemu::warp_collective(cuemu::WarpOp::shfl_up, mask, cuemu::to_bits(var), int(delta), width));
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
    return cuemu::from_bits<T>(
        cuemu::warp_collective(cuemu::WarpOp::shfl_down, mask, cuemu::to_bits(var), int(delta), width));
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
    return cuemu::from_bits<T>(
        cuemu::warp_collective(cuemu::WarpOp::shfl_xor, mask, cuemu::to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return unsigned(cuemu::warp_collective(cuemu::WarpOp::ballot, mask, predicate != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int predicate) {
    return int(cuemu::warp_collective(cuemu::WarpOp::any, mask, predicate != 0, 0, warpSize));
}
inline int __all_sync(unsigned mask, int predicate) {
    return int(cuemu::warp_collective(cuemu::WarpOp::all, mask, predicate != 0, 0, warpSize));
}

// ---------------------------------------------------------------------------------------------
// Tensor-core and asynchronous-copy instructions (emu/tensor_core.cpp), called through the
// wrappers in kernels/tensor_core.cuh (inline PTX under nvcc). Semantics of the PTX ISA sections
// "Matrix Fragments for mma.m16n8k16 with floating point type", "Warp-level matrix load
// instruction: ldmatrix" and "cp.async" / "cp.async.commit_group" / "cp.async.wait_group".

namespace cuemu {

// A warp collective with payloads of any size: every lane in `mask` passes its input and where
// its output goes (both stay valid while it waits); when the last one arrives, `combine` runs
// once with all of them (null for lanes not in the group) and returns null or what went wrong.
using WarpExchangeFn = const char* (*)(const void* const inputs[32], void* const outputs[32], unsigned members);
void warp_exchange(unsigned mask, const void* input, void* output, WarpExchangeFn combine, const char* name);

// A chain of full-warp __shfl_xor_sync steps, v = op(v, __shfl_xor_sync(0xffffffff, v, offset))
// for each offset in turn, as one warp collective (kernels/common.cuh's warp_xor_chain): the same
// operations in the same order as the chain of shuffles, with one fiber switch per lane instead
// of one per lane and step. As with the shuffles, a lane that does not exist in a partial warp
// reads as NaN bits.
template <typename Op, int Values, int... Offsets>
const char* xor_chain_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    for (int i = 0; i < Values; ++i) {  // each of a lane's values through its own butterfly
        float v[32];
        for (unsigned l = 0; l < 32; ++l)
            v[l] = ((members >> l) & 1u) ? static_cast<const float*>(inputs[l])[i] : from_bits<float>(~0ull);
        for (int offset : {Offsets...}) {
            float next[32];
            for (unsigned l = 0; l < 32; ++l) next[l] = Op{}(v[l], v[l ^ unsigned(offset)]);
            for (unsigned l = 0; l < 32; ++l) v[l] = next[l];
        }
        for (unsigned l = 0; l < 32; ++l)
            if ((members >> l) & 1u) static_cast<float*>(outputs[l])[i] = v[l];
    }
    return nullptr;
}
template <typename Op, int... Offsets> float warp_xor_chain(float v) {
    static_assert(sizeof...(Offsets) > 0 && ((Offsets > 0 && Offsets < 32) && ...), "xor offsets are lanes 1..31");
    float result;
    warp_exchange(0xffffffffu, &v, &result, &xor_chain_combine<Op, 1, Offsets...>, "__shfl_xor_sync chain");
    return result;
}
// kCount values' chains (kernels/common.cuh's warp_xor_chain_each) as one collective.
template <typename Op, int kCount, int... Offsets> void warp_xor_chain_each(float (&v)[kCount]) {
    static_assert(sizeof...(Offsets) > 0 && ((Offsets > 0 && Offsets < 32) && ...), "xor offsets are lanes 1..31");
    float out[kCount];
    warp_exchange(0xffffffffu, v, out, &xor_chain_combine<Op, kCount, Offsets...>, "__shfl_xor_sync chains");
    for (int i = 0; i < kCount; ++i) v[i] = out[i];
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (all 32 lanes): d = a * b + c, fragments
// as the PTX ISA lays them out. d may alias c.
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
// ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16 (all 32 lanes): lane 8 * i + r gives the
// address of row r of matrix i (16-byte aligned); r[i] receives this lane's fragment of matrix i.
void ldmatrix(uint32_t* r, int count, bool trans, const void* row_address);
// cp.async.{ca,cg}.shared.global: `bytes` (4, 8 or 16) from gmem to smem, of which the first
// `src_bytes` are read and the rest zero-filled. The source is read at once; the destination
// reads as NaN (0xFF bytes) until the copy's group completes at cp_async_wait, so a read before
// the wait (or before the barrier that publishes another thread's copy) sees poison.
void cp_async(void* smem, const void* gmem, int bytes, int src_bytes);
void cp_async_commit();                // cp.async.commit_group
void cp_async_wait(int max_pending);   // cp.async.wait_group max_pending

// A warp tile product of kernels/tensor_core.cuh (mma_a_bt, mma_p_b, mma_at_b and their _rows forms)
// as one warp collective: acc (frags x 16 x n, each lane's fragments in the mma accumulator layout)
// += A B, the bf16 products of each element added in k order as the chain of mma.sync adds them.
//   a_bt: A's rows 16 f + r at a + (16 f + r) ld_a (k columns), B^T's n rows at b + j ld_b.
//   p_b:  A from each lane's p (frags x 16 x k, accumulator layout) rounded to bf16 (nearest even,
//         as pack_bf16x2); B's k rows at b + i ld_b (n columns).
//   at_b: A stored transposed, row r of A in column r at a + i ld_a; B as for p_b; a column block
//         16 i.. of A (and B's rows 16 i..) with live[i] == 0 is skipped, never read.
// [live_begin, live_end) (multiples of 16): a_bt's columns of acc computed, the others left as they are,
// B's rows for them unread; p_b's and at_b's k computed, the other k blocks skipped (a causal mask's
// zeros on the diagonal tiles).
// Returns false, doing nothing, when CUEMU_TENSOR_CORE=instructions (set_tensor_core_mode): the
// caller then runs the ldmatrix and mma.sync instructions themselves.
enum class TileOperands { a_bt, p_b, at_b };
struct TileProduct {
    TileOperands operands;
    int frags, n, k;
    const __nv_bfloat16* a;
    int ld_a;
    const __nv_bfloat16* b;
    int ld_b;
    const int* live;
    int live_begin, live_end;
};
bool warp_tile_product(const TileProduct& product, float* acc, const float* p);
// The m16n8k16 MMAs warps have run since the program started: one per mma.sync, and for a tile
// product its instructions' count of what it computes (frags x columns / 8 x k / 16). Tests hold the
// kernels' recorded FLOPs (KernelCost) to it: 2 x 16 x 8 x 16 each.
uint64_t mma_count();
// How tile products run: as one collective each (tiles, the default) or as their instructions
// (CUEMU_TENSOR_CORE=instructions). Both give the same bits; the instructions check the fragment
// layouts and addressing a GPU runs; a tile is one collective where its instructions are tens.
enum class TensorCoreMode { tiles, instructions };
void set_tensor_core_mode(TensorCoreMode mode);
TensorCoreMode tensor_core_mode();

// ---- Warpgroup MMA (sm_90a: wgmma.mma_async, PTX ISA "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Instructions"), emulated warp by warp: the instruction's 64 rows are the
// warpgroup's four warps' 16 each (warp w % 4 of its warpgroup owns rows 16 (w % 4)..), and a warp's
// part of D needs only its own A rows, so each warp's wgmma is one warp collective here.
//
// The shared-memory address space of a descriptor is the launch's dynamic shared memory: address 0
// is its first byte (shared_window_address), and a descriptor cannot name static __shared__ data.
uint32_t shared_window_address(const void* p);  // __cvta_generic_to_shared for descriptors

// One wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 of a lane: D (64 x n) = A (64 x 16) B
// (16 x n) (+ D when accumulate: scale-d). A comes from shared memory by a_desc (a_from_shared: the
// SS form) or from this lane's four registers a_regs in the mma.m16n8k16 A layout (the RS form); B
// by b_desc. mn_major: the operand is stored M- or N-major (imm-trans 1), else K-major. d is the
// lane's n / 2 accumulators in the mma accumulator layout (d[4 j + i] is element i of columns
// 8 j..8 j + 7). Asynchronous as on a GPU: the operands are read now; d holds NaN until the
// wgmma.wait_group that retires this instruction's group writes the result there.
struct WgmmaOperands {
    int n;
    bool a_from_shared, a_mn_major, b_mn_major, accumulate;
    uint64_t a_desc, b_desc;
    const uint32_t* a_regs;
};
void wgmma_mma_async(const WgmmaOperands& op, float* d);
void wgmma_fence();                   // wgmma.fence.sync.aligned
void wgmma_commit_group();            // wgmma.commit_group.sync.aligned
void wgmma_wait_group(int pending);   // wgmma.wait_group.sync.aligned pending

}  // namespace cuemu

// ---------------------------------------------------------------------------------------------
// Atomics. Blocks run concurrently on several OS threads, so these are real atomics. Float
// atomics make results depend on block order when CUEMU_THREADS > 1, as on a GPU.

namespace cuemu {
template <typename T, typename F> inline T atomic_update(T* address, F f) {
    std::atomic_ref<T> ref(*address);
    T old = ref.load(std::memory_order_relaxed);
    while (!ref.compare_exchange_weak(old, f(old), std::memory_order_relaxed)) {
    }
    return old;
}
}  // namespace cuemu

inline float atomicAdd(float* a, float v) { return std::atomic_ref<float>(*a).fetch_add(v, std::memory_order_relaxed); }
inline double atomicAdd(double* a, double v) { return std::atomic_ref<double>(*a).fetch_add(v, std::memory_order_relaxed); }
inline int atomicAdd(int* a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
    return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline int atomicMax(int* a, int v) { return cuemu::atomic_update(a, [v](int o) { return o > v ? o : v; }); }
inline unsigned atomicMax(unsigned* a, unsigned v) {
    return cuemu::atomic_update(a, [v](unsigned o) { return o > v ? o : v; });
}
inline int atomicMin(int* a, int v) { return cuemu::atomic_update(a, [v](int o) { return o < v ? o : v; }); }
inline unsigned atomicMin(unsigned* a, unsigned v) {
    return cuemu::atomic_update(a, [v](unsigned o) { return o < v ? o : v; });
}
template <typename T> inline T atomic_cas_impl(T* a, T compare, T v) {
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;  // the old value, whether or not the swap happened
}
inline int atomicCAS(int* a, int c, int v) { return atomic_cas_impl(a, c, v); }
inline unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { return atomic_cas_impl(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
    return atomic_cas_impl(a, c, v);
}
inline int atomicExch(int* a, int v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicExch(unsigned* a, unsigned v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }
inline float atomicExch(float* a, float v) { return std::atomic_ref<float>(*a).exchange(v, std::memory_order_relaxed); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }

// ---------------------------------------------------------------------------------------------
// Cache-hinted loads and stores: plain memory operations on the CPU.

template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldca(const T* p) { return *p; }
template <typename T> inline T __ldlu(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
template <typename T> inline void __stwb(T* p, T v) { *p = v; }

// ---------------------------------------------------------------------------------------------
// Math intrinsics that the host toolchain lacks. The fast-math ones (__expf, __fdividef, ...)
// are computed exactly here; on the GPU they carry the error bounds of the Programming Guide's
// "Intrinsic Functions" table, which tests tolerate.

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float exp2f_fast(float x) { return std::exp2(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }

inline float __fmul_rn(float a, float b) { return a * b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline int __float_as_int(float x) { return cuemu::from_bits<int>(cuemu::to_bits(x)); }
inline unsigned __float_as_uint(float x) { return cuemu::from_bits<unsigned>(cuemu::to_bits(x)); }
inline float __int_as_float(int x) { return cuemu::from_bits<float>(cuemu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return cuemu::from_bits<float>(cuemu::to_bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }

// CUDA provides global min/max overloads for device code.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// Kernels' vector of expf (kernels/common.cuh's expf_each).
#ifdef __AVX2__
#include <immintrin.h>
extern "C" __m256 _ZGVdN8v_expf(__m256);  // glibc's libmvec (the CPU build links -lmvec)
#endif
namespace cuemu {

// out[i] = expf(in[i]) for a thread's chunk of n values (kernels/common.cuh's expf_each): 8 at a
// time through libmvec's AVX2 expf, the last group padded, so a value's result does not depend on
// n or its position. g++ does not vectorize such short loops itself (it unrolls them first, and
// SLP does not use SIMD clones). Like CUDA's expf (2 ulp, Programming Guide) neither libmvec's nor
// glibc's scalar expf is correctly rounded; tests hold kernels to tolerances against a double
// reference. Without AVX2, the scalar expf.
inline void expf_each(float* out, const float* in, int n) {
#ifdef __AVX2__
    // The tail's length as n % 8, which g++ sees is under 8 (from a loop's end it warned, for a whole
    // n such as 32, of iterations past the padded group's end that never run).
    const int tail = n % 8, whole = n - tail;
    for (int i = 0; i < whole; i += 8) _mm256_storeu_ps(out + i, _ZGVdN8v_expf(_mm256_loadu_ps(in + i)));
    if (tail > 0) {
        alignas(32) float padded[8] = {};
        for (int k = 0; k < tail; ++k) padded[k] = in[whole + k];
        _mm256_store_ps(padded, _ZGVdN8v_expf(_mm256_load_ps(padded)));
        for (int k = 0; k < tail; ++k) out[whole + k] = padded[k];
    }
#else
    for (int i = 0; i < n; ++i) out[i] = std::exp(in[i]);
#endif
}

}  // namespace cuemu

// ---------------------------------------------------------------------------------------------
// Recording for the roofline tool (dev/launch_record.h, dev/roofline.cu).
//
// Record-only mode: device allocations only reserve address space (no memory is touched, so the
// plan of a 1.5B-parameter model costs nothing), and kernel launches (the launch wrapper skips
// them), cuBLASLt matmuls, memsets, copies and NCCL collectives check their arguments and are
// reported but not executed; a device-to-host copy fills the host buffer with zeros (so what the
// host decides from device values, such as train_step's skip of a non-finite step, is the same every
// run). In this mode ncclCommInitRank creates a communicator of nranks without MPI peers (only this
// rank exists).
// Set it before the first allocation; allocations keep the kind they were made with.
//
// Work observer: while one is set, memsets, copies, collectives, event records and stream waits
// report themselves to it (kernel launches and matmuls are recorded by the program's own
// wrappers; the events tell a replay which work on different streams may overlap).

namespace cuemu {

void set_record_only(bool on);
bool record_only();

struct WorkReport {
    enum Kind { memset, copy_device, copy_host, communication, event_record, stream_wait };
    const char* name;     // "cudaMemsetAsync", "ncclAllReduce", "cudaEventRecord", ...
    Kind kind;
    double bytes;         // memset: written; copy_device: read + written; copy_host: moved; communication:
                          // NCCL's bus bytes per rank (see emu/nccl.cpp)
    cudaStream_t stream;  // the stream it was issued on (0: the legacy default stream)
    double ms;            // wall time the emulator took
    const void* event = nullptr;  // event_record (cudaEventRecord), stream_wait (cudaStreamWaitEvent)
};
using WorkObserver = void (*)(const WorkReport&);
void set_work_observer(WorkObserver observer);
void report_work(const WorkReport& report);  // to the observer, if any

}  // namespace cuemu

namespace cuemu {

// ---------------------------------------------------------------------------------------------
// Race detection (emu/racecheck.cpp). Work runs synchronously here, so a GPU-only ordering bug
// (work on one stream reading what another stream writes with nothing ordering the two) gives
// right results on the CPU. With detection on, the emulator tracks what the GPU guarantees:
// happens-before between streams, with vector clocks, through
//  - stream order;
//  - events: cudaEventRecord captures the stream's clock, cudaStreamWaitEvent joins it;
//  - the host: cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize and synchronous
//    device-to-host cudaMemcpy join into the host's clock, and everything the host enqueues
//    afterwards joins the host's clock;
//  - the legacy default stream (0 or cudaStreamLegacy, where plain cudaMemcpy/cudaMemset run): an
//    operation on it waits for prior work of every blocking stream, and an operation on a blocking
//    stream waits for the legacy stream's prior work; cudaStreamNonBlocking streams do neither.
//    A synchronous host-to-device or device-to-device cudaMemcpy does not make the host wait (the
//    CUDA runtime may return before the data has landed), nor does cudaMemset.
// Per device allocation it keeps the last write and the reads since, with the byte ranges they
// covered: kernel launches (pointer arguments: pointer to const read, other pointers read and
// written, from the pointer to the end of its labeled range, see label_device_memory), copies,
// memsets, cuBLASLt matmuls (A, B, C when beta != 0 and bias read; D, workspace written; the GELU
// aux written by *_AUX epilogues and read by DGELU ones; the bias written by BGRAD ones) and NCCL
// collectives (send buffer read, receive buffer written). An access that no happens-before edge
// orders after a conflicting one on another stream (write after write or read, read after write)
// is a race: the report names both operations, their streams and the allocation.
// Not tracked: host memory, pointers the kernel reads from device memory (arrays of pointers),
// and the exact extent a kernel reaches from a pointer argument.
//
// CUEMU_RACECHECK=1 turns it on with Racecheck::abort: the first race is printed to stderr and the
// process exits with status 1. Record-only mode tracks nothing.

enum class Racecheck : int {
    off,
    abort,    // print the report to stderr and end the process (exit status 1)
    collect,  // keep the reports for take_race_reports() and go on (the emulator's own tests)
};
void set_racecheck(Racecheck mode);  // changing the mode also forgets all history
Racecheck racecheck();
std::vector<std::string> take_race_reports();  // the reports collected so far, then none

// Names a device allocation (the whole of it) or a range inside it, for race reports. A labeled
// range also bounds what a kernel's pointer argument is taken to reach: from the pointer to the
// next label boundary (else to the end of the allocation). Programs label the sub-ranges that
// different streams use at the same time (e.g. per-layer gradient slices reduced while the next
// layer's are computed), so that they are not mistaken for one buffer.
void label_device_memory(const void* p, size_t bytes, const char* label);

}  // namespace cuemu
