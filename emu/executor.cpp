// The SIMT executor: runs a kernel launch on the CPU.
//
// Blocks are spread over OS threads (CUEMU_THREADS). A block runs on one OS thread and its CUDA
// threads are fibers there; they never migrate. Threads start lazily: a "runner" runs the kernel's
// own loop (cuemu::run_threads, cuda_emu.h), which calls one thread after another on a shared
// stack, the kernel inlined into it where g++ chooses. Only when a thread reaches a barrier or warp
// collective does it get a fiber (its Fiber filled in, that stack its own); a new runner then
// continues on a fresh stack. A thread that never blocks therefore costs a turn of a loop: no
// context switch, no call into the executor, no bookkeeping of its own.
//
// Whenever a fiber must wait, the next one to run is, in this order: a fiber whose barrier has
// completed (released in schedule order), a thread not yet started (in schedule order), or the
// block's scheduler, which then finds the block either finished or deadlocked.
//
// Between two block barriers the schedules also differ in how far one warp may run ahead of the
// others. forward is round robin: lanes released by a warp collective queue behind every fiber
// already released, so the warps move in near lockstep. reverse and random run the released warp
// next (its lanes go to the front of the queue), so one warp reaches the next barrier before the
// others take another step. A race between warps that only a missing barrier would have ordered
// then shows: a reduction scratch rewritten while other warps still read it, a cp.async prefetch
// into a buffer that other warps still read.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <link.h>
#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUEMU_ASAN 1
#else
#define CUEMU_ASAN 0
#endif

// ---------------------------------------------------------------------------------------------
// Context switch (x86-64 System V). Saves the callee-saved registers on the old stack, stores
// its stack pointer, loads the new one and returns into it. Suspending with push + ret and
// starting fibers with a real call keeps the return-address predictor right (see DESIGN.md:
// about 15 ns per switch, against ~30 ns for pop + jmp).
extern "C" void cuemu_switch(void** save_sp, void* new_sp);
extern "C" void cuemu_fiber_start();
asm(R"(
    .text
    .globl cuemu_switch
    .type cuemu_switch, @function
    .p2align 4
cuemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuemu_switch, .-cuemu_switch

    .globl cuemu_fiber_start
    .type cuemu_fiber_start, @function
    .p2align 4
cuemu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cuemu_fiber_start, .-cuemu_fiber_start
)");

namespace cuemu {

// ---------------------------------------------------------------------------------------------
// Settings

namespace {

[[noreturn]] void fatal(const std::string& msg) {
    std::fprintf(stderr, "cuemu: %s\n", msg.c_str());
    std::exit(EXIT_FAILURE);
}

struct Settings {
    Schedule schedule = Schedule::forward;
    uint64_t seed = 0;
    bool check = false;
    int threads = 1;
};

Settings& settings() {
    static Settings s = [] {
        Settings s;
        if (const char* v = std::getenv("CUEMU_SCHEDULE")) {
            std::string o = v;
            if (o == "forward") s.schedule = Schedule::forward;
            else if (o == "reverse") s.schedule = Schedule::reverse;
            else if (o == "random") s.schedule = Schedule::random;
            else fatal("CUEMU_SCHEDULE: expected forward, reverse or random, got '" + o + "'");
        }
        if (const char* v = std::getenv("CUEMU_SEED")) {
            char* end = nullptr;
            s.seed = std::strtoull(v, &end, 0);
            if (end == v || *end != '\0') fatal(std::string("CUEMU_SEED: expected an integer, got '") + v + "'");
        }
        if (const char* v = std::getenv("CUEMU_CHECK")) s.check = std::string(v) != "0" && std::string(v) != "";
        s.threads = int(std::thread::hardware_concurrency());
        if (s.threads < 1) s.threads = 1;
        if (const char* v = std::getenv("CUEMU_THREADS")) {
            char* end = nullptr;
            long n = std::strtol(v, &end, 10);
            if (end == v || *end != '\0' || n < 1 || n > 1024)
                fatal(std::string("CUEMU_THREADS: expected an integer from 1 to 1024, got '") + v + "'");
            s.threads = int(n);
        }
        return s;
    }();
    return s;
}

std::mutex attr_mutex;
std::mutex launch_mutex;  // one launch at a time: the pool serves one launch
std::unordered_map<const void*, size_t>& max_dynamic_shared() {
    static std::unordered_map<const void*, size_t> m;
    return m;
}

}  // namespace

void set_schedule(Schedule s, uint64_t seed) {
    settings().schedule = s;
    settings().seed = seed;
}
Schedule schedule() { return settings().schedule; }
void set_check_mode(bool poison_shared) { settings().check = poison_shared; }
void set_threads(int n) {
    if (n < 1 || n > 1024) fatal("set_threads: expected 1 to 1024 threads, got " + std::to_string(n));
    std::lock_guard<std::mutex> serialize(launch_mutex);
    settings().threads = n;
}
int threads() { return settings().threads; }

void set_max_dynamic_shared(const void* func, size_t bytes) {
    std::lock_guard<std::mutex> lock(attr_mutex);
    max_dynamic_shared()[func] = bytes;
}

static size_t dynamic_shared_limit(const void* func) {
    std::lock_guard<std::mutex> lock(attr_mutex);
    auto it = max_dynamic_shared().find(func);
    return it == max_dynamic_shared().end() ? kDefaultSharedMemPerBlock : it->second;
}

// ---------------------------------------------------------------------------------------------
// Static __shared__ variables live in the TLS section "cuemu_shared" (see cuda_emu.h). Its
// per-thread address follows from the x86-64 TLS layout (variant II: the executable's TLS block
// ends at the thread pointer); a marker variable in the section checks the arithmetic.

extern "C" char __start_cuemu_shared[] __attribute__((weak));
extern "C" char __stop_cuemu_shared[] __attribute__((weak));
__shared__ char cuemu_shared_marker;

namespace {

struct TlsSegment {
    uintptr_t vaddr = 0, memsz = 0, align = 1;
};

TlsSegment executable_tls_segment() {
    TlsSegment seg;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                if (info->dlpi_phdr[i].p_type == PT_TLS) {
                    auto* s = static_cast<TlsSegment*>(out);
                    s->vaddr = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
                    s->memsz = info->dlpi_phdr[i].p_memsz;
                    s->align = info->dlpi_phdr[i].p_align ? info->dlpi_phdr[i].p_align : 1;
                }
            }
            return 1;  // the first object is the executable
        },
        &seg);
    return seg;
}

