// The one CUDA include of the project: the real toolkit under nvcc, emu/ under g++.
// It also holds the one kernel launch wrapper and the error checks.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cuda_bf16.h>
// `DYNAMIC_SHARED(float, smem);` declares `float* smem` at the launch's dynamic shared memory.
#define DYNAMIC_SHARED(type, name)                                      \
    extern __shared__ __align__(16) unsigned char cuda_dynamic_shared_[]; \
    type* name = reinterpret_cast<type*>(cuda_dynamic_shared_)
constexpr bool kEmulatedDevice = false;  // the kernels run on a GPU
// Full unrolling of a loop over a thread's array that must stay in registers (the emulator needs none).
#define FULL_UNROLL _Pragma("unroll")
// A loop nvcc must not unroll (its body's registers once, not several times over); g++ decides alone.
#define ROLLED_LOOP _Pragma("unroll 1")
#else
#include "../emu/cuda_emu.h"
constexpr bool kEmulatedDevice = true;  // the kernels run in the CPU emulator (emu/)
#define FULL_UNROLL
#define ROLLED_LOOP
#endif

// Launchers compiled once. The attention launchers' templates are half of a CPU unit's compile that
// includes train_gpt.cu (BF16, -O3, beside one other compile: 142 s, 75 s without them), and about
// twenty units include them. So the Makefile's CPU builds compile them in one unit per build folder
// and precision, kernels/compiled_once.cu (KERNELS_COMPILED_HERE: explicit instantiations, linked as
// libkernels-<precision>.a), and define KERNELS_COMPILED_ONCE for every other unit, where each
// header's COMPILED_ONCE list becomes `extern template` declarations. Without either (nvcc's
// one-unit build, CMake) the lists vanish. An instance no list names is compiled where it is used.
#if defined(KERNELS_COMPILED_HERE)
#define COMPILED_ONCE template
#elif defined(KERNELS_COMPILED_ONCE)
#define COMPILED_ONCE extern template
#endif

// ---------------------------------------------------------------------------------------------
// Errors. One policy for the whole program: what cannot go on throws a TrainGptError (host modules
// throw its base, std::runtime_error) with a one-line message naming what failed; main() alone
// prints it and, with several ranks, aborts the job. Nothing deep inside exits the process.

struct TrainGptError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A failing CUDA call: the call, file and line.
[[noreturn]] inline void cuda_fail(cudaError_t err, const char* what, const char* file, int line) {
    throw TrainGptError("CUDA error at " + std::string(file) + ":" + std::to_string(line) + ": " + what + ": " +
                        cudaGetErrorString(err));
}
#define CUDA_CHECK(call)                                                    \
    do {                                                                    \
        cudaError_t cuda_check_err_ = (call);                               \
        if (cuda_check_err_ != cudaSuccess) cuda_fail(cuda_check_err_, #call, __FILE__, __LINE__); \
    } while (0)

// Names device memory (a whole allocation, or a range inside one) in the emulator's race reports;
// a range also bounds what the race detector takes a kernel's pointer into it to reach (emu/cuda_emu.h,
// "Race detection"). Nothing under nvcc.
inline void label_device_memory(const void* p, size_t bytes, const char* label) {
#ifdef __CUDACC__
    (void)p, (void)bytes, (void)label;
#else
    cuemu::label_device_memory(p, bytes, label);
#endif
}

// Whether the CPU emulator executes the kernels (not a GPU, nor the emulator's record-only mode, which
// records launches for a GPU's roofline, dev/roofline.cu): launchers that have a form the emulator runs
// faster take it then.
inline bool kernels_run_on_cpu() {
#ifdef __CUDACC__
    return false;
#else
    return !cuemu::record_only();
#endif
}

// ---------------------------------------------------------------------------------------------
// The kernel's name, from the compiler's spelling of the template argument (for messages).

template <auto Kernel> const char* kernel_name() {
    static const std::string name = [pretty = std::string_view(__PRETTY_FUNCTION__)] {
        // pretty: "const char* kernel_name() [with auto Kernel = name]"
        const std::string_view key = "Kernel = ";
        size_t begin = pretty.find(key);
        if (begin == std::string_view::npos) return std::string(pretty);
        begin += key.size();
        size_t end = pretty.find_first_of(";]", begin);
        return std::string(pretty.substr(begin, end - begin));
    }();
    return name.c_str();
}

// ---------------------------------------------------------------------------------------------
// Every kernel launch in the project goes through here:
//     launch<my_kernel>(grid, block, dynamic_smem_bytes, stream, args...);
// Under nvcc this is <<<>>>; under g++ the emu executor runs the launch on the CPU.
// try_launch returns the launch error; launch ends the program on one, naming the kernel.

template <auto Kernel, typename... Args>
cudaError_t try_launch(dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, Args&&... args) {
#ifdef __CUDACC__
    Kernel<<<grid, block, dynamic_smem, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
#else
    if (cuemu::record_only()) return cudaSuccess;  // the roofline tool's mode: nothing executes
    cuemu::launch<Kernel>(kernel_name<Kernel>(), grid, block, dynamic_smem, stream, std::forward<Args>(args)...);
    return cudaGetLastError();
#endif
}

template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, Args&&... args) {
    cudaError_t err = try_launch<Kernel>(grid, block, dynamic_smem, stream, std::forward<Args>(args)...);
    if (err != cudaSuccess) {
        char text[512];
        std::snprintf(text, sizeof text, "kernel launch failed: %s grid (%u,%u,%u) block (%u,%u,%u) smem %zu: %s",
                      kernel_name<Kernel>(), grid.x, grid.y, grid.z, block.x, block.y, block.z, dynamic_smem,
                      cudaGetErrorString(err));
        throw TrainGptError(text);
    }
}

