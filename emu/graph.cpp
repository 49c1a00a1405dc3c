// Stream capture and CUDA graphs on the CPU (CUDA C++ Programming Guide, "CUDA Graphs",
// "Creating a Graph Using Stream Capture").
//
// While a stream is captured, the operations issued on it are recorded, not run: every emulated
// entry point that takes a stream (kernel launches, async copies and sets, event records and
// waits, cuBLASLt matmuls, NCCL collectives) asks capturing(stream) first and, if so, hands
// capture() a closure that issues the same call again with the same arguments. Descriptors and
// host scalars are copied when captured, as the real APIs read them then. Work runs in order on
// one stream here, so the order of capture is a valid topological order of the graph, and
// cudaGraphLaunch runs the closures in that order, each on the stream it was captured on, so the
// race detector sees the graph's dependencies as the events that made them.
//
// The rules the GPU enforces are enforced here, so that a step that captures here captures there:
// a stream joins a capture only by waiting on an event recorded in it (a fork), every forked
// stream must be joined back into the origin before cudaStreamEndCapture; synchronizing with a
// capturing stream or a captured event, waiting on an event recorded outside the capture, and
// (in the global and thread-local modes) cudaMalloc, cudaFree, their host forms and the
// synchronous copies all invalidate the capture with the error CUDA returns. Emulator limits: a
// graph is replayed on the stream it was captured from, and not inside another capture.
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu_internal.h"