struct SharedRegion {
    char* begin = nullptr;
    size_t size = 0;
};

SharedRegion this_threads_static_shared() {
    static const TlsSegment seg = executable_tls_segment();
    static bool warned = false;
    if (__start_cuemu_shared == nullptr || seg.memsz == 0) return {};
    uintptr_t tp;
    asm("movq %%fs:0, %0" : "=r"(tp));
    uintptr_t block = tp - (seg.memsz + seg.align - 1) / seg.align * seg.align;
    char* begin = reinterpret_cast<char*>(block + (uintptr_t(__start_cuemu_shared) - seg.vaddr));
    size_t size = size_t(__stop_cuemu_shared - __start_cuemu_shared);
    char* marker = &cuemu_shared_marker;
    if (marker < begin || marker >= begin + size) {
        if (!warned) std::fprintf(stderr, "cuemu: cannot locate static shared memory; it will not be poisoned\n");
        warned = true;
        return {};
    }
    return {begin, size};
}

// ---------------------------------------------------------------------------------------------
// Fiber stacks: reserved lazily (only touched pages cost memory), with a guard page below.

constexpr size_t kStackBytes = 512 * 1024;
constexpr size_t kGuardBytes = 4096;

struct Stack {
    char* base;       // lowest usable address
    size_t size;
    unsigned index;   // staggers stack tops so fibers do not alias in the caches
};

Stack* new_stack(unsigned index) {
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) fatal("cannot map a fiber stack");
    mprotect(p, kGuardBytes, PROT_NONE);
    return new Stack{static_cast<char*>(p) + kGuardBytes, kStackBytes, index};
}

// ---------------------------------------------------------------------------------------------
// Per-block state

enum class FiberState : uint8_t { running, ready, waiting_block, waiting_warp, done };

struct Fiber {  // valid only where epoch is the running block's serial: filled in when it first blocks
    uint64_t epoch = 0;
    void* sp = nullptr;  // saved stack pointer while suspended
    Stack* stack = nullptr;
    uint3 tid;
    unsigned linear;
    FiberState state;
    // what the fiber brought to its barrier or collective, and what it gets back
    WarpOp op;
    unsigned mask;
    int operand, width, block_op;
    uint64_t value, result;
    // warp_exchange: this lane's payload, where its result goes, and the combining instruction
    const void* exchange_in;
    void* exchange_out;
    WarpExchangeFn exchange_fn;
    const char* exchange_name;
};

struct WarpGroup {  // lanes waiting at one warp collective, keyed by member mask
    unsigned mask, arrived;
    WarpOp op;
    WarpExchangeFn exchange_fn;  // op == exchange: the instruction all lanes must agree on
    const char* exchange_name;
};

struct Warp {
    unsigned existing;  // lanes that exist in this (possibly partial) warp
    std::vector<WarpGroup> groups;
};

struct Worker {
    std::vector<Stack*> free_stacks;
    unsigned stacks_made = 0;
    Stack* release_pending = nullptr;  // stack to return to the pool once we are off it
    void* scheduler_sp = nullptr;
    Stack* scheduler_stack = nullptr;  // null: the OS thread's own stack
#if CUEMU_ASAN
    const void* os_stack_bottom = nullptr;
    size_t os_stack_size = 0;
#endif

