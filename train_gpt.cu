// train_gpt: GPT-2 pretraining in one CUDA source, built for GPUs (nvcc) and for the CPU (g++ + emu/).
//
// Read top to bottom, this file is the story of a training step: the model's configuration, its
// parameters in one contiguous buffer, the activations a step keeps, the forward pass (embeddings,
// L transformer blocks, the fused classifier), and the backward pass in reverse. The kernels live in
// kernels/, one file per family; host-side modules in host/.
//
// GPT-2 (Radford et al. 2019): learned position embeddings, pre-LayerNorm blocks, causal self-attention,
// GELU (tanh), tied input/output embedding, biases everywhere.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "host/rng.h"
#include "kernels/attention.cuh"
#include "kernels/classifier.cuh"
#include "kernels/common.cuh"
#include "kernels/encoder.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"

// ---------------------------------------------------------------------------------------------
// Configuration

struct GPT2Config {
    int max_seq_len;        // maxT: rows of the position embedding
    int vocab_size;         // V: real vocabulary (50257 for GPT-2)
    int padded_vocab_size;  // Vp: V rounded up to a multiple of 128 for fast matmuls (50304)
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
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

// "" when every kernel can run this configuration, else the first constraint it breaks.
inline std::string gpt2_check_config(const GPT2Config& c) {
    auto field = [](const char* name, int value) { return std::string(name) + " = " + std::to_string(value); };
    if (c.num_layers < 1) return "model: " + field("layers", c.num_layers) + " must be at least 1";
    if (c.max_seq_len < 1) return "model: " + field("max_seq_len", c.max_seq_len) + " must be at least 1";
    if (c.vocab_size < 1) return "model: " + field("vocab_size", c.vocab_size) + " must be at least 1";
    if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size % 128 != 0)
        return "model: " + field("padded_vocab_size", c.padded_vocab_size) + " must be a multiple of 128 and >= vocab_size";
    if (c.num_heads < 1 || c.channels % c.num_heads != 0)
        return "model: " + field("channels", c.channels) + " is not divisible by " + field("heads", c.num_heads);
    for (const std::string& message :
         {encoder_requirements(c.channels), layernorm_requirements(c.channels), layernorm_requirements(4 * c.channels),
          matmul_requirements(c.channels, 3 * c.channels), matmul_requirements(c.channels, 4 * c.channels),
          matmul_requirements(4 * c.channels, c.channels), matmul_requirements(c.channels, c.padded_vocab_size),
          attention_requirements(c.channels, c.num_heads),
          classifier_requirements(c.vocab_size, c.padded_vocab_size)}) {
        if (!message.empty()) return message;
    }
    return "";
}

// ---------------------------------------------------------------------------------------------
// Parameters: one contiguous buffer, tensors in llm.c's checkpoint order (so checkpoints interchange),
// weights stored (out, in) like torch.nn.Linear. Gradients mirror the same layout.

constexpr int kNumParameterTensors = 16;
constexpr const char* kParameterNames[kNumParameterTensors] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

struct ParameterTensors {
    floatX* wte;       // (Vp, C) token embedding, also the output head; rows >= V stay zero
    floatX* wpe;       // (maxT, C)
    floatX* ln1w;      // (L, C)
    floatX* ln1b;      // (L, C)
    floatX* qkvw;      // (L, 3C, C)
    floatX* qkvb;      // (L, 3C)
    floatX* attprojw;  // (L, C, C)
    floatX* attprojb;  // (L, C)
    floatX* ln2w;      // (L, C)
    floatX* ln2b;      // (L, C)
    floatX* fcw;       // (L, 4C, C)
    floatX* fcb;       // (L, 4C)
    floatX* fcprojw;   // (L, C, 4C)
    floatX* fcprojb;   // (L, C)
    floatX* lnfw;      // (C)
    floatX* lnfb;      // (C)
    floatX** all() { return &wte; }  // the members above, in order
};
static_assert(sizeof(ParameterTensors) == kNumParameterTensors * sizeof(floatX*));

