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