    // the block being run
    const KernelLaunch* launch = nullptr;
    uint3 block_idx{};
    unsigned nthreads() const { return thread_starts.count; }  // of the block (set in begin_block)
    std::vector<Fiber> fibers;
    std::vector<unsigned> order;     // start order of threads (the schedule; thread_starts.order)
    std::vector<unsigned> position;  // its inverse: a thread's place in `order`
    Stack* runner_stack = nullptr;  // the stack of the loop that starts threads now (theirs if they block)
    std::vector<unsigned> ready;  // released fibers: ready[ready_head..] runs in order
    std::vector<unsigned> released;  // a completed barrier's threads (kept to reuse its memory)
    size_t ready_head = 0;
    unsigned block_arrived = 0;
    unsigned blocked_live = 0;  // threads with a fiber that have not returned
    uint64_t block_serial = 0;  // counts the blocks this worker has run (emu_internal.h)
    std::vector<Warp> warps;
    std::mt19937_64 rng;
    std::string error;  // first error in this block
    std::vector<unsigned char> dynamic_shared;

    uint64_t started = 0, switches = 0;

    Stack* get_stack() {
        if (!free_stacks.empty()) {
            Stack* s = free_stacks.back();
            free_stacks.pop_back();
            return s;
        }
        return new_stack(stacks_made++);
    }
    void put_stack(Stack* s) {
#if CUEMU_ASAN
        // Frames that never returned (a finished runner's last switch, abandoned fibers) leave their
        // redzones poisoned; the next fiber on this stack would trip over them.
        ASAN_UNPOISON_MEMORY_REGION(s->base, s->size);
#endif
        free_stacks.push_back(s);
    }
    void release_pending_stack() {
        if (release_pending) {
            put_stack(release_pending);
            release_pending = nullptr;
        }
    }
    bool has_ready() const { return ready_head < ready.size(); }
    unsigned pop_ready() {
        unsigned t = ready[ready_head++];
        if (ready_head == ready.size()) {
            ready.clear();
            ready_head = 0;
            thread_starts.ready_waiting = false;
        }
        return t;
    }
};

thread_local Worker* tls_worker = nullptr;

Worker& worker() {
    if (!tls_worker) tls_worker = new Worker;  // one per OS thread, kept for reuse
    return *tls_worker;
}

std::string dim_str(dim3 d) {
    return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}
std::string dim_str(uint3 d) { return dim_str(dim3(d.x, d.y, d.z)); }

void block_error(Worker& w, const std::string& what) {
    if (!w.error.empty()) return;
    w.error = "kernel " + std::string(w.launch->name) + " grid " + dim_str(w.launch->grid) + " block " +
              dim_str(w.launch->block) + ", in block " + dim_str(w.block_idx) + ": " + what;
}

// ---- switching ----

#if CUEMU_ASAN
void asan_start(void** fake, const void* bottom, size_t size) { __sanitizer_start_switch_fiber(fake, bottom, size); }
void asan_finish(void* fake) {
    const void* bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(fake, &bottom, &size);
    Worker& w = *tls_worker;
    if (!w.os_stack_bottom && w.scheduler_stack == nullptr) {  // first switch away from the OS stack
        w.os_stack_bottom = bottom;
        w.os_stack_size = size;
    }
}
#endif

// Switch from the running context (saving into *save, or discarding it when save is null) to
// the context whose saved stack pointer is sp and which runs on stack `to` (null: OS stack).
void switch_to(Worker& w, void** save, void* sp, const Stack* to) {
    ++w.switches;
#if CUEMU_ASAN
    void* fake = nullptr;
    const void* bottom = to ? to->base : w.os_stack_bottom;
    size_t size = to ? to->size : w.os_stack_size;
    asan_start(save ? &fake : nullptr, bottom, size);
#else
    (void)to;
#endif
    void* discard;
    cuemu_switch(save ? save : &discard, sp);
#if CUEMU_ASAN
    asan_finish(fake);
#endif
    tls_worker->release_pending_stack();
}

void runner(Stack* my_stack);

// A fresh stack prepared so that switching to it starts runner(stack).
void* runner_context(Stack* s) {
    uintptr_t top = uintptr_t(s->base + s->size) - (s->index % 1024) * 64;
    top &= ~uintptr_t(15);
    auto* sp = reinterpret_cast<uintptr_t*>(top);
    // After the six pops and the ret, rsp == top (16-aligned), so the call in cuemu_fiber_start
    // enters runner with rsp % 16 == 8, as the ABI requires.
    *--sp = uintptr_t(&cuemu_fiber_start);           // return address of the first switch
    *--sp = 0;                                       // rbp
    *--sp = 0;                                       // rbx
    *--sp = uintptr_t(s);                            // r12: argument
    *--sp = uintptr_t(&runner);                      // r13: entry
    *--sp = 0;                                       // r14
    *--sp = 0;                                       // r15
    return sp;
}

