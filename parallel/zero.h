// Data parallelism with ZeRO sharding (Rajbhandari et al. 2020): every rank runs the whole model on
// its own micro-batches; the gradients are averaged over the ranks; the optimizer state is sharded.
// Each rank owns one contiguous, equal-size range (shard) of the flat parameter buffer; the buffer is
// padded at the end so the shards are equal, and each shard starts 16-byte aligned.
//  stage 0: everything everywhere; gradients all-reduced.
//  stage 1: the optimizer state (FP32 master weights, Adam moments) sharded; gradients reduced to the
//           rank that owns them; updated parameters all-gathered.
//  stage 2: the gradients sharded too: each rank keeps only its shard's, accumulated over micro-steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "host/memory_plan.h"
#include "kernels/adamw.cuh"
#include "kernels/common.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/global_norm.cuh"
#include "parallel/process_groups.h"

struct ShardLayout {
    int rank = 0, world_size = 1, zero_stage = 0;
    size_t num_parameters = 0, shard_size = 0, padded_size = 0;
    size_t shard_begin() const { return size_t(rank) * shard_size; }
    // The parameters this rank updates (and keeps master weights and moments for).
    size_t optimizer_begin() const { return zero_stage == 0 ? 0 : shard_begin(); }
    size_t optimizer_size() const { return zero_stage == 0 ? num_parameters : shard_size; }
    // Of those, the real parameters (the last shard ends in padding; a shard may be all padding).
    size_t optimizer_real_size() const {
        const size_t begin = optimizer_begin();
        return std::min(num_parameters, begin + optimizer_size()) - std::min(num_parameters, begin);
    }
};

inline ShardLayout shard_layout(size_t num_parameters, int rank, int world_size, int zero_stage) {
    size_t shard = (num_parameters + world_size - 1) / world_size;
    shard = (shard + 7) / 8 * 8;
    return {rank, world_size, zero_stage, num_parameters, shard, shard * size_t(world_size)};
}

inline ncclDataType_t nccl_type_of_floatX() { return std::is_same_v<floatX, float> ? ncclFloat32 : ncclBfloat16; }

// Reduces the gradients of the flat-buffer range [offset, offset + count), held on this rank at `local`,
// on the communication stream. Averaging: every rank scaled its gradients by world_size / (valid
// targets of the whole step), so the average is the gradient of the step's mean token loss.
//  stage 0: all-reduce in place;
//  stage 1: reduce each part to the rank whose shard holds it, in place (the owner's full buffer);
//  stage 2: reduce each part into the owner's `receive` buffer (shard-sized), then add it to the
//           owner's gradient shard `grad_shard`.
inline void reduce_gradients(const ShardLayout& sh, const Distributed& d, floatX* local, size_t offset, size_t count,
                             floatX* receive, floatX* grad_shard) {
    if (sh.zero_stage == 0) {
        NCCL_CHECK(ncclAllReduce(local, local, count, nccl_type_of_floatX(), ncclAvg, d.nccl, d.comm_stream));
        return;
    }
    struct Part {
        size_t begin, end;  // in the flat buffer
    };
    std::vector<Part> mine;
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < sh.world_size; ++r) {
        const size_t begin = std::max(offset, size_t(r) * sh.shard_size);
        const size_t end = std::min(offset + count, size_t(r + 1) * sh.shard_size);
        if (begin >= end) continue;
        floatX* send = local + (begin - offset);
        floatX* into = sh.zero_stage == 1 ? send : receive + (begin - size_t(r) * sh.shard_size);
        NCCL_CHECK(ncclReduce(send, into, end - begin, nccl_type_of_floatX(), ncclAvg, r, d.nccl, d.comm_stream));
        if (r == sh.rank) mine.push_back({begin, end});
    }
    NCCL_CHECK(ncclGroupEnd());
    if (sh.zero_stage == 2) {
        for (const Part& p : mine) {
            const size_t at = p.begin - sh.shard_begin();
            accumulate(grad_shard + at, receive + at, p.end - p.begin, d.comm_stream);
        }
    }
}

// Stages 1-2: every rank gathers the updated parameters of all shards (each rank updated its own).
inline void gather_parameters(const ShardLayout& sh, const Distributed& d, floatX* params, cudaStream_t stream) {
    if (sh.zero_stage == 0) return;
    NCCL_CHECK(ncclAllGather(params + sh.shard_begin(), params, sh.shard_size, nccl_type_of_floatX(), d.nccl, stream));
}

// Every device buffer the sharding decides: the parameters (padded to equal shards), the gradients
// (all, or under stage 2 this rank's shard plus the buffers a layer's gradients pass through on the
// way to it: two alternating layer buffers, one for the global tensors, one to receive a reduced
// slice), and the optimizer state of this rank's range.
inline void plan_sharded_buffers(MemoryPlan& plan, const ShardLayout& shard, size_t layer_parameters,
                                 size_t global_parameters) {
    const size_t X = sizeof(floatX), F = sizeof(float);
    plan.add("params", "params", shard.padded_size * X);
    if (shard.zero_stage == 2) {
        plan.add("grads", "grads", shard.shard_size * X);  // this rank's shard, accumulated over micro-steps
        plan.add("grad_layer_buffer_0", "communication", layer_parameters * X);
        plan.add("grad_layer_buffer_1", "communication", layer_parameters * X);
        plan.add("grad_global_buffer", "communication", global_parameters * X);
        plan.add("grad_reduce_receive", "communication", shard.shard_size * X);
    } else {
        plan.add("grads", "grads", shard.padded_size * X);
    }
    plan.add("master", "master", shard.optimizer_size() * F);
    plan.add("adam_m", "adam_m", shard.optimizer_size() * F);
    plan.add("adam_v", "adam_v", shard.optimizer_size() * F);
}

