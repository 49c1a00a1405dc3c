// train_gpt: GPT-2 pretraining in one CUDA source, built for GPUs (nvcc) and for the CPU (g++ + emu/).
//
// Read top to bottom, this file is the story of a training step: the model's configuration, its
// parameters in one contiguous buffer, the activations a step keeps, the forward pass (embeddings,
// L transformer blocks, the fused classifier), and the backward pass in reverse. The kernels live in
// kernels/, one file per family; host-side modules in host/.
//
// GPT-2 (Radford et al. 2019): learned position embeddings, pre-LayerNorm blocks, causal self-attention,
// GELU (tanh), tied input/output embedding, biases everywhere.
//
// Guarded: a test program of several test files in one translation unit (test/test_model_suite.cu)
// includes it once through each of them.
#ifndef TRAIN_GPT_CU
#define TRAIN_GPT_CU

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "host/checkpoint.h"
#include "host/checkpointing.h"
#include "host/config.h"
#include "host/dataloader.h"
#include "host/divergence.h"
#include "host/evaluation.h"
#include "host/matmul_algos.h"
#include "host/generation.h"
#include "host/device_memory.h"
#include "host/memory_plan.h"
#include "host/metrics.h"
#include "host/model_config.h"
#include "host/pipeline_schedule.h"
#include "host/preemption.h"
#include "host/rng.h"
#include "dev/roofline.h"
#include "host/run_identity.h"
#include "host/schedule.h"
#include "host/watchdog.h"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/attention_decode.cuh"
#include "kernels/attention_tc.cuh"
#include "kernels/classifier.cuh"
#include "kernels/common.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/encoder.cuh"
#include "kernels/gelu.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "parallel/process_groups.h"
#include "parallel/context.h"
#include "parallel/pipeline.h"
#include "parallel/tensor.h"
#include "parallel/zero.h"

// ---------------------------------------------------------------------------------------------
// Configuration

// The model's shape, its presets, its parameter tensors' sizes and its options (what backward
// recomputes, which attention kernels run): host/model_config.h, shared with the checkpoint files and
// the flags. Here: what the kernels need of a shape.

// "" when every kernel can run this configuration, else the first constraint it breaks.
inline std::string gpt2_check_config(const GPT2Config& c) {
    if (const std::string problem = shape_problem(c); !problem.empty()) return "model: " + problem;
    if (c.padded_vocab_size % 128 != 0)  // the classifier's and the matmuls' tiles
        return "model: padded_vocab_size " + std::to_string(c.padded_vocab_size) + " is not a multiple of 128";
    for (const std::string& message :
         {encoder_requirements(c.channels), layernorm_requirements(c.channels),
          matmul_requirements(c.channels, 3 * c.channels), matmul_requirements(c.channels, 4 * c.channels),
          matmul_requirements(4 * c.channels, c.channels), matmul_requirements(c.channels, c.padded_vocab_size),
          attention_requirements(c.channels, c.num_heads),
          classifier_requirements(c.vocab_size, c.padded_vocab_size)}) {
        if (!message.empty()) return message;
    }
    return "";
}

// ---------------------------------------------------------------------------------------------
// Parameters: one contiguous buffer, tensors in llm.c's checkpoint order (kParameterNames, sizes from
// host/model_config.h, so checkpoints interchange). Gradients mirror the same layout.

struct ParameterTensors {
    floatX* wte;       // (Vp, C) token embedding, also the output head; rows >= V stay zero. With tensor
                       // parallelism a rank's rows of the vocabulary (parallel/tensor.h, vocab_rows_per_rank)
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

// With tensor parallelism over tp ranks the split tensors hold 1/tp of each layer (parallel/tensor.h).
inline LayerTensors layer_view(const ParameterTensors& t, const GPT2Config& config, int l, int tp) {
    const size_t C = config.channels, Ct = C / size_t(tp);
    return {t.ln1w + l * C,          t.ln1b + l * C,         t.qkvw + l * 3 * Ct * C,  t.qkvb + l * 3 * Ct,
            t.attprojw + l * C * Ct, t.attprojb + l * C,     t.ln2w + l * C,           t.ln2b + l * C,
            t.fcw + l * 4 * Ct * C,  t.fcb + l * 4 * Ct,     t.fcprojw + l * 4 * Ct * C, t.fcprojb + l * C};
}

// ---------------------------------------------------------------------------------------------
// Activations: what the forward pass keeps for the backward pass, for B sequences of T tokens,
// described once. Each row: name, element type, elements of one copy (BT = B*T, C; Vr = the logit
// columns a rank holds, all Vp without tensor parallelism; Ct = C/tp and
// NHt = NH/tp, a tensor rank's channels and heads, parallel/tensor.h; BTs = BT/tp with sequence
// parallelism, else BT: the rows a rank keeps of the LayerNorm and residual regions), and which copies
// are kept. The structs, the memory plan and the bindings to memory all come from these rows.
// Per-layer tensors are stored layer-major: L copies, or one when it is recomputed (see Recompute).

enum class Keep {
    scratch,      // one copy, written and read within one pass (never kept for the backward pass)
    once,         // one copy: not per layer
    every_layer,  // L copies in every mode (the residual stream between blocks)
    unless_full,  // L copies; full recompute rebuilds them, keeping one layer's
    only_none,    // L copies without recompute; selective and full keep one layer's
    shares_ln1,   // L copies without recompute; otherwise it lives in ln1's buffer (ln1 is rebuilt after)
};

// Activations of the whole step (not per layer).
#define GPT2_STEP_ACTIVATIONS(X)                                                                 \
    X(encoded, floatX, BT * C, Keep::once)  /* token + position embedding: enters layer 0 */      \
    X(lnf, floatX, BTs * C, Keep::once)     /* final LayerNorm */                                \
    X(lnf_mean, float, BTs, Keep::once)                                                          \
    X(lnf_rstd, float, BTs, Keep::once)                                                          \
    X(losses, float, BT, Keep::once)        /* per-token loss (0 for ignored targets) */         \
    X(logits, floatX, BT * Vr, Keep::once)  /* the classifier turns them into dlogits in place */ \
    X(branch, floatX, BT * C, Keep::scratch) /* a projection's output, before the residual add */

// Activations of one transformer block.
#define GPT2_LAYER_ACTIVATIONS(X)                                                                \
    X(ln1, floatX, BTs * C, Keep::only_none)                                                     \
    X(ln1_mean, float, BTs, Keep::unless_full)                                                   \
    X(ln1_rstd, float, BTs, Keep::unless_full)                                                   \
    X(qkv, floatX, BT * 3 * Ct, Keep::unless_full)                                               \
    X(atty, floatX, BT * Ct, Keep::unless_full)      /* attention output, heads concatenated */  \
    X(att_lse, float, BT * NHt, Keep::unless_full)   /* softmax logsumexp per query row */       \
    X(residual2, floatX, BTs * C, Keep::unless_full) /* the stream after the attention branch */ \
    X(ln2, floatX, BTs * C, Keep::shares_ln1)                                                    \
    X(ln2_mean, float, BTs, Keep::unless_full)                                                   \
    X(ln2_rstd, float, BTs, Keep::unless_full)                                                   \
    X(fch, floatX, BT * 4 * Ct, Keep::only_none)     /* MLP hidden layer before GELU */          \
    X(fch_gelu, floatX, BT * 4 * Ct, Keep::only_none)                                            \
    X(residual3, floatX, BTs * C, Keep::every_layer) /* after the MLP branch: next layer's input */

#define GPT2_DECLARE_ACTIVATION(name, type, elements, keep) type* name;
struct ActivationTensors {
    GPT2_STEP_ACTIVATIONS(GPT2_DECLARE_ACTIVATION)
    GPT2_LAYER_ACTIVATIONS(GPT2_DECLARE_ACTIVATION)
};
struct LayerActivations {  // one layer's: see layer_activations()
    const floatX* input;   // the residual stream entering the layer: encoded, or layer l-1's residual3
    GPT2_LAYER_ACTIVATIONS(GPT2_DECLARE_ACTIVATION)
};
#undef GPT2_DECLARE_ACTIVATION

// How many copies of an activation a recompute mode keeps (0: none of its own, it shares ln1's).
inline size_t kept_copies(Keep keep, int L, Recompute r) {
    switch (keep) {
        case Keep::scratch: return 1;
        case Keep::once: return 1;
        case Keep::every_layer: return size_t(L);
        case Keep::unless_full: return r == Recompute::full ? 1 : size_t(L);
        case Keep::only_none: return r == Recompute::none ? size_t(L) : 1;
        case Keep::shares_ln1: return r == Recompute::none ? size_t(L) : 0;
    }
    return 0;
}

// Gradient buffers of the backward pass (besides the parameter gradients).
struct BackwardBuffers {
    floatX* dresidual;  // (BTs, C) gradient of the residual stream, flowing down the layers
    floatX* dbuf_c;     // (B, T, C) gradient of a C-wide activation (lnf, ln2, atty, ln1)
    floatX* dbuf_4c;    // (B, T, 4Ct) gradient of fch, or of qkv (3Ct wide)
    float* scratch;     // per-block partial sums of the deterministic reductions
    int* encoder_scratch;  // the encoder backward's grouping of the micro-batch (kernels/encoder.cuh)
    float* grad_scale;     // dloss/dlogits' scale, 1 / (the step's valid targets): on the device, so
                           // that a captured micro-step (CUDA graph) replays for every step
};

// A tensor rank's share of the channels and heads (the whole model's without tensor parallelism), and of
// the rows of a LayerNorm or residual region of `rows` tokens (1/tp of them with sequence parallelism).
inline int tensor_channels(const GPT2Config& c, const ModelOptions& o) { return c.channels / o.tensor_parallel; }
inline int tensor_heads(const GPT2Config& c, const ModelOptions& o) { return c.num_heads / o.tensor_parallel; }
inline size_t sequence_rows(size_t rows, const ModelOptions& o) { return o.sequence_parallel ? rows / o.tensor_parallel : rows; }
// The tensor-core attention backward's kernels (--attention-backward).
inline AttentionTcBackward attention_tc_backward_of(const ModelOptions& o) {
    return o.fused_attention_backward ? AttentionTcBackward::fused : AttentionTcBackward::split;
}
// Where the qkv bias sums' second-level rows start in the backward's scratch: after the attention's, 16-byte aligned.
inline size_t qkv_bias_scratch_offset(const ModelOptions& o, int B, int T, int Ct, int NHt) {
    return (attention_tc_backward_scratch_floats(B, T, Ct, NHt, attention_tc_backward_of(o), true) + 3) / 4 * 4;
}
// Whether the attention backward sums qkv's bias gradient while it writes dqkv (the tensor-core kernels,
// split or fused, kernels/attention_tc.cuh), so the qkv matmul need not read dqkv again for it; the SIMT
// kernels and the context ring leave it to the matmul.
inline bool attention_sums_qkv_bias(const ModelOptions& o) { return o.attention == Attention::tc && o.context_parallel == 1; }
// The attention backward's scratch; with those sums, then the rows bias_grad_add_partials reduces them to.
inline size_t attention_scratch_floats(const ModelOptions& o, int B, int T, int Ct, int NHt) {
    if (o.attention != Attention::tc) return attention_backward_scratch_floats(B, T, NHt);
    if (!attention_sums_qkv_bias(o)) return attention_tc_backward_scratch_floats(B, T, Ct, NHt, attention_tc_backward_of(o));
    return qkv_bias_scratch_offset(o, B, T, Ct, NHt) +
           bias_grad_add_partials_scratch_floats(attention_tc_qkv_bias_chunks(B, T, attention_tc_backward_of(o)), 3 * Ct);
}
// The device ints of a micro-batch's documents: each token's document start, or with --cp and
// --doc-mask each ring step's first visible key of each token (parallel/context.h, context_first_keys).
inline size_t document_ints(int B, int T, const ModelOptions& o) {
    return size_t(B) * T * (o.context_parallel > 1 && o.doc_mask ? size_t(o.context_parallel) : 1);
}

// What one micro-batch keeps from its forward pass to its backward pass. Without pipeline parallelism
// one micro-batch is in flight; a pipeline stage keeps up to ModelOptions::micro_batches_in_flight
// (the schedule's most, host/pipeline_schedule.h), in slots used in turn.
struct MicroBatchSlot {
    ActivationTensors acts{};
    int* inputs = nullptr;           // (B, T) on the device
    int* targets = nullptr;          // (B, T) on the device
    int* doc_start = nullptr;        // (B, T) document starts (--doc-mask, --doc-positions; host/documents.h);
                                     // with --cp and --doc-mask the ring's first keys (cp, B, T): document_ints
    int* token_positions = nullptr;  // (B, T) positions, ModelOptions::uses_token_positions (kernels/encoder.cuh)
    int* encoder_scratch = nullptr;  // the encoder backward's grouping of its tokens (kernels/encoder.cuh)
    EncoderGrouping encoder;         // its sizes (count 0: no backward pass may follow the forward pass)
};

struct GPT2 {
    GPT2Config config{};        // of this rank's layers: the whole model's, or a pipeline stage's (parallel/pipeline.h)
    GPT2Config whole_config{};  // the whole model's (checkpoints, initialization)
    size_t param_sizes[kNumParameterTensors]{};
    size_t param_offsets[kNumParameterTensors]{};
    size_t num_parameters = 0;  // this rank's: its stage's tensors, its slices of them (parallel/pipeline.h)
    ShardLayout shard{};
    ModelOptions options{};
    TensorParallel tensor{};    // the tensor group (size options.tensor_parallel), set before gpt2_build
    PipelineParallel pipeline{};  // the pipeline group (size options.pipeline_parallel), set before gpt2_build
    ContextRing context{};        // the context group (size options.context_parallel), set before gpt2_build
    std::vector<MicroBatchSlot> slots;  // micro-batches in flight; the current one's buffers are below
    int slot = 0;
    StageLayers layers;  // this rank's layers: one range, or one per model chunk (parallel/pipeline.h)
    int chunk = 0;       // the model chunk the current pass runs (interleaved; 0 otherwise)
    floatX* sequence_gathered = nullptr;  // (B, T, C): a region's rows from every rank (sequence parallelism)
    floatX* dresidual_buffers[2] = {nullptr, nullptr};  // bwd.dresidual is one of them (two: pipeline_micro_steps)
    float* classifier_stats = nullptr;    // (tp, B*T, kClassifierStats): the vocabulary-parallel classifier's
    MemoryPlan plan;
    PlannedMemory memory;
    ParameterTensors params{};
    ParameterTensors grads{};  // stages 0-1: the full gradient buffer; stage 2: see layer_grads()
    floatX* params_memory = nullptr;
    floatX* grads_memory = nullptr;  // stage 0-1: all gradients; stage 2: this rank's gradient shard