inline void parameter_sizes(const GPT2Config& c, size_t sizes[kNumParameterTensors]) {
    const size_t C = c.channels, L = c.num_layers;
    const size_t s[kNumParameterTensors] = {size_t(c.padded_vocab_size) * C, size_t(c.max_seq_len) * C,
                                            L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                                            L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    for (int i = 0; i < kNumParameterTensors; ++i) sizes[i] = s[i];
}

// Points the tensors into one buffer.
inline void point_parameters(ParameterTensors* t, floatX* memory, const size_t sizes[kNumParameterTensors]) {
    floatX** ptrs = t->all();
    for (int i = 0; i < kNumParameterTensors; ++i) {
        ptrs[i] = memory;
        memory += sizes[i];
    }
}

// One transformer block's slice of each per-layer tensor (of the parameters, or of the gradients).
struct LayerTensors {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

inline LayerTensors layer_view(const ParameterTensors& t, const GPT2Config& config, int l) {
    const size_t C = config.channels;
    return {t.ln1w + l * C,         t.ln1b + l * C,         t.qkvw + l * 3 * C * C,  t.qkvb + l * 3 * C,
            t.attprojw + l * C * C, t.attprojb + l * C,     t.ln2w + l * C,          t.ln2b + l * C,
            t.fcw + l * 4 * C * C,  t.fcb + l * 4 * C,      t.fcprojw + l * 4 * C * C, t.fcprojb + l * C};
}

// ---------------------------------------------------------------------------------------------
// Activations: what the forward pass keeps for the backward pass, for B sequences of T tokens.
// Per-layer tensors are stored for all L layers, layer-major.

struct ActivationTensors {
    floatX* encoded;    // (B, T, C) token + position embedding: the residual stream entering layer 0
    floatX* ln1;        // (L, B, T, C)
    float* ln1_mean;    // (L, B, T)
    float* ln1_rstd;    // (L, B, T)
    floatX* qkv;        // (L, B, T, 3C)
    floatX* atty;       // (L, B, T, C) attention output, heads concatenated, before the projection
    float* att_lse;     // (L, B, NH, T) softmax logsumexp per query row (flash attention keeps only this)
    floatX* residual2;  // (L, B, T, C) residual stream after the attention branch
    floatX* ln2;        // (L, B, T, C)
    float* ln2_mean;    // (L, B, T)
    float* ln2_rstd;    // (L, B, T)
    floatX* fch;        // (L, B, T, 4C) MLP hidden layer before GELU
    floatX* fch_gelu;   // (L, B, T, 4C) after GELU
    floatX* residual3;  // (L, B, T, C) residual stream after the MLP branch (the next layer's input)
    floatX* lnf;        // (B, T, C) final LayerNorm
    float* lnf_mean;    // (B, T)
    float* lnf_rstd;    // (B, T)
    float* losses;      // (B, T) per-token loss (0 for ignored targets)
    floatX* logits;     // (B, T, Vp); the classifier turns them into dlogits in place
    floatX* branch;     // (B, T, C) output of a projection, before it joins the residual stream
};

// Gradient buffers of the backward pass (besides the parameter gradients).
struct BackwardBuffers {
    floatX* dresidual;  // (B, T, C) gradient of the residual stream, flowing down the layers
    floatX* dbuf_c;     // (B, T, C) gradient of a C-wide activation (lnf, ln2, atty, ln1)
    floatX* dbuf_4c;    // (B, T, 4C) gradient of fch, or of qkv (3C wide)
    float* scratch;     // per-block partial sums of the deterministic reductions
    int* encoder_scratch;
};

struct GPT2 {
    GPT2Config config{};
    size_t param_sizes[kNumParameterTensors]{};
    size_t num_parameters = 0;
    ParameterTensors params{}, grads{};
    floatX* params_memory = nullptr;
    floatX* grads_memory = nullptr;

    int max_batch = 0, max_tokens = 0;  // the activations hold up to max_batch x max_tokens
    ActivationTensors acts{};
    BackwardBuffers bwd{};
    std::vector<void*> allocations;  // activation and backward buffers, freed together
    int* inputs = nullptr;           // (B, T) on the device
    int* targets = nullptr;          // (B, T) on the device
    std::vector<int> inputs_host;    // the encoder's deterministic backward groups positions by token on the host
    int B = 0, T = 0;                // sizes of the last forward pass
    double loss_sum = 0;             // sum of per-token losses of the last forward pass with targets
    int valid_targets = 0;           // targets != -1 in it
    cudaStream_t stream = nullptr;
};

template <typename T> T* device_alloc(GPT2& model, size_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
    model.allocations.push_back(p);
    return static_cast<T*>(p);
}

// Allocates parameters, gradients and activations for batches of up to B x T tokens.
// Exits with a message naming the constraint when the configuration is not supported.
inline void gpt2_build(GPT2& model, const GPT2Config& config, int B, int T) {
    std::string problem = gpt2_check_config(config);
    if (problem.empty() && (T < 1 || T > config.max_seq_len))
        problem = "model: sequence length T = " + std::to_string(T) + " must be in [1, max_seq_len = " +
                  std::to_string(config.max_seq_len) + "]";
    if (problem.empty() && B < 1) problem = "model: batch size B = " + std::to_string(B) + " must be at least 1";
    if (!problem.empty()) {
        std::fprintf(stderr, "%s\n", problem.c_str());
        std::exit(EXIT_FAILURE);
    }
    model.config = config;
    parameter_sizes(config, model.param_sizes);
    model.num_parameters = 0;
    for (size_t s : model.param_sizes) model.num_parameters += s;
    CUDA_CHECK(cudaMalloc(&model.params_memory, model.num_parameters * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc(&model.grads_memory, model.num_parameters * sizeof(floatX)));
    point_parameters(&model.params, model.params_memory, model.param_sizes);
    point_parameters(&model.grads, model.grads_memory, model.param_sizes);

    const size_t L = config.num_layers, C = config.channels, NH = config.num_heads, BT = size_t(B) * T;
    ActivationTensors& a = model.acts;
    a.encoded = device_alloc<floatX>(model, BT * C);
    a.ln1 = device_alloc<floatX>(model, L * BT * C);
    a.ln1_mean = device_alloc<float>(model, L * BT);
    a.ln1_rstd = device_alloc<float>(model, L * BT);
    a.qkv = device_alloc<floatX>(model, L * BT * 3 * C);
    a.atty = device_alloc<floatX>(model, L * BT * C);
    a.att_lse = device_alloc<float>(model, L * BT * NH);
    a.residual2 = device_alloc<floatX>(model, L * BT * C);
    a.ln2 = device_alloc<floatX>(model, L * BT * C);
    a.ln2_mean = device_alloc<float>(model, L * BT);
    a.ln2_rstd = device_alloc<float>(model, L * BT);
    a.fch = device_alloc<floatX>(model, L * BT * 4 * C);
    a.fch_gelu = device_alloc<floatX>(model, L * BT * 4 * C);
    a.residual3 = device_alloc<floatX>(model, L * BT * C);
    a.lnf = device_alloc<floatX>(model, BT * C);
    a.lnf_mean = device_alloc<float>(model, BT);
    a.lnf_rstd = device_alloc<float>(model, BT);
    a.losses = device_alloc<float>(model, BT);
    a.logits = device_alloc<floatX>(model, BT * config.padded_vocab_size);
    a.branch = device_alloc<floatX>(model, BT * C);

    BackwardBuffers& g = model.bwd;
    g.dresidual = device_alloc<floatX>(model, BT * C);
    g.dbuf_c = device_alloc<floatX>(model, BT * C);
    g.dbuf_4c = device_alloc<floatX>(model, BT * 4 * C);
    const int n = int(BT), c = int(C), vp = config.padded_vocab_size;
    size_t scratch = std::max({layernorm_backward_scratch_floats(n, c), matmul_backward_scratch_floats(n, 3 * c),
                               matmul_backward_scratch_floats(n, 4 * c), matmul_backward_scratch_floats(n, c),
                               matmul_backward_scratch_floats(n, vp),
                               attention_backward_scratch_floats(B, T, config.num_heads)});
    g.scratch = device_alloc<float>(model, std::max<size_t>(scratch, 1));
    g.encoder_scratch = device_alloc<int>(model, encoder_backward_scratch_ints(B, T));

    model.inputs = device_alloc<int>(model, BT);
    model.targets = device_alloc<int>(model, BT);
    model.max_batch = B;
    model.max_tokens = T;
    matmul_init();
}

inline void gpt2_free(GPT2& model) {
    for (void* p : model.allocations) CUDA_CHECK(cudaFree(p));
    model.allocations.clear();
    CUDA_CHECK(cudaFree(model.params_memory));
    CUDA_CHECK(cudaFree(model.grads_memory));
    model.params_memory = model.grads_memory = nullptr;
    matmul_destroy();
}

// GPT-2 initialization (seeded): weights and embeddings N(0, 0.02); the projections that write into the
// residual stream (attprojw, fcprojw) N(0, 0.02 / sqrt(2L)) so the stream's variance does not grow with
// depth; biases 0; LayerNorm weights 1, biases 0; wte rows >= V (vocabulary padding) 0.
inline void gpt2_init_weights(GPT2& model, uint64_t seed) {
    const GPT2Config& c = model.config;
    std::vector<floatX> host(model.num_parameters);
    Rng rng(seed);
    const double residual_std = 0.02 / std::sqrt(2.0 * c.num_layers);
    size_t offset = 0;
    for (int i = 0; i < kNumParameterTensors; ++i) {
        const std::string name = kParameterNames[i];
        const bool is_layernorm_weight = name == "ln1w" || name == "ln2w" || name == "lnfw";
        const bool is_bias = name == "ln1b" || name == "ln2b" || name == "lnfb" || name == "qkvb" ||
                             name == "attprojb" || name == "fcb" || name == "fcprojb";
        const double std_dev = (name == "attprojw" || name == "fcprojw") ? residual_std : 0.02;
        size_t count = model.param_sizes[i];
        if (name == "wte") count = size_t(c.vocab_size) * c.channels;  // padded rows stay zero
        for (size_t j = 0; j < model.param_sizes[i]; ++j) {
            float v = 0.0f;
            if (is_layernorm_weight) v = 1.0f;
            else if (!is_bias && j < count) v = float(rng.normal(0.0, std_dev));
            host[offset + j] = from_float<floatX>(v);
        }
        offset += model.param_sizes[i];
    }
    CUDA_CHECK(cudaMemcpy(model.params_memory, host.data(), host.size() * sizeof(floatX), cudaMemcpyHostToDevice));
}

// ---------------------------------------------------------------------------------------------
// Forward pass. targets may be null (inference: logits only). With targets, the per-token losses are
// computed, and when grad_scale > 0 the classifier also leaves dlogits = grad_scale * dloss/dlogits in
// the logits buffer for the backward pass. grad_scale is 1 / (valid targets of the whole optimizer
// step), known before backward, so the step's loss is a mean over tokens, never a mean of means.
// Returns the sum of the per-token losses (0 without targets).

inline double gpt2_forward(GPT2& model, const int* inputs_host, const int* targets_host, int B, int T,
                           float grad_scale) {
    if (B < 1 || B > model.max_batch || T < 1 || T > model.max_tokens) {
        std::fprintf(stderr, "gpt2_forward: B = %d, T = %d exceed the allocated %d x %d\n", B, T, model.max_batch,
                     model.max_tokens);
        std::exit(EXIT_FAILURE);
    }
    const GPT2Config& cfg = model.config;
    const int L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    const int BT = B * T;
    for (int i = 0; i < BT; ++i) {
        if (inputs_host[i] < 0 || inputs_host[i] >= V) {
            std::fprintf(stderr, "gpt2_forward: input token %d at position %d is outside the vocabulary [0, %d)\n",
                         inputs_host[i], i, V);
            std::exit(EXIT_FAILURE);
        }
        if (targets_host && (targets_host[i] < -1 || targets_host[i] >= V)) {
            std::fprintf(stderr, "gpt2_forward: target %d at position %d is neither -1 nor in [0, %d)\n", targets_host[i],
                         i, V);
            std::exit(EXIT_FAILURE);
        }
    }
    model.B = B;
    model.T = T;
    model.inputs_host.assign(inputs_host, inputs_host + BT);
    cudaStream_t stream = model.stream;
    CUDA_CHECK(cudaMemcpyAsync(model.inputs, inputs_host, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets_host)
        CUDA_CHECK(cudaMemcpyAsync(model.targets, targets_host, BT * sizeof(int), cudaMemcpyHostToDevice, stream));

    ParameterTensors& p = model.params;
    ActivationTensors& a = model.acts;
    const size_t btc = size_t(BT) * C;

    // Embeddings, then the first LayerNorm; later LayerNorms are fused with the residual add before them.
    encoder_forward(a.encoded, model.inputs, p.wte, p.wpe, B, T, C, stream);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, BT, C, stream);

    for (int l = 0; l < L; ++l) {
        const LayerTensors w = layer_view(p, cfg, l);
        const floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        floatX* ln1 = a.ln1 + l * btc;
        floatX* qkv = a.qkv + l * 3 * btc;
        floatX* atty = a.atty + l * btc;
        floatX* residual2 = a.residual2 + l * btc;
        floatX* ln2 = a.ln2 + l * btc;
        floatX* fch = a.fch + l * 4 * btc;
        floatX* fch_gelu = a.fch_gelu + l * 4 * btc;
        floatX* residual3 = a.residual3 + l * btc;

        // Attention branch: x + attproj(attention(ln1(x)))
        matmul_forward(qkv, ln1, w.qkvw, w.qkvb, BT, C, 3 * C, stream);
        attention_forward(atty, a.att_lse + size_t(l) * BT * NH, qkv, B, T, C, NH, stream);
        matmul_forward(a.branch, atty, w.attprojw, w.attprojb, BT, C, C, stream);
        fused_residual_layernorm_forward(residual2, ln2, a.ln2_mean + size_t(l) * BT, a.ln2_rstd + size_t(l) * BT,
                                         residual, a.branch, w.ln2w, w.ln2b, BT, C, stream);
        // MLP branch: x + fcproj(gelu(fc(ln2(x)))), GELU fused into the first matmul's epilogue
        matmul_forward(fch_gelu, ln2, w.fcw, w.fcb, BT, C, 4 * C, stream, fch);
        matmul_forward(a.branch, fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * C, C, stream);
        // The residual add, fused with the next LayerNorm: the next layer's ln1, or the final one
        if (l + 1 < L) {
            const LayerTensors next = layer_view(p, cfg, l + 1);
            fused_residual_layernorm_forward(residual3, a.ln1 + (l + 1) * btc, a.ln1_mean + size_t(l + 1) * BT,
                                             a.ln1_rstd + size_t(l + 1) * BT, residual2, a.branch, next.ln1w,
                                             next.ln1b, BT, C, stream);
        } else {
            fused_residual_layernorm_forward(residual3, a.lnf, a.lnf_mean, a.lnf_rstd, residual2, a.branch, p.lnfw,
                                             p.lnfb, BT, C, stream);
        }
    }

    // Tied output head: logits = lnf @ wte^T over the padded vocabulary.
    matmul_forward(a.logits, a.lnf, p.wte, nullptr, BT, C, Vp, stream);
    if (!targets_host) return 0.0;

    fused_classifier(a.logits, a.losses, model.targets, grad_scale, BT, V, Vp, grad_scale > 0.0f, stream);
    std::vector<float> losses(BT);
    CUDA_CHECK(cudaMemcpyAsync(losses.data(), a.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double sum = 0.0;  // in position order: deterministic
    int valid = 0;
    for (int i = 0; i < BT; ++i) {
        sum += losses[i];
        valid += targets_host[i] != -1;
    }
    model.loss_sum = sum;
    model.valid_targets = valid;
    return sum;
}

inline void gpt2_zero_grad(GPT2& model) {
    CUDA_CHECK(cudaMemsetAsync(model.grads_memory, 0, model.num_parameters * sizeof(floatX), model.stream));
}

// ---------------------------------------------------------------------------------------------
// Backward pass: the forward pass in reverse. Parameter gradients accumulate (+=) so micro-steps add up;
// the logits buffer already holds dlogits from the forward pass.

inline void gpt2_backward(GPT2& model) {
    const GPT2Config& cfg = model.config;
    const int L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, Vp = cfg.padded_vocab_size;
    const int B = model.B, T = model.T, BT = B * T;
    const size_t btc = size_t(BT) * C;
    cudaStream_t stream = model.stream;
    ParameterTensors& p = model.params;
    ParameterTensors& g = model.grads;
    ActivationTensors& a = model.acts;
    BackwardBuffers& b = model.bwd;

    // Output head: dlnf = dlogits @ wte, dwte += dlogits^T @ lnf.
    matmul_backward(b.dbuf_c, g.wte, nullptr, b.scratch, a.logits, a.lnf, p.wte, BT, C, Vp, stream);
    // Final LayerNorm: dresidual starts as the gradient of the last layer's output.
    CUDA_CHECK(cudaMemsetAsync(b.dresidual, 0, btc * sizeof(floatX), stream));
    layernorm_backward(b.dresidual, g.lnfw, g.lnfb, b.scratch, b.dbuf_c, a.residual3 + (L - 1) * btc, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, BT, C, stream);

    for (int l = L - 1; l >= 0; --l) {
        const LayerTensors w = layer_view(p, cfg, l), dw = layer_view(g, cfg, l);
        const floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * btc;
        const float* ln1_mean = a.ln1_mean + size_t(l) * BT;
        const float* ln1_rstd = a.ln1_rstd + size_t(l) * BT;
        const float* ln2_mean = a.ln2_mean + size_t(l) * BT;
        const float* ln2_rstd = a.ln2_rstd + size_t(l) * BT;
        // MLP branch. dresidual holds the gradient of residual3; the DGELU epilogue turns the gradient of
        // fch_gelu into the gradient of fch directly.
        matmul_backward(b.dbuf_4c, dw.fcprojw, dw.fcprojb, b.scratch, b.dresidual, a.fch_gelu + l * 4 * btc, w.fcprojw,
                        BT, 4 * C, C, stream, a.fch + l * 4 * btc);
        matmul_backward(b.dbuf_c, dw.fcw, dw.fcb, b.scratch, b.dbuf_4c, a.ln2 + l * btc, w.fcw, BT, C, 4 * C, stream);
        // ln2's gradient joins the residual path: dresidual becomes the gradient of residual2.
        layernorm_backward(b.dresidual, dw.ln2w, dw.ln2b, b.scratch, b.dbuf_c, a.residual2 + l * btc, w.ln2w, ln2_mean,
                           ln2_rstd, BT, C, stream);
        // Attention branch.
        matmul_backward(b.dbuf_c, dw.attprojw, dw.attprojb, b.scratch, b.dresidual, a.atty + l * btc, w.attprojw, BT, C,
                        C, stream);
        attention_backward(b.dbuf_4c, b.scratch, b.dbuf_c, a.qkv + l * 3 * btc, a.atty + l * btc,
                           a.att_lse + size_t(l) * BT * NH, B, T, C, NH, stream);
        matmul_backward(b.dbuf_c, dw.qkvw, dw.qkvb, b.scratch, b.dbuf_4c, a.ln1 + l * btc, w.qkvw, BT, C, 3 * C, stream);
        // ln1's gradient joins too: dresidual becomes the gradient of this layer's input.
        layernorm_backward(b.dresidual, dw.ln1w, dw.ln1b, b.scratch, b.dbuf_c, residual, w.ln1w, ln1_mean, ln1_rstd, BT,
                           C, stream);
    }
    // Embeddings: deterministic, grouped by token on the host.
    encoder_backward(g.wte, g.wpe, b.encoder_scratch, b.dresidual, model.inputs_host.data(), B, T, C, stream);
}

// ---------------------------------------------------------------------------------------------
// main: for now, a smoke run of the model (the optimizer and the training program come next).

#ifndef TRAIN_GPT_NO_MAIN
int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("train_gpt: device %s, precision %s\n", prop.name, kPrecisionName);
    GPT2Config config{64, 512, pad_vocab(512), 2, 4, 64};  // a small GPT-2 for the smoke run
    if (argc > 1 && !gpt2_preset(argv[1], &config)) {
        std::fprintf(stderr, "train_gpt: unknown model '%s' (presets: d12, d24, d36, d48)\n", argv[1]);
        return EXIT_FAILURE;
    }
    const int B = 2, T = std::min(64, config.max_seq_len);
    GPT2 model;
    gpt2_build(model, config, B, T);
    gpt2_init_weights(model, 1337);
    std::printf("model: L=%d C=%d NH=%d V=%d (padded %d) maxT=%d: %zu parameters\n", config.num_layers,
                config.channels, config.num_heads, config.vocab_size, config.padded_vocab_size, config.max_seq_len,
                model.num_parameters);
    std::vector<int> tokens(B * T + 1);
    Rng rng(42);
    for (int& t : tokens) t = int(rng.next_u64() % uint64_t(config.vocab_size));
    gpt2_zero_grad(model);
    double loss_sum = gpt2_forward(model, tokens.data(), tokens.data() + 1, B, T, 1.0f / float(B * T));
    gpt2_backward(model);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("forward + backward on random tokens: loss %.4f (ln V = %.4f)\n", loss_sum / (B * T),
                std::log(double(config.vocab_size)));
    std::printf("train_gpt: the optimizer and training program land with the next issues\n");
    gpt2_free(model);
    return 0;
}
#endif