// The L2 norm over all ranks of a flat-buffer-sized tensor, from this rank's part at `local`
// (its optimizer range: everything under stage 0, where all ranks hold the same values, its shard
// otherwise): the squares summed on the device into *out, over the ranks.
inline float all_ranks_norm(const ShardLayout& sh, const Distributed& d, const floatX* local, float* out, float* scratch,
                            cudaStream_t stream) {
    global_norm_squared(out, local, sh.optimizer_size(), scratch, stream);
    if (sh.zero_stage > 0) NCCL_CHECK(ncclAllReduce(out, out, 1, ncclFloat32, ncclSum, d.nccl, stream));
    float norm_squared = 0;
    CUDA_CHECK(recorded_copy(&norm_squared, out, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return std::sqrt(norm_squared);
}

// ---------------------------------------------------------------------------------------------
// The optimizer: AdamW (Loshchilov & Hutter 2019, kernels/adamw.cuh) on this rank's range of the
// flat buffer (ShardLayout::optimizer_*), with FP32 master weights and moments for that range only.

struct OptimizerConfig {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
    float grad_clip = 1.0f;  // clip the global gradient norm to this (0: no clipping)
    uint64_t seed = 1337;    // stochastic rounding of BF16 parameters
};

inline OptimizerConfig optimizer_config_of(const RunConfig& rc) {
    return {float(rc.beta1), float(rc.beta2), float(rc.eps), float(rc.weight_decay), float(rc.grad_clip), uint64_t(rc.seed)};
}

// One tensor of the flat parameter buffer, and whether weight decay applies to it.
struct ParameterRange {
    size_t offset, size;
    bool decays;
};

struct ShardedAdamW {
    ShardLayout shard;
    OptimizerConfig config;
    std::vector<ParameterRange> tensors;  // the flat buffer's tensors, in order
    float* master = nullptr;              // FP32 master weights of the optimizer range
    float* adam_m = nullptr;
    float* adam_v = nullptr;
    int step = 0;  // optimizer steps taken
};

// The master weights from this rank's range of the parameters; the moments cleared; step 0. On several
// ranks the parameters must already agree (same seed, or the same checkpoint).
inline void optimizer_start(ShardedAdamW& o, const floatX* params, cudaStream_t stream) {
    const size_t n = o.shard.optimizer_size();
    std::vector<floatX> range(n);
    CUDA_CHECK(cudaMemcpyAsync(range.data(), params + o.shard.optimizer_begin(), n * sizeof(floatX), cudaMemcpyDeviceToHost,
                               stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> master(n);
    for (size_t i = 0; i < n; ++i) master[i] = to_float(range[i]);
    CUDA_CHECK(cudaMemcpyAsync(o.master, master.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemsetAsync(o.adam_m, 0, n * sizeof(float), stream));
    CUDA_CHECK(cudaMemsetAsync(o.adam_v, 0, n * sizeof(float), stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // `master` is host memory freed on return
    o.step = 0;
}

// One AdamW step on this rank's range of each tensor (weight decay only where it decays), gradients
// scaled by grad_scale (clipping), then under stages 1-2 every rank gathers all updated shards.
// `grads` is the full gradient buffer (stages 0-1) or this rank's shard (stage 2).
inline void optimizer_update(ShardedAdamW& o, const Distributed& d, floatX* params, const floatX* grads,
                             float learning_rate, float grad_scale, cudaStream_t stream) {
    const ShardLayout& sh = o.shard;
    ++o.step;
    const size_t lo = sh.optimizer_begin(), hi = lo + sh.optimizer_size();
    for (const ParameterRange& t : o.tensors) {
        const size_t begin = std::max(lo, t.offset), end = std::min(hi, t.offset + t.size);
        if (begin >= end) continue;
        const AdamWHyper hyper{learning_rate, o.config.beta1, o.config.beta2, o.config.eps,
                               t.decays ? o.config.weight_decay : 0.0f};
        const floatX* g = sh.zero_stage == 2 ? grads + (begin - sh.shard_begin()) : grads + begin;
        adamw_update(params + begin, o.master + (begin - lo), o.adam_m + (begin - lo), o.adam_v + (begin - lo), g,
                     end - begin, hyper, o.step, grad_scale, o.config.seed, begin, stream);
    }
    gather_parameters(sh, d, params, stream);
}

// Where a rank's optimizer range lies in the whole model's flat buffer (the layout of checkpoint state
// files): runs of `count` elements at `whole` there and at `local` in the range. `owned`: this rank
// writes them; the others that hold the same elements (every rank at ZeRO-0, every tensor rank for
// replicated tensors) only read them.
struct StatePiece {
    uint64_t whole = 0, local = 0, count = 0;
    bool owned = false;
};

// The optimizer state of this rank's range on the host (checkpoints): its first `count` elements.
struct OptimizerState {
    std::vector<float> master, adam_m, adam_v;
};

inline OptimizerState download_optimizer_state(const ShardedAdamW& o, size_t count, cudaStream_t stream) {
    OptimizerState s{std::vector<float>(count), std::vector<float>(count), std::vector<float>(count)};
    CUDA_CHECK(cudaMemcpyAsync(s.master.data(), o.master, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(s.adam_m.data(), o.adam_m, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(s.adam_v.data(), o.adam_v, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return s;
}

// Restores the whole optimizer range (the state's vectors are optimizer_size() long) and the step.
inline void upload_optimizer_state(ShardedAdamW& o, const OptimizerState& s, int step, cudaStream_t stream) {
    const size_t bytes = o.shard.optimizer_size() * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(o.master, s.master.data(), bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(o.adam_m, s.adam_m.data(), bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(o.adam_v, s.adam_v.data(), bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));  // before the host buffers go
    o.step = step;
}