namespace cuemu {
namespace {

struct Node {
    std::string name;
    std::function<bool()> run;
};

struct Capture {
    cudaStream_t origin;
    cudaStreamCaptureMode mode;
    std::thread::id thread;
    std::vector<Node> nodes;
    std::map<cudaStream_t, size_t> operations;      // streams in the capture: operations issued on each
    std::map<cudaStream_t, size_t> joined_through;  // forked streams: operations the origin has waited for
    std::string invalid_because;                    // empty: valid
};

struct CapturedEvent {
    Capture* capture;
    cudaStream_t stream;
    size_t operations;  // on `stream` when recorded
};

struct Captures {
    std::mutex mutex;
    std::map<cudaStream_t, Capture*> by_stream;
    std::map<cudaEvent_t, CapturedEvent> events;
    std::atomic<int> active{0};
};

Captures& captures() {
    static Captures c;
    return c;
}

// Invalidates `c` (the first reason is kept; CUDA reports cudaErrorStreamCaptureInvalidated from
// then on) and returns `error` for the call that did it.
cudaError_t invalidate(Capture& c, const std::string& why, cudaError_t error) {
    if (c.invalid_because.empty()) {
        c.invalid_because = why;
        std::fprintf(stderr, "cuemu: stream capture invalidated: %s\n", why.c_str());
    }
    return record_error(error);
}

bool restricts_thread(const Capture& c) {
    return c.mode == cudaStreamCaptureModeGlobal ||
           (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id());
}

}  // namespace

bool capturing(cudaStream_t stream) {
    Captures& all = captures();
    if (all.active.load(std::memory_order_relaxed) == 0 || stream == nullptr) return false;
    std::lock_guard<std::mutex> lock(all.mutex);
    return all.by_stream.count(stream) != 0;
}

cudaError_t capture(cudaStream_t stream, const char* name, std::function<bool()> replay) {
    Captures& all = captures();
    std::lock_guard<std::mutex> lock(all.mutex);
    auto it = all.by_stream.find(stream);
    if (it == all.by_stream.end()) return record_error(cudaErrorIllegalState);
    Capture& c = *it->second;
    if (!c.invalid_because.empty()) return record_error(cudaErrorStreamCaptureInvalidated);
    c.nodes.push_back({name, std::move(replay)});
    ++c.operations[stream];
    return cudaSuccess;
}

cudaError_t capture_unsafe_call(const char* name) {
    Captures& all = captures();
    if (all.active.load(std::memory_order_relaxed) == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(all.mutex);
    for (auto& [stream, c] : all.by_stream)
        if (restricts_thread(*c))
            return invalidate(*c, std::string(name) + " while a stream is captured (not permitted in this capture mode)",
                              cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}

cudaError_t capture_host_waits_for_stream(cudaStream_t stream, const char* name) {
    Captures& all = captures();
    if (all.active.load(std::memory_order_relaxed) == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(all.mutex);
    if (stream == nullptr) {  // the legacy stream synchronizes with every blocking stream
        for (auto& [s, c] : all.by_stream)
            if (restricts_thread(*c))
                return invalidate(*c, std::string(name) + " on the legacy stream while a stream is captured",
                                  cudaErrorStreamCaptureImplicit);
        return cudaSuccess;
    }
    auto it = all.by_stream.find(stream);
    if (it == all.by_stream.end()) return cudaSuccess;
    return invalidate(*it->second, std::string(name) + " on a stream that is being captured",
                      cudaErrorStreamCaptureUnsupported);
}

cudaError_t capture_host_waits_for_event(cudaEvent_t event, const char* name) {
    Captures& all = captures();
    if (all.active.load(std::memory_order_relaxed) == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(all.mutex);
    auto it = all.events.find(event);
    if (it == all.events.end()) return cudaSuccess;
    return invalidate(*it->second.capture, std::string(name) + " on an event recorded in a capture",
                      cudaErrorStreamCaptureUnsupported);
}

bool capture_event_record(cudaEvent_t event, cudaStream_t stream, cudaError_t* result) {
    Captures& all = captures();
    if (all.active.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lock(all.mutex);
    auto it = all.by_stream.find(stream);
    if (it == all.by_stream.end()) {
        all.events.erase(event);  // recorded outside any capture again
        return false;
    }
    Capture& c = *it->second;
    if (!c.invalid_because.empty()) {
        *result = record_error(cudaErrorStreamCaptureInvalidated);
        return true;
    }
    all.events[event] = {&c, stream, c.operations[stream]};
    c.nodes.push_back({"cudaEventRecord", [event, stream] { return cudaEventRecord(event, stream) == cudaSuccess; }});
    *result = cudaSuccess;
    return true;
}

bool capture_stream_wait(cudaStream_t stream, cudaEvent_t event, cudaError_t* result) {
    Captures& all = captures();
    if (all.active.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lock(all.mutex);
    auto waiter = all.by_stream.find(stream);
    auto recorded = all.events.find(event);
    if (recorded == all.events.end()) {
        if (waiter == all.by_stream.end()) return false;  // nothing captured on either side
        *result = invalidate(*waiter->second,
                             "cudaStreamWaitEvent: a captured stream waits on an event recorded outside the capture "
                             "(CUDA needs cudaEventWaitExternal for that)",
                             cudaErrorStreamCaptureIsolation);
        return true;
    }
    Capture& c = *recorded->second.capture;
    if (waiter != all.by_stream.end() && waiter->second != &c) {
        *result = invalidate(c, "cudaStreamWaitEvent: an event of one capture waited on in another",
                             cudaErrorStreamCaptureMerge);
        return true;
    }
    if (!c.invalid_because.empty()) {
        *result = record_error(cudaErrorStreamCaptureInvalidated);
        return true;
    }
    if (waiter == all.by_stream.end()) {  // a fork: the stream joins the capture
        all.by_stream[stream] = &c;
        c.operations[stream] = 0;
    }
    const cudaStream_t from = recorded->second.stream;
    if (stream == c.origin && from != c.origin) {
        size_t& through = c.joined_through[from];
        through = std::max(through, recorded->second.operations);
    }
    c.nodes.push_back(
        {"cudaStreamWaitEvent", [stream, event] { return cudaStreamWaitEvent(stream, event, 0) == cudaSuccess; }});
    ++c.operations[stream];
    *result = cudaSuccess;
    return true;
}

}  // namespace cuemu

using cuemu::record_error;

namespace {
struct EmuGraph {
    cudaStream_t origin;
    std::vector<cuemu::Node> nodes;
};
struct EmuGraphExec {
    cudaStream_t origin;
    std::vector<cuemu::Node> nodes;
};
}  // namespace

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (stream == nullptr) return record_error(cudaErrorStreamCaptureUnsupported);  // the legacy stream
    cuemu::Captures& all = cuemu::captures();
    std::lock_guard<std::mutex> lock(all.mutex);
    if (all.by_stream.count(stream)) return record_error(cudaErrorIllegalState);
    auto* c = new cuemu::Capture{stream, mode, std::this_thread::get_id(), {}, {}, {}, {}};
    c->operations[stream] = 0;
    all.by_stream[stream] = c;
    ++all.active;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (graph == nullptr) return record_error(cudaErrorInvalidValue);
    *graph = nullptr;
    cuemu::Captures& all = cuemu::captures();
    std::unique_ptr<cuemu::Capture> c;
    {
        std::lock_guard<std::mutex> lock(all.mutex);
        auto it = all.by_stream.find(stream);
        if (it == all.by_stream.end()) return record_error(cudaErrorIllegalState);
        if (it->second->origin != stream) return record_error(cudaErrorStreamCaptureUnmatched);
        c.reset(it->second);
        std::erase_if(all.by_stream, [&](const auto& entry) { return entry.second == c.get(); });
        std::erase_if(all.events, [&](const auto& entry) { return entry.second.capture == c.get(); });
        --all.active;
    }
    if (!c->invalid_because.empty()) return record_error(cudaErrorStreamCaptureInvalidated);
    for (const auto& [s, issued] : c->operations) {
        if (s == stream) continue;
        const size_t joined = c->joined_through.count(s) ? c->joined_through.at(s) : 0;
        if (joined < issued) {
            std::fprintf(stderr,
                         "cuemu: cudaStreamEndCapture: a forked stream has %zu operation(s) the origin stream never "
                         "waited for (record an event on it and cudaStreamWaitEvent the origin on it)\n",
                         issued - joined);
            return record_error(cudaErrorStreamCaptureUnjoined);
        }
    }
    *graph = reinterpret_cast<cudaGraph_t>(new EmuGraph{stream, std::move(c->nodes)});
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    if (status == nullptr) return record_error(cudaErrorInvalidValue);
    cuemu::Captures& all = cuemu::captures();
    std::lock_guard<std::mutex> lock(all.mutex);
    auto it = all.by_stream.find(stream);
    *status = it == all.by_stream.end()            ? cudaStreamCaptureStatusNone
              : it->second->invalid_because.empty() ? cudaStreamCaptureStatusActive
                                                     : cudaStreamCaptureStatusInvalidated;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (exec == nullptr || graph == nullptr) return record_error(cudaErrorInvalidValue);
    const auto* g = reinterpret_cast<const EmuGraph*>(graph);
    *exec = reinterpret_cast<cudaGraphExec_t>(new EmuGraphExec{g->origin, g->nodes});
    return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
    if (graph == nullptr || count == nullptr) return record_error(cudaErrorInvalidValue);
    if (nodes != nullptr) return record_error(cudaErrorNotSupported);  // emu: the count only
    *count = reinterpret_cast<const EmuGraph*>(graph)->nodes.size();
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (exec == nullptr) return record_error(cudaErrorInvalidResourceHandle);
    const auto* e = reinterpret_cast<const EmuGraphExec*>(exec);
    if (cuemu::capturing(stream)) {
        std::fprintf(stderr, "cuemu: cudaGraphLaunch into a capture is not emulated\n");
        return record_error(cudaErrorNotSupported);
    }
    if (stream != e->origin) {
        std::fprintf(stderr, "cuemu: cudaGraphLaunch: emu replays a graph only on the stream it was captured from\n");
        return record_error(cudaErrorNotSupported);
    }
    for (size_t i = 0; i < e->nodes.size(); ++i) {
        if (!e->nodes[i].run()) {
            std::fprintf(stderr, "cuemu: cudaGraphLaunch: node %zu of %zu (%s) failed\n", i, e->nodes.size(),
                         e->nodes[i].name.c_str());
            return record_error(cudaErrorLaunchFailure);
        }
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete reinterpret_cast<EmuGraphExec*>(exec);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete reinterpret_cast<EmuGraph*>(graph);
    return cudaSuccess;
}