void set_builtins(const Fiber& f) { threadIdx = f.tid; }

Fiber*& current_slot() { return reinterpret_cast<Fiber*&>(thread_starts.current); }

// The running thread's fiber. A thread the runner started gets it at its first barrier or
// collective: the runner's stack becomes its own, and the threads the runner's loop claimed after
// this one go back to be started (run_threads).
Fiber& current_fiber(Worker& w) {
    if (Fiber* f = current_slot()) return *f;
    const uint3 t = threadIdx;
    const unsigned linear = t.x + w.launch->block.x * (t.y + w.launch->block.y * t.z);
    thread_starts.next = (thread_starts.order ? w.position[linear] : linear) + 1;
    Fiber& f = w.fibers[linear];
    f.epoch = w.block_serial;
    f.linear = linear;
    f.tid = t;
    f.state = FiberState::running;
    f.stack = w.runner_stack;
    ++w.blocked_live;
    current_slot() = &f;
    return f;
}

// Continue with someone else: a released fiber, else a new thread, else the scheduler.
// `save` is where the current context is saved (null: the current context is finished and its
// stack `mine` is returned to the pool once left).
void run_next(Worker& w, void** save, Stack* mine) {
    if (!save) w.release_pending = mine;
    if (w.has_ready()) {
        Fiber& g = w.fibers[w.pop_ready()];
        g.state = FiberState::running;
        current_slot() = &g;
        switch_to(w, save, g.sp, g.stack);
    } else if (thread_starts.next < thread_starts.count) {
        Stack* s = w.get_stack();
        switch_to(w, save, runner_context(s), s);
    } else {
        switch_to(w, save, w.scheduler_sp, w.scheduler_stack);
    }
}

bool end_block_and_begin_next(Worker& w);

// Starts threads one after another on this stack until none is left to start, or until a ready
// fiber should run first. When that leaves the block complete, the launch's next block for this
// OS thread begins here too: a kernel whose threads never block runs all its blocks on this one
// stack, without a switch.
void runner(Stack* my_stack) {
    Worker& w = *tls_worker;
#if CUEMU_ASAN
    asan_finish(nullptr);
#endif
    w.release_pending_stack();
    for (;;) {
        current_slot() = nullptr;
        w.runner_stack = my_stack;
        w.launch->run_threads(w.launch->params);
        const bool complete = !w.has_ready() && thread_starts.next == thread_starts.count && w.blocked_live == 0;
        if (!complete || !end_block_and_begin_next(w)) break;
    }
    run_next(w, nullptr, my_stack);
    __builtin_unreachable();
}

}  // namespace

// A thread that blocked has returned: we are back on the stack it owned, which is free again,
// and the loop that started it may go on with the next thread there.
void thread_returned_after_blocking() {
    Worker& w = *tls_worker;
    Fiber& f = *current_slot();
    f.state = FiberState::done;
    --w.blocked_live;
    w.runner_stack = f.stack;
    current_slot() = nullptr;
}

