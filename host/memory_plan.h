// A memory plan: every device allocation of a rank, named and grouped, computed before anything is
// allocated. The program allocates exactly the plan (PlannedMemory), and --dry-run prints it, so
// what is printed is what gets allocated.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "host/config.h"
#include "kernels/cuda_common.h"

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
    std::string table() const {
        std::string out;
        char line[256];
        auto gib = [](size_t b) { return double(b) / double(size_t(1) << 30); };
        std::snprintf(line, sizeof line, "%-28s %-14s %16s %10s\n", "item", "group", "bytes", "GiB");
        out += line;
        for (const MemoryItem& i : items) {
            std::snprintf(line, sizeof line, "%-28s %-14s %16zu %10.4f\n", i.name.c_str(), i.group.c_str(), i.bytes,
                          gib(i.bytes));
            out += line;
        }
        out += "\n";
        for (const std::string& g : groups()) {
            std::snprintf(line, sizeof line, "%-28s %-14s %16zu %10.4f\n", ("total " + g).c_str(), "", group_bytes(g),
                          gib(group_bytes(g)));
            out += line;
        }
        std::snprintf(line, sizeof line, "%-28s %-14s %16zu %10.4f\n", "total", "", total(), gib(total()));
        return out + line;
    }

    nlohmann::json bytes_json() const {
        nlohmann::json j;
        for (const std::string& g : groups()) j[g] = group_bytes(g);
        j["total"] = total();
        nlohmann::json items_json = nlohmann::json::object();
        for (const MemoryItem& i : items) items_json[i.name] = i.bytes;
        j["items"] = items_json;
        return j;
    }
};

// Allocates every item of a plan, one exact-size cudaMalloc each, and hands out pointers by name.
class PlannedMemory {
public:
    void allocate(const MemoryPlan& plan) {
        for (const MemoryItem& i : plan.items) {
            void* p = nullptr;
            if (i.bytes > 0) {
                CUDA_CHECK(cudaMalloc(&p, i.bytes));
                label_device_memory(p, i.bytes, i.name.c_str());
            }
            pointers_[i.name] = p;
        }
    }
    void free_all() {
        for (auto& [name, p] : pointers_) CUDA_CHECK(cudaFree(p));
        pointers_.clear();
    }
    template <typename T> T* get(const std::string& name) const {
        auto it = pointers_.find(name);
        if (it == pointers_.end()) throw std::runtime_error("memory plan: nothing allocated for '" + name + "'");
        return static_cast<T*>(it->second);
    }
    bool has(const std::string& name) const { return pointers_.count(name) != 0; }

private:
    std::map<std::string, void*> pointers_;
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

// --dry-run's report of a rank's plan for the run `rc`: its table, or with --json one JSON object, and
// the largest micro-batch that fits `budget` bytes in each recompute mode (`fits`: mode -> B).
inline std::string dry_run_report(const RunConfig& rc, const MemoryPlan& plan, size_t num_parameters, int world,
                                  size_t budget, const nlohmann::json& fits, const char* precision) {
    if (rc.json) {
        const nlohmann::json j = {{"parameters", num_parameters}, {"world_size", world},
                                  {"zero_stage", rc.zero_stage},  {"recompute", rc.recompute},
                                  {"attention", rc.attention},    {"micro_batch", rc.batch_size},
                                  {"seq_len", rc.seq_len},        {"precision", precision},
                                  {"bytes", plan.bytes_json()},   {"memory_budget_bytes", budget},
                                  {"largest_micro_batch", fits}};
        return j.dump(2) + "\n";
    }
    char line[512];
    std::snprintf(line, sizeof line, ", %zu parameters, B=%d T=%d, %d rank(s), ZeRO-%d, recompute %s, %s\n", num_parameters,
                  rc.batch_size, rc.seq_len, world, rc.zero_stage, rc.recompute.c_str(), precision);
    std::string out = "memory plan per rank: " + rc.model + line + plan.table();
    std::snprintf(line, sizeof line, "largest micro-batch within %.2f GiB: none %d, selective %d, full %d\n",
                  double(budget) / double(size_t(1) << 30), fits["none"].get<int>(), fits["selective"].get<int>(),
                  fits["full"].get<int>());
    return out + line;
}
