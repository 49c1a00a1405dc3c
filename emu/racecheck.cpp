// The happens-before race detector (cuda_emu.h, "Race detection"). Work runs synchronously here,
// so nothing ever races on the CPU; this file tracks what the GPU would be allowed to reorder.
//
// Clocks: every stream has a vector clock (one counter per stream); so does the host. Enqueuing an
// operation on stream s joins the host's clock into s's (the host issued it after everything it
// had waited for), applies the legacy default stream's implicit ordering, and ticks s's own
// counter; the operation is stamped (s, tick). Event records copy the stream's clock, stream waits
// join it; synchronizations join into the host's clock. An earlier stamp (t, c) happens before an
// operation on s when s's clock holds at least c for t.
//
// Memory: per device allocation, the bytes are split into pieces (at the boundaries of the ranges
// accessed), each holding the stamp of its last write and the latest read from each stream since.
// A write must come after the last write and all reads; a read after the last write.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cuemu {
namespace {

using Clock = std::vector<uint64_t>;  // index: stream id; missing entries are 0

void join(Clock& into, const Clock& other) {
    if (into.size() < other.size()) into.resize(other.size(), 0);
    for (size_t i = 0; i < other.size(); ++i) into[i] = std::max(into[i], other[i]);
}
uint64_t at(const Clock& c, uint32_t stream) { return stream < c.size() ? c[stream] : 0; }

constexpr uint32_t kLegacy = 0;  // stream id of the legacy default stream (stream 0, cudaStreamLegacy)

struct StreamState {
    enum Kind { legacy, blocking, non_blocking } kind;
    Clock clock;
    bool live = true;
};

// One operation's access to memory, as remembered for later checks.
struct Stamp {
    const char* op = nullptr;  // kernel or API name (static strings)
    uint64_t serial = 0;       // operation number, counted from 1 over the process
    uint32_t stream = 0;
    uint64_t tick = 0;
    size_t begin = 0, end = 0;  // bytes of the allocation it accessed
};

struct Piece {
    bool written = false;
    Stamp last_write;
    std::vector<Stamp> reads;  // since the last write: the latest per stream
};

struct Allocation {
    size_t size = 0;
    std::string label;
    std::map<size_t, std::string> sub_labels;  // begin -> label of [begin, end), end in sub_label_end
    std::map<size_t, size_t> sub_label_end;
    std::set<size_t> cuts;                     // label boundaries: a kernel's pointer reaches the next one
    std::map<size_t, Piece> pieces;            // begin -> piece; they cover [0, size)
};

struct Tracker {
    std::mutex mutex;
    std::vector<StreamState> streams{StreamState{StreamState::legacy, {}, true}};
    std::unordered_map<cudaStream_t, uint32_t> stream_ids;
    std::unordered_map<cudaEvent_t, Clock> events;  // recorded events: the clock they captured
    Clock host;
    std::map<uintptr_t, Allocation> allocations;  // by base address
    uint64_t serial = 0;
    std::vector<std::string> collected;
};
Tracker& tracker() {
    static Tracker* t = new Tracker;  // never destroyed: frees may run during exit
    return *t;
}

Racecheck mode_from_environment() {
    const char* v = std::getenv("CUEMU_RACECHECK");
    if (v == nullptr || std::string(v) == "" || std::string(v) == "0") return Racecheck::off;
    if (std::string(v) == "1") return Racecheck::abort;
    std::fprintf(stderr, "CUEMU_RACECHECK: expected 0 or 1, got '%s'\n", v);
    std::exit(EXIT_FAILURE);
}
std::atomic<int>& mode_storage() {
    static std::atomic<int> mode{int(mode_from_environment())};
    return mode;
}

uint32_t stream_id(Tracker& t, cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy) return kLegacy;
    auto it = t.stream_ids.find(stream);
    if (it != t.stream_ids.end()) return it->second;
    // Not created through cudaStreamCreate*: the per-thread default stream, which (unlike a
    // non-blocking stream) synchronizes with the legacy one.
    const uint32_t id = uint32_t(t.streams.size());
    t.streams.push_back({StreamState::blocking, {}, true});
    t.stream_ids[stream] = id;
    return id;
}

std::string stream_name(const Tracker& t, uint32_t id) {
    if (id == kLegacy) return "the legacy default stream";
    const char* kind = t.streams[id].kind == StreamState::non_blocking ? "non-blocking" : "blocking";
    return "stream #" + std::to_string(id) + " (" + kind + ")";
}

// Enqueues an operation on `id`: the host's clock and the legacy stream's implicit ordering join
// the stream's clock, then its own counter ticks. Returns the tick.
uint64_t enqueue(Tracker& t, uint32_t id) {
    StreamState& s = t.streams[id];
    join(s.clock, t.host);
    if (s.kind == StreamState::legacy) {
        // An operation on the legacy stream waits for all prior work of every blocking stream.
        for (const StreamState& other : t.streams)
            if (other.kind == StreamState::blocking && other.live) join(s.clock, other.clock);
    } else if (s.kind == StreamState::blocking) {
        join(s.clock, t.streams[kLegacy].clock);  // ... and blocking streams wait for the legacy stream
    }
    if (s.clock.size() <= id) s.clock.resize(id + 1, 0);
    return ++s.clock[id];
}