    int max_batch = 0, max_tokens = 0;  // the activations hold up to max_batch x max_tokens
    ActivationTensors acts{};  // the current micro-batch slot's (select_micro_batch)
    BackwardBuffers bwd{};
    // Stage 2 keeps no full gradient buffer: the backward pass writes a layer's gradients into one of
    // two layer buffers (alternating, so one can be reduced while the next layer is computed) and the
    // global tensors' (wte, wpe, lnf) into their own buffer; each is reduced into the shards.
    floatX* layer_grad_buffers[2] = {nullptr, nullptr};
    size_t layer_grad_size = 0;  // parameters of one transformer block
    int* inputs = nullptr;       // the current micro-batch slot's (MicroBatchSlot)
    int* targets = nullptr;
    int* doc_start = nullptr;
    int* token_positions = nullptr;
    // What each forward pass uploads (token ids, targets, document starts) and the encoder backward's
    // grouping of its tokens, in page-locked host memory, so the copies do not make the host wait.
    // Two slots, used in turn: the host fills one while the device may still copy from the other;
    // `copied` is recorded after a slot's last copy, and the host waits on it only when the device is
    // two forward passes behind.
    struct UploadSlot {
        int* inputs = nullptr;
        int* targets = nullptr;
        int* doc_start = nullptr;        // (B, T): under --cp, as positions in the whole sequence
        int* token_positions = nullptr;
        int* first_keys = nullptr;       // (cp, B, T): --cp with --doc-mask (parallel/context.h)
        int* grouping = nullptr;  // encoder_backward_scratch_ints
        float* grad_scale = nullptr;
        EncoderGrouping encoder;  // made from `inputs` for the backward pass (count 0: not yet)
        cudaEvent_t copied = nullptr;
    };
    UploadSlot uploads[2];
    int upload_slot = 0;  // the slot of the last forward pass
    int B = 0, T = 0;              // sizes of the last forward pass
    int valid_targets = 0;         // targets != -1 in the last forward pass with targets
    cudaStream_t stream = nullptr;
    Matmul matmul;  // the cuBLASLt handle and workspace of this model's matmuls
    // Inference models (ModelOptions::inference): layer l's cached keys and values are (max_tokens, C)
    // at kv_keys/kv_values + l * max_tokens * C (kernels/attention_decode.cuh); positions [0, kv_length) are set.
    floatX* kv_keys = nullptr;
    floatX* kv_values = nullptr;
    int kv_length = 0;
};

// Copies between the host and the model's device buffers on the model's stream, then waits for it.
// The model's kernels run on model.stream, a non-blocking stream (trainer_build): a plain cudaMemcpy
// or cudaMemset runs on the legacy default stream, which neither waits for a non-blocking stream
// nor is waited for by one, so only the model's own stream orders host copies against its kernels.
inline void copy_and_wait(GPT2& model, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    CUDA_CHECK(recorded_copy(dst, src, bytes, kind, model.stream));
    CUDA_CHECK(cudaStreamSynchronize(model.stream));
}

// ---------------------------------------------------------------------------------------------
// Memory plan: every device allocation of a rank, from the model configuration, the micro-batch
// B x T, the sharding, the recompute mode and the precision. gpt2_build allocates exactly this;
// --dry-run prints it.

// Whether a pipeline stage keeps the step activation `name`: the final LayerNorm's and the classifier's
// live on the last stage alone.
inline bool stage_keeps(const char* name, const ModelOptions& o) {
    const std::string n = name;
    return o.last_stage() || !(n == "lnf" || n == "lnf_mean" || n == "lnf_rstd" || n == "losses" || n == "logits");
}

// Whether an activation's copies hold what the backward pass reads of its forward pass (then each
// micro-batch in flight has its own), or are rebuilt or overwritten first (one buffer serves them all).
inline bool kept_for_backward(Keep keep, Recompute r) {
    switch (keep) {
        case Keep::scratch: return false;
        case Keep::once: return true;
        case Keep::every_layer: return true;
        case Keep::unless_full: return r != Recompute::full;
        case Keep::only_none: return r == Recompute::none;
        case Keep::shares_ln1: return r == Recompute::none;
    }
    return true;
}

// One micro-batch's copies of an activation on this stage (kept_copies), and all of them: one set per
// micro-batch in flight of what the backward pass reads.
inline size_t activation_copies(const char* name, Keep keep, int L, const ModelOptions& o) {
    if (!stage_keeps(name, o)) return 0;
    return kept_copies(keep, L, o.recompute) * (kept_for_backward(keep, o.recompute) ? size_t(o.micro_batches_in_flight) : 1);
}

// `whole` is the whole model's configuration; a pipeline stage plans for its own layers and tensors.
inline MemoryPlan gpt2_memory_plan(const GPT2Config& whole, int B, int T, const ShardLayout& shard,
                                   const ModelOptions& options = {}) {
    const GPT2Config c = stage_config(whole, options.pipeline_parallel, options.pipeline_stage, options.pipeline_chunks);
    // Per-layer activations for one model chunk's layers at a time (all the rank's without chunks).
    const int La = stage_layers(whole.num_layers, options.pipeline_parallel, options.pipeline_stage, options.pipeline_chunks).most();
    MemoryPlan plan;
    const size_t X = sizeof(floatX), F = sizeof(float), I = sizeof(int);
    const size_t L = c.num_layers, C = c.channels, BT = size_t(B) * T;
    const size_t Ct = size_t(tensor_channels(c, options)), NHt = size_t(tensor_heads(c, options));
    const size_t BTs = sequence_rows(BT, options);
    const size_t K = size_t(options.micro_batches_in_flight);  // each micro-batch in flight has its own inputs
    size_t sizes[kNumParameterTensors];
    model_part_sizes(whole, options.tensor_parallel, options.pipeline_parallel, options.pipeline_stage, sizes, options.pipeline_chunks);

    size_t layer = 0, global = 0;  // parameters of one block, and of the global tensors
    for (int i = 0; i < kNumParameterTensors; ++i) (is_layer_tensor(i) ? layer : global) += sizes[i];
    if (options.inference) plan.add("params", "params", shard.padded_size * X);
    else plan_sharded_buffers(plan, shard, layer / L, global);

    // Forward activations kept for the backward pass: the table's rows, each for its kept copies.
    const size_t Vr = size_t(vocab_rows_per_rank(c, options.tensor_parallel));
#define GPT2_PLAN_ACTIVATION(name, type, elements, keep)                                      \
    if (const size_t copies = activation_copies(#name, keep, La, options); copies > 0)          \
        plan.add(#name, "activations", copies * (elements) * sizeof(type));
    GPT2_STEP_ACTIVATIONS(GPT2_PLAN_ACTIVATION)
    GPT2_LAYER_ACTIVATIONS(GPT2_PLAN_ACTIVATION)
#undef GPT2_PLAN_ACTIVATION

    if (options.inference) {  // generation: the keys and values of every layer, for BT positions
        plan.add("kv_cache", "activations", 2 * L * BT * C * X);
        plan.add("inputs", "workspace", BT * I);
        if (options.uses_documents()) plan.add("doc_start", "workspace", BT * I);
        if (options.uses_token_positions()) plan.add("token_positions", "workspace", BT * I);
        plan.add("matmul_workspace", "workspace", kMatmulWorkspaceBytes);
        return plan;
    }
    // Backward buffers, scratch of the deterministic reductions, inputs, the cuBLASLt workspace.
    // Two under pipeline parallelism: a stage receives one micro-batch's gradient while it sends another's.
    plan.add("dresidual", "workspace", (options.pipeline_parallel > 1 ? 2 : 1) * BTs * C * X);
    if (options.sequence_parallel) plan.add("sequence_gathered", "communication", BT * C * X);
    plan.add("dbuf_c", "workspace", BT * C * X);
    plan.add("dbuf_4c", "workspace", BT * 4 * Ct * X);
    const int n = int(BT), ci = int(C), ct = int(Ct), vp = int(Vr);
    const size_t scratch = std::max({layernorm_backward_scratch_floats(n, ci, layernorm_sums_residual_bias(ci)),
                                     matmul_backward_scratch_floats(n, 3 * ct),
                                     matmul_backward_scratch_floats(n, 4 * ct), matmul_backward_scratch_floats(n, ci),
                                     matmul_backward_scratch_floats(n, vp),
                                     attention_scratch_floats(options, B, T, int(Ct), int(NHt)),
                                     global_norm_scratch_floats(shard.optimizer_size()),
                                     options.first_stage() ? encoder_backward_partial_floats(B, T, ci) : size_t(0), size_t(1)});
    plan.add("scratch", "workspace", scratch * F);
    if (options.context_parallel > 1) {  // the ring's buffers (parallel/context.h), for the whole sequence of T cp
        const ContextRingSizes ring = context_ring_sizes(B, T * options.context_parallel, int(Ct), int(NHt), options.context_parallel);
        plan.add("context_kv", "communication", 2 * ring.kv * X);
        plan.add("context_dkv", "communication", 2 * ring.kv * F);
        plan.add("context_sum", "workspace", ring.out * F);
        plan.add("context_part_out", "workspace", ring.out * F);
        plan.add("context_part_lse", "workspace", ring.lse * F);
    }
    if (options.tensor_parallel > 1 && options.last_stage())  // the vocabulary-parallel classifier's row statistics, every rank's
        plan.add("classifier_stats", "communication", size_t(options.tensor_parallel) * BT * kClassifierStats * F);
    plan.add("grad_norm", "workspace", (options.tensor_parallel > 1 ? kNumParameterTensors : 1) * F);  // all_ranks_norm
    plan.add("grad_scale", "workspace", F);
    if (options.first_stage())
        plan.add("encoder_scratch", "workspace", K * encoder_backward_scratch_ints(B, T, options.uses_token_positions()) * I);
    plan.add("inputs", "workspace", K * BT * I);
    plan.add("targets", "workspace", K * BT * I);
    if (options.uses_documents()) plan.add("doc_start", "workspace", K * document_ints(B, T, options) * I);
    if (options.uses_token_positions()) plan.add("token_positions", "workspace", K * BT * I);
    plan.add("matmul_workspace", "workspace", kMatmulWorkspaceBytes);
    return plan;
}

// "" when the model can be built for micro-batches of B x T with these options, else the first
// constraint broken (the configuration's, then the batch's, the attention kernels', the ZeRO stage's).
inline std::string gpt2_check_build(const GPT2Config& config, int B, int T, int zero_stage, const ModelOptions& options) {
    std::string problem = gpt2_check_config(config);
    if (problem.empty() && (T < 1 || T > config.max_seq_len))
        problem = "model: sequence length T = " + std::to_string(T) + " must be in [1, max_seq_len = " +
                  std::to_string(config.max_seq_len) + "]";
    if (problem.empty() && B < 1) problem = "model: batch size B = " + std::to_string(B) + " must be at least 1";
    if (problem.empty() && options.tensor_parallel > 1) problem = tensor_parallel_problem(config, options.tensor_parallel);
    if (problem.empty() && options.tensor_parallel > 1)
        problem = classifier_shard_requirements(0, config.vocab_size, vocab_rows_per_rank(config, options.tensor_parallel));
    if (problem.empty() && options.sequence_parallel && (options.tensor_parallel < 2 || T % options.tensor_parallel != 0))
        problem = "--sequence-parallel: the sequence length T = " + std::to_string(T) + " must be a multiple of --tp " +
                  std::to_string(options.tensor_parallel) + " (> 1): each tensor rank keeps 1/tp of the tokens";
    if (problem.empty() && options.tensor_parallel > 1 && options.inference)
        problem = "model: generation (an inference model) runs on one rank, not split over --tp " +
                  std::to_string(options.tensor_parallel);
    if (problem.empty() && options.pipeline_parallel > 1)
        problem = pipeline_split_problem(config, options.pipeline_parallel, options.pipeline_chunks);
    if (problem.empty() && options.pipeline_parallel > 1 && options.inference)
        problem = "model: generation (an inference model) runs on one rank, not split over --pp " +
                  std::to_string(options.pipeline_parallel);
    if (problem.empty() && (options.pipeline_stage < 0 || options.pipeline_stage >= options.pipeline_parallel ||
                            options.micro_batches_in_flight < 1))
        problem = "model: pipeline stage " + std::to_string(options.pipeline_stage) + " of " +
                  std::to_string(options.pipeline_parallel) + " with " + std::to_string(options.micro_batches_in_flight) +
                  " micro-batches in flight";
    if (problem.empty() && options.attention == Attention::tc)
        problem = attention_tc_requirements(B, T, tensor_channels(config, options), tensor_heads(config, options));
    if (problem.empty() && options.fused_attention_backward && options.attention != Attention::tc)
        problem = "--attention-backward fused: the fused backward is a tensor-core kernel and needs --attention tc (auto "
                  "takes simt in the FP32 build and under the CPU emulator)";
    if (problem.empty() && options.fused_attention_backward && options.context_parallel > 1)
        problem = "--attention-backward fused: context parallelism's ring steps run the split kernels over spans; use "
                  "--attention-backward split with --cp";
    if (problem.empty() && options.context_parallel > 1) {  // T is this rank's share (see ModelOptions)
        problem = context_parallel_problem(T * options.context_parallel, options.context_parallel);
        if (problem.empty() && int64_t(T) * options.context_parallel > config.max_seq_len)
            problem = "model: --cp " + std::to_string(options.context_parallel) + " x T = " + std::to_string(T) +
                      " exceeds max_seq_len = " + std::to_string(config.max_seq_len);
        if (problem.empty() && options.inference)
            problem = "model: context parallelism splits training's sequences; an inference model runs on one rank";
    }
    if (problem.empty() && (zero_stage < 0 || zero_stage > 2))
        problem = "model: ZeRO stage " + std::to_string(zero_stage) + " is not one of 0, 1, 2";
    if (problem.empty() && options.uses_documents() && (options.eot_token < 0 || options.eot_token >= config.vocab_size))
        problem = "model: documents (--doc-mask, --doc-positions) start at the end-of-text token " +
                  std::to_string(options.eot_token) + ", outside the vocabulary of " + std::to_string(config.vocab_size);
    return problem;
}

// Names each layer's slice of each per-layer gradient tensor (and each global tensor's gradient) in the
// full gradient buffer. Stages 0-1 reduce layer l's slices on the communication stream while the
// backward pass writes layer l-1's on the compute stream: one buffer, disjoint ranges. The labels let
// the emulator's race detector tell them apart (and name them in its reports); nothing under nvcc.
inline void label_gradient_slices(const GPT2& model) {
    ParameterTensors g = model.grads;
    const size_t L = size_t(model.config.num_layers);
    for (int i = 0; i < kNumParameterTensors; ++i) {
        const std::string name = std::string("grads.") + kParameterNames[i];
        if (model.param_sizes[i] == 0) continue;  // a tensor another pipeline stage holds
        if (!is_layer_tensor(i)) {
            label_device_memory(g.all()[i], model.param_sizes[i] * sizeof(floatX), name.c_str());
            continue;
        }
        const size_t per_layer = model.param_sizes[i] / L;
        for (size_t l = 0; l < L; ++l)
            label_device_memory(g.all()[i] + l * per_layer, per_layer * sizeof(floatX),
                                (name + "[layer " + std::to_string(l) + "]").c_str());
    }
}

// Makes micro-batch slot k the current one: the forward and backward passes use its buffers.
inline void select_micro_batch(GPT2& model, int k) {
    MicroBatchSlot& slot = model.slots.at(size_t(k));
    model.slot = k;
    model.acts = slot.acts;
    model.inputs = slot.inputs;
    model.targets = slot.targets;
    model.doc_start = slot.doc_start;
    model.token_positions = slot.token_positions;
    model.bwd.encoder_scratch = slot.encoder_scratch;
}

// Allocates the plan for batches of up to B x T tokens on `shard` (default: one rank, no sharding).
// Throws a message naming the constraint when the configuration is not supported.
inline void gpt2_build(GPT2& model, const GPT2Config& config, int B, int T, int rank = 0, int world_size = 1,
                       int zero_stage = 0, const ModelOptions& options = {}) {
    if (const std::string problem = gpt2_check_build(config, B, T, zero_stage, options); !problem.empty())
        throw TrainGptError(problem);
    if (model.tensor.size != options.tensor_parallel)
        throw TrainGptError("gpt2_build: the model's tensor group has " + std::to_string(model.tensor.size) +
                            " ranks, its options say " + std::to_string(options.tensor_parallel));
    if (model.pipeline.size != options.pipeline_parallel || model.pipeline.rank != options.pipeline_stage)
        throw TrainGptError("gpt2_build: the model's pipeline group is stage " + std::to_string(model.pipeline.rank) + " of " +
                            std::to_string(model.pipeline.size) + ", its options say " + std::to_string(options.pipeline_stage) +
                            " of " + std::to_string(options.pipeline_parallel));
    model.whole_config = config;
    model.config = stage_config(config, options.pipeline_parallel, options.pipeline_stage, options.pipeline_chunks);
    model.layers = stage_layers(config.num_layers, options.pipeline_parallel, options.pipeline_stage, options.pipeline_chunks);
    model.chunk = 0;
    model_part_sizes(config, options.tensor_parallel, options.pipeline_parallel, options.pipeline_stage, model.param_sizes,
                     options.pipeline_chunks);
    model.num_parameters = 0;
    for (int i = 0; i < kNumParameterTensors; ++i) {
        model.param_offsets[i] = model.num_parameters;
        model.num_parameters += model.param_sizes[i];
    }
    model.shard = shard_layout(model.num_parameters, rank, world_size, zero_stage);
    const Recompute recompute = options.recompute;
    model.options = options;
    model.plan = gpt2_memory_plan(config, B, T, model.shard, options);
    model.memory.allocate(model.plan);
    const PlannedMemory& m = model.memory;

    model.params_memory = m.get<floatX>("params");
    // On the model's stream (see copy_and_wait): its kernels must see the zeros.
    CUDA_CHECK(recorded_memset(model.params_memory, 0, model.plan.bytes_of("params"), model.stream));  // padding stays zero
    point_parameters(&model.params, model.params_memory, model.param_sizes);
    model.max_batch = B;
    model.max_tokens = T;
    model.matmul = matmul_create(m.get<void>("matmul_workspace"));
    const size_t BT = size_t(B) * T, grouping_ints = encoder_backward_scratch_ints(B, T, options.uses_token_positions());
    for (GPT2::UploadSlot& up : model.uploads) {  // page-locked host memory: not in the device plan
        int* block = nullptr;
        const size_t first_keys = options.context_parallel > 1 && options.doc_mask ? document_ints(B, T, options) : 0;
        CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&block), (4 * BT + first_keys + grouping_ints + 1) * sizeof(int)));
        up.inputs = block;
        up.targets = block + BT;
        up.doc_start = block + 2 * BT;
        up.token_positions = block + 3 * BT;
        up.first_keys = first_keys ? block + 4 * BT : nullptr;
        up.grouping = block + 4 * BT + first_keys;
        up.grad_scale = reinterpret_cast<float*>(block + 4 * BT + first_keys + grouping_ints);
        CUDA_CHECK(cudaEventCreateWithFlags(&up.copied, cudaEventDisableTiming));
    }
    model.matmul.autotune = options.matmul_autotune;
    model.matmul.fuse_bias_grad = options.fuse_bias_grad;
    model.matmul.bias_grad_in_output_type = options.bias_grad_in_output_type;
    // Micro-batch slot k's buffers: the k-th of each set of copies the backward pass reads, the one
    // buffer of the others (kept_for_backward).
    const int L = model.layers.most();  // per-layer activations: one chunk's layers
    const size_t C = size_t(model.config.channels), Ct = size_t(tensor_channels(model.config, options));
    const size_t NHt = size_t(tensor_heads(model.config, options)), BTs = sequence_rows(BT, options);
    const size_t Vr = size_t(vocab_rows_per_rank(model.config, options.tensor_parallel));
    model.slots.assign(size_t(options.micro_batches_in_flight), MicroBatchSlot{});
    for (size_t k = 0; k < model.slots.size(); ++k) {
        MicroBatchSlot& slot = model.slots[k];
        ActivationTensors& a = slot.acts;
#define GPT2_BIND_ACTIVATION(name, type, elements, keep)                                                   \
    a.name = activation_copies(#name, keep, L, options) == 0 ? nullptr                                      \
             : m.get<type>(#name) + (kept_for_backward(keep, recompute) ? k * kept_copies(keep, L, recompute) * (elements) : 0);
        GPT2_STEP_ACTIVATIONS(GPT2_BIND_ACTIVATION)
        GPT2_LAYER_ACTIVATIONS(GPT2_BIND_ACTIVATION)
#undef GPT2_BIND_ACTIVATION
        if (recompute != Recompute::none) a.ln2 = a.ln1;  // Keep::shares_ln1
        slot.inputs = m.get<int>("inputs") + k * BT;
        if (!options.inference) slot.targets = m.get<int>("targets") + k * BT;
        if (options.uses_documents()) slot.doc_start = m.get<int>("doc_start") + k * document_ints(B, T, options);
        if (options.uses_token_positions()) slot.token_positions = m.get<int>("token_positions") + k * BT;
        if (!options.inference && options.first_stage())
            slot.encoder_scratch = m.get<int>("encoder_scratch") + k * grouping_ints;
    }
    select_micro_batch(model, 0);
    if (options.inference) {
        model.kv_keys = m.get<floatX>("kv_cache");
        model.kv_values = model.kv_keys + size_t(config.num_layers) * B * T * config.channels;
        model.kv_length = 0;
        return;
    }

    model.grads_memory = m.get<floatX>("grads");
    CUDA_CHECK(recorded_memset(model.grads_memory, 0, model.plan.bytes_of("grads"), model.stream));
    if (zero_stage == 2) {
        model.layer_grad_buffers[0] = m.get<floatX>("grad_layer_buffer_0");
        model.layer_grad_buffers[1] = m.get<floatX>("grad_layer_buffer_1");
        model.layer_grad_size = model.plan.bytes_of("grad_layer_buffer_0") / sizeof(floatX);
        // The global tensors' gradients live in their own buffer; the per-layer pointers are unused.
        floatX* global = m.get<floatX>("grad_global_buffer");
        floatX** g = model.grads.all();
        for (int i = 0; i < kNumParameterTensors; ++i) {
            g[i] = nullptr;
            if (!is_layer_tensor(i)) {
                g[i] = global;
                global += model.param_sizes[i];
            }
        }
    } else {
        point_parameters(&model.grads, model.grads_memory, model.param_sizes);
        label_gradient_slices(model);
    }

    BackwardBuffers& b = model.bwd;
    b.dresidual = m.get<floatX>("dresidual");
    model.dresidual_buffers[0] = b.dresidual;
    model.dresidual_buffers[1] = options.pipeline_parallel > 1 ? b.dresidual + BTs * C : b.dresidual;
    if (options.sequence_parallel) model.sequence_gathered = m.get<floatX>("sequence_gathered");
    if (options.tensor_parallel > 1 && options.last_stage()) model.classifier_stats = m.get<float>("classifier_stats");
    b.dbuf_c = m.get<floatX>("dbuf_c");
    b.dbuf_4c = m.get<floatX>("dbuf_4c");
    b.scratch = m.get<float>("scratch");
    b.grad_scale = m.get<float>("grad_scale");
    if (options.context_parallel > 1) {
        if (model.context.size != options.context_parallel)
            throw TrainGptError("gpt2_build: the model's context group has " + std::to_string(model.context.size) +
                                " ranks, its options say " + std::to_string(options.context_parallel));
        ContextRing& ring = model.context;
        ring.kv[0] = m.get<floatX>("context_kv");
        ring.kv[1] = ring.kv[0] + model.plan.bytes_of("context_kv") / sizeof(floatX) / 2;
        ring.dkv[0] = m.get<float>("context_dkv");
        ring.dkv[1] = ring.dkv[0] + model.plan.bytes_of("context_dkv") / sizeof(float) / 2;
        ring.sum = m.get<float>("context_sum");
        ring.part_out = m.get<float>("context_part_out");
        ring.part_lse = m.get<float>("context_part_lse");
        // One buffer is computed on while the other is written by a transfer: labeled apart for the
        // emulator's race detector (a kernel's pointer is taken to reach the end of its labeled range).
        const size_t kv_bytes = model.plan.bytes_of("context_kv") / 2, dkv_bytes = model.plan.bytes_of("context_dkv") / 2;
        for (int i = 0; i < 2; ++i) {
            label_device_memory(ring.kv[i], kv_bytes, i == 0 ? "context_kv[0]" : "context_kv[1]");
            label_device_memory(ring.dkv[i], dkv_bytes, i == 0 ? "context_dkv[0]" : "context_dkv[1]");
        }
        ring.tensor_cores = options.attention == Attention::tc;  // the kernels of every ring step
        context_ring_start(ring);
    }
    select_micro_batch(model, 0);
}

inline void gpt2_free(GPT2& model) {
    for (GPT2::UploadSlot& up : model.uploads) {
        if (up.copied) CUDA_CHECK(cudaEventSynchronize(up.copied));  // no copy still reads the block
        if (up.inputs) CUDA_CHECK(cudaFreeHost(up.inputs));
        if (up.copied) CUDA_CHECK(cudaEventDestroy(up.copied));
        up = {};
    }
    matmul_destroy(model.matmul);
    context_ring_stop(model.context);
    model.memory.free_all();
    model.params_memory = model.grads_memory = nullptr;
}

// GPT-2 initialization (seeded): weights and embeddings N(0, 0.02); the projections that write into the
// residual stream (attprojw, fcprojw) N(0, 0.02 / sqrt(2L)) so the stream's variance does not grow with
// depth; biases 0; LayerNorm weights 1, biases 0; wte rows >= V (vocabulary padding) 0.
// Under tensor and pipeline parallelism every rank draws the whole model's values and keeps its part
// (parallel/pipeline.h), so the model is the same for any --tp and --pp.
inline ModelPart model_part(const GPT2& m) {
    return {m.tensor.size, m.tensor.rank, m.pipeline.size, m.pipeline.rank, m.options.pipeline_chunks};
}
// The values, in one seeded stream of normals (tensor by tensor, in order), drawn by `threads` threads
// (0: the hardware's): each piece of the stream starts from the generator skipped to its first draw,
// so any thread count gives the same bits. One thread took 46 s here for GPT-2 1.5B's 1.56 billion.
inline std::vector<floatX> gpt2_initial_parameters(const GPT2Config& c, uint64_t seed, unsigned threads = 0) {
    size_t whole_sizes[kNumParameterTensors];
    parameter_sizes(c, whole_sizes);
    std::vector<floatX> host(gpt2_num_parameters(c));
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    const double residual_std = 0.02 / std::sqrt(2.0 * c.num_layers);
    size_t offset = 0, normals_before = 0;  // of this tensor: where it starts, normals drawn before it
    for (int i = 0; i < kNumParameterTensors; ++i) {
        const std::string name = kParameterNames[i];
        const bool is_layernorm_weight = name == "ln1w" || name == "ln2w" || name == "lnfw";
        const bool is_bias = name == "ln1b" || name == "ln2b" || name == "lnfb" || name == "qkvb" ||
                             name == "attprojb" || name == "fcb" || name == "fcprojb";
        const double std_dev = (name == "attprojw" || name == "fcprojw") ? residual_std : 0.02;
        size_t count = whole_sizes[i];
        if (name == "wte") count = size_t(c.vocab_size) * c.channels;  // padded rows stay zero
        const size_t normals = is_layernorm_weight || is_bias ? 0 : count;  // drawn for j < normals
        auto fill = [&, offset, normals_before, normals](size_t begin, size_t end) {
            Rng rng(seed);
            rng.skip(uint64_t(Rng::kDrawsPerNormal) * (normals_before + std::min(begin, normals)));
            for (size_t j = begin; j < end; ++j) {
                float v = 0.0f;
                if (is_layernorm_weight) v = 1.0f;
                else if (j < normals) v = float(rng.normal(0.0, std_dev));
                host[offset + j] = from_float<floatX>(v);
            }
        };
        const size_t n = whole_sizes[i], pieces = std::min<size_t>(threads, std::max<size_t>(1, n / 4096));
        std::vector<std::thread> pool;
        for (size_t p = 1; p < pieces; ++p) pool.emplace_back(fill, n * p / pieces, n * (p + 1) / pieces);
        fill(0, n / pieces);
        for (std::thread& t : pool) t.join();
        offset += n;
        normals_before += normals;
    }
    return host;
}
inline void gpt2_init_weights(GPT2& model, uint64_t seed) {
    const GPT2Config& c = model.whole_config;
    std::vector<floatX> host = gpt2_initial_parameters(c, seed);
    if (model.tensor.size > 1 || model.pipeline.size > 1) host = model_shard(host, c, model_part(model));
    copy_and_wait(model, model.params_memory, host.data(), host.size() * sizeof(floatX), cudaMemcpyHostToDevice);
}

// Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", section 4.2.2): outside the tensor-parallel matmuls (LayerNorms, residual adds)
// every rank of the tensor group would compute the same thing on all B*T tokens; instead rank r keeps
// and computes rows [r BT/tp, (r+1) BT/tp) of those regions. The all-reduce after a row-parallel matmul
// becomes a reduce-scatter (each rank gets the sum of its rows), and an all-gather brings the whole
// input back before a column-parallel matmul; the backward pass does the reverse. The same bytes move
// as with the all-reduce alone (an all-reduce is a reduce-scatter then an all-gather), and the
// regions' activations take 1/tp of the memory. Without sequence parallelism the helpers below are
// the all-reduce alone and the identity.

// The rows this rank keeps of the current pass's LayerNorm and residual regions, and the first of them.
inline size_t sequence_local_rows(const GPT2& m) { return sequence_rows(size_t(m.B) * m.T, m.options); }
inline size_t first_sequence_row(const GPT2& m) { return m.options.sequence_parallel ? m.tensor.rank * sequence_local_rows(m) : 0; }

// A region's (BT, C) rows from every rank, gathered into model.sequence_gathered from this rank's at
// `local` (the input of a column-parallel matmul); without sequence parallelism `local` holds them all.
inline const floatX* gather_sequence(GPT2& m, const floatX* local) {
    if (!m.options.sequence_parallel) return local;
    const size_t n = sequence_local_rows(m) * size_t(m.config.channels);
    NCCL_CHECK(ncclAllGather(local, m.sequence_gathered, n, std::is_same_v<floatX, float> ? ncclFloat32 : ncclBfloat16,
                             m.tensor.nccl, m.stream));
    return m.sequence_gathered;
}

// Sums the (BT, C) partial results of a row-parallel matmul (or the partial gradients of a
// column-parallel one's input) over the tensor group, in place: all of them (all-reduce), or with
// sequence parallelism this rank's rows (reduce-scatter, NCCL's in-place layout): returns where the
// sums this rank keeps start.
inline floatX* sum_over_tensor_ranks(GPT2& m, floatX* partial) {
    const size_t C = size_t(m.config.channels);
    if (!m.options.sequence_parallel) {
        tensor_all_reduce(m.tensor, partial, size_t(m.B) * m.T * C, m.stream);
        return partial;
    }
    const size_t n = sequence_local_rows(m) * C;
    floatX* mine = partial + first_sequence_row(m) * C;
    NCCL_CHECK(ncclReduceScatter(partial, mine, n, std::is_same_v<floatX, float> ? ncclFloat32 : ncclBfloat16, ncclSum,
                                 m.tensor.nccl, m.stream));
    return mine;
}

// Layer l's activations for the current B x T: slices of the layer-major buffers (laid out for this
// B x T), or the one-layer buffers of what recomputation rebuilds.
// Layer l is one of the rank's (its local index); the buffers hold the current model chunk's layers.
inline LayerActivations layer_activations(const GPT2& model, int l) {
    const ActivationTensors& a = model.acts;
    const size_t BT = size_t(model.B) * model.T, C = model.config.channels;
    const size_t Ct = size_t(tensor_channels(model.config, model.options)), NHt = size_t(tensor_heads(model.config, model.options));
    const size_t BTs = sequence_rows(BT, model.options);
    const int L = model.layers.most(), i = l - model.layers.local_first(model.chunk);  // the layer within its chunk
    LayerActivations r;
    r.input = i == 0 ? a.encoded + first_sequence_row(model) * C : a.residual3 + size_t(i - 1) * BTs * C;
    // The slice of layer l, or the single buffer when one layer's copy is kept (or ln1's, shared).
#define GPT2_LAYER_SLICE(name, type, elements, keep) \
    r.name = a.name + (kept_copies(keep, L, model.options.recompute) > 1 ? size_t(i) * (elements) : 0);
    GPT2_LAYER_ACTIVATIONS(GPT2_LAYER_SLICE)
#undef GPT2_LAYER_SLICE
    return r;
}

// The current pass's layers (the rank's, or its current model chunk's), and whether it is the whole
// model's first (it embeds the tokens) or last virtual stage (it runs the classifier).
inline LayerRange pass_layers(const GPT2& m) {
    return {m.layers.local_first(m.chunk), m.layers.chunks[size_t(m.chunk)].count};
}
inline bool embeds(const GPT2& m) { return m.options.first_stage() && m.chunk == 0; }
inline bool classifies(const GPT2& m) { return m.options.last_stage() && m.chunk == m.options.pipeline_chunks - 1; }

// The causal self-attention of B x T tokens: x.atty and x.att_lse from x.qkv, by the kernels
// model.options.attention names. Under tensor parallelism over this rank's heads only: x.qkv holds
// their queries, keys and values, x.atty their outputs.
inline void causal_attention_forward(GPT2& model, const LayerActivations& x) {
    const int B = model.B, T = model.T, Ct = tensor_channels(model.config, model.options), NHt = tensor_heads(model.config, model.options);
    if (model.options.context_parallel > 1) {  // this rank's T of the whole T cp, the others' keys around the ring
        ring_attention_forward(model.context, x.atty, x.att_lse, x.qkv, B, T * model.context.size, Ct, NHt, model.stream,
                               model.options.doc_mask ? model.doc_start : nullptr);  // the ring's first keys
        return;
    }
    const int* doc_mask = model.options.doc_mask ? model.doc_start : nullptr;
    if (model.options.attention == Attention::tc) attention_tc_forward(x.atty, x.att_lse, x.qkv, B, T, Ct, NHt, model.stream, doc_mask);
    else attention_forward(x.atty, x.att_lse, x.qkv, B, T, Ct, NHt, model.stream, doc_mask);
}

// The bias of a row-parallel projection (attprojb, fcprojb): added by tensor rank 0 alone, so that the
// sum over the tensor group adds it once.
inline const floatX* bias_before_sum(const GPT2& model, const floatX* bias) { return model.tensor.rank == 0 ? bias : nullptr; }

// Without tensor parallelism the projections before the residual adds (attproj, fcproj) write the
// residual stream themselves: D = x W^T + b + residual, the add in the GEMM's epilogue (cuBLASLt's
// beta C), so only the LayerNorm after it is left, reading one tensor where the fused residual +
// LayerNorm read two and wrote one more. Under tensor parallelism each rank's projection is a partial
// sum: the add waits for the group's sum (the fused kernel, as before).
inline bool residual_added_by_projection(const GPT2& m) { return m.tensor.size == 1; }

// Block l's forward from ln1 (already computed: by the LayerNorm after the previous block's residual
// add, or by recomputation) up to the MLP's hidden layer: everything its backward pass reads. `attend(x)`
// writes x.atty from x.qkv: the causal attention, or in generation the attention over the cache.
// Under tensor parallelism (parallel/tensor.h) qkv and the MLP's hidden layer are this rank's columns,
// and the attention projection's partial sums are summed over the group (Megatron's g).
template <typename Attend> inline void block_forward_to_mlp(GPT2& model, int l, const LayerActivations& x, Attend&& attend) {
    const GPT2Config& cfg = model.config;
    const int BT = model.B * model.T, C = cfg.channels, Ct = tensor_channels(cfg, model.options);
    const LayerTensors w = layer_view(model.params, cfg, l, model.tensor.size);
    floatX* branch = model.acts.branch;
    cudaStream_t stream = model.stream;
    const Matmul& mm = model.matmul;
    const int rows = int(sequence_local_rows(model));  // of the LayerNorm and residual regions
    // Attention branch: x + attproj(attention(ln1(x)))
    matmul_forward(mm, x.qkv, gather_sequence(model, x.ln1), w.qkvw, w.qkvb, BT, C, 3 * Ct, stream);
    attend(x);
    if (residual_added_by_projection(model)) {
        matmul_forward(mm, x.residual2, x.atty, w.attprojw, w.attprojb, BT, Ct, C, stream, nullptr, x.input);
        layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, w.ln2w, w.ln2b, rows, C, stream);
    } else {
        matmul_forward(mm, branch, x.atty, w.attprojw, bias_before_sum(model, w.attprojb), BT, Ct, C, stream);
        const floatX* attended = sum_over_tensor_ranks(model, branch);
        fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, x.input, attended, w.ln2w, w.ln2b, rows,
                                         C, stream);
    }
    // MLP's first half: gelu(fc(ln2(x))), GELU fused into the matmul's epilogue (fch keeps its input)
    matmul_forward(mm, x.fch_gelu, gather_sequence(model, x.ln2), w.fcw, w.fcb, BT, C, 4 * Ct, stream, x.fch);
}
inline void block_forward_to_mlp(GPT2& model, int l, const LayerActivations& x) {
    block_forward_to_mlp(model, l, x, [&model](const LayerActivations& y) { causal_attention_forward(model, y); });
}

// The L blocks, from layer 0's ln1 (computed) to the final LayerNorm lnf; `attend(l, x)` is layer l's
// attention (see block_forward_to_mlp). A pipeline stage before the last ends at its last layer's
// residual3 (the next stage's input): the residual add alone, which rounds as the fused one does.
template <typename Attend> inline void gpt2_blocks_forward(GPT2& model, Attend&& attend) {
    const GPT2Config& cfg = model.config;
    const int C = cfg.channels, Ct = tensor_channels(cfg, model.options), BT = model.B * model.T;
    const int rows = int(sequence_local_rows(model));
    const ParameterTensors& p = model.params;
    ActivationTensors& a = model.acts;
    const LayerRange range = pass_layers(model);
    const int L = range.first + range.count;  // the pass's layers end here
    for (int l = range.first; l < L; ++l) {
        const LayerTensors w = layer_view(p, cfg, l, model.tensor.size);
        const LayerActivations x = layer_activations(model, l);
        block_forward_to_mlp(model, l, x, [&](const LayerActivations& y) { attend(l, y); });
        // MLP branch's second half: x + fcproj(fch_gelu), the add in the projection or fused with the next
        // LayerNorm: the next layer's ln1, or the final one (a stage before the last ends at residual3)
        const bool added = residual_added_by_projection(model);
        const floatX* mlp_out = nullptr;
        if (added) {
            matmul_forward(model.matmul, x.residual3, x.fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * Ct, C, model.stream, nullptr,
                           x.residual2);
        } else {
            matmul_forward(model.matmul, a.branch, x.fch_gelu, w.fcprojw, bias_before_sum(model, w.fcprojb), BT, 4 * Ct, C,
                           model.stream);
            mlp_out = sum_over_tensor_ranks(model, a.branch);
        }
        // The next LayerNorm of residual3, after the add or with it.
        const auto next_layernorm = [&](floatX* out, float* mean, float* rstd, const floatX* weight, const floatX* bias) {
            if (added) layernorm_forward(out, mean, rstd, x.residual3, weight, bias, rows, C, model.stream);
            else fused_residual_layernorm_forward(x.residual3, out, mean, rstd, x.residual2, mlp_out, weight, bias, rows, C,
                                                  model.stream);
        };
        if (l + 1 < L) {
            const LayerTensors next_w = layer_view(p, cfg, l + 1, model.tensor.size);
            const LayerActivations next = layer_activations(model, l + 1);
            next_layernorm(next.ln1, next.ln1_mean, next.ln1_rstd, next_w.ln1w, next_w.ln1b);
        } else if (classifies(model)) {
            next_layernorm(a.lnf, a.lnf_mean, a.lnf_rstd, p.lnfw, p.lnfb);
        } else if (!added) {
            CUDA_CHECK(recorded_copy(x.residual3, x.residual2, size_t(rows) * C * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                     model.stream));
            accumulate(x.residual3, mlp_out, size_t(rows) * C, model.stream);
        }
    }
}

// The upload slot the next forward pass fills: the other one than last time, once the device has
// done that slot's copies (cudaEventQuery first: no wait when it has, the usual case).
inline GPT2::UploadSlot& next_upload_slot(GPT2& model) {
    model.upload_slot ^= 1;
    GPT2::UploadSlot& up = model.uploads[model.upload_slot];
    const cudaError_t state = cudaEventQuery(up.copied);
    if (state == cudaErrorNotReady) {
        (void)cudaGetLastError();  // "not actually an error" (cudaErrorNotReady doc), but recorded as the last one
        CUDA_CHECK(cudaEventSynchronize(up.copied));
    } else {
        CUDA_CHECK(state);
    }
    up.encoder = EncoderGrouping{};
    return up;
}

inline EncoderGrouping encoder_grouping_of(const GPT2& model, const GPT2::UploadSlot& up) {
    return encoder_backward_grouping(up.grouping, up.inputs, model.B, model.T,
                                     model.options.uses_token_positions() ? up.token_positions : nullptr, model.config.max_seq_len);
}

// ---------------------------------------------------------------------------------------------
// Forward pass. targets may be null (inference: logits only). With targets, the per-token losses are
// computed, and when grad_scale > 0 the classifier also leaves dlogits = grad_scale * dloss/dlogits in
// the logits buffer for the backward pass. grad_scale is 1 / (valid targets of the whole optimizer
// step), known before backward, so the step's loss is a mean over tokens, never a mean of means.
// gpt2_forward_queue queues it on model.stream and returns without waiting for the device (the
// losses are in acts.losses when the stream gets there); gpt2_forward waits and returns the sum of
// the per-token losses (0 without targets). It is two parts: gpt2_upload, the host's (checks and
// copies that depend on the batch), and gpt2_forward_kernels, the device's, which depends only on the
// shapes and so may be captured into a CUDA graph (train_step).

// Checks the batch and copies it to the device on model.stream from page-locked memory: token ids,
// targets, document starts and, when a backward pass follows (grad_scale > 0), the encoder backward's
// grouping of the tokens and grad_scale itself.
inline void gpt2_upload(GPT2& model, const int* inputs_host, const int* targets_host, int B, int T, float grad_scale) {
    const auto fail = [](const std::string& what) { throw TrainGptError("gpt2_forward: " + what); };
    if (B < 1 || B > model.max_batch || T < 1 || T > model.max_tokens)
        fail("B = " + std::to_string(B) + ", T = " + std::to_string(T) + " exceed the allocated " +
             std::to_string(model.max_batch) + " x " + std::to_string(model.max_tokens));
    if (targets_host && !model.targets) fail("an inference model (ModelOptions::inference) computes no losses");
    if (model.context.size > 1 && T != model.max_tokens)  // the ring's chunks are the build's (parallel/context.h)
        fail("context parallelism (--cp) runs whole sequences: T = " + std::to_string(T) + " per rank, not the built " +
             std::to_string(model.max_tokens));
    const GPT2Config& cfg = model.config;
    const int V = cfg.vocab_size;
    const int BT = B * T;
    for (int i = 0; i < BT; ++i) {
        if (inputs_host[i] < 0 || inputs_host[i] >= V)
            fail("input token " + std::to_string(inputs_host[i]) + " at position " + std::to_string(i) +
                 " is outside the vocabulary [0, " + std::to_string(V) + ")");
        if (targets_host && (targets_host[i] < -1 || targets_host[i] >= V))
            fail("target " + std::to_string(targets_host[i]) + " at position " + std::to_string(i) + " is neither -1 nor in [0, " +
                 std::to_string(V) + ")");
    }
    // Sequence parallelism splits B*T tokens evenly over the tensor ranks: a pass whose B*T does not
    // divide (evaluation of shorter rows, sampling) runs on rows padded at their ends with end-of-text
    // tokens and ignored targets; causal attention keeps the real positions as they were (the build's
    // T is a multiple of tp, so the padded rows fit). model.T is then the padded length.
    int padded_T = T;
    if (model.options.sequence_parallel)
        while ((size_t(B) * padded_T) % size_t(model.tensor.size) != 0) ++padded_T;
    const int padded_BT = B * padded_T;
    model.B = B;
    model.T = padded_T;
    cudaStream_t stream = model.stream;
    GPT2::UploadSlot& up = next_upload_slot(model);
    const int pad = model.options.eot_token >= 0 && model.options.eot_token < V ? model.options.eot_token : 0;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < padded_T; ++t) {
            const bool real = t < T;
            up.inputs[b * padded_T + t] = real ? inputs_host[b * T + t] : pad;
            if (targets_host) up.targets[b * padded_T + t] = real ? targets_host[b * T + t] : -1;
        }
    CUDA_CHECK(recorded_copy(model.inputs, up.inputs, padded_BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets_host)
        CUDA_CHECK(recorded_copy(model.targets, up.targets, padded_BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    const ZigzagLayout zigzag{padded_T * model.context.size, model.context.size};  // --cp's rows (parallel/context.h)
    if (model.options.uses_documents() && model.context.size == 1) {  // each token's document start (host/documents.h)
        document_starts(up.doc_start, up.inputs, B, padded_T, model.options.eot_token);
        CUDA_CHECK(recorded_copy(model.doc_start, up.doc_start, padded_BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    } else if (model.options.uses_documents()) {
        // Documents cross the ranks' chunks: their starts are found on the whole rows, gathered from the
        // context group, as positions in the sequence; the ring's kernels take each step's first keys.
        const int n = model.context.size, rank = model.context.rank;
        std::vector<int> all(size_t(n) * padded_BT), whole(size_t(n) * padded_BT), starts(whole.size());
        MPI_CHECK(MPI_Allgather(up.inputs, padded_BT, MPI_INT, all.data(), padded_BT, MPI_INT, model.context.mpi));
        for (int r = 0; r < n; ++r) unzigzag_rows(whole.data(), all.data() + size_t(r) * padded_BT, B, zigzag, r);
        document_starts(starts.data(), whole.data(), B, zigzag.T, model.options.eot_token);
        zigzag_rows(up.doc_start, starts.data(), B, zigzag, rank);
        if (model.options.doc_mask) {
            context_first_keys(up.first_keys, up.doc_start, B, zigzag, rank);
            CUDA_CHECK(recorded_copy(model.doc_start, up.first_keys, size_t(n) * padded_BT * sizeof(int),
                                     cudaMemcpyHostToDevice, stream));
        }
    }
    if (model.options.uses_token_positions()) {  // restarted per document, the zigzag chunks' (--cp), or both
        for (int i = 0; i < padded_BT; ++i) {
            const int t = i % padded_T, position = zigzag.position(model.context.rank, t);
            up.token_positions[i] = model.options.doc_positions ? position - up.doc_start[i] : position;
        }
        CUDA_CHECK(recorded_copy(model.token_positions, up.token_positions, padded_BT * sizeof(int), cudaMemcpyHostToDevice,
                                 stream));
    }
    // A backward pass follows (dlogits are written): its grouping now, while the device runs ahead
    // (the embeddings' backward: the first pipeline stage's).
    if (grad_scale > 0.0f && targets_host) {
        if (model.options.first_stage()) {
            up.encoder = encoder_grouping_of(model, up);
            CUDA_CHECK(recorded_copy(model.bwd.encoder_scratch, up.encoder.ints, up.encoder.count * sizeof(int),
                                     cudaMemcpyHostToDevice, stream));
        }
        *up.grad_scale = grad_scale;
        CUDA_CHECK(recorded_copy(model.bwd.grad_scale, up.grad_scale, sizeof(float), cudaMemcpyHostToDevice, stream));
    }
    model.slots[size_t(model.slot)].encoder = up.encoder;
    CUDA_CHECK(cudaEventRecord(up.copied, stream));
    if (targets_host) {
        int valid = 0;
        for (int i = 0; i < BT; ++i) valid += targets_host[i] != -1;
        model.valid_targets = valid;
    }
}

// The forward pass's kernels over the uploaded batch of model.B x model.T: with targets the losses,
// and with write_dlogits dlogits too (scaled by the uploaded grad_scale). A pipeline stage runs its
// part: after the first, it starts from the residual stream received into acts.encoded; before the
// last, it ends at its last layer's residual3 (pipeline_micro_steps sends it).
inline void gpt2_forward_kernels(GPT2& model, bool with_targets, bool write_dlogits) {
    const GPT2Config& cfg = model.config;
    const int C = cfg.channels, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    const int B = model.B, T = model.T, BT = B * T;
    cudaStream_t stream = model.stream;
    const Matmul& mm = model.matmul;
    ParameterTensors& p = model.params;
    ActivationTensors& a = model.acts;

    // Embeddings, then the first LayerNorm; later LayerNorms are fused with the residual add before them.
    // Under tensor parallelism each rank embeds the tokens of its vocabulary rows (rank 0 adds the
    // positions) and the group sums them; with sequence parallelism each rank keeps its rows' sums,
    // in place (first.input).
    const int Vr = vocab_rows_per_rank(cfg, model.tensor.size), vocab_first = model.tensor.rank * Vr;
    if (embeds(model)) {
        encoder_forward(a.encoded, model.inputs, p.wte, model.tensor.rank == 0 ? p.wpe : nullptr, B, T, C, stream,
                        model.options.uses_token_positions() ? model.token_positions : nullptr, vocab_first, Vr);
        if (model.tensor.size > 1) sum_over_tensor_ranks(model, a.encoded);
    }
    const int first_layer = pass_layers(model).first;
    const LayerActivations first = layer_activations(model, first_layer);
    const LayerTensors first_w = layer_view(p, cfg, first_layer, model.tensor.size);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, first.input, first_w.ln1w, first_w.ln1b,
                      int(sequence_local_rows(model)), C, stream);

    gpt2_blocks_forward(model, [&model](int, const LayerActivations& x) { causal_attention_forward(model, x); });
    if (!classifies(model)) return;

    // Tied output head: logits = lnf @ wte^T over the padded vocabulary (this rank's columns of it).
    matmul_forward(mm, a.logits, gather_sequence(model, a.lnf), p.wte, nullptr, BT, C, Vr, stream);
    if (!with_targets) return;
    if (model.tensor.size == 1) {
        fused_classifier(a.logits, a.losses, model.targets, model.bwd.grad_scale, BT, V, Vp, write_dlogits, stream);
        return;
    }
    // Vocabulary-parallel: each rank's row statistics, gathered in place (rank order), then the losses
    // (alike on every rank) and this rank's dlogits.
    float* mine = model.classifier_stats + size_t(model.tensor.rank) * BT * kClassifierStats;
    classifier_shard_stats(mine, a.logits, model.targets, BT, vocab_first, V, Vr, stream);
    NCCL_CHECK(ncclAllGather(mine, model.classifier_stats, size_t(BT) * kClassifierStats, ncclFloat32, model.tensor.nccl, stream));
    classifier_shard_finish(a.logits, a.losses, model.classifier_stats, model.targets, model.bwd.grad_scale, BT, model.tensor.size,
                            vocab_first, V, Vr, write_dlogits, stream);
}

// The residual stream between pipeline stages: entering a stage's first layer (the current slot's),
// and leaving its last (slot k's: residual3 is kept layer-major for every layer).
inline floatX* stage_input(GPT2& m) { return m.acts.encoded + first_sequence_row(m) * size_t(m.config.channels); }
inline floatX* stage_output(const GPT2& m, int k, int chunk) {
    const size_t region = sequence_local_rows(m) * size_t(m.config.channels);
    return m.slots[size_t(k)].acts.residual3 + size_t(m.layers.chunks[size_t(chunk)].count - 1) * region;
}
constexpr ncclDataType_t kNcclFloatX = std::is_same_v<floatX, float> ? ncclFloat32 : ncclBfloat16;

// What a tensor rank sends of a tensor crossing a stage boundary (the residual stream or its gradient)
// to the same tensor rank of the neighbouring stage: with sequence parallelism its rows, all it holds;
// otherwise every rank of the tensor group holds the whole (replicated), so each sends 1/tp of it and
// the receiving group all-gathers the parts (Megatron's scatter-gather, Narayanan et al. 2021, 4.1):
// the pipeline link carries 1/tp of the bytes, NVLink the rest.
struct StageBoundaryPart {
    size_t offset = 0, count = 0;  // elements
    bool gathered = false;         // the receiver all-gathers over its tensor group
};
inline StageBoundaryPart stage_boundary_part(const GPT2& m) {
    const size_t n = sequence_local_rows(m) * size_t(m.config.channels);
    if (m.tensor.size == 1 || m.options.sequence_parallel) return {0, n, false};
    const size_t part = n / size_t(m.tensor.size);  // C, and so n, is a multiple of tp (whole heads per rank)
    return {size_t(m.tensor.rank) * part, part, true};
}
// Activations and gradients travel on two communicators of the pipeline group, each matched in order
// between two ranks (host/pipeline_schedule.h, check_pipeline_exchanges).
inline void send_stage_boundary(GPT2& m, const floatX* x, int peer, bool activation = true) {
    const StageBoundaryPart part = stage_boundary_part(m);
    NCCL_CHECK(ncclSend(x + part.offset, part.count, kNcclFloatX, peer,
                        activation ? m.pipeline.nccl : m.pipeline.gradient_nccl, m.stream));
}
inline void receive_stage_boundary(GPT2& m, floatX* x, int peer, bool activation = true) {
    const StageBoundaryPart part = stage_boundary_part(m);
    NCCL_CHECK(ncclRecv(x + part.offset, part.count, kNcclFloatX, peer,
                        activation ? m.pipeline.nccl : m.pipeline.gradient_nccl, m.stream));
}
// After the receive's group: the whole from the tensor group's parts, in place.
inline void complete_stage_boundary(GPT2& m, floatX* x) {
    const StageBoundaryPart part = stage_boundary_part(m);
    if (part.gathered) NCCL_CHECK(ncclAllGather(x + part.offset, x, part.count, kNcclFloatX, m.tensor.nccl, m.stream));
}

// Under pipeline parallelism every stage calls it, in turn along the pipeline: a stage after the
// first receives its input from the one before, a stage before the last sends its output on (one
// micro-batch alone: forward passes that no backward pass follows; training runs pipeline_micro_steps).
inline void gpt2_forward_queue(GPT2& model, const int* inputs_host, const int* targets_host, int B, int T,
                               float grad_scale) {
    gpt2_upload(model, inputs_host, targets_host, B, T, grad_scale);
    const PipelineParallel& pipe = model.pipeline;
    const int p = pipe.size;
    for (int chunk = 0; chunk < model.options.pipeline_chunks; ++chunk) {  // virtual stages chunk p + rank, in order
        model.chunk = chunk;
        if (!embeds(model)) {
            receive_stage_boundary(model, stage_input(model), (pipe.rank + p - 1) % p);
            complete_stage_boundary(model, stage_input(model));
        }
        gpt2_forward_kernels(model, targets_host != nullptr, targets_host != nullptr && grad_scale > 0.0f);
        if (!classifies(model)) send_stage_boundary(model, stage_output(model, model.slot, chunk), (pipe.rank + 1) % p);
    }
}

// Under pipeline parallelism: the last stage's `count` values at `data` on every stage of the pipeline.
template <typename T> inline void from_last_stage(const GPT2& m, T* data, size_t count) {
    if (m.pipeline.size > 1)
        MPI_CHECK(MPI_Bcast(data, int(count * sizeof(T)), MPI_BYTE, m.pipeline.size - 1, m.pipeline.mpi));
}

// The sum of n per-token losses copied to the host, in position order (double: deterministic).
inline double sum_of_losses(const float* losses, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += losses[i];
    return sum;
}

inline double gpt2_forward(GPT2& model, const int* inputs_host, const int* targets_host, int B, int T,
                           float grad_scale) {
    gpt2_forward_queue(model, inputs_host, targets_host, B, T, grad_scale);
    if (!targets_host) return 0.0;
    const size_t BT = size_t(model.B) * model.T;  // padded rows (sequence parallelism) add losses of 0
    std::vector<float> losses(BT);
    if (model.options.last_stage())
        CUDA_CHECK(recorded_copy(losses.data(), model.acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, model.stream));
    CUDA_CHECK(cudaStreamSynchronize(model.stream));
    double sum = sum_of_losses(losses.data(), BT);
    from_last_stage(model, &sum, 1);
    return sum;
}

// Generation with a key/value cache (an inference model): the forward pass of n new tokens of one
// sequence at positions [kv_length, kv_length + n), each attending to every position before it and
// itself; their keys and values join the cache. Returns the logits over the real vocabulary at the
// last new position. The first call (the prompt) runs the causal flash attention over its n tokens;
// each later call one token, whose query attends over the cache (kernels/attention_decode.cuh).
inline std::vector<float> gpt2_forward_cached(GPT2& model, const int* tokens, int n) {
    const auto fail = [](const std::string& what) { throw TrainGptError("gpt2_forward_cached: " + what); };
    const GPT2Config& cfg = model.config;
    const int C = cfg.channels, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size, pos = model.kv_length;
    if (!model.options.inference || model.max_batch != 1 || model.options.uses_documents())
        fail("needs an inference model built for B = 1, without document masking or positions");
    if (n < 1 || (pos > 0 && n != 1) || pos + n > model.max_tokens)
        fail(std::to_string(n) + " new tokens after " + std::to_string(pos) + " cached: a prompt first, then one at a time, " +
             std::to_string(model.max_tokens) + " positions in all");
    for (int i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= V)
            fail("token " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    model.B = 1;
    model.T = n;
    cudaStream_t stream = model.stream;
    const ParameterTensors& p = model.params;
    ActivationTensors& a = model.acts;
    CUDA_CHECK(recorded_copy(model.inputs, tokens, n * sizeof(int), cudaMemcpyHostToDevice, stream));
    // Positions pos, pos + 1, ...: the embedding table from row pos on.
    encoder_forward(a.encoded, model.inputs, p.wte, p.wpe + size_t(pos) * C, 1, n, C, stream);
    const LayerActivations first = layer_activations(model, 0);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a.encoded, p.ln1w, p.ln1b, n, C, stream);
    gpt2_blocks_forward(model, [&](int l, const LayerActivations& x) {
        const size_t layer = size_t(l) * model.max_tokens * C;
        floatX *keys = model.kv_keys + layer, *values = model.kv_values + layer;
        kv_cache_append(keys, values, x.qkv, pos, n, C, stream);
        if (pos == 0) causal_attention_forward(model, x);
        else attention_decode(x.atty, x.qkv, keys, values, pos + 1, C, NH, stream);
    });
    model.kv_length = pos + n;
    // The tied head for the last position only: the next token's logits.
    matmul_forward(model.matmul, a.logits, a.lnf + size_t(n - 1) * C, p.wte, nullptr, 1, C, Vp, stream);
    std::vector<floatX> row(Vp);
    copy_and_wait(model, row.data(), a.logits, Vp * sizeof(floatX), cudaMemcpyDeviceToHost);
    std::vector<float> logits(V);
    for (int v = 0; v < V; ++v) logits[v] = to_float(row[v]);
    return logits;
}

// Clears the step's accumulated gradients (all of them, or this rank's shard under ZeRO-2).
inline void gpt2_zero_grad(GPT2& model) {
    CUDA_CHECK(recorded_memset(model.grads_memory, 0, model.plan.bytes_of("grads"), model.stream));
}

// Where the backward pass writes layer l's parameter gradients: the full gradient buffer (stages 0-1),
// or one of the two alternating layer buffers (stage 2), laid out like one block of the flat buffer.
inline LayerTensors layer_grads(const GPT2& model, int l) {
    const int tp = model.tensor.size;
    if (model.shard.zero_stage != 2) return layer_view(model.grads, model.config, l, tp);
    GPT2Config one_layer = model.config;
    one_layer.num_layers = 1;
    size_t sizes[kNumParameterTensors];
    tensor_parallel_sizes(one_layer, tp, sizes);
    ParameterTensors t{};
    floatX* p = model.layer_grad_buffers[l % 2];
    for (int i = 0; i < kNumParameterTensors; ++i) {
        if (!is_layer_tensor(i)) continue;
        t.all()[i] = p;
        p += sizes[i];
    }
    return layer_view(t, one_layer, 0, tp);
}

// ---------------------------------------------------------------------------------------------
// Backward pass: the forward pass in reverse. Parameter gradients accumulate (+=) so micro-steps add up;
// the logits buffer already holds dlogits from the forward pass. `layer_done(l)` is called when layer
// l's gradients are complete (then -1 for the global tensors wte, wpe, lnf), so the gradient reduction
// can start while the layers below are still being computed.
// `before_layer(l)` runs before layer l's gradients are written (ZeRO-2 waits there until the layer
// buffer it reuses has been reduced).

inline void gpt2_backward(GPT2& model, const std::function<void(int)>& layer_done = {},
                          const std::function<void(int)>& before_layer = {}) {
    const GPT2Config& cfg = model.config;
    const int C = cfg.channels;
    const int Ct = tensor_channels(cfg, model.options), NHt = tensor_heads(cfg, model.options);
    const int B = model.B, T = model.T, BT = B * T;
    const LayerRange range = pass_layers(model);  // the rank's layers, or the current chunk's
    // The LayerNorm and residual regions' rows on this rank (all BT without sequence parallelism): the
    // residual stream's gradient is kept for those rows, and gathered whole where a matmul reads it.
    const int rows = int(sequence_local_rows(model));
    const size_t region = size_t(rows) * C;
    cudaStream_t stream = model.stream;
    const Matmul& mm = model.matmul;
    ParameterTensors& p = model.params;
    ParameterTensors& g = model.grads;
    ActivationTensors& a = model.acts;
    BackwardBuffers& b = model.bwd;

    // The global tensors' gradients are per micro-step under ZeRO-2 (a pipeline stage accumulates them over
    // the step instead, pipeline_micro_steps: the tied embedding's two halves are summed before reducing).
    if (model.shard.zero_stage == 2 && model.pipeline.size == 1)
        CUDA_CHECK(recorded_memset(g.wte, 0, model.plan.bytes_of("grad_global_buffer"), stream));
    const int Vr = vocab_rows_per_rank(cfg, model.tensor.size);
    // A pipeline stage before the last starts from the gradient of its output, received into dresidual.
    if (classifies(model)) {
        // Output head: dlnf = dlogits @ wte, dwte += dlogits^T @ lnf (lnf gathered again: the buffer is
        // shared). Vocabulary-parallel: each rank's columns give a part of dlnf, summed over the group.
        matmul_backward(mm, b.dbuf_c, g.wte, nullptr, b.scratch, a.logits, gather_sequence(model, a.lnf), p.wte, BT, C, Vr,
                        stream);
        const floatX* dlnf = model.tensor.size > 1 ? sum_over_tensor_ranks(model, b.dbuf_c) : b.dbuf_c;
        // Final LayerNorm: dresidual starts as the gradient of the last layer's output.
        CUDA_CHECK(recorded_memset(b.dresidual, 0, region * sizeof(floatX), stream));
        layernorm_backward(b.dresidual, g.lnfw, g.lnfb, b.scratch, dlnf, a.residual3 + (range.count - 1) * region, p.lnfw,
                           a.lnf_mean, a.lnf_rstd, rows, C, stream);
    }

    for (int l = range.first + range.count - 1; l >= range.first; --l) {
        if (before_layer) before_layer(l);
        const LayerTensors w = layer_view(p, cfg, l, model.tensor.size), dw = layer_grads(model, l);
        if (model.shard.zero_stage == 2)
            CUDA_CHECK(recorded_memset(model.layer_grad_buffers[l % 2], 0, model.layer_grad_size * sizeof(floatX), stream));
        const LayerActivations x = layer_activations(model, l);
        // Recompute what the forward pass did not keep, with the forward's kernels on the kept inputs.
        // The LayerNorm statistics come out equal to the kept ones; selective mode need not store them.
        if (model.options.recompute == Recompute::full) {
            layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, x.input, w.ln1w, w.ln1b, rows, C, stream);
            block_forward_to_mlp(model, l, x);
        } else if (model.options.recompute == Recompute::selective) {
            layernorm_forward(x.ln2, nullptr, nullptr, x.residual2, w.ln2w, w.ln2b, rows, C, stream);
            matmul_forward(mm, x.fch_gelu, gather_sequence(model, x.ln2), w.fcw, w.fcb, BT, C, 4 * Ct, stream, x.fch);
        }
        // MLP branch. dresidual holds the gradient of residual3; the DGELU epilogue turns the gradient of
        // fch_gelu into the gradient of fch directly. Under tensor parallelism each rank's hidden units
        // give a part of ln2's gradient: summed over the group (Megatron's f; with sequence parallelism
        // each rank gets its rows' sums). The two projections' bias gradients, column sums of dresidual
        // before and after ln2's gradient joins it, are summed by ln2's backward, which reads and writes
        // dresidual anyway (kernels/layernorm.cuh, ResidualBiasGrads; rows up to C = 2048, every GPT-2
        // size: wider ones leave them to the matmuls).
        const ResidualBiasGrads ln2_sums = layernorm_sums_residual_bias(C) ? ResidualBiasGrads{dw.fcprojb, dw.attprojb}
                                                                           : ResidualBiasGrads{};
        matmul_backward(mm, b.dbuf_4c, dw.fcprojw, ln2_sums.any() ? nullptr : dw.fcprojb, b.scratch,
                        gather_sequence(model, b.dresidual), x.fch_gelu, w.fcprojw, BT, 4 * Ct, C, stream, x.fch);
        matmul_backward(mm, b.dbuf_c, dw.fcw, dw.fcb, b.scratch, b.dbuf_4c, gather_sequence(model, x.ln2), w.fcw, BT, C,
                        4 * Ct, stream);
        const floatX* dln2 = sum_over_tensor_ranks(model, b.dbuf_c);
        // ln2's gradient joins the residual path: dresidual becomes the gradient of residual2.
        layernorm_backward(b.dresidual, dw.ln2w, dw.ln2b, b.scratch, dln2, x.residual2, w.ln2w, x.ln2_mean, x.ln2_rstd,
                           rows, C, stream, ln2_sums);
        // Attention branch. Recomputation rebuilds ln1 in the buffer ln2 took over (ln2 is no longer read).
        matmul_backward(mm, b.dbuf_c, dw.attprojw, ln2_sums.any() ? nullptr : dw.attprojb, b.scratch,
                        gather_sequence(model, b.dresidual), x.atty, w.attprojw, BT, Ct, C, stream);
        // The tensor-core kernels (split or fused) also sum qkv's bias gradient from the dqkv rows they stage
        // (attention_sums_qkv_bias); its partial rows are added into dw.qkvb before the matmul, whose
        // own scratch use would overwrite them.
        const int* doc_mask = model.options.doc_mask ? model.doc_start : nullptr;
        const bool attention_qkv_bias = attention_sums_qkv_bias(model.options);
        if (model.options.context_parallel > 1)
            ring_attention_backward(model.context, b.dbuf_4c, b.scratch, b.dbuf_c, x.qkv, x.atty, x.att_lse, B,
                                    T * model.context.size, Ct, NHt, stream, doc_mask);
        else if (model.options.attention == Attention::tc) {
            const float* qkv_bias_partials = attention_tc_backward(b.dbuf_4c, b.scratch, b.dbuf_c, x.qkv, x.atty, x.att_lse, B, T,
                                                                   Ct, NHt, stream, doc_mask, attention_tc_backward_of(model.options),
                                                                   attention_qkv_bias);
            if (attention_qkv_bias)
                bias_grad_add_partials(dw.qkvb, qkv_bias_partials,
                                       attention_tc_qkv_bias_chunks(B, T, attention_tc_backward_of(model.options)), 3 * Ct,
                                       b.scratch + qkv_bias_scratch_offset(model.options, B, T, Ct, NHt), stream);
        } else
            attention_backward(b.dbuf_4c, b.scratch, b.dbuf_c, x.qkv, x.atty, x.att_lse, B, T, Ct, NHt, stream, doc_mask);
        if (model.options.recompute != Recompute::none)
            layernorm_forward(x.ln1, nullptr, nullptr, x.input, w.ln1w, w.ln1b, rows, C, stream);
        matmul_backward(mm, b.dbuf_c, dw.qkvw, attention_qkv_bias ? nullptr : dw.qkvb, b.scratch, b.dbuf_4c,
                        gather_sequence(model, x.ln1), w.qkvw, BT, C, 3 * Ct, stream);
        const floatX* dln1 = sum_over_tensor_ranks(model, b.dbuf_c);  // f: ln1's gradient from every rank's heads
        // ln1's gradient joins too: dresidual becomes the gradient of this layer's input.
        layernorm_backward(b.dresidual, dw.ln1w, dw.ln1b, b.scratch, dln1, x.input, w.ln1w, x.ln1_mean, x.ln1_rstd, rows, C,
                           stream);
        if (layer_done) layer_done(l);
    }
    // Embeddings: deterministic, grouped by token on the host (uploaded by the forward pass that wrote dlogits).
    // With sequence parallelism every rank gathers the whole gradient and computes the (replicated)
    // embeddings' gradients alike. A pipeline stage after the first leaves dresidual to be sent back.
    if (embeds(model)) {
        const EncoderGrouping& grouping = model.slots[size_t(model.slot)].encoder;
        if (grouping.count == 0) throw TrainGptError("gpt2_backward: the forward pass before it wrote no dlogits (grad_scale 0)");
        encoder_backward(g.wte, g.wpe, b.encoder_scratch, b.scratch, gather_sequence(model, b.dresidual), grouping, B, T, C, stream,
                         model.tensor.rank * Vr, Vr);
    }
    if (layer_done) layer_done(-1);
}

// ---------------------------------------------------------------------------------------------
// The training step: micro-steps of forward + backward, the gradient reduction across ranks (ZeRO),
// the global gradient norm and clipping, and the AdamW update of this rank's shard.

struct Trainer {
    GPT2 model;
    Distributed dist;   // the data-parallel group (the world without --tp)
    Distributed world;  // every rank of the run: checkpoints are written and read by all of them
    MPI_Comm model_mpi = MPI_COMM_SELF;  // the tensor x pipeline ranks holding this data rank's copy of the model
    ShardedAdamW optimizer;            // parallel/zero.h: AdamW on this rank's shard
    floatX* reduce_receive = nullptr;  // ZeRO-2: where a reduced slice of this rank's shard arrives
    cudaEvent_t layer_buffer_free[2] = {nullptr, nullptr};
    Watchdog* watchdog = nullptr;      // told of progress (host/watchdog.h); null: none
    // Each micro-step's per-token losses, copied here as the stream reaches them and read once the
    // step's backward passes are queued: page-locked (cudaMallocHost), so the copies do not make
    // the host wait, and it queues the next micro-step while the device computes this one.
    float* step_losses = nullptr;
    size_t step_losses_capacity = 0;  // floats
    // ModelOptions::cuda_graphs: the device work of a micro-step captured once into a CUDA graph and
    // replayed, [0] forward and backward, [1] the same and the gradient reduction; for micro-batches of
    // graph_B x graph_T. Captured at first use after one eager step (cuBLASLt's heuristics and
    // --matmul-autotune's timing run outside any capture).
    cudaGraphExec_t micro_step_graphs[2] = {nullptr, nullptr};
    size_t micro_step_graph_nodes[2] = {0, 0};  // operations in each, as captured
    int graph_B = 0, graph_T = 0;
    int64_t steps_run = 0;  // train_step calls so far
    // Host time in the micro-batches' uploads (checks, page-locked copies, the encoder grouping): with one
    // micro-step a step the device waits for all of it (--profile-step reports the step's).
    double upload_seconds = 0;
    PipelineSchedule schedule = PipelineSchedule::one_f_one_b;  // with pipeline stages (pipeline_micro_steps)
    std::set<int> pipeline_plans_checked;  // micro-batch counts whose exchange plan was played out (check_pipeline_plan)
};

// gpt2_upload of a training micro-batch, its host time added to tr.upload_seconds.
inline void upload_micro_batch(Trainer& tr, const int* inputs, const int* targets, int B, int T, float grad_scale) {
    const auto start = std::chrono::steady_clock::now();
    gpt2_upload(tr.model, inputs, targets, B, T, grad_scale);
    tr.upload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline void drop_micro_step_graphs(Trainer& tr) {
    for (cudaGraphExec_t& g : tr.micro_step_graphs) {
        if (g) CUDA_CHECK(cudaGraphExecDestroy(g));
        g = nullptr;
    }
    tr.micro_step_graph_nodes[0] = tr.micro_step_graph_nodes[1] = 0;
}

// Room for n floats of losses (the previous step's copies are done: train_step waits for them).
inline float* reserve_step_losses(Trainer& tr, size_t n) {
    if (n > tr.step_losses_capacity) {
        if (tr.step_losses) CUDA_CHECK(cudaFreeHost(tr.step_losses));
        tr.step_losses = nullptr;
        tr.step_losses_capacity = 0;
        CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&tr.step_losses), n * sizeof(float)));
        tr.step_losses_capacity = n;
    }
    return tr.step_losses;
}

// Progress for the watchdog: `what` (a string literal) at optimizer step `step`.
inline void progress(Trainer& tr, const char* what, int64_t step) {
    if (tr.watchdog) tr.watchdog->beat(what, step);
}

// Builds the model for micro-batches of B x T on `dist`'s ranks with the given ZeRO stage, and the
// optimizer state. Parameters must be set (gpt2_init_weights or loaded) before trainer_start.
// `dist` is the data-parallel group; with tensor parallelism `tensor` is this rank's tensor group (its size
// is options.tensor_parallel) and ZeRO shards this rank's slices over `dist`.
// With pipeline parallelism `pipeline` is this rank's pipeline group (options.pipeline_parallel ranks,
// this one stage options.pipeline_stage) and ZeRO shards its stage's part.
// With context parallelism `context` is this rank's context group (options.context_parallel ranks, each
// holding T of every sequence of T cp: parallel/context.h); its ranks are also in `dist`, which reduces
// the gradients over data and context ranks together.
inline void trainer_build(Trainer& tr, const Distributed& dist, const GPT2Config& config, int B, int T, int zero_stage,
                          const OptimizerConfig& opt, const ModelOptions& options = {}, const TensorParallel& tensor = {},
                          const PipelineParallel& pipeline = {}, const ProcessGroup& context = {}) {
    tr.dist = dist;
    tr.world = dist;  // run() sets the world when the data group is not all of it
    tr.model.tensor = tensor;
    tr.model.pipeline = pipeline;
    tr.model.context = ContextRing{context.nccl, context.mpi, context.rank, context.size};
    tr.model_mpi = tensor.size > 1 && pipeline.size == 1 ? tensor.mpi : MPI_COMM_SELF;  // run() sets it with --pp
    CUDA_CHECK(cudaStreamCreateWithFlags(&tr.model.stream, cudaStreamNonBlocking));
    gpt2_build(tr.model, config, B, T, dist.rank, dist.world_size, zero_stage, options);
    const GPT2& m = tr.model;
    tr.optimizer = {m.shard, opt, {}, m.memory.get<float>("master"), m.memory.get<float>("adam_m"), m.memory.get<float>("adam_v")};
    for (int i = 0; i < kNumParameterTensors; ++i) tr.optimizer.tensors.push_back({m.param_offsets[i], m.param_sizes[i], decays(i)});
    if (zero_stage == 2) tr.reduce_receive = m.memory.get<floatX>("grad_reduce_receive");
    for (cudaEvent_t& e : tr.layer_buffer_free) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

// The optimizer's master weights from the parameters (set before: gpt2_init_weights or loaded).
inline void trainer_start(Trainer& tr) { optimizer_start(tr.optimizer, tr.model.params_memory, tr.model.stream); }

inline void trainer_free(Trainer& tr) {
    drop_micro_step_graphs(tr);
    if (tr.step_losses) CUDA_CHECK(cudaFreeHost(tr.step_losses));
    tr.step_losses = nullptr;
    tr.step_losses_capacity = 0;
    for (cudaEvent_t& e : tr.layer_buffer_free) CUDA_CHECK(cudaEventDestroy(e));
    gpt2_free(tr.model);
    CUDA_CHECK(cudaStreamDestroy(tr.model.stream));
}

// Sequence parallelism: a tensor rank's LayerNorm parameter gradients cover its rows only, and so do the
// projections' bias gradients that ln2's backward sums; summed over the tensor group (on the compute
// stream, with the group's other collectives) where the gradients are reduced, so that every rank holds
// the whole, alike. Layer l's (l = -1: the final LayerNorm's).
inline void sum_layernorm_gradients(GPT2& m, int l) {
    if (!m.options.sequence_parallel || (l < 0 && !m.options.last_stage())) return;  // lnf: the last stage's
    const size_t C = size_t(m.config.channels);
    NCCL_CHECK(ncclGroupStart());
    if (l >= 0) {
        const LayerTensors dw = layer_grads(m, l);
        for (floatX* t : {dw.ln1w, dw.ln1b, dw.ln2w, dw.ln2b}) tensor_all_reduce(m.tensor, t, C, m.stream);
        // Where ln2's backward summed them; else the matmuls' sums of the gathered rows are whole already.
        if (layernorm_sums_residual_bias(int(C)))
            for (floatX* t : {dw.attprojb, dw.fcprojb}) tensor_all_reduce(m.tensor, t, C, m.stream);
    } else {
        tensor_all_reduce(m.tensor, m.grads.lnfw, 2 * C, m.stream);  // lnfw, lnfb: adjacent
    }
    NCCL_CHECK(ncclGroupEnd());
}

// The gradients of layer l (or, for l = -1, of wte, wpe, lnfw, lnfb) are complete on the compute
// stream: reduce them on the communication stream, after the compute stream's work so far.
inline void reduce_layer_gradients(Trainer& tr, int l) {
    GPT2& m = tr.model;
    sum_layernorm_gradients(m, l);
    CUDA_CHECK(cudaEventRecord(tr.dist.compute_done, m.stream));
    CUDA_CHECK(cudaStreamWaitEvent(tr.dist.comm_stream, tr.dist.compute_done, 0));
    const int L = m.config.num_layers;
    if (l >= 0) {
        const LayerTensors dw = layer_grads(m, l);
        floatX* const* local = &dw.ln1w;  // the 12 per-layer tensors, in flat-buffer order
        int k = 0;
        for (int i = 0; i < kNumParameterTensors; ++i) {
            if (!is_layer_tensor(i)) continue;
            const size_t per_layer = m.param_sizes[i] / L;
            reduce_gradients(m.shard, tr.dist, local[k++], m.param_offsets[i] + size_t(l) * per_layer, per_layer,
                             tr.reduce_receive, m.grads_memory);
        }
        if (m.shard.zero_stage == 2) CUDA_CHECK(cudaEventRecord(tr.layer_buffer_free[l % 2], tr.dist.comm_stream));
    } else {
        for (int i = 0; i < kNumParameterTensors; ++i)
            if (!is_layer_tensor(i) && m.param_sizes[i] > 0)  // (a pipeline stage holds some of them)
                reduce_gradients(m.shard, tr.dist, m.grads.all()[i], m.param_offsets[i], m.param_sizes[i], tr.reduce_receive,
                                 m.grads_memory);
    }
}

// The L2 norm over all ranks of a flat-buffer-sized tensor, from this rank's part at `local` (its
// optimizer range). Under tensor parallelism the tensors every rank of the group holds alike are counted
// once (on tensor rank 0), the split ones on every rank; under pipeline parallelism each stage's, the
// tied wte on the first stage alone (part_owns): the squares of each run of tensors counted here, then
// summed in double over the tensor and pipeline groups and (when ZeRO shards the range) the data group.
inline float all_ranks_norm(Trainer& tr, const floatX* local) {
    GPT2& m = tr.model;
    float* out = m.memory.get<float>("grad_norm");
    if (m.tensor.size == 1 && m.pipeline.size == 1) return all_ranks_norm(m.shard, tr.dist, local, out, m.bwd.scratch, m.stream);
    const size_t lo = m.shard.optimizer_begin(), hi = lo + m.shard.optimizer_size();
    std::vector<std::pair<size_t, size_t>> counted;  // [begin, end) in the flat buffer
    const ModelPart part = model_part(m);
    for (int i = 0; i < kNumParameterTensors; ++i) {
        if (!part_owns(part, i)) continue;  // a replica: another tensor rank's, or the first stage's wte
        const size_t begin = std::max(lo, m.param_offsets[i]), end = std::min(hi, m.param_offsets[i] + m.param_sizes[i]);
        if (begin >= end) continue;
        if (!counted.empty() && counted.back().second == begin) counted.back().second = end;
        else counted.push_back({begin, end});
    }
    for (size_t k = 0; k < counted.size(); ++k)
        global_norm_squared(out + k, local + (counted[k].first - lo), counted[k].second - counted[k].first, m.bwd.scratch,
                            m.stream);
    std::vector<float> squares(counted.size());
    if (!counted.empty())
        CUDA_CHECK(recorded_copy(squares.data(), out, squares.size() * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    CUDA_CHECK(cudaStreamSynchronize(m.stream));
    double sum = 0;
    for (float x : squares) sum += x;
    if (m.tensor.size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, m.tensor.mpi));
    if (m.pipeline.size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, m.pipeline.mpi));
    if (m.shard.zero_stage > 0) sum = all_ranks_sum(tr.dist, sum);
    return float(std::sqrt(sum));
}

inline float global_gradient_norm(Trainer& tr) {
    const ShardLayout& sh = tr.model.shard;
    // stage 1 keeps all gradients and owns a shard of them; stage 2 keeps only its shard
    return all_ranks_norm(tr, sh.zero_stage == 1 ? tr.model.grads_memory + sh.shard_begin() : tr.model.grads_memory);
}

// The parameters' norm: not finite when any parameter is NaN or infinite (checked at start and before
// every checkpoint, so that no checkpoint of a diverged model is ever written).
inline float parameter_norm(Trainer& tr) { return all_ranks_norm(tr, tr.model.params_memory + tr.model.shard.optimizer_begin()); }

// The device work of one micro-step whose batch is uploaded (gpt2_upload): forward, backward and, when
// `reduce`, the reduction of the gradients on the communication stream, joined back into the compute
// stream. Nothing here depends on the batch's values, so it can be captured (run_micro_step).
inline void micro_step_device_work(Trainer& tr, bool reduce) {
    GPT2& m = tr.model;
    gpt2_forward_kernels(m, /*with_targets=*/true, /*write_dlogits=*/true);
    auto layer_done = [&](int l) { reduce_layer_gradients(tr, l); };
    auto before_layer = [&](int l) {  // stage 2: the layer buffer must be reduced before it is reused
        if (m.shard.zero_stage == 2 && l + 2 < m.config.num_layers)
            CUDA_CHECK(cudaStreamWaitEvent(m.stream, tr.layer_buffer_free[l % 2], 0));
    };
    gpt2_backward(m, reduce ? std::function<void(int)>(layer_done) : std::function<void(int)>(), before_layer);
    if (!reduce) return;
    // The next micro-step (or the optimizer) overwrites or reads what the reduction uses: wait for it.
    CUDA_CHECK(cudaEventRecord(tr.dist.comm_done, tr.dist.comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(m.stream, tr.dist.comm_done, 0));
}

// One micro-step's device work: launched kernel by kernel, or with ModelOptions::cuda_graphs replayed
// from a CUDA graph (CUDA C++ Programming Guide, "CUDA Graphs"): one host call instead of one per
// operation (323 for a d12 micro-step, 499 with the reduction), so the GPU never waits for the host
// between kernels.
// The graph is captured from the same calls the eager path makes, so the step computes the same bits.
inline void run_micro_step(Trainer& tr, bool reduce) {
    GPT2& m = tr.model;
    // Eager: without graphs, on the first step (heuristics and autotuning synchronize), and while the
    // launches are being recorded one by one (--profile-step, the roofline tool).
    if (!m.options.cuda_graphs || tr.steps_run == 0 || launch_record::recording()) {
        micro_step_device_work(tr, reduce);
        return;
    }
    if (m.B != tr.graph_B || m.T != tr.graph_T) drop_micro_step_graphs(tr);
    cudaGraphExec_t& exec = tr.micro_step_graphs[reduce];
    if (exec == nullptr) {
        const auto capture_failed = [&](const std::string& why) {
            cudaGraph_t partial = nullptr;
            (void)cudaStreamEndCapture(m.stream, &partial);
            if (partial) (void)cudaGraphDestroy(partial);
            (void)cudaGetLastError();
            throw TrainGptError("--cuda-graphs: capturing the micro-step failed: " + why +
                                " (--cuda-graphs off runs it without graphs)");
        };
        CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
        try {
            micro_step_device_work(tr, reduce);
        } catch (const TrainGptError& e) {
            capture_failed(e.what());
        }
        cudaGraph_t graph = nullptr;
        if (const cudaError_t ended = cudaStreamEndCapture(m.stream, &graph); ended != cudaSuccess)
            capture_failed(cudaGetErrorString(ended));
        CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &tr.micro_step_graph_nodes[reduce]));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
        tr.graph_B = m.B;
        tr.graph_T = m.T;
        if (tr.dist.rank == 0 && m.tensor.rank == 0)
            std::printf("cuda graph: the micro-step%s captured once (%zu operations), replayed from now on\n",
                        reduce ? " with its gradient reduction" : "", tr.micro_step_graph_nodes[reduce]);
    }
    CUDA_CHECK(cudaGraphLaunch(exec, m.stream));
}

// ---------------------------------------------------------------------------------------------
// Pipeline parallelism (parallel/pipeline.h): this stage's forward and backward passes of the step's
// micro-batches in the schedule's order, each micro-batch in its own slot of activations from its
// forward pass to its backward pass, the residual stream and its gradient exchanged with the
// neighbouring stages as host/pipeline_schedule.h's plan says (a send goes with the next receive).
// Then the tied embedding's gradient is summed between the first and the last stage, and the
// gradients are reduced over the data group as without pipeline parallelism.

// Every rank's plan for m micro-batches played out before the first step that runs them: a plan that
// would deadlock or take one message for another is refused here, by name, instead of hanging.
inline void check_pipeline_plan(const Trainer& tr, int micro_batches) {
    const GPT2& m = tr.model;
    std::vector<std::vector<PipelineAction>> plans;
    for (int r = 0; r < m.pipeline.size; ++r)
        plans.push_back(pipeline_actions(tr.schedule, m.pipeline.size, r, micro_batches, m.options.pipeline_chunks));
    if (const std::string problem = check_pipeline_exchanges(plans); !problem.empty())
        throw TrainGptError("--pp " + std::to_string(m.pipeline.size) + " --pp-schedule " + pipeline_schedule_name(tr.schedule) +
                            " with " + std::to_string(micro_batches) + " micro-batches: the stages' exchanges cannot run (" +
                            problem + "); use more micro-batches (-d) or another schedule");
}

inline void pipeline_micro_steps(Trainer& tr, const std::vector<const int*>& inputs, const std::vector<const int*>& targets,
                                 int B, int T, float grad_scale, float* losses) {
    GPT2& m = tr.model;
    const PipelineParallel& pipe = m.pipeline;
    const int micro_batches = int(inputs.size()), slots = int(m.slots.size());
    if (tr.pipeline_plans_checked.insert(micro_batches).second) check_pipeline_plan(tr, micro_batches);
    const size_t BT = size_t(B) * T;
    // Each (micro-batch, chunk) in flight holds a slot from its forward pass to its backward pass.
    std::vector<std::pair<int, int>> in_slot(size_t(slots), {-1, -1});
    const auto slot_of = [&](int j, int chunk) {
        for (int k = 0; k < slots; ++k)
            if (in_slot[size_t(k)] == std::pair<int, int>{j, chunk}) return k;
        throw TrainGptError("pipeline: micro-batch " + std::to_string(j) + " (chunk " + std::to_string(chunk) +
                            ") has no activations in flight");
    };
    int backwards = 0;  // backward passes so far: they use the two gradient buffers in turn
    const floatX* sent_gradient = nullptr;  // the last backward pass's, sent with the next group
    // ZeRO-2: each backward pass reduces its layers' gradients as it goes (into this rank's shard); the
    // global tensors' accumulate over the step and are reduced after it, as with ZeRO-0 and 1.
    const bool per_pass = m.shard.zero_stage == 2;
    if (per_pass) CUDA_CHECK(recorded_memset(m.grads.wte, 0, m.plan.bytes_of("grad_global_buffer"), m.stream));
    const auto layer_done = [&](int l) {
        if (l >= 0) reduce_layer_gradients(tr, l);
    };
    const auto before_layer = [&](int l) {  // the layer buffer must be reduced before it is reused
        CUDA_CHECK(cudaStreamWaitEvent(m.stream, tr.layer_buffer_free[l % 2], 0));
    };
    for (const PipelineAction& a : pipeline_actions(tr.schedule, pipe.size, pipe.rank, micro_batches, m.options.pipeline_chunks)) {
        const int j = a.op.micro_batch;
        if (a.has_op && a.op.forward) {  // a free slot (the schedule keeps at most `slots` in flight)
            int k = 0;
            while (k < slots && in_slot[size_t(k)].first != -1) ++k;
            if (k == slots)
                throw TrainGptError("pipeline: micro-batch " + std::to_string(j) + " finds all " + std::to_string(slots) +
                                    " planned activation slots in flight");
            in_slot[size_t(k)] = {j, a.op.chunk};
            select_micro_batch(m, k);
            m.chunk = a.op.chunk;
            progress(tr, "a training step", tr.optimizer.step + 1);
            upload_micro_batch(tr, inputs[size_t(j)], targets[size_t(j)], B, T, grad_scale);
        }
        // The group: outputs not sent yet, and the inputs of this operation (into its slot) and, in a
        // forward-backward pair, of the backward after it (into the next gradient buffer).
        floatX* next_gradient = m.dresidual_buffers[backwards % 2];
        NCCL_CHECK(ncclGroupStart());
        for (const PipelineMessage& s : a.sends)  // from the slot of the micro-batch and chunk it belongs to
            send_stage_boundary(m, s.activation ? stage_output(m, slot_of(s.micro_batch, s.chunk), s.chunk) : sent_gradient,
                                s.peer, s.activation);
        for (const PipelineMessage& r : a.receives)
            receive_stage_boundary(m, r.activation ? stage_input(m) : next_gradient, r.peer, r.activation);
        NCCL_CHECK(ncclGroupEnd());
        for (const PipelineMessage& r : a.receives) complete_stage_boundary(m, r.activation ? stage_input(m) : next_gradient);
        if (!a.has_op) continue;
        if (a.op.forward) {
            gpt2_forward_kernels(m, /*with_targets=*/true, /*write_dlogits=*/true);
            if (classifies(m))
                CUDA_CHECK(recorded_copy(losses + size_t(j) * BT, m.acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost,
                                         m.stream));
        } else {
            const int k = slot_of(j, a.op.chunk);
            select_micro_batch(m, k);
            m.chunk = a.op.chunk;
            m.bwd.dresidual = m.dresidual_buffers[backwards++ % 2];
            if (per_pass) gpt2_backward(m, layer_done, before_layer);
            else gpt2_backward(m);
            sent_gradient = m.bwd.dresidual;
            in_slot[size_t(k)] = {-1, -1};
        }
    }
    // The tied embedding: the first stage's gradient of the input embedding plus the last stage's of the
    // output head, on both (so the two copies of wte take the same update).
    if (pipe.embedding_nccl)
        NCCL_CHECK(ncclAllReduce(m.grads.wte, m.grads.wte, m.param_sizes[0], kNcclFloatX, ncclSum, pipe.embedding_nccl, m.stream));
    for (int l = per_pass ? -1 : m.config.num_layers - 1; l >= -1; --l) reduce_layer_gradients(tr, l);
    CUDA_CHECK(cudaEventRecord(tr.dist.comm_done, tr.dist.comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(m.stream, tr.dist.comm_done, 0));
}

struct StepResult {
    double loss = 0;            // mean over the step's valid targets, all micro-steps and ranks
    float grad_norm = 0;        // before clipping
    long long valid_targets = 0;
    bool updated = false;       // false: the step was skipped (no valid target, or skipped_because)
    std::string skipped_because;  // why a step with valid targets did not update: host/divergence.h
};

// One optimizer step over this rank's micro-batches (host arrays of B*T tokens each; every rank passes
// the same number). The loss is the mean over all valid targets of the step: their count is summed
// over micro-steps and ranks before any backward pass, so no mean of means is ever taken.
// `guard` decides which steps must not update (host/divergence.h); without one, those whose loss or
// gradient norm is not finite.
inline StepResult train_step(Trainer& tr, const std::vector<const int*>& inputs, const std::vector<const int*>& targets,
                             int B, int T, float learning_rate, const DivergenceGuard* guard = nullptr) {
    GPT2& m = tr.model;
    const ShardLayout& sh = m.shard;
    long long local_valid = 0;
    for (const int* t : targets)
        for (int i = 0; i < B * T; ++i) local_valid += t[i] != -1;
    StepResult result;
    result.valid_targets = all_ranks_sum(tr.dist, local_valid);
    if (result.valid_targets == 0) return result;
    const float grad_scale = float(sh.world_size) / float(result.valid_targets);

    gpt2_zero_grad(m);
    const size_t micro_steps = inputs.size(), BT = size_t(B) * T;
    float* losses = reserve_step_losses(tr, micro_steps * BT);
    if (m.pipeline.size > 1) pipeline_micro_steps(tr, inputs, targets, B, T, grad_scale, losses);
    for (size_t s = 0; s < micro_steps && m.pipeline.size == 1; ++s) {
        progress(tr, "a training step", tr.optimizer.step + 1);
        upload_micro_batch(tr, inputs[s], targets[s], B, T, grad_scale);
        // Stages 0-1 accumulate full gradients over the micro-steps and reduce after the last one;
        // stage 2 keeps no full gradients, so it reduces after every micro-step.
        run_micro_step(tr, sh.zero_stage == 2 || s + 1 == micro_steps);
        CUDA_CHECK(recorded_copy(losses + s * BT, m.acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
    }
    ++tr.steps_run;
    CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the step's one wait before its norm: the losses are here
    double loss_sum = 0;
    if (m.pipeline.last())  // the losses are the last stage's; it tells the other stages
        for (size_t s = 0; s < micro_steps; ++s) loss_sum += sum_of_losses(losses + s * BT, BT);  // as micro-step sums
    loss_sum = all_ranks_sum(tr.dist, loss_sum);
    if (m.pipeline.size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, m.pipeline.mpi));
    result.loss = loss_sum / double(result.valid_targets);
    result.grad_norm = global_gradient_norm(tr);
    static const DivergenceGuard finite_only(DivergenceSettings{});
    result.skipped_because = (guard ? *guard : finite_only).skip_reason(result.loss, result.grad_norm);
    if (!result.skipped_because.empty()) return result;
    const float max_norm = tr.optimizer.config.grad_clip;
    const float clip = max_norm > 0 && result.grad_norm > max_norm ? max_norm / result.grad_norm : 1.0f;
    optimizer_update(tr.optimizer, tr.dist, m.params_memory, m.grads_memory, learning_rate, clip, m.stream);
    CUDA_CHECK(cudaStreamSynchronize(m.stream));
    result.updated = true;
    return result;
}

// ---------------------------------------------------------------------------------------------
// The program: configuration, the model (a preset or an llm.c checkpoint), the memory plan
// (--dry-run), the data, and the training loop with evaluation, sampling, checkpoints and reports.

inline ModelHeader header_of(const GPT2Config& c) { return {c, std::is_same_v<floatX, float> ? 3 : 5}; }

// Loads llm.c checkpoint parameters (FP32 or BF16 file, whatever the build) into the model: under tensor
// parallelism this rank's slices of them.
inline void load_model_parameters(GPT2& m, const std::string& path) {
    std::vector<float> file = read_model_parameters_as_float(path, m.whole_config);
    if (m.tensor.size > 1 || m.pipeline.size > 1) file = model_shard(file, m.whole_config, model_part(m));
    std::vector<floatX> params(file.size());
    for (size_t i = 0; i < file.size(); ++i) params[i] = from_float<floatX>(file[i]);
    copy_and_wait(m, m.params_memory, params.data(), params.size() * sizeof(floatX), cudaMemcpyHostToDevice);
}

// Per-token losses (0 where a target is -1) of one forward pass, copied to the host.
inline void forward_token_losses(GPT2& m, const int* inputs, const int* targets, int B, int T, float* losses) {
    gpt2_forward(m, inputs, targets, B, T, 0.0f);
    // Each row's first T of the pass's m.T positions (more when sequence parallelism padded the rows).
    if (m.options.last_stage())
        for (int b = 0; b < B; ++b)
            CUDA_CHECK(recorded_copy(losses + size_t(b) * T, m.acts.losses + size_t(b) * m.T, size_t(T) * sizeof(float),
                                     cudaMemcpyDeviceToHost, m.stream));
    CUDA_CHECK(cudaStreamSynchronize(m.stream));
    from_last_stage(m, losses, size_t(B) * T);
}

// The whole sequences the model's context group runs: T cp positions, T on each rank (parallel/context.h).
inline ZigzagLayout sequence_layout(const GPT2& m) { return {m.max_tokens * m.context.size, m.context.size}; }

// Context parallelism: this rank's rows (parallel/context.h's zigzag chunks) of B whole sequences of T
// token ids or targets.
inline std::vector<int> context_rows(const int* whole, int B, int T, const ContextRing& ring) {
    const ZigzagLayout z{T, ring.size};
    std::vector<int> mine(size_t(B) * z.local_length(ring.rank));
    zigzag_rows(mine.data(), whole, B, z, ring.rank);
    return mine;
}
// The same of B rows of T <= T cp tokens (evaluation's own lengths) padded with `fill` to whole sequences
// of the model's T cp: the ring runs nothing shorter, and the causal mask keeps the padding from the tokens.
inline std::vector<int> padded_context_rows(const GPT2& m, const int* rows, int B, int T, int fill) {
    const int whole_T = sequence_layout(m).T;
    std::vector<int> whole(size_t(B) * whole_T, fill);
    for (int r = 0; r < B; ++r) std::copy(rows + size_t(r) * T, rows + size_t(r + 1) * T, whole.begin() + ptrdiff_t(r) * whole_T);
    return context_rows(whole.data(), B, whole_T, m.context);
}

// forward_token_losses of B rows of T tokens (T up to the whole sequence), every rank of a context group
// together under --cp: the rows padded to whole sequences (no targets there) and dealt out, and every
// rank's token losses gathered back into sequence order (HellaSwag).
inline void sequence_token_losses(GPT2& m, const int* inputs, const int* targets, int B, int T, float* losses) {
    if (m.context.size == 1) return forward_token_losses(m, inputs, targets, B, T, losses);
    const ZigzagLayout z = sequence_layout(m);
    const std::vector<int> mine = padded_context_rows(m, inputs, B, T, 0), mine_targets = padded_context_rows(m, targets, B, T, -1);
    const size_t local = size_t(B) * m.max_tokens;  // every rank's (T cp is a multiple of 2 cp)
    std::vector<float> all(local * size_t(m.context.size)), whole(size_t(B) * z.T);
    forward_token_losses(m, mine.data(), mine_targets.data(), B, m.max_tokens, all.data() + local * size_t(m.context.rank));
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), int(local), MPI_FLOAT, m.context.mpi));
    for (int r = 0; r < m.context.size; ++r) unzigzag_rows(whole.data(), all.data() + local * size_t(r), B, z, r);
    for (int r = 0; r < B; ++r)
        std::copy(whole.begin() + ptrdiff_t(r) * z.T, whole.begin() + ptrdiff_t(r) * z.T + T, losses + size_t(r) * T);
}

