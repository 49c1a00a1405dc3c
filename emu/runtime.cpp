// The CUDA runtime subset the project uses, defined for the CPU against the real
// cuda_runtime_api.h declarations. One emulated device per process; device memory is host
// memory, allocated at exactly the requested size so AddressSanitizer sees every overrun.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace cuemu {

// ---- errors: per host thread, as in the CUDA runtime ----

static thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record_error(cudaError_t err) {
    if (err != cudaSuccess) last_error = err;
    return err;
}

// ---- device memory accounting ----

namespace {
struct Allocations {
    std::mutex mutex;
    std::unordered_map<void*, size_t> sizes;
    std::unordered_set<void*> reserved;  // record-only allocations: address space only (munmap)
    size_t current = 0, peak = 0;
};
Allocations& allocations() {
    static Allocations* a = new Allocations;  // never destroyed: frees may run during exit
    return *a;
}
size_t device_capacity_bytes() {
    static const size_t capacity = [] {
        const char* gib = std::getenv("CUEMU_DEVICE_MEMORY_GIB");
        double g = gib ? std::atof(gib) : 80.0;
        if (!(g > 0)) {
            std::fprintf(stderr, "CUEMU_DEVICE_MEMORY_GIB: expected a positive number, got '%s'\n", gib);
            std::exit(EXIT_FAILURE);
        }
        return size_t(g * double(size_t(1) << 30));
    }();
    return capacity;
}
}  // namespace

MemoryStats memory_stats() {
    Allocations& a = allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    return {a.current, a.peak, a.sizes.size()};
}

void reset_peak_memory() {
    Allocations& a = allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    a.peak = a.current;
}

namespace {
std::atomic<uint64_t> host_wait_count{0};
struct PinnedAllocations {  // cudaMallocHost's blocks by start: an address is pinned if one holds it
    std::mutex mutex;
    std::map<const char*, size_t> blocks;
};
PinnedAllocations& pinned_allocations() {
    static PinnedAllocations* p = new PinnedAllocations;  // never destroyed, as allocations()
    return *p;
}
bool is_pinned(const void* p) {
    PinnedAllocations& pinned = pinned_allocations();
    std::lock_guard<std::mutex> lock(pinned.mutex);
    auto it = pinned.blocks.upper_bound(static_cast<const char*>(p));
    if (it == pinned.blocks.begin()) return false;
    --it;
    return static_cast<const char*>(p) < it->first + it->second;
}
}  // namespace

uint64_t host_waits() { return host_wait_count.load(); }
void count_host_wait() { ++host_wait_count; }

bool is_device_allocation(const void* p) {
    Allocations& a = allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    return a.sizes.count(const_cast<void*>(p)) != 0;
}

// ---- record-only mode and the work observer (cuda_emu.h, "Recording for the roofline tool") ----

namespace {
std::atomic<bool> record_only_mode{false};
std::atomic<WorkObserver> work_observer{nullptr};
}  // namespace

void set_record_only(bool on) { record_only_mode = on; }
bool record_only() { return record_only_mode; }
void set_work_observer(WorkObserver observer) { work_observer = observer; }
void report_work(const WorkReport& report) {
    if (WorkObserver observer = work_observer) observer(report);
}

namespace {
// Runs `work` unless in record-only mode, and reports it (timed) when an observer is set.
template <typename F>
void run_reported(const char* name, WorkReport::Kind kind, double bytes, cudaStream_t stream, F work) {
    const auto begin = std::chrono::steady_clock::now();
    if (!record_only()) work();
    if (work_observer.load() == nullptr) return;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    report_work({name, kind, bytes, stream, ms});
}
}  // namespace

}  // namespace cuemu

using cuemu::record_error;

// ---- memory ----

