// A memory plan: every device allocation of a rank, named and grouped, computed before anything is
// allocated. The program allocates exactly the plan (PlannedMemory, host/device_memory.h), and
// --dry-run prints it, so what is printed is what gets allocated. The reports are formatted in
// host/memory_plan.cpp (the host library).
#pragma once

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/config.h"

struct MemoryItem {
    std::string name;
    std::string group;  // params, grads, master, adam_m, adam_v, activations, workspace, communication
    size_t bytes;
};

struct MemoryPlan {
    std::vector<MemoryItem> items;

    void add(const std::string& name, const std::string& group, size_t bytes) { items.push_back({name, group, bytes}); }

    size_t total() const {
        size_t sum = 0;
        for (const MemoryItem& i : items) sum += i.bytes;
        return sum;
    }
    size_t group_bytes(const std::string& group) const {
        size_t sum = 0;
        for (const MemoryItem& i : items)
            if (i.group == group) sum += i.bytes;
        return sum;
    }
    size_t bytes_of(const std::string& name) const {
        for (const MemoryItem& i : items)
            if (i.name == name) return i.bytes;
        throw std::runtime_error("memory plan: no item '" + name + "'");
    }
    static const std::vector<std::string>& groups() {
        static const std::vector<std::string> g = {"params", "grads",      "master",    "adam_m",
                                                   "adam_v", "activations", "workspace", "communication"};
        return g;
    }

    // One line per item, then the total of each group and the grand total, in bytes and GiB.
    std::string table() const;
};

// The largest micro-batch B in [1, 4096] whose plan, `plan_bytes(B)` (growing with B), fits in `bytes`;
// 0 if none: powers of two up, then a binary refinement between the last that fits and twice it.
inline int largest_fitting_batch(const std::function<size_t(int)>& plan_bytes, size_t bytes) {
    int best = 0;
    for (int b = 1; b <= 4096; b *= 2) {
        if (plan_bytes(b) > bytes) break;
        best = b;
    }
    for (int step = best / 2; step >= 1; step /= 2)
        if (plan_bytes(best + step) <= bytes) best += step;
    return best;
}

// The largest micro-batch that fits the budget in each recompute mode.
struct LargestBatches {
    int none = 0, selective = 0, full = 0;
};

// What a rank sends and receives per micro-step inside its tensor group (parallel/tensor.h), and the
// time that takes at `link_bytes_per_second` (none without tensor parallelism).
struct TensorTraffic {
    int all_reduces = 0, all_gathers = 0, reduce_scatters = 0;  // per micro-step, forward and backward
    double bytes_each = 0;          // of one collective's whole (B, T, C) tensor (one all-gather is smaller)
    double bus_bytes_per_rank = 0;  // ring algorithms: (tp - 1) / tp of the tensor per all-gather or
                                    // reduce-scatter, twice that per all-reduce
    double link_bytes_per_second = 0;
    int collectives() const { return all_reduces + all_gathers + reduce_scatters; }
};

// Pipeline parallelism (--pp): each stage's plan (its layers, the micro-batches it keeps in flight under
// the schedule, its bytes) and the schedule played out (host/pipeline_schedule.h).
struct PipelineStagePlan {
    int first_layer = 0, layers = 0, micro_batches_in_flight = 0;
    size_t total_bytes = 0, activation_bytes = 0;
};
struct PipelinePlan {
    std::string schedule;
    int stages = 1, micro_batches = 0, virtual_chunks = 1;
    double bubble_measured = 0, bubble_formula = 0;
    double boundary_bytes = 0;  // one micro-batch's residual stream (or its gradient) between two stages, per tensor rank
    std::vector<PipelineStagePlan> per_stage;
};

// --dry-run's report of a rank's plan for the run `rc`: its table, or with --json one JSON object, and
// the largest micro-batch that fits `budget` bytes in each recompute mode; `attention`: the kernels
// --attention resolved to (their scratch is in the plan); the tensor group's traffic; with --pp every
// stage's plan (`plan` is stage 0's).
std::string dry_run_report(const RunConfig& rc, const MemoryPlan& plan, size_t num_parameters, int world,
                           size_t budget, const LargestBatches& fits, const char* precision, const char* attention,
                           const TensorTraffic& traffic = {}, const PipelinePlan& pipeline = {});
