// Device memory allocated exactly as a memory plan (host/memory_plan.h) says: one exact-size
// cudaMalloc per item, handed out by name.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

#include "host/memory_plan.h"
#include "kernels/cuda_common.h"

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

