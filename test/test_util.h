// Helpers shared by the tests. Tests build under g++ (emu) and nvcc (real GPU), so they move
// data through cudaMemcpy and never touch device pointers from the host.
#pragma once
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <string>
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

// The repository root, for tests that read committed files: tests.cmake sets TRAIN_GPT_ROOT; by
// hand, run from the repository root or set it.
inline std::string repo_root() {
    const char* env = std::getenv("TRAIN_GPT_ROOT");
    const std::string root = env ? env : ".";
    INFO("set TRAIN_GPT_ROOT to the repository root (tests.cmake does); looked in '" << root << "'");
    REQUIRE(std::filesystem::exists(root + "/dev/gpt2_reference.py"));
    return root;
}

// A fresh directory under the system temporary directory, removed with its contents.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        static int count = 0;
        path = std::filesystem::temp_directory_path() /
               ("train_gpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return (path / name).string(); }
    // Writes `text` to the file `name` in the directory and returns its path.
    std::string write(const std::string& name, const std::string& text) const {
        const std::string p = file(name);
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }
};

// Same size and the same bytes (results that must be bitwise reproducible).
template <typename T> bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The exception message of a call expected to throw std::runtime_error, checked to be one line.
template <typename F> std::string error_of(F&& call) {
    try {
        call();
    } catch (const std::runtime_error& error) {
        const std::string message = error.what();
        CHECK(message.find('\n') == std::string::npos);
        return message;
    }
    FAIL("expected a std::runtime_error");
    return "";
}
