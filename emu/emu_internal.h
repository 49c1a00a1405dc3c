// Shared between emu/*.cpp only: not part of what kernels or the program see.
#pragma once
#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "cuda_emu.h"

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

// This rank's share of the CPU's cores for bulk host-side work (emu/cublaslt.cpp): the GEMMs, their
// epilogues, large fills and copies; ranks started by mpirun on one machine split the cores.
int cpu_threads_per_rank();
// slice(first, last) over [0, n) on `threads` OpenMP threads (passive: they sleep between calls,
// not spin on the cores the executor's threads use), each slice but the last ending at a multiple of
// `granule`; on the calling thread alone when threads <= 1 or n < 2 granule.
void run_on_cpu_threads(size_t n, size_t granule, int threads, const std::function<void(size_t, size_t)>& slice);

// Executor services for emu/tensor_core.cpp (called from kernel code, on the block's OS thread):
// a number that changes with every block this OS thread runs (per-block state can reset itself),
// and recording an error of the running block (its launch then fails with that message).
uint64_t block_serial();
void kernel_error(const std::string& what);
size_t dynamic_shared_bytes();  // the running launch's dynamic shared memory (dynamic_shared_memory())

// Stream capture hooks (emu/graph.cpp; capturing and capture are in cuda_emu.h). Each returns
// cudaSuccess when the call may go on; otherwise the capture it breaks is invalidated and the
// error CUDA gives is returned (and recorded).
cudaError_t capture_unsafe_call(const char* name);  // cudaMalloc, cudaFree, synchronous copies, ...
cudaError_t capture_host_waits_for_stream(cudaStream_t stream, const char* name);
cudaError_t capture_host_waits_for_event(cudaEvent_t event, const char* name);
// cudaEventRecord and cudaStreamWaitEvent: true when the capture took the call (its result in *result).
bool capture_event_record(cudaEvent_t event, cudaStream_t stream, cudaError_t* result);
bool capture_stream_wait(cudaStream_t stream, cudaEvent_t event, cudaError_t* result);

// Hooks of the race detector (emu/racecheck.cpp; cuda_emu.h, "Race detection"). The runtime,
// executor, cuBLASLt and NCCL call them; each does nothing unless race detection is on (and
// record-only mode is off), except the bookkeeping of allocations, streams and events, which is
// kept always so that detection can be switched on at any time.
namespace race {
bool enabled();
void allocated(const void* p, size_t size);
void freed(const void* p);
void stream_created(cudaStream_t stream, unsigned flags);
void stream_destroyed(cudaStream_t stream);
void event_destroyed(cudaEvent_t event);
// One operation enqueued on `stream` that touches `accesses` (addresses outside device
// allocations are ignored): checked against earlier operations, then remembered.
void operation(const char* name, cudaStream_t stream, const MemoryAccess* accesses, int count);
void host_waits_for_stream(cudaStream_t stream);  // cudaStreamSynchronize, synchronous copies to the host
void host_waits_for_device();                     // cudaDeviceSynchronize
void host_waits_for_event(cudaEvent_t event);     // cudaEventSynchronize
void event_recorded(cudaEvent_t event, cudaStream_t stream);
void stream_waits_for_event(cudaStream_t stream, cudaEvent_t event);
}  // namespace race

}  // namespace cuemu
