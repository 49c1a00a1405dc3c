// Helpers of the tests that run the whole model against the PyTorch fixtures (test_model.cu,
// test_mpi_train.cu); include after train_gpt.cu.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test/fixture.h"
#include "test_util.h"

constexpr bool kFP32 = std::is_same_v<floatX, float>;

inline std::vector<float> download_as_float(const floatX* device, size_t count) {
    std::vector<floatX> raw(count);
    CUDA_CHECK(cudaMemcpy(raw.data(), device, count * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> out(count);
    for (size_t i = 0; i < count; ++i) out[i] = to_float(raw[i]);
    return out;
}

inline GPT2Config config_of(const FixtureConfig& f) { return {f.maxT, f.V, f.Vp, f.L, f.NH, f.C}; }

// The fixture's parameters (or those under `prefix`, e.g. "final.") into the model, as floatX.
inline void load_parameters(GPT2& model, const Fixture& fx, const std::string& prefix = "") {
    std::vector<floatX> host;
    host.reserve(model.num_parameters);
    for (int i = 0; i < kNumParameterTensors; ++i) {
        const FixtureTensor& t = fx.at(prefix + kParameterNames[i]);
        REQUIRE(t.numel() == model.param_sizes[i]);
        for (float v : t.f32) host.push_back(from_float<floatX>(v));
    }
    copy_and_wait(model, model.params_memory, host.data(), host.size() * sizeof(floatX), cudaMemcpyHostToDevice);
}

// Error relative to the tensor's scale: max |got - ref| / max |ref|. Gradients of different tensors
// differ by orders of magnitude, and elementwise relative error is meaningless near zero.
inline double scaled_error(const float* got, const float* ref, size_t n) {
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < n; ++i) {
        max_err = std::max(max_err, std::fabs(double(got[i]) - ref[i]));
        max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    }
    return max_ref > 0 ? max_err / max_ref : max_err;
}
inline double scaled_error(const std::vector<float>& got, const std::vector<float>& ref) {
    REQUIRE(got.size() == ref.size());
    return scaled_error(got.data(), ref.data(), ref.size());
}
