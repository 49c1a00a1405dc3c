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
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/elementwise.cuh"
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
    // Where this rank's part of a flat-buffer-sized tensor starts (everything under stage 0, since all
    // ranks hold the same values; its shard otherwise), and its length.
    size_t norm_begin() const { return zero_stage == 0 ? 0 : shard_begin(); }
    size_t norm_count() const { return zero_stage == 0 ? num_parameters : shard_size; }
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