// The allocation holding p, or null (host memory, or memory the emulator did not allocate).
Allocation* find_allocation(Tracker& t, const void* p, uintptr_t* base) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    auto it = t.allocations.upper_bound(address);
    if (it == t.allocations.begin()) return nullptr;
    --it;
    if (address >= it->first + std::max<size_t>(it->second.size, 1)) return nullptr;
    *base = it->first;
    return &it->second;
}

// Splits the piece holding `offset` so that a piece begins there.
void cut_pieces(Allocation& a, size_t offset) {
    if (offset == 0 || offset >= a.size) return;
    auto it = a.pieces.upper_bound(offset);
    --it;
    if (it->first == offset) return;
    a.pieces.emplace(offset, it->second);
}

std::string label_at(const Allocation& a, size_t offset) {
    auto it = a.sub_labels.upper_bound(offset);
    if (it != a.sub_labels.begin()) {
        --it;
        if (offset < a.sub_label_end.at(it->first)) return it->second;
    }
    return "";
}

std::string describe_race(const Tracker& t, uintptr_t base, const Allocation& a, const Stamp& now, bool now_writes,
                          const Stamp& before, bool before_wrote) {
    char buffer[2048];
    const std::string label = a.label.empty() ? "unlabeled" : "\"" + a.label + "\"";
    const std::string sub = label_at(a, now.begin);
    const std::string where = sub.empty() ? "" : ", inside \"" + sub + "\"";
    const bool legacy_involved = now.stream == kLegacy || before.stream == kLegacy;
    const bool non_blocking_involved = t.streams[now.stream].kind == StreamState::non_blocking ||
                                       t.streams[before.stream].kind == StreamState::non_blocking;
    std::snprintf(
        buffer, sizeof buffer,
        "cuemu racecheck: data race on device memory\n"
        "  memory:  allocation 0x%" PRIxPTR " of %zu bytes (%s), bytes [%zu, %zu)%s\n"
        "  now:     %s by %s (operation #%" PRIu64 ") on %s\n"
        "  earlier: %s by %s (operation #%" PRIu64 ") on %s, bytes [%zu, %zu)\n"
        "  why:     nothing orders the earlier operation before this one: no cudaStreamWaitEvent on an event "
        "recorded after it, and the host did not synchronize with its stream (cudaStreamSynchronize, "
        "cudaEventSynchronize, cudaDeviceSynchronize, or a device-to-host cudaMemcpy) before enqueuing this one%s\n",
        base, a.size, label.c_str(), now.begin, now.end, where.c_str(), now_writes ? "written" : "read", now.op,
        now.serial, stream_name(t, now.stream).c_str(), before_wrote ? "written" : "read", before.op, before.serial,
        stream_name(t, before.stream).c_str(), before.begin, before.end,
        legacy_involved && non_blocking_involved
            ? "; the legacy default stream (stream 0, plain cudaMemcpy/cudaMemset) does not wait for a "
              "non-blocking stream, nor it for the legacy stream"
            : "");
    return buffer;
}

// Checks one access of the operation `op` against what each piece it covers remembers, then
// records it; a race is added to `reports` (unless the operation already has one).
void access(Tracker& t, const Stamp& op, const void* p, size_t bytes, bool extends_to_label_end, bool writes,
            std::vector<std::string>& reports) {
    uintptr_t base = 0;
    Allocation* a = find_allocation(t, p, &base);
    if (a == nullptr || a->size == 0) return;
    const size_t begin = reinterpret_cast<uintptr_t>(p) - base;
    size_t end = begin + bytes;
    if (extends_to_label_end) {
        auto cut = a->cuts.upper_bound(begin);
        end = cut == a->cuts.end() ? a->size : *cut;
    }
    end = std::min(end, a->size);
    if (end <= begin) return;
    Stamp now = op;
    now.begin = begin;
    now.end = end;
    const Clock& clock = t.streams[op.stream].clock;
    auto ordered = [&](const Stamp& s) { return s.stream == op.stream || at(clock, s.stream) >= s.tick; };

    cut_pieces(*a, begin);
    cut_pieces(*a, end);
    auto first = a->pieces.find(begin);
    auto last = a->pieces.lower_bound(end);
    // One report per operation: the first unordered last write, else the first unordered read.
    for (auto it = first; it != last && reports.empty(); ++it) {
        const Piece& piece = it->second;
        if (piece.written && !ordered(piece.last_write)) {
            reports.push_back(describe_race(t, base, *a, now, writes, piece.last_write, true));
            break;
        }
        if (writes)
            for (const Stamp& r : piece.reads)
                if (!ordered(r)) {
                    reports.push_back(describe_race(t, base, *a, now, true, r, false));
                    break;
                }
    }
    // Recorded whether or not it raced, so that collecting reports goes on from a consistent state.
    if (writes) {
        // Every covered byte now has the same history: one piece.
        a->pieces.erase(std::next(first), last);
        first->second.written = true;
        first->second.last_write = now;
        first->second.reads.clear();
    } else {
        for (auto it = first; it != last; ++it) {
            std::vector<Stamp>& reads = it->second.reads;
            auto same = std::find_if(reads.begin(), reads.end(), [&](const Stamp& r) { return r.stream == op.stream; });
            if (same != reads.end()) *same = now;
            else reads.push_back(now);
        }
    }
}

