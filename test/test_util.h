// Helpers shared by the tests. Tests build under g++ (emu) and nvcc (real GPU), so they move
// data through cudaMemcpy and never touch device pointers from the host.
#pragma once
#include <catch2/catch.hpp>

#include <vector>

#include "kernels/cuda_common.h"

// A device buffer that frees itself.
template <typename T> struct DeviceBuffer {
    T* ptr = nullptr;
    size_t count = 0;
    explicit DeviceBuffer(size_t n) : count(n) { CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T) + (n == 0))); }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void upload(const std::vector<T>& host) {
        REQUIRE(host.size() == count);
        CUDA_CHECK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> host(count);
        CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    void fill_bytes(int byte) { CUDA_CHECK(cudaMemset(ptr, byte, count * sizeof(T))); }
};