// The logits over the real vocabulary at the last of n tokens (an inference forward pass).
// Under tensor parallelism every rank of the group calls it: each holds its vocabulary's columns, and
// the group gathers the row. Under context parallelism every rank of the context group calls it (n up
// to the whole sequence of T cp tokens): the rank holding position n - 1 shares its row.
inline std::vector<float> next_token_logits(GPT2& m, const int* tokens, int n) {
    const int Vr = vocab_rows_per_rank(m.config, m.tensor.size);
    std::vector<floatX> row(size_t(Vr) * m.tensor.size);
    ZigzagLayout::Row last{0, n - 1};  // the context rank and local row of position n - 1
    if (m.context.size > 1) {  // the n tokens padded to a whole sequence and dealt out like a training batch
        const std::vector<int> rows = padded_context_rows(m, tokens, 1, n, 0);
        gpt2_forward(m, rows.data(), nullptr, 1, m.max_tokens, 0.0f);
        last = sequence_layout(m).row_of(n - 1);
    } else {
        gpt2_forward(m, tokens, nullptr, 1, n, 0.0f);
    }
    // gpt2_forward without targets returns with the logits still being computed on m.stream.
    // This rank's columns go to its place in the row (the in-place all-gather sends them from there).
    floatX* mine = row.data() + size_t(m.tensor.rank) * Vr;
    if (m.options.last_stage()) {
        if (last.rank == m.context.rank)
            copy_and_wait(m, mine, m.acts.logits + size_t(last.row) * Vr, Vr * sizeof(floatX), cudaMemcpyDeviceToHost);
        if (m.context.size > 1)
            MPI_CHECK(MPI_Bcast(mine, int(Vr * sizeof(floatX)), MPI_BYTE, last.rank, m.context.mpi));
    }
    from_last_stage(m, row.data(), row.size());  // each stage's tensor rank t: the last stage's columns of t
    if (m.tensor.size > 1)
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, row.data(), int(Vr * sizeof(floatX)), MPI_BYTE, m.tensor.mpi));
    std::vector<float> logits(m.config.vocab_size);
    for (size_t v = 0; v < logits.size(); ++v) logits[v] = to_float(row[v]);
    return logits;
}

