// A GPT-2 model's shape (what an llm.c checkpoint header records), its presets, its parameter
// tensors' names and sizes in llm.c's checkpoint order, and the options it runs with (recomputation,
// attention kernels). Every parameter count in the program, and every
// check of a shape's own consistency, comes from here: the model (train_gpt.cu), the checkpoint files
// (host/checkpoint.h) and the memory plan all ask this file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "host/config.h"
#include "host/documents.h"

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

// Every preset name, for messages and --help: gpt2_preset's, then small_preset's.
inline constexpr const char* kPresetNames = "d12|d24|d36|d48|tiny|mini";

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

// A preset's shape with --layers, --heads, --channels applied (0 = keep). A model file's shape is its
// own: `checkpoint` names it, and a flag there must be 0 or equal the file's. Throws ConfigError naming
// the flag, or the flags when the shape they make is inconsistent.
inline GPT2Config with_shape_flags(GPT2Config c, int layers, int heads, int channels, const std::string& checkpoint) {
    const struct {
        const char* flag;
        int value;
        int* field;
    } flags[] = {{"layers", layers, &c.num_layers}, {"heads", heads, &c.num_heads}, {"channels", channels, &c.channels}};
    for (const auto& f : flags) {
        if (f.value == 0 || f.value == *f.field) continue;
        if (!checkpoint.empty())
            throw ConfigError("--" + std::string(f.flag) + " " + std::to_string(f.value) + ": the model file '" + checkpoint +
                              "' has " + std::to_string(*f.field) + " (a model file's shape is its own)");
        *f.field = f.value;
    }
    if (const std::string problem = shape_problem(c); !problem.empty())
        throw ConfigError("--layers/--heads/--channels: " + problem);
    return c;
}

// The parameter tensors, in llm.c's checkpoint order; weights stored (out, in) like torch.nn.Linear.
constexpr int kNumParameterTensors = 16;
constexpr const char* kParameterNames[kNumParameterTensors] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// The per-layer tensors (ln1w .. fcprojb) and the global ones (wte, wpe, lnfw, lnfb).
inline bool is_layer_tensor(int tensor) { return tensor >= 2 && tensor <= 13; }

// Decoupled weight decay applies to the weight matrices and the embeddings only, never to biases
// or LayerNorm parameters: the 2-D tensors.
inline bool decays(int tensor) {
    const std::string name = kParameterNames[tensor];
    return name == "wte" || name == "wpe" || name == "qkvw" || name == "attprojw" || name == "fcw" || name == "fcprojw";
}

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

// Activation recomputation (-r): what the forward pass keeps for backward, and what backward rebuilds
// (train_gpt.cu's activation table says which copies each mode keeps).
//  none:      every activation backward reads is kept, for all L layers.
//  selective: the LayerNorm outputs ln1, ln2 and the MLP's hidden layer fch, fch_gelu (10 of the 16
//             B*T*C-sized tensors a layer keeps) live in one layer's buffers (ln1 and ln2 share one);
//             backward rebuilds them layer by layer: ln2 from residual2, fch and fch_gelu with the fc
//             matmul (8*B*T*C^2 FLOPs), ln1 from the layer's input.
//  full:      only each block's input (the residual stream) is kept for all layers; backward reruns
//             the block's forward up to fch_gelu (LayerNorm, qkv matmul, attention, projection,
//             residual + LayerNorm, fc matmul) into one layer's buffers, then ln1 once more when ln2
//             has taken its buffer, and differentiates the block.
// Recomputation reruns the very kernels of the forward pass on the very inputs, so activations, and
// therefore gradients, are bitwise identical in all three modes.

enum class Recompute { none, selective, full };

inline const char* recompute_name(Recompute r) {
    return r == Recompute::none ? "none" : r == Recompute::selective ? "selective" : "full";
}
inline Recompute recompute_of(const std::string& name) {
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
        if (name == recompute_name(r)) return r;
    throw std::runtime_error("-r/--recompute must be one of none|selective|full, got '" + name + "'");
}