namespace {

// The current fiber has registered at a barrier; run others until it is released.
void suspend_current(Worker& w) {
    Fiber& f = *current_slot();
    if (f.state == FiberState::ready) {
        // Released by its own arrival. If it is also next in line, just carry on.
        if (w.has_ready() && w.ready[w.ready_head] == f.linear) {
            w.pop_ready();
            f.state = FiberState::running;
            return;
        }
    }
    run_next(w, &f.sp, f.stack);
    current_slot() = &f;
    set_builtins(f);
}

// Queues released fibers in schedule order: behind the fibers already released, or (run_first)
// ahead of them, to run next.
void release_in_schedule_order(Worker& w, unsigned* ids, size_t count, bool run_first = false) {
    unsigned* const end = ids + count;
    switch (settings().schedule) {
        case Schedule::forward: break;
        case Schedule::reverse: std::reverse(ids, end); break;
        case Schedule::random: std::shuffle(ids, end, w.rng); break;
    }
    for (unsigned* t = ids; t != end; ++t) w.fibers[*t].state = FiberState::ready;
    if (count > 0) thread_starts.ready_waiting = true;
    if (!run_first) {
        w.ready.insert(w.ready.end(), ids, end);
    } else if (w.ready_head >= count) {  // into the slots already run: no element moves
        w.ready_head -= count;
        std::copy(ids, end, w.ready.begin() + std::ptrdiff_t(w.ready_head));
    } else {
        w.ready.insert(w.ready.begin() + std::ptrdiff_t(w.ready_head), ids, end);
    }
}

// ---- warp collectives: the semantics of PTX shfl.sync / vote.sync (PTX ISA, "Parallel
// Synchronization and Communication Instructions") ----

unsigned shuffle_source(const Fiber& f, unsigned lane) {
    // CUDA's __shfl*_sync(width) pass c = ((32 - width) << 8) | clamp, with clamp 0 for shfl.up
    // and 31 otherwise (see the Programming Guide and the PTX shfl.sync description).
    unsigned segmask = unsigned(32 - f.width) & 31u;
    unsigned cval = f.op == WarpOp::shfl_up ? 0u : 31u;
    unsigned max_lane = (lane & segmask) | (cval & ~segmask);
    unsigned min_lane = lane & segmask;
    unsigned b = unsigned(f.operand);
    int j = int(lane);
    bool in_range = false;
    switch (f.op) {
        case WarpOp::shfl_up: j = int(lane) - int(b); in_range = j >= int(max_lane); break;
        case WarpOp::shfl_down: j = int(lane) + int(b); in_range = j <= int(max_lane); break;
        case WarpOp::shfl_xor: j = int(lane ^ b); in_range = j <= int(max_lane); break;
        case WarpOp::shfl_idx: j = int(min_lane | (b & 31u & ~segmask)); in_range = j <= int(max_lane); break;
        default: break;
    }
    if (!in_range) j = int(lane);
    return unsigned(j);
}

void complete_warp_group(Worker& w, unsigned warp, const WarpGroup& g) {
    Fiber* lanes = &w.fibers[warp * 32];
    unsigned members = g.arrived;
    if (g.op == WarpOp::exchange) {  // the instruction combines all payloads at once
        const void* inputs[32] = {};
        void* outputs[32] = {};
        bool agreed = true;  // lanes that came to another instruction (an error already) bring no payload
        for (unsigned l = 0; l < 32; ++l) {
            if (!((members >> l) & 1u)) continue;
            agreed = agreed && lanes[l].op == WarpOp::exchange && lanes[l].exchange_fn == g.exchange_fn;
            inputs[l] = lanes[l].exchange_in, outputs[l] = lanes[l].exchange_out;
        }
        if (const char* problem = agreed ? g.exchange_fn(inputs, outputs, members) : nullptr)
            block_error(w, std::string(g.exchange_name) + " in warp " + std::to_string(warp) + ": " + problem);
    }
    uint64_t ballot = 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((members >> l) & 1u) ballot |= uint64_t(lanes[l].value != 0) << l;
    for (unsigned l = 0; l < 32; ++l) {
        if (!((members >> l) & 1u)) continue;
        Fiber& f = lanes[l];
        switch (g.op) {
            case WarpOp::sync:
            case WarpOp::exchange: f.result = 0; break;
            case WarpOp::ballot: f.result = ballot; break;
            case WarpOp::any: f.result = ballot != 0; break;
            case WarpOp::all: f.result = ballot == (members & 0xffffffffu); break;
            default: {
                unsigned src = shuffle_source(f, l);
                // Reading a lane that is not taking part is undefined in CUDA: give NaN bits.
                f.result = ((members >> src) & 1u) ? lanes[src].value : ~uint64_t(0);
            }
        }
    }
    unsigned ids[32];
    size_t count = 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((members >> l) & 1u) ids[count++] = warp * 32 + l;
    // reverse and random let this warp run ahead of the others (see the top of this file)
    release_in_schedule_order(w, ids, count, settings().schedule != Schedule::forward);
}

const char* op_name(WarpOp op) {
    switch (op) {
        case WarpOp::sync: return "__syncwarp";
        case WarpOp::shfl_idx: return "__shfl_sync";
        case WarpOp::shfl_up: return "__shfl_up_sync";
        case WarpOp::shfl_down: return "__shfl_down_sync";
        case WarpOp::shfl_xor: return "__shfl_xor_sync";
        case WarpOp::ballot: return "__ballot_sync";
        case WarpOp::any: return "__any_sync";
        case WarpOp::all: return "__all_sync";
        case WarpOp::exchange: return "a warp-wide instruction";
    }
    return "?";
}

std::string hex(unsigned v) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", v);
    return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Barriers (called from kernel code)

int block_barrier(int op, int predicate) {
    Worker& w = *tls_worker;
    Fiber& f = current_fiber(w);
    f.state = FiberState::waiting_block;
    f.block_op = op;
    f.value = predicate != 0;
    if (++w.block_arrived == w.nthreads()) {
        uint64_t count = 0;
        for (const Fiber& g : w.fibers) count += g.value;
        uint64_t result = 0;
        switch (op) {
            case 1: result = count; break;
            case 2: result = count == w.nthreads(); break;
            case 3: result = count != 0; break;
            default: break;
        }
        w.block_arrived = 0;
        std::vector<unsigned>& ids = w.released;
        ids.resize(w.nthreads());
        for (unsigned t = 0; t < w.nthreads(); ++t) {
            ids[t] = t;
            w.fibers[t].result = result;
        }
        release_in_schedule_order(w, ids.data(), ids.size());
    }
    suspend_current(w);
    return int(f.result);
}

namespace {

// The calling lane joins the group of its warp that waits with the same member mask; the last
// lane to arrive completes the group. Returns the lane's result once it is released.
uint64_t join_warp_group(Worker& w, Fiber& f, WarpOp op, unsigned mask) {
    unsigned lane = f.linear & 31u, warp = f.linear >> 5;
    f.state = FiberState::waiting_warp;
    f.op = op;
    f.mask = mask;
    Warp& wp = w.warps[warp];
    WarpGroup* g = nullptr;
    for (WarpGroup& cand : wp.groups)
        if (cand.mask == mask) g = &cand;
    if (!g) {
        wp.groups.push_back({mask, 0u, op, f.exchange_fn, f.exchange_name});
        g = &wp.groups.back();
    } else if (g->op != op || (op == WarpOp::exchange && g->exchange_fn != f.exchange_fn)) {
        const std::string here = op == WarpOp::exchange ? f.exchange_name : op_name(op);
        const std::string there = g->op == WarpOp::exchange ? g->exchange_name : op_name(g->op);
        block_error(w, std::string("lanes of warp ") + std::to_string(warp) + " with mask " + hex(mask) + " meet at " +
                           there + " and " + here + " (divergent warp collectives)");
    }
    g->arrived |= 1u << lane;
    unsigned needed = mask & wp.existing;
    if ((g->arrived & needed) == needed) {
        WarpGroup done = *g;
        wp.groups.erase(wp.groups.begin() + (g - wp.groups.data()));
        complete_warp_group(w, warp, done);
    }
    suspend_current(w);
    return f.result;
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int operand, int width) {
    Worker& w = *tls_worker;
    Fiber& f = current_fiber(w);
    unsigned lane = f.linear & 31u;
    if (!((mask >> lane) & 1u))
        block_error(w, std::string(op_name(op)) + " with mask " + hex(mask) + " called by lane " + std::to_string(lane) +
                           ", which is not in the mask (undefined in CUDA)");
    if (width < 1 || width > 32 || (width & (width - 1)) != 0)
        block_error(w, std::string(op_name(op)) + " width " + std::to_string(width) + " is not a power of two in [1, 32]");
    mask |= 1u << lane;
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) width = 32;
    f.value = value;
    f.operand = operand;
    f.width = width;
    f.exchange_fn = nullptr;
    f.exchange_name = nullptr;
    return join_warp_group(w, f, op, mask);
}

// ---- warp_exchange: collectives with payloads of any size (tensor-core instructions) ----

void warp_exchange(unsigned mask, const void* input, void* output, WarpExchangeFn combine, const char* name) {
    Worker& w = *tls_worker;
    Fiber& f = current_fiber(w);
    unsigned lane = f.linear & 31u;
    if (!((mask >> lane) & 1u))
        block_error(w, std::string(name) + " with mask " + hex(mask) + " called by lane " + std::to_string(lane) +
                           ", which is not in the mask");
    f.exchange_in = input;
    f.exchange_out = output;
    f.exchange_fn = combine;
    f.exchange_name = name;
    join_warp_group(w, f, WarpOp::exchange, mask | (1u << lane));
}

uint64_t block_serial() { return tls_worker->block_serial; }

void kernel_error(const std::string& what) { block_error(*tls_worker, what); }

void* dynamic_shared_memory() { return tls_worker->dynamic_shared.data(); }
size_t dynamic_shared_bytes() { return tls_worker->dynamic_shared.size(); }

// ---------------------------------------------------------------------------------------------
// Running one block

namespace {

std::string describe_deadlock(Worker& w) {
    unsigned at_block = 0;
    const unsigned exited = thread_starts.next - w.blocked_live;
    std::string warps;
    for (const Fiber& f : w.fibers)
        if (f.epoch == w.block_serial && f.state == FiberState::waiting_block) ++at_block;
    for (size_t i = 0; i < w.warps.size(); ++i) {
        for (const WarpGroup& g : w.warps[i].groups) {
            unsigned missing = g.mask & w.warps[i].existing & ~g.arrived;
            warps += "; warp " + std::to_string(i) + ": lanes " + hex(g.arrived) + " wait at " + op_name(g.op) +
                     " for lanes " + hex(missing);
        }
    }
    std::string msg = "deadlock: " + std::to_string(at_block) + " of " + std::to_string(w.nthreads()) +
                      " threads wait at __syncthreads, " + std::to_string(exited) + " have exited";
    if (at_block && exited) msg += " (a barrier some threads never reach)";
    return msg + warps;
}

// Sets up block `block_linear` of launch L to run on this OS thread.
void begin_block(Worker& w, const KernelLaunch& L, unsigned block_linear) {
    const dim3 grid = L.grid, block = L.block;
    w.launch = &L;
    ++w.block_serial;
    // From a local: reading back w.block_idx's just-written halves as one wider load would stall
    // store forwarding. A 1D grid needs no division.
    const uint3 idx = grid.y == 1 && grid.z == 1 ? uint3{block_linear, 0, 0}
                                                 : uint3{block_linear % grid.x, (block_linear / grid.x) % grid.y,
                                                         block_linear / (grid.x * grid.y)};
    w.block_idx = idx;
    blockIdx = idx;
    blockDim = block;
    gridDim = grid;
    thread_starts.count = block.x * block.y * block.z;
    // Nothing per thread: a Fiber is filled in only if its thread blocks (current_fiber).
    w.fibers.resize(w.nthreads());
    // The start order: none means 0, 1, 2, ... (forward), so the common case builds no table.
    const Settings& s = settings();
    if (s.schedule != Schedule::forward) {
        w.order.resize(w.nthreads());
        for (unsigned t = 0; t < w.nthreads(); ++t) w.order[t] = t;
        if (s.schedule == Schedule::reverse) std::reverse(w.order.begin(), w.order.end());
        if (s.schedule == Schedule::random) {
            w.rng.seed(s.seed * 0x9E3779B97F4A7C15ull + block_linear);
            std::shuffle(w.order.begin(), w.order.end(), w.rng);
        }
        w.position.resize(w.nthreads());
        for (unsigned i = 0; i < w.nthreads(); ++i) w.position[w.order[i]] = i;
    }
    unsigned nwarps = (w.nthreads() + 31) / 32;
    w.warps.resize(nwarps);
    for (unsigned i = 0; i < nwarps; ++i) {
        unsigned lanes = std::min(32u, w.nthreads() - i * 32);
        w.warps[i].existing = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
        w.warps[i].groups.clear();
    }
    ThreadStarts& starts = thread_starts;
    starts.next = 0;
    starts.order = s.schedule == Schedule::forward ? nullptr : w.order.data();
    starts.ready_waiting = false;
    starts.current = nullptr;
    w.ready.clear();
    w.ready_head = 0;
    w.block_arrived = 0;
    w.blocked_live = 0;

    if (s.check) {
        SharedRegion r = this_threads_static_shared();
        if (r.size) std::memset(r.begin, 0xFF, r.size);
        if (!w.dynamic_shared.empty()) std::memset(w.dynamic_shared.data(), 0xFF, w.dynamic_shared.size());
    }
}

// ---------------------------------------------------------------------------------------------
// Spreading blocks over OS threads

struct Pool {
    std::mutex mutex;
    std::condition_variable wake, finished;
    std::vector<std::thread> threads;
    const KernelLaunch* launch = nullptr;
    size_t nblocks = 0;
    std::atomic<size_t> next_block{0};
    std::atomic<bool> abort{false};
    // Written under `mutex` (so that a waiter cannot miss a change), read without it while spinning.
    std::atomic<unsigned> generation{0}, active{0};
    std::string error;
    uint64_t started = 0, switches = 0;
};

Pool& pool() {
    static Pool* p = new Pool;  // never destroyed: worker threads outlive static destruction
    return *p;
}

std::atomic<uint64_t> total_started{0}, total_switches{0}, total_launches{0};

// Takes the launch's next block for this OS thread and sets it up; false when none is left or
// the launch failed.
bool begin_next_block(Pool& p, Worker& w, const KernelLaunch& L) {
    if (p.abort.load(std::memory_order_relaxed)) return false;
    const size_t b = p.next_block.fetch_add(1, std::memory_order_relaxed);
    if (b >= p.nblocks) return false;
    begin_block(w, L, unsigned(b));
    return true;
}

// The block that ran is over: count its threads; its error, if any, fails the launch.
void end_block(Pool& p, Worker& w) {
    w.started += thread_starts.next;
    if (!w.error.empty()) {
        std::lock_guard<std::mutex> lock(p.mutex);
        if (p.error.empty()) p.error = w.error;
        w.error.clear();
        p.abort = true;
    }
}

// Runs blocks of the current launch until none is left or one fails. The runners go from block
// to block themselves and come back here only then, or when a block cannot go on (deadlock).
void run_blocks(Pool& p, Worker& w, const KernelLaunch& L) {
    uint64_t started0 = w.started, switches0 = w.switches;
    w.dynamic_shared.assign(L.dynamic_smem, 0);  // exact size: ASan sees overruns
    if (begin_next_block(p, w, L)) {
        Stack* first = w.get_stack();
        switch_to(w, &w.scheduler_sp, runner_context(first), first);
        if (w.blocked_live != 0) {  // the last block began did not end: its threads wait for each other
            block_error(w, describe_deadlock(w));
            // Abandon the stuck fibers; their stacks go back to the pool.
            for (Fiber& f : w.fibers)
                if (f.epoch == w.block_serial && (f.state == FiberState::waiting_block || f.state == FiberState::waiting_warp))
                    w.put_stack(f.stack);
            end_block(p, w);
        }
    }
    total_started += w.started - started0;
    total_switches += w.switches - switches0;
}

// Waits up to kSpinWait for done() to hold, giving the core to any other thread that wants it
// meanwhile; false if it still does not. Waking a thread asleep on a condition variable took ~20 us
// a side on these VMs (a futex wake is an interrupt to the other core): a launch of two empty blocks
// on two OS threads cost 47.6 us, 0.7 us with the spin (`make emu-bench`). Kernels follow each other
// within microseconds, so a pool thread that spins a little finds the next launch awake; a GEMM
// between them (its own OpenMP threads) outlasts the spin, and yielding leaves them the core.
constexpr auto kSpinWait = std::chrono::microseconds(50);
template <typename Done> bool spin_until(Done done) {
    const auto give_up = std::chrono::steady_clock::now() + kSpinWait;
    for (int turn = 0;; ++turn) {
        if (done()) return true;
        if (turn % 16 == 15) {
            if (std::chrono::steady_clock::now() > give_up) return false;
            std::this_thread::yield();
        }
    }
}

void worker_thread(Pool& p, unsigned index) {
    unsigned seen = 0;
    for (;;) {
        const auto launched = [&] { return p.generation.load(std::memory_order_acquire) != seen; };
        if (!spin_until(launched)) {
            std::unique_lock<std::mutex> lock(p.mutex);
            p.wake.wait(lock, launched);
        }
        const KernelLaunch* L;
        {
            std::lock_guard<std::mutex> lock(p.mutex);  // pairs with the launch's writes
            seen = p.generation;
            L = p.launch;
        }
        if (index + 1 < unsigned(threads())) run_blocks(p, worker(), *L);  // set_threads may have lowered it
        std::lock_guard<std::mutex> lock(p.mutex);
        if (--p.active == 0) p.finished.notify_all();
    }
}

bool end_block_and_begin_next(Worker& w) {
    Pool& p = pool();
    end_block(p, w);
    return begin_next_block(p, w, *w.launch);
}

}  // namespace

ExecutorStats executor_stats() { return {total_started.load(), total_switches.load(), total_launches.load()}; }

cudaError_t launch_kernel(const KernelLaunch& L) {
    const dim3 g = L.grid, b = L.block;
    uint64_t nthreads = uint64_t(b.x) * b.y * b.z;
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 || nthreads > kMaxThreadsPerBlock ||
        b.x > 1024 || b.y > 1024 || b.z > 64 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        std::fprintf(stderr, "cuemu: kernel %s: invalid launch configuration grid %s block %s\n", L.name,
                     dim_str(g).c_str(), dim_str(b).c_str());
        return record_error(cudaErrorInvalidConfiguration);
    }
    size_t smem_limit = dynamic_shared_limit(L.func);
    if (L.dynamic_smem > smem_limit) {
        std::fprintf(stderr,
                     "cuemu: kernel %s: %zu bytes of dynamic shared memory exceed the limit of %zu "
                     "(raise it with cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, ...))\n",
                     L.name, L.dynamic_smem, smem_limit);
        return record_error(cudaErrorInvalidValue);
    }