// ---------------------------------------------------------------------------------------------
// What one launch costs: the floating-point operations it performs and the bytes it must move to
// and from device memory (each input read once, each output written once; launchers say where
// their kernel reads more). Every launcher states it, so that the launch recorder
// (launch_record.h: the roofline tool, --profile-step) accounts for every launch.

#include "dev/launch_record.h"

struct KernelCost {
    double flops = 0;
    double bytes = 0;
    WorkKind kind = WorkKind::cuda_cores;  // tensor_cores for kernels built on mma.sync
    // > 0: every block of the grid does the same work, and an H100 SM holds this many at once, so the
    // grid runs in whole waves (the roofline charges the last one in full). 0: blocks of unequal work,
    // or so many that the scheduler's packing leaves no wave to speak of.
    int equal_blocks_per_sm = 0;
};

template <auto Kernel, typename... Args>
void launch(const KernelCost& cost, dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, Args&&... args) {
    launch_record::Scope recorded(kernel_name<Kernel>(), cost.kind, cost.flops, cost.bytes, stream, grid, block,
                                  dynamic_smem);
    if (cost.equal_blocks_per_sm > 0) recorded.equal_blocks(cost.equal_blocks_per_sm);
    launch<Kernel>(grid, block, dynamic_smem, stream, std::forward<Args>(args)...);
}

// cudaMemsetAsync and cudaMemcpyAsync, recorded like launches while recording is on (--profile-step):
// the CPU emulator reports its memsets and copies itself, and under nvcc these time them with events,
// so that a GPU profile's kernel sum holds the step's memsets (zeroing 249 MB of d12's gradients) too.
inline cudaError_t recorded_memset(void* dst, int value, size_t bytes, cudaStream_t stream) {
#ifdef __CUDACC__
    launch_record::Scope recorded("cudaMemsetAsync", WorkKind::memset, 0, double(bytes), stream);
#endif
    return cudaMemsetAsync(dst, value, bytes, stream);
}
inline cudaError_t recorded_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
#ifdef __CUDACC__
    const bool on_device = kind == cudaMemcpyDeviceToDevice;  // read and written there; else bytes over PCIe
    launch_record::Scope recorded("cudaMemcpyAsync", on_device ? WorkKind::copy_device : WorkKind::copy_host, 0,
                                  double(bytes) * (on_device ? 2 : 1), stream);
#endif
    return cudaMemcpyAsync(dst, src, bytes, kind, stream);
}

inline unsigned ceil_div(size_t a, size_t b) { return unsigned((a + b - 1) / b); }