// The model as evaluation calls it (host/evaluation.h: validation loss, HellaSwag, sampling).
inline EvaluatedModel evaluated_model(Trainer& tr) {
    GPT2& m = tr.model;
    return {[&tr, &m](const int* inputs, const int* targets) {
                progress(tr, "validation", tr.optimizer.step);
                if (m.context.size > 1) {  // B x T cp whole sequences: this rank's rows of them
                    const int T = sequence_layout(m).T;
                    const std::vector<int> mine = context_rows(inputs, m.max_batch, T, m.context),
                                           mine_targets = context_rows(targets, m.max_batch, T, m.context);
                    const double sum = gpt2_forward(m, mine.data(), mine_targets.data(), m.max_batch, m.max_tokens, 0.0f);
                    return std::pair<double, long long>(sum, m.valid_targets);
                }
                const double sum = gpt2_forward(m, inputs, targets, m.max_batch, m.max_tokens, 0.0f);
                return std::pair<double, long long>(sum, m.valid_targets);
            },
            [&tr, &m](const int* inputs, const int* targets, int b, int t, float* losses) {
                progress(tr, "HellaSwag", tr.optimizer.step);
                sequence_token_losses(m, inputs, targets, b, t, losses);
            },
            [&m](const int* tokens, int n) { return next_token_logits(m, tokens, n); },
            // A window of up to the whole sequence; under --cp every rank of the context group runs it, and
            // they keep context rank 0's draw (their generators need not agree). The context group runs each
            // sequence together (sampling, HellaSwag).
            sequence_layout(m).T, m.context.size,
            [&m](int token) {
                if (m.context.size > 1) MPI_CHECK(MPI_Bcast(&token, 1, MPI_INT, 0, m.context.mpi));
                return token;
            }};
}

