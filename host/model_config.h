// A GPT-2 model's shape (what an llm.c checkpoint header records), its presets, and its parameter
// tensors' names and sizes in llm.c's checkpoint order. Every parameter count in the program, and every
// check of a shape's own consistency, comes from here: the model (train_gpt.cu), the checkpoint files
// (host/checkpoint.h) and the memory plan all ask this file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

struct GPT2Config {
    int max_seq_len;        // maxT: rows of the position embedding
    int vocab_size;         // V: real vocabulary (50257 for GPT-2)
    int padded_vocab_size;  // Vp: V rounded up to a multiple of 128 for fast matmuls (50304)
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    bool operator==(const GPT2Config&) const = default;
};

inline int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

// GPT-2 at the depths of the paper: d12 = 124M, d24 = 350M, d36 = 774M, d48 = 1558M.
inline bool gpt2_preset(const std::string& name, GPT2Config* config) {
    struct Preset {
        const char* name;
        int layers, heads, channels;
    };
    const Preset presets[] = {{"d12", 12, 12, 768}, {"d24", 24, 16, 1024}, {"d36", 36, 20, 1280}, {"d48", 48, 25, 1600}};
    for (const Preset& p : presets) {
        if (name == p.name) {
            *config = {1024, 50257, pad_vocab(50257), p.layers, p.heads, p.channels};
            return true;
        }
    }
    return false;
}

// Small models for tests and demos (tiny) and for `make train` on a CPU (mini); maxT at least T.
inline bool small_preset(const std::string& name, int T, GPT2Config* config) {
    const int max_seq_len = T > 64 ? T : 64;
    if (name == "tiny") *config = {max_seq_len, 50257, pad_vocab(50257), 2, 4, 64};
    else if (name == "mini") *config = {max_seq_len, 50257, pad_vocab(50257), 4, 4, 128};
    else return false;
    return true;
}

// "" when the shape is consistent (every size positive, Vp >= V, C divisible by NH), else the first
// field that is not, named with its value. What the kernels need besides: gpt2_check_config.
inline std::string shape_problem(const GPT2Config& c) {
    const std::pair<const char*, int> sizes[] = {{"max_seq_len", c.max_seq_len}, {"vocab_size", c.vocab_size},
                                                 {"num_layers", c.num_layers},   {"num_heads", c.num_heads},
                                                 {"channels", c.channels},       {"padded_vocab_size", c.padded_vocab_size}};
    for (const auto& [name, value] : sizes)
        if (value <= 0) return std::string(name) + " " + std::to_string(value) + " must be positive";
    if (c.padded_vocab_size < c.vocab_size)
        return "padded_vocab_size " + std::to_string(c.padded_vocab_size) + " is below vocab_size " +
               std::to_string(c.vocab_size);
    if (c.channels % c.num_heads != 0)
        return "channels " + std::to_string(c.channels) + " is not a multiple of num_heads " + std::to_string(c.num_heads);
    return "";
}

// The parameter tensors, in llm.c's checkpoint order; weights stored (out, in) like torch.nn.Linear.
constexpr int kNumParameterTensors = 16;
constexpr const char* kParameterNames[kNumParameterTensors] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// The per-layer tensors (ln1w .. fcprojb) and the global ones (wte, wpe, lnfw, lnfb).
inline bool is_layer_tensor(int tensor) { return tensor >= 2 && tensor <= 13; }

// Sizes of the tensors of a consistent shape (shape_problem() == ""): wte (Vp, C), wpe (maxT, C), per
// layer ln1w, ln1b (C), qkvw (3C, C), qkvb (3C), attprojw (C, C), attprojb (C), ln2w, ln2b (C), fcw
// (4C, C), fcb (4C), fcprojw (C, 4C), fcprojb (C), each times L; lnfw, lnfb (C). Throws
// std::overflow_error when a size or their sum does not fit 64 bits (a shape read from a file).
inline void parameter_sizes(const GPT2Config& c, size_t sizes[kNumParameterTensors]) {
    const auto mul = [](uint64_t a, uint64_t b) {
        uint64_t product;
        if (__builtin_mul_overflow(a, b, &product)) throw std::overflow_error("a parameter tensor's size overflows 64 bits");
        return product;
    };
    const uint64_t C = uint64_t(c.channels), L = uint64_t(c.num_layers);
    const uint64_t s[kNumParameterTensors] = {
        mul(uint64_t(c.padded_vocab_size), C), mul(uint64_t(c.max_seq_len), C),
        mul(L, C), mul(L, C), mul(L, mul(3 * C, C)), mul(L, 3 * C), mul(L, mul(C, C)), mul(L, C),
        mul(L, C), mul(L, C), mul(L, mul(4 * C, C)), mul(L, 4 * C), mul(L, mul(C, 4 * C)), mul(L, C), C, C};
    for (int i = 0; i < kNumParameterTensors; ++i) sizes[i] = size_t(s[i]);
}

// N = Vp*C + maxT*C + L*(12*C*C + 13*C) + 2*C.
inline size_t gpt2_num_parameters(const GPT2Config& c) {
    size_t sizes[kNumParameterTensors], n = 0;
    parameter_sizes(c, sizes);
    for (size_t s : sizes)
        if (__builtin_add_overflow(n, s, &n)) throw std::overflow_error("the parameter count overflows 64 bits");
    return n;
}