    // The launch is valid: it is enqueued (race detection sees its pointer arguments), then runs.
    race::operation(L.name, L.stream, L.pointers, L.pointer_count);

    std::lock_guard<std::mutex> serialize(launch_mutex);
    ++total_launches;
    Pool& p = pool();
    size_t nblocks = size_t(g.x) * g.y * g.z;
    p.launch = &L;
    p.nblocks = nblocks;
    p.next_block = 0;
    p.abort = false;
    p.error.clear();
    unsigned helpers = unsigned(std::min<size_t>(size_t(threads()) - 1, nblocks - 1));
    if (helpers > 0) {
        std::lock_guard<std::mutex> lock(p.mutex);
        while (p.threads.size() < size_t(threads()) - 1)
            p.threads.emplace_back(worker_thread, std::ref(p), unsigned(p.threads.size()));
        // Every pool thread wakes; those beyond `helpers` find no block left and return at once.
        p.active = unsigned(p.threads.size());
        ++p.generation;
        p.wake.notify_all();
    }
    run_blocks(p, worker(), L);
    if (helpers > 0) {
        const auto finished = [&] { return p.active.load(std::memory_order_acquire) == 0; };
        if (!spin_until(finished)) {
            std::unique_lock<std::mutex> lock(p.mutex);
            p.finished.wait(lock, finished);
        }
    }
    if (!p.error.empty()) {
        std::fprintf(stderr, "cuemu: %s\n", p.error.c_str());
        return record_error(cudaErrorLaunchFailure);
    }
    return cudaSuccess;
}

}  // namespace cuemu