// Collective over data rank 0's tensor x pipeline ranks (the others return at once): the whole model's
// parameters at world rank 0, from those ranks' parts, and what writes them there.
inline std::function<void(const std::string&)> gather_model_writer(Trainer& tr) {
    GPT2& m = tr.model;
    if (tr.dist.rank != 0) return [](const std::string&) {};
    std::vector<floatX> local(m.num_parameters);
    copy_and_wait(m, local.data(), m.params_memory, local.size() * sizeof(floatX), cudaMemcpyDeviceToHost);
    const int tp = m.tensor.size, pp = m.pipeline.size, chunks = m.options.pipeline_chunks;
    std::vector<ModelPart> parts;
    std::vector<size_t> sizes;
    for (int r = 0; r < tp * pp; ++r) {  // the model group's ranks in world order: tensor fastest, then stage
        parts.push_back(part_of_rank(r, tp, pp, chunks));
        sizes.push_back(model_part_num_parameters(m.whole_config, tp, pp, parts.back().stage, chunks));
    }
    std::vector<std::vector<floatX>> locals = gather_model_parts(tr.model_mpi, local, sizes);
    if (m.tensor.rank != 0 || m.pipeline.rank != 0) return [](const std::string&) {};
    auto whole = std::make_shared<std::vector<floatX>>(tp * pp == 1 ? std::move(locals[0])
                                                                    : model_unshard(locals, parts, m.whole_config));
    const ModelHeader header = header_of(m.whole_config);
    return [whole, header](const std::string& path) { write_model_checkpoint(path, header, whole->data(), whole->size()); };
}

