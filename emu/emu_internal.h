// Shared between emu/*.cpp only: not part of what kernels or the program see.
#pragma once
#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cuemu {

// H100 launch limits, enforced by the executor so a launch that would fail there fails here.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kDefaultSharedMemPerBlock = 48 * 1024;
constexpr size_t kMaxSharedMemPerBlockOptin = 227 * 1024;

// Records err as the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t record_error(cudaError_t err);

// cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void set_max_dynamic_shared(const void* func, size_t bytes);

bool is_device_allocation(const void* p);

// Executor services for emu/tensor_core.cpp (called from kernel code, on the block's OS thread):
// a number that changes with every block this OS thread runs (per-block state can reset itself),
// and recording an error of the running block (its launch then fails with that message).
uint64_t block_serial();
void kernel_error(const std::string& what);

}  // namespace cuemu
