// Shared by the two translation units of test_linkage: one forward + backward pass of a small model,
// with the kernels and functions of whichever unit calls it. Include after train_gpt.cu.
#pragma once

#include <cstdint>
#include <vector>

struct LinkageResult {
    double loss_sum = 0;
    std::vector<float> logits;  // (B, T, Vp) after the forward pass with targets: dlogits, in fact
    std::vector<float> grads;   // every parameter gradient, in buffer order
};

// Defined in test/second_unit_linkage.cu.
LinkageResult run_in_second_unit(const GPT2Config& config, int B, int T, uint64_t seed);

inline LinkageResult run_linkage_model(const GPT2Config& config, int B, int T, uint64_t seed) {
    GPT2 model;
    gpt2_build(model, config, B, T);
    gpt2_init_weights(model, seed);
    std::vector<int> inputs(size_t(B) * T), targets(size_t(B) * T);
    for (size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = int((i * 7 + 3) % size_t(config.vocab_size));
        targets[i] = int((i * 11 + 5) % size_t(config.vocab_size));
    }
    LinkageResult r;
    gpt2_zero_grad(model);
    r.loss_sum = gpt2_forward(model, inputs.data(), targets.data(), B, T, 1.0f / float(B * T));
    gpt2_backward(model);
    auto download = [&](const floatX* device, size_t count) {
        std::vector<floatX> raw(count);
        copy_and_wait(model, raw.data(), device, count * sizeof(floatX), cudaMemcpyDeviceToHost);
        std::vector<float> out(count);
        for (size_t i = 0; i < count; ++i) out[i] = to_float(raw[i]);
        return out;
    };
    r.logits = download(model.acts.logits, size_t(B) * T * config.padded_vocab_size);
    r.grads = download(model.grads_memory, model.num_parameters);
    gpt2_free(model);
    return r;
}