// The training state as checkpoints read and write it (host/checkpointing.h): every rank of the run
// together; the parameters through the model (in its precision, tensor slices gathered into the whole
// model), and this rank's range of the optimizer, which lies in the whole model's flat buffer as
// optimizer_state_pieces says (parallel/pipeline.h).
inline CheckpointedTraining checkpointed(Trainer& tr) {
    GPT2& m = tr.model;
    const GPT2Config config = m.whole_config;
    const int tp = m.tensor.size, pp = m.pipeline.size, cp = m.context.size, chunks = m.options.pipeline_chunks;
    const int data_ranks = tr.dist.world_size, zero_stage = m.shard.zero_stage;
    return {tr.world, tr.optimizer, m.stream, gpt2_num_parameters(config), sizeof(floatX),
            [&tr] { return gather_model_writer(tr); },
            [&m](const std::string& path) { load_model_parameters(m, path); }, [&tr] { return parameter_norm(tr); },
            [&tr](const char* what, int64_t step) { progress(tr, what, step); },
            [config, tp, pp, cp, chunks, data_ranks, zero_stage](int rank) {
                return optimizer_state_pieces(config, tp, pp, data_ranks, zero_stage, rank, chunks, cp);
            }};
}

// The run's fixed facts, decided before anything is allocated: the model, how it runs, its shard.
struct RunPlan {
    GPT2Config config;
    std::string checkpoint;  // the llm.c checkpoint the parameters come from ("" for a preset)
    ModelOptions options;
    int world = 1;  // the planned world size (--dry-run may plan for more ranks than run it)
    int data_ranks = 1;  // world / (--tp x --pp): the ranks ZeRO shards over and gradients are reduced over
    int batch_ranks = 1;  // data_ranks / --cp: the ranks that read different batches (a context group shares one)
    int local_T = 1;      // the tokens of each sequence a rank holds: -t / --cp
    int micro_batches = 1;  // per step and data rank, at the largest batch (the pipeline's micro-batches)
    size_t num_parameters = 0;  // the whole model's
    ShardLayout shard;  // of this rank's parameters (its slices under tensor parallelism) over the data ranks
    MemoryPlan memory;
    size_t budget = 0;  // device bytes a rank may use
};