cudaError_t cudaMalloc(void** ptr, size_t size) {
    if (ptr == nullptr) return record_error(cudaErrorInvalidValue);
    if (cudaError_t e = cuemu::capture_unsafe_call("cudaMalloc")) return e;
    *ptr = nullptr;
    auto& a = cuemu::allocations();
    {
        std::lock_guard<std::mutex> lock(a.mutex);
        if (a.current + size > cuemu::device_capacity_bytes()) return record_error(cudaErrorMemoryAllocation);
    }
    void* p = nullptr;
    const bool reserve_only = cuemu::record_only();
    if (reserve_only) {
        // Address space only: nothing may touch it (PROT_NONE), and no memory is committed.
        p = mmap(nullptr, size == 0 ? 1 : size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return record_error(cudaErrorMemoryAllocation);
    } else if (posix_memalign(&p, 256, size == 0 ? 1 : size) != 0) {
        // 256-byte alignment like cudaMalloc; the size stays exact so overruns are visible to ASan.
        return record_error(cudaErrorMemoryAllocation);
    }
    std::lock_guard<std::mutex> lock(a.mutex);
    if (reserve_only) a.reserved.insert(p);
    a.sizes[p] = size;
    a.current += size;
    if (a.current > a.peak) a.peak = a.current;
    *ptr = p;
    if (!reserve_only) cuemu::race::allocated(p, size);
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (ptr == nullptr) return cudaSuccess;
    if (cudaError_t e = cuemu::capture_unsafe_call("cudaFree")) return e;
    auto& a = cuemu::allocations();
    size_t size = 0;
    bool reserved = false;
    {
        std::lock_guard<std::mutex> lock(a.mutex);
        auto it = a.sizes.find(ptr);
        if (it == a.sizes.end()) return record_error(cudaErrorInvalidValue);
        size = it->second;
        a.current -= size;
        a.sizes.erase(it);
        reserved = a.reserved.erase(ptr) != 0;
    }
    cuemu::race::freed(ptr);
    if (reserved) munmap(ptr, size == 0 ? 1 : size);
    else std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
    if (ptr == nullptr) return record_error(cudaErrorInvalidValue);
    if (cudaError_t e = cuemu::capture_unsafe_call("cudaMallocHost")) return e;
    *ptr = std::malloc(size == 0 ? 1 : size);
    if (*ptr == nullptr) return record_error(cudaErrorMemoryAllocation);
    cuemu::PinnedAllocations& pinned = cuemu::pinned_allocations();
    std::lock_guard<std::mutex> lock(pinned.mutex);
    pinned.blocks[static_cast<const char*>(*ptr)] = size == 0 ? 1 : size;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
    if (cudaError_t e = cuemu::capture_unsafe_call("cudaFreeHost")) return e;
    {
        cuemu::PinnedAllocations& pinned = cuemu::pinned_allocations();
        std::lock_guard<std::mutex> lock(pinned.mutex);
        pinned.blocks.erase(static_cast<const char*>(ptr));
    }
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    size_t total = cuemu::device_capacity_bytes();
    size_t used = cuemu::memory_stats().current_bytes;
    if (free_bytes) *free_bytes = used < total ? total - used : 0;
    if (total_bytes) *total_bytes = total;
    return cudaSuccess;
}

namespace {
// slice(first, last) over the `count` bytes of a fill or copy: from 4 MB on, when `splittable`, in
// page-aligned slices on all of the rank's cores (emu_internal.h, run_on_cpu_threads); one core fills
// or copies at about half the rate two reach (the gradients' zeroing: 250 MB a step for GPT-2 124M
// in BF16).
template <typename Slice> void for_byte_slices(size_t count, bool splittable, const Slice& slice) {
    constexpr size_t kParallelBytes = size_t(4) << 20, kPage = 4096;
    const int threads = splittable && count >= kParallelBytes ? cuemu::cpu_threads_per_rank() : 1;
    cuemu::run_on_cpu_threads(count, kPage, threads, slice);
}

const char* copy_name(bool synchronous, cudaMemcpyKind kind) {
    switch (kind) {
        case cudaMemcpyHostToDevice: return synchronous ? "cudaMemcpy (host to device)" : "cudaMemcpyAsync (host to device)";
        case cudaMemcpyDeviceToHost: return synchronous ? "cudaMemcpy (device to host)" : "cudaMemcpyAsync (device to host)";
        case cudaMemcpyDeviceToDevice:
            return synchronous ? "cudaMemcpy (device to device)" : "cudaMemcpyAsync (device to device)";
        default: return synchronous ? "cudaMemcpy" : "cudaMemcpyAsync";
    }
}

// Streams execute in order, synchronously, so the Async forms are the same as the others, except
// to the race detector: a synchronous copy runs on the legacy default stream, and one into host
// memory returns only when it is done (the host then waits for that stream).
cudaError_t copy_bytes(const char* name, void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream,
                       bool synchronous) {
    if (count && (dst == nullptr || src == nullptr)) return record_error(cudaErrorInvalidValue);
    const bool into_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
                           (kind == cudaMemcpyDefault && !cuemu::is_device_allocation(dst));
    const bool from_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost ||
                           (kind == cudaMemcpyDefault && !cuemu::is_device_allocation(src));
    if (synchronous || (into_host && !cuemu::is_pinned(dst)) || (from_host && !cuemu::is_pinned(src))) cuemu::count_host_wait();
    if (count && cuemu::race::enabled()) {
        const cuemu::MemoryAccess accesses[] = {{src, count, false, false}, {dst, count, true, false}};
        cuemu::race::operation(copy_name(synchronous, kind), stream, accesses, 2);
        const bool to_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
                             (kind == cudaMemcpyDefault && !cuemu::is_device_allocation(dst));
        if (synchronous && to_host) cuemu::race::host_waits_for_stream(stream);
    }
    // Bytes to device memory and back: read and written for a device-to-device copy.
    const bool on_device = kind == cudaMemcpyDeviceToDevice ||
                           (kind == cudaMemcpyDefault && cuemu::is_device_allocation(dst) && cuemu::is_device_allocation(src));
    // Overlapping ranges stay one memmove.
    const char *from = static_cast<const char*>(src), *to = static_cast<const char*>(dst);
    const bool disjoint = from + count <= to || to + count <= from;
    // Record-only: device memory holds nothing, so what the host reads from it is zeros (not the host
    // buffer's stale bytes: a step's skip decision reads its losses and norm this way).
    if (cuemu::record_only() && into_host && !from_host) std::memset(dst, 0, count);
    cuemu::run_reported(name, on_device ? cuemu::WorkReport::copy_device : cuemu::WorkReport::copy_host,
                        double(count) * (on_device ? 2 : 1), stream, [&] {
                            for_byte_slices(count, disjoint, [&](size_t first, size_t last) {
                                std::memmove(static_cast<char*>(dst) + first, from + first, last - first);
                            });
                        });
    return cudaSuccess;
}
cudaError_t fill_bytes(const char* name, void* dst, int value, size_t count, cudaStream_t stream) {
    if (count && dst == nullptr) return record_error(cudaErrorInvalidValue);
    if (count && cuemu::race::enabled()) {
        const cuemu::MemoryAccess written{dst, count, true, false};
        cuemu::race::operation(name, stream, &written, 1);
    }
    cuemu::run_reported(name, cuemu::WorkReport::memset, double(count), stream, [&] {
        for_byte_slices(count, true, [&](size_t first, size_t last) {
            std::memset(static_cast<char*>(dst) + first, value, last - first);
        });
    });
    return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    if (cudaError_t e = cuemu::capture_host_waits_for_stream(nullptr, "cudaMemcpy")) return e;
    return copy_bytes("cudaMemcpy", dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
    if (cuemu::capturing(stream))
        return cuemu::capture(stream, "cudaMemcpyAsync",
                              [=] { return cudaMemcpyAsync(dst, src, count, kind, stream) == cudaSuccess; });
    return copy_bytes("cudaMemcpyAsync", dst, src, count, kind, stream, false);
}

cudaError_t cudaMemset(void* dst, int value, size_t count) {
    if (cudaError_t e = cuemu::capture_host_waits_for_stream(nullptr, "cudaMemset")) return e;
    return fill_bytes("cudaMemset", dst, value, count, nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
    if (cuemu::capturing(stream))
        return cuemu::capture(stream, "cudaMemsetAsync", [=] { return cudaMemsetAsync(dst, value, count, stream) == cudaSuccess; });
    return fill_bytes("cudaMemsetAsync", dst, value, count, stream);
}

// ---- streams and events: work runs synchronously, so events are host timestamps ----

namespace {
struct EmuStream {
    unsigned flags;
};
struct EmuEvent {
    std::chrono::steady_clock::time_point when{};
    bool recorded = false;
};
}  // namespace

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    if (stream == nullptr) return record_error(cudaErrorInvalidValue);
    *stream = reinterpret_cast<cudaStream_t>(new EmuStream{flags});
    cuemu::race::stream_created(*stream, flags);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    cuemu::race::stream_destroyed(stream);
    delete reinterpret_cast<EmuStream*>(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (cudaError_t e = cuemu::capture_host_waits_for_stream(stream, "cudaStreamSynchronize")) return e;
    cuemu::count_host_wait();
    cuemu::race::host_waits_for_stream(stream);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    if (cudaError_t captured; cuemu::capture_stream_wait(stream, event, &captured)) return captured;
    cuemu::race::stream_waits_for_event(stream, event);
    cuemu::report_work({"cudaStreamWaitEvent", cuemu::WorkReport::stream_wait, 0, stream, 0, event});
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
    if (cudaError_t e = cuemu::capture_unsafe_call("cudaDeviceSynchronize")) return e;
    cuemu::count_host_wait();
    cuemu::race::host_waits_for_device();
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
    if (event == nullptr) return record_error(cudaErrorInvalidValue);
    *event = reinterpret_cast<cudaEvent_t>(new EmuEvent);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    cuemu::race::event_destroyed(event);
    delete reinterpret_cast<EmuEvent*>(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t captured; cuemu::capture_event_record(event, stream, &captured)) return captured;
    auto* e = reinterpret_cast<EmuEvent*>(event);
    e->when = std::chrono::steady_clock::now();
    e->recorded = true;
    cuemu::race::event_recorded(event, stream);
    cuemu::report_work({"cudaEventRecord", cuemu::WorkReport::event_record, 0, stream, 0, event});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (cudaError_t e = cuemu::capture_host_waits_for_event(event, "cudaEventSynchronize")) return e;
    cuemu::count_host_wait();
    cuemu::race::host_waits_for_event(event);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return cuemu::capture_host_waits_for_event(event, "cudaEventQuery"); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == nullptr || start == nullptr || end == nullptr) return record_error(cudaErrorInvalidValue);
    auto* s = reinterpret_cast<EmuEvent*>(start);
    auto* e = reinterpret_cast<EmuEvent*>(end);
    if (!s->recorded || !e->recorded) return record_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(e->when - s->when).count();
    return cudaSuccess;
}

// ---- device: one emulated device per process, described like an H100 SXM where it matters
// to launch limits (the executor enforces the same limits) ----

cudaError_t cudaGetDeviceCount(int* count) {
    if (count == nullptr) return record_error(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : record_error(cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int* device) {
    if (device == nullptr) return record_error(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (prop == nullptr) return record_error(cudaErrorInvalidValue);
    if (device != 0) return record_error(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof(prop->name), "CUDA emulator on the CPU (emu/)");
    prop->totalGlobalMem = cuemu::device_capacity_bytes();
    prop->sharedMemPerBlock = cuemu::kDefaultSharedMemPerBlock;
    prop->sharedMemPerBlockOptin = cuemu::kMaxSharedMemPerBlockOptin;
    prop->sharedMemPerMultiprocessor = 228 * 1024;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = cuemu::kMaxThreadsPerBlock;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->multiProcessorCount = cuemu::threads();
    prop->major = 9;
    prop->minor = 0;
    prop->l2CacheSize = 50 * 1024 * 1024;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (value == nullptr) return record_error(cudaErrorInvalidValue);
    if (device != 0) return record_error(cudaErrorInvalidDevice);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(p.sharedMemPerBlock); break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(p.sharedMemPerBlockOptin); break;
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrWarpSize: *value = p.warpSize; break;
        default: return record_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceReset() { return cudaSuccess; }

// ---- errors ----

cudaError_t cudaGetLastError() {
    cudaError_t e = cuemu::last_error;
    cuemu::last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError() { return cuemu::last_error; }

const char* cudaGetErrorName(cudaError_t err) {
    switch (err) {
#define CUEMU_ERROR_NAME(e) \
    case e: return #e;
        CUEMU_ERROR_NAME(cudaSuccess)
        CUEMU_ERROR_NAME(cudaErrorInvalidValue)
        CUEMU_ERROR_NAME(cudaErrorMemoryAllocation)
        CUEMU_ERROR_NAME(cudaErrorInvalidConfiguration)
        CUEMU_ERROR_NAME(cudaErrorInvalidDevice)
        CUEMU_ERROR_NAME(cudaErrorInvalidResourceHandle)
        CUEMU_ERROR_NAME(cudaErrorLaunchFailure)
        CUEMU_ERROR_NAME(cudaErrorLaunchOutOfResources)
        CUEMU_ERROR_NAME(cudaErrorInvalidDeviceFunction)
        CUEMU_ERROR_NAME(cudaErrorNotSupported)
        CUEMU_ERROR_NAME(cudaErrorIllegalState)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureUnsupported)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureInvalidated)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureMerge)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureUnmatched)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureUnjoined)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureIsolation)
        CUEMU_ERROR_NAME(cudaErrorStreamCaptureImplicit)
#undef CUEMU_ERROR_NAME
        default: return "cudaErrorUnknown";
    }
}

const char* cudaGetErrorString(cudaError_t err) {
    switch (err) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorLaunchFailure:
            return "unspecified launch failure (emu: deadlock or divergent barrier; details on stderr)";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorNotSupported: return "operation not supported";
        // The CUDA runtime's own wording (driver_types.h).
        case cudaErrorIllegalState: return "the resource is not in a valid state to perform the requested operation";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
        case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
        case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
        case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
        default: return "unknown error";
    }
}

// ---- kernel attributes: the executor enforces the opted-in dynamic shared memory size ----

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (func == nullptr) return record_error(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || size_t(value) > cuemu::kMaxSharedMemPerBlockOptin) return record_error(cudaErrorInvalidValue);
        cuemu::set_max_dynamic_shared(func, size_t(value));
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return record_error(cudaErrorInvalidValue);
}