// Which flash attention kernels run (--attention): tensor cores (kernels/attention_tc.cuh, BF16 only)
// or CUDA cores (kernels/attention.cuh, both precisions). "auto", the default, takes the tensor cores
// for the BF16 build on a GPU and SIMT otherwise: the FP32 build has no tensor-core kernels, and under
// the CPU emulator (emu/) the tensor-core kernels, with each warp tile product one collective, take no
// less time than the SIMT ones (GPT-2 124M, B=4, T=64, --profile-step: 158-163 against 151-173 ms a
// step; 968 against 249 ms when every mma.sync and ldmatrix was a collective of its own), and SIMT's
// FP32 probabilities keep the program's losses closest to the FP64 references.
enum class Attention { tc, simt };

#ifdef PRECISION_FP32
constexpr bool kBuildHasTensorCoreAttention = false;  // the tensor-core kernels take BF16 operands only
#else
constexpr bool kBuildHasTensorCoreAttention = true;
#endif

inline const char* attention_name(Attention a) { return a == Attention::tc ? "tc" : "simt"; }

// `emulated`: the kernels run in the CPU emulator (kernels/cuda_common.h's kEmulatedDevice).
inline Attention attention_of(const std::string& name, bool emulated) {
    if (name == "tc") return Attention::tc;
    if (name == "simt") return Attention::simt;
    if (name == "auto") return kBuildHasTensorCoreAttention && !emulated ? Attention::tc : Attention::simt;
    throw std::runtime_error("--attention must be one of auto|tc|simt, got '" + name + "'");
}
// The model's default (ModelOptions{}, for tests and tools that build a model themselves): what
// --attention's default takes on a GPU. The program resolves the flag for the device it runs on.
inline const Attention kDefaultAttention = attention_of(RunConfig{}.attention, false);

// How the model runs, beyond its shape: what backward recomputes, which attention kernels, and
// whether documents packed into a row are kept apart (host/documents.h): --doc-mask lets a token
// attend only within its document, --doc-positions restarts the position embedding at each
// document's start. Documents start at the token eot_token (GPT-2's end of text by default).
struct ModelOptions {
    Recompute recompute = Recompute::none;
    Attention attention = kDefaultAttention;
    bool doc_mask = false;
    bool doc_positions = false;
    int eot_token = kGpt2EotToken;
    bool uses_documents() const { return doc_mask || doc_positions; }
    // A model that only runs forward passes (--generate): no gradients, optimizer state or backward
    // buffers, and a key/value cache for one sequence of up to the build's B x T positions.
    bool inference = false;
    bool matmul_autotune = false;  // Matmul::autotune (kernels/matmul.cuh)
    bool fuse_bias_grad = true;    // Matmul::fuse_bias_grad: --bias-grad auto or epilogue
    bool bias_grad_in_output_type = false;  // Matmul::bias_grad_in_output_type: --bias-grad epilogue
    bool fused_attention_backward = false;  // --attention-backward fused (with Attention::tc)
    bool cuda_graphs = false;      // replay each micro-step from a CUDA graph (train_gpt.cu, run_micro_step)
    int tensor_parallel = 1;       // ranks each block's weights and heads are split over (parallel/tensor.h)
    bool sequence_parallel = false;  // with tensor_parallel > 1: LayerNorm/residual rows split over those ranks
    int pipeline_parallel = 1;       // stages the layers are split over (parallel/pipeline.h)
    int pipeline_stage = 0;          // this rank's
    int pipeline_chunks = 1;         // model chunks per rank (the interleaved schedule)
    int micro_batches_in_flight = 1; // forward passes whose backward is still to come: the activations kept
    int context_parallel = 1;        // ranks each sequence is split over (parallel/context.h): the model's
                                     // T is this rank's share, T / context_parallel
    // Whether tokens carry positions other than their row index (kernels/encoder.cuh's token_positions):
    // restarted per document, or their places in the whole sequence under context parallelism.
    bool uses_token_positions() const { return doc_positions || context_parallel > 1; }
    bool first_stage() const { return pipeline_stage == 0; }
    bool last_stage() const { return pipeline_stage == pipeline_parallel - 1; }
};

// The attention kernels a run uses, as its first line and the memory plan print them: "tc", "simt", or
// "tc + fused backward" (--attention-backward fused).
inline std::string attention_kernels_name(const ModelOptions& o) {
    return std::string(attention_name(o.attention)) +
           (o.attention == Attention::tc && o.fused_attention_backward ? " + fused backward" : "");
}