inline RunPlan plan_run(const RunConfig& rc, const Distributed& dist) {
    RunPlan p;
    p.world = planned_world_size(rc, dist.world_size);
    p.config = with_shape_flags(model_config_of(rc.model, rc.seq_len, &p.checkpoint), rc.layers, rc.heads, rc.channels,
                                p.checkpoint);
    p.options = {.recompute = recompute_of(rc.recompute),
                 .attention = attention_of(rc.attention, kEmulatedDevice),
                 .doc_mask = rc.doc_mask, .doc_positions = rc.doc_positions, .matmul_autotune = rc.matmul_autotune,
                 .fuse_bias_grad = rc.bias_grad != "kernels", .bias_grad_in_output_type = rc.bias_grad == "epilogue",
                 .fused_attention_backward = rc.attention_backward == "fused",
                 .cuda_graphs = rc.cuda_graphs == "on" && rc.pp == 1, .tensor_parallel = rc.tp,
                 .sequence_parallel = rc.tp > 1 && rc.sequence_parallel != "off", .pipeline_parallel = rc.pp,
                 .context_parallel = rc.cp};
    if (p.world % (rc.tp * rc.pp) != 0)
        throw std::runtime_error(model_parallel_flags(rc.tp, rc.pp) + " does not divide the " + std::to_string(p.world) +
                                 " ranks (--world-size or those launched): world = data x pipeline x tensor");
    p.data_ranks = p.world / (rc.tp * rc.pp);
    if (const std::string problem = context_parallel_problem(rc.seq_len, rc.cp); !problem.empty())
        throw std::runtime_error(problem);
    if (p.data_ranks % rc.cp != 0)
        throw std::runtime_error(model_parallel_flags(rc.tp, rc.pp, rc.cp) + " does not divide the " + std::to_string(p.world) +
                                 " ranks (--world-size or those launched): world = data x " + (rc.pp > 1 ? "pipeline x " : "") +
                                 "context" + (rc.tp > 1 ? " x tensor" : ""));
    p.batch_ranks = p.data_ranks / rc.cp;
    p.local_T = rc.seq_len / rc.cp;
    // This rank's stage, and the micro-batches its schedule keeps in flight at the largest batch (the
    // schedule's most: host/pipeline_schedule.h).
    const int chunks = rc.pp > 1 && rc.pp_schedule == "interleaved" ? rc.pp_virtual : 1;
    const ModelPart part = part_of_rank(dist.rank % p.world, rc.tp, rc.pp, chunks, rc.cp);
    p.options.pipeline_stage = part.stage;
    p.options.pipeline_chunks = chunks;
    p.micro_batches = int(total_batch_tokens_for(rc, p.batch_ranks) / (int64_t(rc.batch_size) * rc.seq_len * p.batch_ranks));
    if (rc.pp > 1) {
        const PipelineSchedule schedule = pipeline_schedule_of(rc.pp_schedule);
        if (const std::string problem = pipeline_problem(schedule, rc.pp, p.micro_batches, rc.pp_virtual); !problem.empty())
            throw std::runtime_error(problem);
        p.options.micro_batches_in_flight =
            simulate_pipeline(schedule, rc.pp, p.micro_batches, rc.pp_virtual).max_in_flight[size_t(part.stage)];
    }
    if (const std::string problem = gpt2_check_build(p.config, rc.batch_size, p.local_T, rc.zero_stage, p.options);
        !problem.empty())  // named with the shape flags where they made the shape
        throw std::runtime_error(model_label(rc) == rc.model ? problem : "-e " + model_label(rc) + ": " + problem);
    p.num_parameters = gpt2_num_parameters(p.config);
    // Tensor ranks are consecutive, then context ranks, pipeline stages (parallel/pipeline.h, part_of_rank).
    p.shard = shard_layout(model_part_num_parameters(p.config, rc.tp, rc.pp, part.stage, chunks),
                           data_rank_of(dist.rank % p.world, rc.tp, rc.pp, rc.cp), p.data_ranks, rc.zero_stage);
    p.memory = gpt2_memory_plan(p.config, rc.batch_size, p.local_T, p.shard, p.options);
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    p.budget = rc.max_memory > 0 ? size_t(rc.max_memory * double(size_t(1) << 30)) : free_bytes;
    return p;
}

// --pp-print-schedule: the pipeline's schedule for the step's micro-batches per data rank
// (host/pipeline_schedule.h, which refuses what it cannot schedule; rank 0 prints).
inline void print_pipeline_schedule(const RunConfig& rc, const Distributed& dist) {
    const int world = planned_world_size(rc, dist.world_size), model_ranks = rc.tp * rc.pp * rc.cp;
    if (world % model_ranks != 0)
        throw std::runtime_error(model_parallel_flags(rc.tp, rc.pp, rc.cp) + " does not divide the " + std::to_string(world) +
                                 " ranks (--world-size or those launched)");
    const int data_ranks = world / model_ranks;  // each reads its own batches (a context group shares one)
    const int micro_batches = int(total_batch_tokens_for(rc, data_ranks) / (int64_t(rc.batch_size) * rc.seq_len * data_ranks));
    const std::string table = pipeline_schedule_table(pipeline_schedule_of(rc.pp_schedule), rc.pp, micro_batches, rc.pp_virtual);
    const std::string others = (rc.cp > 1 ? " x " + std::to_string(rc.cp) + " context" : "") +
                               (rc.tp > 1 ? " x " + std::to_string(rc.tp) + " tensor" : std::string());
    if (dist.rank == 0)
        std::printf("%d ranks = %d data x %d pipeline%s; %d micro-batches of %d x %d per data rank and step\n%s", world,
                    data_ranks, rc.pp, others.c_str(), micro_batches, rc.batch_size, rc.seq_len, table.c_str());
}

// --dry-run: the plan, and the largest micro-batch that fits in each recompute mode (rank 0 prints).
inline void print_dry_run(const RunConfig& rc, const RunPlan& p) {
    const auto fits = [&](Recompute r) {
        ModelOptions options = p.options;
        options.recompute = r;
        return largest_fitting_batch([&](int B) { return gpt2_memory_plan(p.config, B, p.local_T, p.shard, options).total(); },
                                     p.budget);
    };
    const LargestBatches largest{fits(Recompute::none), fits(Recompute::selective), fits(Recompute::full)};
    const TensorTraffic traffic = tensor_traffic(p.config, rc.batch_size, p.local_T, rc.tp, p.options.sequence_parallel,
                                                 p.options.recompute, sizeof(floatX));
    PipelinePlan pipeline;
    if (rc.pp > 1) {  // every stage's plan (data rank 0's shard), and the schedule played out
        const PipelineSchedule schedule = pipeline_schedule_of(rc.pp_schedule);
        const PipelineTimeline timeline = simulate_pipeline(schedule, rc.pp, p.micro_batches, rc.pp_virtual);
        pipeline = {rc.pp_schedule, rc.pp, p.micro_batches, rc.pp_virtual, timeline.bubble_fraction,
                    pipeline_bubble_formula(schedule, rc.pp, p.micro_batches, rc.pp_virtual),
                    double(sequence_rows(size_t(rc.batch_size) * p.local_T, p.options)) * p.config.channels * sizeof(floatX) /
                        (p.options.sequence_parallel ? 1 : rc.tp),
                    {}};
        for (int stage = 0; stage < rc.pp; ++stage) {
            ModelOptions options = p.options;
            options.pipeline_stage = stage;
            options.micro_batches_in_flight = timeline.max_in_flight[size_t(stage)];
            const ShardLayout shard = shard_layout(
                model_part_num_parameters(p.config, rc.tp, rc.pp, stage, options.pipeline_chunks), 0, p.data_ranks, rc.zero_stage);
            const MemoryPlan plan = gpt2_memory_plan(p.config, rc.batch_size, p.local_T, shard, options);
            const StageLayers layers = stage_layers(p.config.num_layers, rc.pp, stage, options.pipeline_chunks);
            pipeline.per_stage.push_back({layers.chunks[0].first, layers.total(), options.micro_batches_in_flight, plan.total(),
                                          plan.group_bytes("activations")});
        }
    }
    std::printf("%s", dry_run_report(rc, p.memory, p.num_parameters, p.world, p.budget, largest, kPrecisionName,
                                     attention_kernels_name(p.options).c_str(), traffic, pipeline).c_str());
}

