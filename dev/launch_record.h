// Launch recording: while it is on, every kernel launched through launch<>(KernelCost, ...), every
// cuBLASLt matmul (kernels/matmul.cuh), every memset and copy made through recorded_memset and
// recorded_copy (kernels/cuda_common.h; under nvcc: in the CPU build the emulator reports all its
// memsets and copies) and, in the CPU build, the emulator's NCCL collectives append one record each
// (name, grid, block, FLOPs, bytes, stream). With timing,
// each record also gets its device time: CUDA events around it on its stream under nvcc; under g++
// the emulator runs work synchronously, so the same events measure the CPU's wall time.
// Readers: the roofline tool (dev/roofline.cu), `train_gpt --profile-step`, dev/roofline.h.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cuda_common.h"  // which includes this file after CUDA_CHECK, before the launch wrapper

// What executes the work, which decides the roofline it is held against (dev/roofline.h).
enum class WorkKind {
    cuda_cores,    // our SIMT kernels (FP32 arithmetic on CUDA cores)
    tensor_cores,  // our kernels that use mma.sync (tensor-core attention)
    matmul,        // cuBLASLt
    communication, // NCCL collectives: bytes are those each rank sends over the links
    memset,        // cudaMemset*: bytes written
    copy_device,   // device-to-device cudaMemcpy*: bytes read + written
    copy_host,     // host<->device cudaMemcpy*: bytes over PCIe
    event_record,  // cudaEventRecord and cudaStreamWaitEvent (the emulator reports them): the
    stream_wait,   // dependencies between streams, so a replay can tell what overlaps
};

inline const char* work_kind_name(WorkKind kind) {
    switch (kind) {
        case WorkKind::cuda_cores: return "simt";
        case WorkKind::tensor_cores: return "tensor";
        case WorkKind::matmul: return "cublasLt";
        case WorkKind::communication: return "nccl";
        case WorkKind::memset: return "memset";
        case WorkKind::copy_device: return "copy";
        case WorkKind::copy_host: return "pcie";
        case WorkKind::event_record:
        case WorkKind::stream_wait: return "sync";
    }
    return "?";
}

struct LaunchRecord {
    std::string name;
    WorkKind kind = WorkKind::cuda_cores;
    dim3 grid{0, 0, 0}, block{0, 0, 0};  // zero for work that is not one of our kernel launches
    size_t dynamic_smem = 0;
    double flops = 0, bytes = 0;
    cudaStream_t stream = nullptr;
    double ms = -1;               // measured device time; -1 when not timed
    const void* event = nullptr;  // event_record, stream_wait: the event
    int gemm_m = 0, gemm_n = 0, gemm_k = 0;  // a cuBLASLt GEMM's m, n, k (dev/roofline.h's efficiency); 0 otherwise
    // A grid of blocks with equal work, this many resident on an SM at once (KernelCost); 0 otherwise.
    int equal_blocks_per_sm = 0;
};

namespace launch_record {

struct State {
    bool on = false, timing = false;
    bool own_events = false;  // the recorder's own cudaEventRecord calls: not part of the work
    std::vector<LaunchRecord> records;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events;  // per record, when timing (else null)
};
inline State& state() {
    static State s;
    return s;
}

inline bool recording() { return state().on; }

inline size_t append(LaunchRecord record) {
    State& s = state();
    s.records.push_back(std::move(record));
    s.events.push_back({nullptr, nullptr});
    return s.records.size() - 1;
}

#ifndef __CUDACC__
// The emulator reports its memsets, copies and collectives here while recording is on.
inline void on_emulated_work(const cuemu::WorkReport& w) {
    if (state().own_events) return;
    LaunchRecord r;
    r.name = w.name;
    switch (w.kind) {
        case cuemu::WorkReport::memset: r.kind = WorkKind::memset; break;
        case cuemu::WorkReport::copy_device: r.kind = WorkKind::copy_device; break;
        case cuemu::WorkReport::copy_host: r.kind = WorkKind::copy_host; break;
        case cuemu::WorkReport::communication: r.kind = WorkKind::communication; break;
        case cuemu::WorkReport::event_record: r.kind = WorkKind::event_record; break;
        case cuemu::WorkReport::stream_wait: r.kind = WorkKind::stream_wait; break;
    }
    r.bytes = w.bytes;
    r.stream = w.stream;
    r.event = w.event;
    if (state().timing) r.ms = w.ms;
    append(std::move(r));
}
#endif

// Starts a new recording (dropping an unread one); `timing` also measures each record.
inline void start(bool timing) {
    State& s = state();
    s = State{};
    s.on = true;
    s.timing = timing;
#ifndef __CUDACC__
    cuemu::set_work_observer(&on_emulated_work);
#endif
}

// Ends the recording and returns it; with timing, waits for the device and reads the events.
inline std::vector<LaunchRecord> stop() {
    State& s = state();
#ifndef __CUDACC__
    cuemu::set_work_observer(nullptr);
#endif
    if (s.timing) CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < s.records.size(); ++i) {
        auto [begin, end] = s.events[i];
        if (!begin) continue;
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
        s.records[i].ms = ms;
        CUDA_CHECK(cudaEventDestroy(begin));
        CUDA_CHECK(cudaEventDestroy(end));
    }
    std::vector<LaunchRecord> out = std::move(s.records);
    s = State{};
    return out;
}

// One piece of device work issued on `stream` during the object's lifetime: recorded when
// recording is on, and bracketed by timing events when timing is on. A no-op otherwise.
class Scope {
public:
    Scope(std::string_view name, WorkKind kind, double flops, double bytes, cudaStream_t stream,
          dim3 grid = dim3(0, 0, 0), dim3 block = dim3(0, 0, 0), size_t dynamic_smem = 0) {
        State& s = state();
        if (!s.on) return;  // the common case: nothing allocated, nothing recorded
        index_ = append({std::string(name), kind, grid, block, dynamic_smem, flops, bytes, stream, -1});
        if (!s.timing) return;
        stream_ = stream;
        auto& [begin, end] = s.events[index_];
        CUDA_CHECK(cudaEventCreate(&begin));
        CUDA_CHECK(cudaEventCreate(&end));
        s.own_events = true;
        CUDA_CHECK(cudaEventRecord(begin, stream));
        s.own_events = false;
    }
    ~Scope() {
        State& s = state();
        if (index_ == kNone || !s.timing || index_ >= s.events.size()) return;
        s.own_events = true;
        CUDA_CHECK(cudaEventRecord(s.events[index_].second, stream_));
        s.own_events = false;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

    // The record is a GEMM of this shape.
    void gemm(int m, int n, int k) {
        State& s = state();
        if (index_ == kNone || index_ >= s.records.size()) return;
        LaunchRecord& r = s.records[index_];
        r.gemm_m = m, r.gemm_n = n, r.gemm_k = k;
    }
    // The record's blocks have equal work, `per_sm` of them resident on an SM at once.
    void equal_blocks(int per_sm) {
        State& s = state();
        if (index_ == kNone || index_ >= s.records.size()) return;
        s.records[index_].equal_blocks_per_sm = per_sm;
    }

private:
    static constexpr size_t kNone = size_t(-1);
    size_t index_ = kNone;
    cudaStream_t stream_ = nullptr;
};

}  // namespace launch_record
