// Helpers shared by the tests. Tests build under g++ (emu) and nvcc (real GPU), so they move
// data through cudaMemcpy and never touch device pointers from the host.
#pragma once
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cuda_common.h"

// cuBLASLt's epilogues with a BF16 D, as an H100's cuBLAS 13 computes them (measured 2026-11-27 by
// test_cublaslt and test_kernel_matmul): the terms (alpha AB, beta C, the bias) are added as if each
// were first rounded to BF16 (a result near zero after cancellation came out 0 or a multiple of 2^-9:
// aux 0.0039 for 0.0015; a weight gradient accumulated onto a BF16 dweight 0 for -0.0015), and GELU and
// GELU' are evaluated at about BF16 precision (DGELU's product 6.5e-4 off at 6.5e-3, GELU' near its
// zero). So on a GPU a BF16 result may be two more BF16 units of its terms' magnitudes off, and a
// GELU output 2^-6 (four BF16 units) of |x|. The emulator's epilogues work in FP32: no such terms.
constexpr double kBf16EpilogueTermUnits = kEmulatedDevice ? 0.0 : 2 * 0x1p-8;
constexpr double kBf16EpilogueGeluTolerance = 0x1p-6;  // on a GPU

// The exit code of a test executable that cannot run in this configuration: test/tests.cmake gives
// such tests SKIP_RETURN_CODE 77, so CTest reports them skipped, never passed.
constexpr int kSkipReturnCode = 77;

// For the tests of sm_90a instructions (wgmma; their GPU build is sm_90a machine code alone, the line
// "// gpu arch: sm_90a"): on a GPU that is not sm_90 the executable says so and exits skipped. The
// emulator runs them everywhere.
inline void skip_unless_hopper() {
    if (kEmulatedDevice) return;
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9 || prop.minor != 0) {
        std::printf("skipped: wgmma needs sm_90 (this GPU is sm_%d%d)\n", prop.major, prop.minor);
        std::exit(kSkipReturnCode);
    }
}

// Bit patterns, for tests that compare exactly (NaN payloads, signed zeros, rounding).
inline uint32_t float_bits(float x) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
}
inline float float_from_bits(uint32_t b) {
    float x;
    std::memcpy(&x, &b, sizeof(x));
    return x;
}
inline uint16_t bf16_bits(__nv_bfloat16 x) {
    uint16_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
}

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
    // (memcmp must not see the null data() of an empty vector, even for zero bytes)
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
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

// ---------------------------------------------------------------------------------------------
// How far a result is from its reference: the one error measure of every test that compares
// tensors. A NaN or infinity in the result or the reference is an error of +inf, never a small one
// (std::max(err, NaN) keeps err, which once let an all-NaN tensor score 0), and the element that
// decided the error is kept, so a failed CHECK(error <= bound) prints where and what.

struct TensorError {
    double value = 0;  // the error; +inf when an element is not finite
    size_t index = 0;  // the element that decided it
    double got = 0, ref = 0;
};
inline std::ostream& operator<<(std::ostream& os, const TensorError& e) {
    return os << e.value << " (element " << e.index << ": got " << e.got << ", ref " << e.ref << ")";
}
inline bool operator<=(const TensorError& e, double bound) { return e.value <= bound; }
// A running worst ratio in which NaN counts as the worst and stays so: whether `ratio` replaces `worst`
// (`!(ratio <= worst)` alone lets the next finite ratio replace a NaN, so only a NaN last would fail).
inline bool new_worst(double ratio, double worst) { return !std::isnan(worst) && !(ratio <= worst); }
inline bool operator<(const TensorError& e, double bound) { return e.value < bound; }

inline double as_double(double x) { return x; }
inline double as_double(float x) { return x; }
inline double as_double(__nv_bfloat16 x) { return __bfloat162float(x); }

enum class ErrorScale {
    tensor,   // |got - ref| / max |ref| (absolute where the reference is all zero): gradients of
              // different tensors differ by orders of magnitude, and elementwise relative error is
              // meaningless near zero
    element,  // |got - ref| / |ref| per element (losses, norms: values far from zero)
    absolute  // |got - ref|
};

template <typename G, typename R>
TensorError tensor_error(const G* got, const R* ref, size_t n, ErrorScale scale = ErrorScale::tensor) {
    TensorError worst;
    double max_ref = 0;
    for (size_t i = 0; i < n; ++i) {
        const double g = as_double(got[i]), r = as_double(ref[i]);
        if (!std::isfinite(g) || !std::isfinite(r)) return {INFINITY, i, g, r};
        double err = std::fabs(g - r);
        if (scale == ErrorScale::element) err = r != 0 ? err / std::fabs(r) : (err == 0 ? 0 : INFINITY);
        if (err > worst.value || i == 0) worst = {err, i, g, r};
        max_ref = std::max(max_ref, std::fabs(r));
    }
    if (scale == ErrorScale::tensor && max_ref > 0) worst.value /= max_ref;
    return worst;
}
template <typename G, typename R>
TensorError tensor_error(const std::vector<G>& got, const std::vector<R>& ref, ErrorScale scale = ErrorScale::tensor) {
    REQUIRE(got.size() == ref.size());
    return tensor_error(got.data(), ref.data(), ref.size(), scale);
}
// The worse of two errors (for the worst over several tensors), keeping where it was.
inline TensorError worse(const TensorError& a, const TensorError& b) { return b.value > a.value ? b : a; }