// The same of each micro-batch of a step; every rank of a context group reads the same batches.
inline StepBatches context_rows(const StepBatches& whole, int B, int T, const ContextRing& ring) {
    StepBatches mine;
    for (size_t s = 0; s < whole.inputs.size(); ++s) {
        mine.inputs.push_back(context_rows(whole.inputs[s].data(), B, T, ring));
        mine.targets.push_back(context_rows(whole.targets[s].data(), B, T, ring));
    }
    for (size_t s = 0; s < mine.inputs.size(); ++s) {
        mine.input_ptrs.push_back(mine.inputs[s].data());
        mine.target_ptrs.push_back(mine.targets[s].data());
    }
    return mine;
}

// --profile-step: a warm-up step, then one step with every launch recorded and timed (dev/roofline.h).
inline void profile_step(Trainer& tr, const RunPlan& p, StepBatches& batches, int64_t batch_tokens, float lr, int B, int T,
                         const char* device, double peak) {
    double upload_s = 0;  // the recorded step's (the last call's)
    const auto [seconds, records] = record_one_step([&] {
        const double before = tr.upload_seconds;
        train_step(tr, batches.input_ptrs, batches.target_ptrs, B, p.local_T, lr);
        upload_s = tr.upload_seconds - before;
    });
    if (tr.dist.rank == 0 && tr.model.tensor.rank == 0)
        std::printf("%s", profile_report(records, seconds, double(batch_tokens), tr.dist.world_size, int64_t(p.num_parameters),
                                         p.config.num_layers, p.config.channels, T, device, peak,
                                         HostUploads{upload_s, int(batches.input_ptrs.size())}).c_str());
}

// The parameters (initialized, from an llm.c checkpoint, or with -y the whole training state from the
// latest checkpoint of the run), checked finite; returns the step to start from.
inline int64_t start_training(Trainer& tr, const RunConfig& rc, const RunPlan& p, DataLoader& loader, Rng& sample_rng,
                              RunInfo* run) {
    if (p.checkpoint.empty()) gpt2_init_weights(tr.model, uint64_t(rc.seed));
    else load_model_parameters(tr.model, p.checkpoint);
    trainer_start(tr);
    const int64_t step = rc.resume ? resume_checkpoint(checkpointed(tr), rc, loader, sample_rng, run) : 0;
    if (!std::isfinite(parameter_norm(tr)))
        throw std::runtime_error("model '" + (rc.resume ? model_checkpoint_path(rc.output_dir, step) : p.checkpoint) +
                                 "': parameters are not finite (NaN or Inf)");
    return step;
}

// --matmul-autotune's picks kept in a file (host/matmul_algos.h), so that a later run or a resume takes
// the same algorithms instead of timing them again (and getting other last bits).
struct KeptMatmulAlgos {
    std::string path;     // this rank's file; "" = none kept
    int timed_kept = 0;   // PlanCache::timed when it was last written
    bool reported = false;
};

// Takes the picks of this rank's file (--matmul-algos, else -o's matmul_algos.json) where it exists. A file
// that does not read stops the run (one line naming it and the field); one written with another cuBLASLt,
// device or precision is timed over and rewritten, with a note.
inline KeptMatmulAlgos take_kept_matmul_algos(Matmul& mm, const RunConfig& rc, const Distributed& dist) {
    KeptMatmulAlgos kept;
    if (!rc.matmul_autotune) return kept;
    const std::string path = !rc.matmul_algos.empty() ? rc.matmul_algos
                             : rc.output_dir.empty()   ? ""
                                                       : rc.output_dir + "/matmul_algos.json";
    if (path.empty()) return kept;
    kept.path = matmul_algos_path_of_rank(path, dist.rank, dist.world_size);
    if (!std::filesystem::exists(kept.path)) {  // -o is made before the first step's end; another folder must exist
        const std::filesystem::path dir = std::filesystem::path(kept.path).parent_path();
        if (!rc.matmul_algos.empty() && !dir.empty() && !std::filesystem::is_directory(dir))
            throw std::runtime_error("--matmul-algos '" + kept.path + "': no directory '" + dir.string() + "' to write it in");
        return kept;
    }
    const std::string why_not = matmul_take_algos(mm, read_matmul_algos(kept.path));
    if (!why_not.empty())
        std::fprintf(stderr, "note: matmul autotune: '%s' was %s: its shapes are timed again and the file rewritten\n",
                     kept.path.c_str(), why_not.c_str());
    return kept;
}

// After a step: writes the picks where shapes were timed since the last write; the first time, says on the
// main rank how many shapes were timed and how many took a recorded pick. A file that cannot be written is a
// warning (the run goes on; a later run times those shapes again).
inline void keep_matmul_algos(const Matmul& mm, KeptMatmulAlgos& kept, bool main_rank) {
    if (!mm.autotune) return;
    const matmul_detail::PlanCache& cache = *mm.plans;
    if (main_rank && !kept.reported && kept.path.empty())
        std::printf("matmul autotune: %d GEMM shapes timed (picks are kept in a file only with -o or --matmul-algos)\n",
                    cache.timed);
    else if (main_rank && !kept.reported)
        std::printf("matmul autotune: %d GEMM shapes timed, %d took the picks recorded in '%s'\n", cache.timed,
                    cache.from_record, kept.path.c_str());
    kept.reported = true;
    if (kept.path.empty() || cache.timed == kept.timed_kept) return;
    kept.timed_kept = cache.timed;
    try {
        write_matmul_algos(kept.path, matmul_algos(mm));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "warning: %s: a later run will time these shapes again\n", e.what());
    }
}

// ---------------------------------------------------------------------------------------------
// --generate: text from a model file, a run's newest complete checkpoint, or a preset (its seeded
// initialization), one sequence on one rank; no training data, gradients or optimizer state.

// -e names a model file or preset, or a run directory: then its newest complete checkpoint's model.
inline std::string generation_model(const std::string& model) {
    if (!std::filesystem::is_directory(model)) return model;
    const std::optional<int64_t> step = latest_complete_checkpoint(model);
    if (!step) throw std::runtime_error("-e/--model '" + model + "': a directory that holds no complete checkpoint");
    return model_checkpoint_path(model, *step);
}

inline int generate(const RunConfig& rc, const Distributed& dist) {
    if (dist.world_size != 1)
        throw std::runtime_error("--generate runs one sequence on one rank, not " + std::to_string(dist.world_size));
    std::string checkpoint;
    const GPT2Config config = with_shape_flags(model_config_of(generation_model(rc.model), rc.seq_len, &checkpoint),
                                               rc.layers, rc.heads, rc.channels, checkpoint);
    const std::optional<Tokenizer> tokenizer = tokenizer_beside(rc.train_data);
    const int eot = tokenizer ? tokenizer->eot_token() : int(Tokenizer::kGpt2Eot), context = config.max_seq_len;
    std::vector<int> prompt = {eot};  // as every document of the training data begins
    if (!rc.prompt_ids.empty()) prompt = parse_token_ids(rc.prompt_ids, config.vocab_size);
    if (!rc.prompt.empty())
        for (int id : encode_prompt(rc.prompt, config.vocab_size)) prompt.push_back(id);
    if (int(prompt.size()) >= context)
        throw std::runtime_error("--generate: the prompt's " + std::to_string(prompt.size()) +
                                 " tokens leave no room in the model's context of " + std::to_string(context));
    const int count = std::min(rc.max_tokens, context - int(prompt.size()));
    if (count < rc.max_tokens)
        std::fprintf(stderr, "note: at most %d tokens, not --max-tokens %d: the model's context ends at %d positions\n", count,
                     rc.max_tokens, context);

    // Forward passes only: one layer's activations at a time (Recompute::full's buffers) and the cache.
    GPT2 model;
    CUDA_CHECK(cudaStreamCreateWithFlags(&model.stream, cudaStreamNonBlocking));
    const ModelOptions options{.recompute = Recompute::full, .attention = attention_of(rc.attention, kEmulatedDevice),
                               .inference = true, .matmul_autotune = rc.matmul_autotune};
    gpt2_build(model, config, 1, int(prompt.size()) + count, 0, 1, 0, options);
    KeptMatmulAlgos kept_algos = take_kept_matmul_algos(model.matmul, rc, dist);
    if (checkpoint.empty()) gpt2_init_weights(model, uint64_t(rc.seed));
    else load_model_parameters(model, checkpoint);

    const bool cached = rc.kv_cache == "on";
    const NextTokenLogits next = [&](const std::vector<int>& tokens, int fresh) {
        return cached ? gpt2_forward_cached(model, tokens.data() + tokens.size() - fresh, fresh)
                      : next_token_logits(model, tokens.data(), int(tokens.size()));
    };
    if (tokenizer) std::printf("%s", tokenizer->decode(std::vector<int>(prompt.begin() + (prompt[0] == eot), prompt.end())).c_str());
    Rng rng = sampling_rng(rc.seed);
    const auto start = std::chrono::steady_clock::now();
    double first = 0;
    const std::vector<int> generated = generate_tokens(next, prompt, count, eot, sampling_settings_of(rc), rng, [&](int token) {
        if (first == 0) first = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (tokenizer) std::printf("%s", token == eot ? "" : tokenizer->decode(token).c_str());
        else std::printf("%d ", token);
        std::fflush(stdout);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("\n");
    std::fprintf(stderr, "generate: %zu prompt tokens, %zu generated%s in %.2f s: the first after %.3f s, then %.1f tokens/s "
                 "(kv cache %s, %s, attention %s)\n", prompt.size(), generated.size(),
                 generated.back() == eot ? " (the last an end-of-text)" : "", seconds, first,
                 generated.size() > 1 ? double(generated.size() - 1) / (seconds - first) : 0.0, rc.kv_cache.c_str(),
                 kPrecisionName, attention_name(options.attention));
    keep_matmul_algos(model.matmul, kept_algos, false);  // written; stdout keeps the text alone
    gpt2_free(model);
    CUDA_CHECK(cudaStreamDestroy(model.stream));
    return 0;
}

// The whole run: plan, data, model, then steps, each followed by evaluation, checkpoint and a check
// for preemption. Returns the exit status.
inline int run(const RunConfig& rc, Distributed& dist) {
    const bool main_rank = dist.rank == 0;
    if (rc.pp_print_schedule) {
        print_pipeline_schedule(rc, dist);
        return 0;
    }
    const RunPlan p = plan_run(rc, dist);
    if (rc.dry_run) {
        if (main_rank) print_dry_run(rc, p);
        return 0;
    }
    if (p.memory.total() > p.budget)
        throw std::runtime_error("the memory plan needs " + std::to_string(p.memory.total()) + " bytes per rank, more than the " +
                                 std::to_string(p.budget) + " available (--dry-run prints it; lower -b, raise -z, or add ranks)");
    prepare_output_dir(rc, main_rank);
    // The data-parallel group splits the batches and reduces the gradients; a tensor group (--tp) splits
    // the layers and sees the same batches (parallel/tensor.h). Without --tp the data group is the world.
    ParallelGroups groups = make_parallel_groups(dist, rc.tp, rc.pp, rc.cp);
    const Distributed& data = groups.data;

    const int B = rc.batch_size, T = rc.seq_len;
    const int64_t cap = total_batch_tokens_for(rc, p.batch_ranks);
    const BatchRamp ramp = rc.batch_ramp.empty() ? BatchRamp{} : parse_batch_ramp(rc.batch_ramp);
    // A context group (--cp; its ranks are in the data group, which then spans data x context) reads one
    // batch and each rank keeps its rows of it (context_rows); without --cp every data rank reads its own.
    const int batch_rank = data.rank / rc.cp, batch_ranks = p.batch_ranks;
    const auto release_groups = [&] { release_parallel_groups(groups); };
    DataLoader train_loader(rc.train_data, B, T, batch_rank, batch_ranks, uint64_t(rc.seed), true);
    train_loader.check_tokens(p.config.vocab_size);  // every token below the vocabulary, before the first step
    Evaluation eval = evaluation_of(rc, data, p.config.vocab_size, batch_rank, batch_ranks);
    const int64_t total_steps = rc.max_steps > 0 ? rc.max_steps : steps_for_tokens(int64_t(train_loader.total_tokens()), ramp, cap);
    const LrSchedule schedule = lr_schedule_of(rc);

    Trainer tr;
    trainer_build(tr, data, p.config, B, p.local_T, rc.zero_stage, optimizer_config_of(rc), p.options, groups.tensor,
                  groups.pipeline, groups.context);
    tr.world = dist;
    tr.model_mpi = groups.model_mpi;
    tr.schedule = pipeline_schedule_of(rc.pp_schedule);
    KeptMatmulAlgos kept_algos = take_kept_matmul_algos(tr.model.matmul, rc, dist);
    RunInfo run{new_run_id(), cap};
    int64_t step = start_training(tr, rc, p, train_loader, eval.sample_rng, &run);
    DivergenceGuard divergence({rc.skip_loss_z, rc.skip_norm_z, rc.max_skipped_steps});
    int64_t tokens_seen = tokens_before_step(step, ramp, cap);  // a resumed run continues the batch ramp

    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const double peak = peak_bf16_flops(prop.name), flops_token = flops_per_token(int64_t(p.num_parameters), p.config.num_layers, p.config.channels, T);
    if (main_rank)
        announce_run(rc, prop.name, dist.world_size, kPrecisionName, attention_kernels_name(p.options).c_str(), p.num_parameters,
                     total_steps, run, step);
    if (main_rank && rc.cp > 1)
        std::printf("context parallel: --cp %d, each rank holds %d of every sequence's %d tokens in two zigzag chunks of %d "
                    "(rank r: chunks r and %d-r); keys and values go around a ring of %d\n",
                    rc.cp, p.local_T, T, T / (2 * rc.cp), 2 * rc.cp - 1, rc.cp);
    if (main_rank && rc.pp > 1)
        std::printf("pipeline: %s; schedule %s, %d micro-batches per step and data rank; stage 0 keeps %d in flight%s\n",
                    pipeline_split_text(p.config, rc.pp, p.options.pipeline_chunks).c_str(), rc.pp_schedule.c_str(),
                    int(cap / (int64_t(B) * T * p.batch_ranks)),
                    p.options.micro_batches_in_flight, rc.cuda_graphs == "on" ? "; CUDA graphs not used (point-to-point "
                    "exchanges are not captured yet)" : "");
    RunLog log(main_rank, rc.output_dir);
    StepBatches batches;
    const auto micro_steps_of = [&](int64_t batch_tokens) { return int(batch_tokens / (int64_t(B) * T * batch_ranks)); };
    // This rank's part of the step's batches: all of them, or its rows under --cp. One return: with two,
    // nvcc warned falsely "returning reference to local variable" (the lambda's captures are the caller's).
    StepBatches context_batches;
    const auto step_batches = [&]() -> StepBatches& {
        if (rc.cp != 1) context_batches = context_rows(batches, B, T, tr.model.context);
        return rc.cp == 1 ? batches : context_batches;
    };
    if (rc.profile_step) {
        const int64_t batch_tokens = total_batch_tokens_at(tokens_seen, ramp, cap);
        batches.load(train_loader, micro_steps_of(batch_tokens), B, T);
        profile_step(tr, p, step_batches(), batch_tokens, learning_rate(schedule, step, total_steps), B, T, prop.name, peak);
        trainer_free(tr);
        release_groups();
        return 0;
    }

    install_preemption_handlers();
    Watchdog watchdog(rc.collective_timeout, dist.rank,
                      {data.nccl, groups.tensor.nccl, groups.pipeline.nccl, groups.pipeline.gradient_nccl, groups.pipeline.embedding_nccl,
                       groups.context.nccl});
    tr.watchdog = &watchdog;
    double elapsed = 0;
    for (int64_t steps_this_run = 1; step < total_steps; ++step, ++steps_this_run) {
        const int64_t batch_tokens = total_batch_tokens_at(tokens_seen, ramp, cap), done = step + 1;
        batches.load(train_loader, micro_steps_of(batch_tokens), B, T);
        const float lr = learning_rate(schedule, step, total_steps);
        const auto t0 = std::chrono::steady_clock::now();
        const StepBatches& mine = step_batches();
        const StepResult r = train_step(tr, mine.input_ptrs, mine.target_ptrs, B, p.local_T, lr, &divergence);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        tokens_seen += batch_tokens;
        elapsed += seconds;
        if (done % rc.log_every == 0 || done == total_steps)
            log.step({done, total_steps, float(r.loss), lr, r.grad_norm, seconds * 1000.0, double(batch_tokens) / seconds,
                      model_flops_utilization(flops_token, double(batch_tokens) / seconds, peak, dist.world_size),
                      elapsed / double(steps_this_run) * double(total_steps - done), batch_tokens});
        if (!r.skipped_because.empty()) log.skipped(done, r.skipped_because);
        if (r.valid_targets > 0)  // a divergence stops the run (throws), or rolls it back
            if (const auto back = record_or_roll_back(checkpointed(tr), rc, divergence, done, r.loss, r.grad_norm,
                                                      r.skipped_because, train_loader, eval.sample_rng, &run)) {
                step = *back - 1, tokens_seen = tokens_before_step(*back, ramp, cap);  // the loop adds the 1
                continue;
            }
        evaluate_when_due(rc, eval, evaluated_model(tr), log, data, done, done == total_steps);
        keep_matmul_algos(tr.model.matmul, kept_algos, main_rank);  // the step's shapes, and evaluation's
        const auto save = [&] { return save_checkpoint(checkpointed(tr), rc, run, done, train_loader.position(), eval.sample_rng.state); };
        const bool due = checkpoint_due(rc, done, total_steps), saved = due && save();
        if (done < total_steps && stop_requested(dist, done, !rc.output_dir.empty(), due, saved, save)) {
            trainer_free(tr);
            release_groups();
            return kPreemptedExitCode;
        }
    }
    trainer_free(tr);
    release_groups();
    return 0;
}

#ifndef TRAIN_GPT_NO_MAIN
// The one error handler (kernels/cuda_common.h, "Errors"): the message on one line, and with several
// ranks the whole job aborted, since the other ranks may be waiting in a collective.
int main(int argc, char** argv) {
    try {
        const RunConfig rc = parse_config(argc, argv);
        if (rc.help) {
            std::printf("%s", help_text().c_str());
            return EXIT_SUCCESS;
        }
        Distributed dist = distributed_init(&argc, &argv);
        const int status = rc.generate ? generate(rc, dist) : run(rc, dist);
        distributed_finalize(dist);
        return status;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train_gpt: %s\n", e.what());
        int mpi_started = 0, mpi_ended = 0, ranks = 1;
        MPI_Initialized(&mpi_started);
        MPI_Finalized(&mpi_ended);
        if (mpi_started && !mpi_ended) {
            MPI_Comm_size(MPI_COMM_WORLD, &ranks);
            if (ranks > 1) MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
            MPI_Finalize();
        }
        return EXIT_FAILURE;
    }
}
#endif
#endif  // TRAIN_GPT_CU