void deliver(Tracker& t, std::unique_lock<std::mutex>& lock, std::vector<std::string>& reports) {
    if (reports.empty()) return;
    if (racecheck() == Racecheck::collect) {
        for (std::string& r : reports) t.collected.push_back(std::move(r));
        return;
    }
    lock.unlock();
    std::fflush(stdout);
    std::fputs(reports.front().c_str(), stderr);
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);  // not exit(): atexit handlers would run CUDA calls into the tracker
}

}  // namespace

// ---- the public controls (cuda_emu.h) ----

void set_racecheck(Racecheck mode) {
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (Racecheck(mode_storage().load()) == mode) return;
    // A fresh start: history from before (or from while it was off) would be stale.
    for (auto& [base, a] : t.allocations) a.pieces = {{0, Piece{}}};
    for (StreamState& s : t.streams) s.clock.clear();
    t.events.clear();
    t.host.clear();
    mode_storage() = int(mode);
}

Racecheck racecheck() { return Racecheck(mode_storage().load(std::memory_order_relaxed)); }

std::vector<std::string> take_race_reports() {
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    return std::exchange(t.collected, {});
}

void label_device_memory(const void* p, size_t bytes, const char* label) {
    if (record_only()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    uintptr_t base = 0;
    Allocation* a = find_allocation(t, p, &base);
    if (a == nullptr) return;
    const size_t begin = reinterpret_cast<uintptr_t>(p) - base, end = std::min(a->size, begin + bytes);
    if (begin == 0 && end == a->size) {
        a->label = label;
        return;
    }
    a->sub_labels[begin] = label;
    a->sub_label_end[begin] = end;
    a->cuts.insert(begin);
    a->cuts.insert(end);
}

// ---- hooks of the runtime, executor, cuBLASLt and NCCL (emu_internal.h) ----

bool racecheck_enabled() { return race::enabled(); }

namespace race {

bool enabled() { return racecheck() != Racecheck::off && !record_only(); }

void allocated(const void* p, size_t size) {
    if (record_only()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    Allocation a;
    a.size = size;
    a.pieces[0] = Piece{};
    t.allocations[reinterpret_cast<uintptr_t>(p)] = std::move(a);
}

void freed(const void* p) {
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.allocations.erase(reinterpret_cast<uintptr_t>(p));
}

void stream_created(cudaStream_t stream, unsigned flags) {
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    const uint32_t id = uint32_t(t.streams.size());
    t.streams.push_back(
        {flags & cudaStreamNonBlocking ? StreamState::non_blocking : StreamState::blocking, {}, true});
    t.stream_ids[stream] = id;
}

void stream_destroyed(cudaStream_t stream) {
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.stream_ids.find(stream);
    if (it == t.stream_ids.end()) return;
    t.streams[it->second].live = false;  // its work still completes; its stamps stay meaningful
    t.stream_ids.erase(it);
}

void event_destroyed(cudaEvent_t event) {
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.events.erase(event);
}

void operation(const char* name, cudaStream_t stream, const MemoryAccess* accesses, int count) {
    if (!enabled()) return;
    Tracker& t = tracker();
    std::unique_lock<std::mutex> lock(t.mutex);
    const uint32_t id = stream_id(t, stream);
    Stamp op;
    op.op = name;
    op.serial = ++t.serial;
    op.stream = id;
    op.tick = enqueue(t, id);
    std::vector<std::string> reports;
    for (int i = 0; i < count; ++i) {
        const MemoryAccess& m = accesses[i];
        if (m.address != nullptr) access(t, op, m.address, m.bytes, m.to_label_end, m.writes, reports);
    }
    deliver(t, lock, reports);
}

void host_waits_for_stream(cudaStream_t stream) {
    if (!enabled()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    join(t.host, t.streams[stream_id(t, stream)].clock);
}

void host_waits_for_device() {
    if (!enabled()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const StreamState& s : t.streams) join(t.host, s.clock);
}

void event_recorded(cudaEvent_t event, cudaStream_t stream) {
    if (!enabled()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    const uint32_t id = stream_id(t, stream);
    // A record is enqueued like any work (it joins what the host and the legacy stream order before it).
    enqueue(t, id);
    t.events[event] = t.streams[id].clock;
}

void stream_waits_for_event(cudaStream_t stream, cudaEvent_t event) {
    if (!enabled()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.events.find(event);
    if (it == t.events.end()) return;  // never recorded: the wait is a no-op (CUDA does the same)
    join(t.streams[stream_id(t, stream)].clock, it->second);
}

void host_waits_for_event(cudaEvent_t event) {
    if (!enabled()) return;
    Tracker& t = tracker();
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.events.find(event);
    if (it != t.events.end()) join(t.host, it->second);
}

}  // namespace race
}  // namespace cuemu
