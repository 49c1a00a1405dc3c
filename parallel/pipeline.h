// Pipeline parallelism (Huang et al. 2019, "GPipe"; Narayanan et al. 2021, "Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM", section 2.2): the model's layers split into
// contiguous ranges, one per stage (a rank of the pipeline group; with the interleaved schedule v
// ranges per rank, one per model chunk: StageLayers); the token and position embeddings on the first
// stage, the final LayerNorm and the classifier on the last. Micro-batches flow through
// the stages: the residual stream after a stage's last layer goes to the next stage (ncclSend/Recv),
// its gradient comes back. The order of each stage's forward and backward passes is the schedule's
// (host/pipeline_schedule.h); train_gpt.cu runs it (pipeline_micro_steps).
// The output head is tied to the token embedding: wte lives on the first and on the last stage, both
// update it alike from the sum of their gradients (Megatron's embedding group), so the two copies stay
// equal; checkpoints and the gradient norm count the first stage's.
//
// A rank's part of the model (ModelPart): its stage's layers (all its chunks'), and of them its tensor rank's slices
// (parallel/tensor.h). Its flat buffer holds, in llm.c's tensor order, the tensors it holds (the others
// have size 0 there); model_shard / model_unshard convert between it and the whole model's buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "host/model_config.h"
#include "parallel/process_groups.h"
#include "parallel/tensor.h"
#include "parallel/zero.h"

// A rank's place in its pipeline group (stage = rank) and the communicators it uses: the group's, and
// the embedding group's (the first and the last stage, for the tied embedding's gradient).
struct PipelineParallel {
    ncclComm_t nccl = nullptr;           // activations, to the next stage
    ncclComm_t gradient_nccl = nullptr;  // gradients, to the previous stage (a communicator of their own: see
                                         // host/pipeline_schedule.h, check_pipeline_exchanges)
    MPI_Comm mpi = MPI_COMM_NULL;
    int rank = 0, size = 1;
    ncclComm_t embedding_nccl = nullptr;  // first and last stage only (size > 1)
    bool first() const { return rank == 0; }
    bool last() const { return rank == size - 1; }
};

// The layers of each of `stages` stages: L / stages each, the first L % stages stages one more.
struct LayerRange {
    int first = 0, count = 0;
};
inline LayerRange pipeline_layers(int num_layers, int stages, int stage) {
    const int base = num_layers / stages, extra = num_layers % stages;
    return {stage * base + std::min(stage, extra), base + (stage < extra ? 1 : 0)};
}

// A rank's layers with v model chunks per rank (the interleaved schedule; 1 otherwise): chunk c is
// virtual stage c p + rank of p v, so rank r holds v ranges of the model's layers, which its flat
// buffer keeps one after the other (its local layers: chunk 0's, then chunk 1's, ...).
struct StageLayers {
    std::vector<LayerRange> chunks;  // each chunk's layers in the whole model
    int total() const {
        int n = 0;
        for (const LayerRange& r : chunks) n += r.count;
        return n;
    }
    int local_first(int chunk) const {  // the chunk's first layer among the rank's
        int n = 0;
        for (int c = 0; c < chunk; ++c) n += chunks[size_t(c)].count;
        return n;
    }
    int most() const {  // the most layers of one chunk
        int n = 0;
        for (const LayerRange& r : chunks) n = std::max(n, r.count);
        return n;
    }
};
inline StageLayers stage_layers(int num_layers, int stages, int stage, int chunks = 1) {
    StageLayers s;
    for (int c = 0; c < chunks; ++c) s.chunks.push_back(pipeline_layers(num_layers, stages * chunks, c * stages + stage));
    return s;
}

// "" when the model's layers split over `stages` stages of `chunks` chunks, else why not (naming the
// flags and the shape).
inline std::string pipeline_split_problem(const GPT2Config& c, int stages, int chunks = 1) {
    if (stages < 1) return "--pp " + std::to_string(stages) + " must be at least 1";
    if (c.num_layers < stages * chunks)
        return "--pp " + std::to_string(stages) + (chunks > 1 ? " x --pp-virtual " + std::to_string(chunks) : std::string()) +
               ": the model has " + std::to_string(c.num_layers) + " layers (--layers), fewer than the " +
               (chunks > 1 ? "model chunks" : "stages") + "; every " + (chunks > 1 ? "chunk" : "stage") + " needs at least one";
    return "";
}

// "12 layers over 4 stages: 0-2, 3-5, 6-8, 9-11" (stated at start-up; uneven splits are allowed); with
// chunks each stage's ranges joined by '+'.
inline std::string pipeline_split_text(const GPT2Config& c, int stages, int chunks = 1) {
    std::string s = std::to_string(c.num_layers) + " layers over " + std::to_string(stages) + " stages" +
                    (chunks > 1 ? " of " + std::to_string(chunks) + " chunks" : std::string()) + ":";
    for (int k = 0; k < stages; ++k) {
        const StageLayers layers = stage_layers(c.num_layers, stages, k, chunks);
        for (size_t i = 0; i < layers.chunks.size(); ++i) {
            const LayerRange& r = layers.chunks[i];
            s += (i ? "+" : k ? ", " : " ") + std::to_string(r.first) + "-" + std::to_string(r.first + r.count - 1);
        }
    }
    return s;
}

// What a rank holds of the model.
struct ModelPart {
    int tp = 1, tensor_rank = 0;  // parallel/tensor.h
    int pp = 1, stage = 0;
    int chunks = 1;  // model chunks per rank (interleaved)
};

// The configuration a stage builds: the whole model's, with its own number of layers (all its chunks').
inline GPT2Config stage_config(const GPT2Config& c, int stages, int stage, int chunks = 1) {
    GPT2Config s = c;
    s.num_layers = stage_layers(c.num_layers, stages, stage, chunks).total();
    return s;
}

// Whether a stage holds global tensor i (every stage holds its layers' tensors).
inline bool stage_holds(int tensor, int stages, int stage) {
    if (is_layer_tensor(tensor)) return true;
    const std::string name = kParameterNames[tensor];
    if (name == "wte") return stage == 0 || stage == stages - 1;  // the embedding, and the tied output head
    if (name == "wpe") return stage == 0;
    return stage == stages - 1;  // lnfw, lnfb
}

// Whether the part's copy of tensor i is the one checkpoints and the gradient norm count: replicated
// tensors on tensor rank 0, wte on the first stage (the last stage's is the same).
inline bool part_owns(const ModelPart& part, int tensor) {
    if (!stage_holds(tensor, part.pp, part.stage)) return false;
    if (tensor == 0 && part.stage != 0) return false;
    return part.tensor_rank == 0 || tensor_split_of(tensor).kind != TensorSplit::replicated;
}

// The part's tensor sizes in its flat buffer (0 for what it does not hold).
inline void model_part_sizes(const GPT2Config& c, int tp, int pp, int stage, size_t sizes[kNumParameterTensors], int chunks = 1) {
    tensor_parallel_sizes(stage_config(c, pp, stage, chunks), tp, sizes);
    for (int i = 0; i < kNumParameterTensors; ++i)
        if (!stage_holds(i, pp, stage)) sizes[i] = 0;
}
inline size_t model_part_num_parameters(const GPT2Config& c, int tp, int pp, int stage, int chunks = 1) {
    size_t sizes[kNumParameterTensors], n = 0;
    model_part_sizes(c, tp, pp, stage, sizes, chunks);
    for (size_t s : sizes) n += s;
    return n;
}

// Calls piece(whole_offset, local_offset, count) for every contiguous run of tensor `tensor` the part
// holds: offsets into the tensor in the whole model and in the part's buffer.
inline void for_each_part_piece(const GPT2Config& c, const ModelPart& part, int tensor,
                                const std::function<void(size_t, size_t, size_t)>& piece) {
    if (!stage_holds(tensor, part.pp, part.stage)) return;
    if (!is_layer_tensor(tensor)) {
        for_each_tensor_piece(c, part.tp, part.tensor_rank, tensor, piece);
        return;
    }
    size_t whole_sizes[kNumParameterTensors], local_sizes[kNumParameterTensors];
    parameter_sizes(c, whole_sizes);
    GPT2Config one_layer = c;
    one_layer.num_layers = 1;
    tensor_parallel_sizes(one_layer, part.tp, local_sizes);  // one layer's slice on this tensor rank
    const StageLayers layers = stage_layers(c.num_layers, part.pp, part.stage, part.chunks);
    for (size_t k = 0; k < layers.chunks.size(); ++k) {  // each chunk's layers: a block in the whole and in the part
        const size_t whole_offset = size_t(layers.chunks[k].first) * (whole_sizes[tensor] / size_t(c.num_layers));
        const size_t local_offset = size_t(layers.local_first(int(k))) * local_sizes[tensor];
        GPT2Config chunk = c;
        chunk.num_layers = layers.chunks[k].count;
        for_each_tensor_piece(chunk, part.tp, part.tensor_rank, tensor, [&](size_t whole, size_t local, size_t n) {
            piece(whole_offset + whole, local_offset + local, n);
        });
    }
}

// Calls f(tensor, whole_at + whole offset, local_at + local offset, count) for every piece of the part,
// in tensor order: offsets into the whole model's flat buffer and the part's.
template <typename F>
inline void for_each_model_piece(const GPT2Config& c, const ModelPart& part, F&& f) {
    size_t whole_sizes[kNumParameterTensors], local_sizes[kNumParameterTensors];
    parameter_sizes(c, whole_sizes);
    model_part_sizes(c, part.tp, part.pp, part.stage, local_sizes, part.chunks);
    size_t whole_at = 0, local_at = 0;
    for (int i = 0; i < kNumParameterTensors; ++i) {
        for_each_part_piece(c, part, i, [&](size_t whole, size_t local, size_t n) { f(i, whole_at + whole, local_at + local, n); });
        whole_at += whole_sizes[i];
        local_at += local_sizes[i];
    }
}

// The part's flat buffer from the whole model's.
template <typename T>
inline std::vector<T> model_shard(const std::vector<T>& whole, const GPT2Config& c, const ModelPart& part) {
    std::vector<T> local(model_part_num_parameters(c, part.tp, part.pp, part.stage, part.chunks));
    for_each_model_piece(c, part, [&](int, size_t from, size_t to, size_t n) {
        std::copy(whole.begin() + ptrdiff_t(from), whole.begin() + ptrdiff_t(from + n), local.begin() + ptrdiff_t(to));
    });
    return local;
}

// The whole model's flat buffer from every part's (locals[k] is parts[k]'s): each value from the part
// that owns it.
template <typename T>
inline std::vector<T> model_unshard(const std::vector<std::vector<T>>& locals, const std::vector<ModelPart>& parts,
                                    const GPT2Config& c) {
    std::vector<T> whole(gpt2_num_parameters(c));
    for (size_t k = 0; k < parts.size(); ++k)
        for_each_model_piece(c, parts[k], [&](int tensor, size_t to, size_t from, size_t n) {
            if (part_owns(parts[k], tensor))
                std::copy(locals[k].begin() + ptrdiff_t(from), locals[k].begin() + ptrdiff_t(from + n),
                          whole.begin() + ptrdiff_t(to));
        });
    return whole;
}

// The world's ranks as a grid (parallel/process_groups.h: tensor fastest, then context, pipeline, data):
// world rank r's part and its rank in the data group, which ZeRO shards over (with --cp it spans the
// context and data axes: make_parallel_groups). Within one copy of the model (cp = 1: the tensor x
// pipeline ranks of one data rank, in world order) the same functions give each rank's part.
inline ModelPart part_of_rank(int rank, int tp, int pp, int chunks = 1, int cp = 1) {
    const GridCoordinates at = grid_position(rank, {tp, cp, pp, rank / (tp * cp * pp) + 1});
    return {tp, at.tensor, pp, at.pipeline, chunks};
}
inline int data_rank_of(int rank, int tp, int pp, int cp = 1) {
    const GridCoordinates at = grid_position(rank, {tp, cp, pp, rank / (tp * cp * pp) + 1});
    return at.data * cp + at.context;  // make_process_group(shape, rank, Axis::context, Axis::data)'s rank
}

// World rank `rank`'s optimizer range (parallel/zero.h) as pieces of the whole model's flat buffer, in
// the range's order, for a run of data x pp x cp x tp ranks at `zero_stage` (data_ranks: the data
// group's size, cp x data): what a checkpoint writes from each rank and reads back into each
// (host/checkpointing.h), at any tp, pp, cp and data ranks.
inline std::vector<StatePiece> optimizer_state_pieces(const GPT2Config& c, int tp, int pp, int data_ranks, int zero_stage,
                                                      int rank, int chunks = 1, int cp = 1) {
    const ModelPart part = part_of_rank(rank, tp, pp, chunks, cp);
    const int data_rank = data_rank_of(rank, tp, pp, cp);
    const ShardLayout sh = shard_layout(model_part_num_parameters(c, tp, pp, part.stage, chunks), data_rank, data_ranks, zero_stage);
    const size_t lo = sh.optimizer_begin(), hi = lo + sh.optimizer_real_size();
    const bool writes_shard = zero_stage > 0 || data_rank == 0;  // ZeRO-0: every data rank holds it all
    std::vector<StatePiece> pieces;
    for_each_model_piece(c, part, [&](int tensor, size_t whole, size_t local, size_t n) {
        const size_t begin = std::max(lo, local), end = std::min(hi, local + n);
        if (begin >= end) return;
        const bool owned = writes_shard && part_owns(part, tensor);
        const uint64_t whole_begin = whole + (begin - local);
        if (!pieces.empty() && pieces.back().whole + pieces.back().count == whole_begin && pieces.back().owned == owned &&
            pieces.back().local + pieces.back().count == begin - lo)  // runs that continue each other (one rank: one run)
            pieces.back().count += end - begin;
        else
            pieces.push_back({whole_begin, begin - lo, end - begin, owned});
    });
    return pieces;
}

// Collective over `mpi` (the ranks holding one copy of the model: a data rank's tensor x pipeline
// ranks, in world order): every rank's `local` (sizes[r] elements on rank r) at rank 0 of `mpi`
// (locals[r] is rank r's; empty elsewhere), sent in chunks of at most 1 GiB (MPI counts are ints).
template <typename T>
inline std::vector<std::vector<T>> gather_model_parts(MPI_Comm mpi, const std::vector<T>& local, const std::vector<size_t>& sizes) {
    constexpr size_t kChunk = size_t(1) << 30;
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(mpi, &rank));
    MPI_CHECK(MPI_Comm_size(mpi, &size));
    const auto chunks = [&](size_t elements, auto&& move) {
        const size_t bytes = elements * sizeof(T);
        for (size_t at = 0; at < bytes; at += kChunk) move(at, int(std::min(kChunk, bytes - at)));
    };
    std::vector<std::vector<T>> locals;
    if (rank != 0) {
        chunks(local.size(), [&](size_t at, int n) {
            MPI_CHECK(MPI_Send(reinterpret_cast<const char*>(local.data()) + at, n, MPI_BYTE, 0, 0, mpi));
        });
        return locals;
    }
    locals.resize(size_t(size));
    locals[0] = local;
    for (int r = 1; r < size; ++r) {
        locals[r].resize(sizes[r]);
        chunks(sizes[r], [&](size_t at, int n) {
            MPI_CHECK(MPI_Recv(reinterpret_cast<char*>(locals[r].data()) + at, n, MPI_BYTE, r, 0, mpi, MPI_STATUS_IGNORE));
        });
    }
    return locals;
}

// "--tp 2", "--pp 4", "--tp 2 x --pp 4 x --cp 2", ...: the flags above 1 that split the model and its
// sequences (messages; "--tp 1" when none is).
inline std::string model_parallel_flags(int tp, int pp, int cp = 1) {
    std::string flags;
    for (const auto& [flag, n] : {std::pair<const char*, int>{"--tp ", tp}, {"--pp ", pp}, {"--cp ", cp}})
        if (n > 1) flags += (flags.empty() ? "" : " x ") + std::string(flag) + std::to_string(n);
    return flags.empty() ? "--tp " + std::to_string(tp) : flags;
}

// ---------------------------------------------------------------------------------------------
// The run's groups (the grid of parallel/process_groups.h): tensor groups of `tp` consecutive ranks
// (so they share a node), pipeline groups across them, data groups across both. Collective over the
// world. Without --tp and --pp the data group is the world itself. With --cp (parallel/context.h)
// context groups of cp ranks sit between the tensor and the pipeline axis, and the data group spans the
// context and data axes: each context group reads one batch, and the gradients are reduced over all its
// ranks and all data ranks together (a pipeline stage's over the same stage of every copy).
struct ParallelGroups {
    Distributed data;           // gradients averaged, batches split, losses summed over these ranks
    TensorParallel tensor;      // each layer split over these
    PipelineParallel pipeline;  // the layers split over these
    ProcessGroup context;       // each sequence split over these (size 1: no context parallelism)
    MPI_Comm model_mpi = MPI_COMM_NULL;  // the tensor x pipeline ranks of this data rank (one copy of the model)
    bool owns_data = false;     // data is a group of its own (released by release_parallel_groups)
};

inline ParallelGroups make_parallel_groups(const Distributed& world, int tp, int pp = 1, int cp = 1) {
    ParallelGroups g;
    if (tp == 1 && pp == 1 && cp == 1) {
        g.data = world;
        g.model_mpi = MPI_COMM_SELF;
        return g;
    }
    if (world.world_size % (tp * pp * cp) != 0)
        throw TrainGptError(model_parallel_flags(tp, pp, cp) + " does not divide the " + std::to_string(world.world_size) +
                            " ranks launched (world = data x pipeline x context x tensor)");
    GridCoordinates shape;
    shape.tensor = tp;
    shape.context = cp;
    shape.pipeline = pp;
    shape.data = world.world_size / (tp * pp * cp);
    ProcessGroup tensor = make_process_group(shape, world.rank, Axis::tensor);
    ProcessGroup pipeline = make_process_group(shape, world.rank, Axis::pipeline);
    ProcessGroup pipeline_gradients = make_process_group(shape, world.rank, Axis::pipeline);
    MPI_CHECK(MPI_Comm_free(&pipeline_gradients.mpi));  // its NCCL communicator is all it is for
    if (cp > 1) g.context = make_process_group(shape, world.rank, Axis::context);
    ProcessGroup data = make_process_group(shape, world.rank, Axis::context, Axis::data);  // the data axis alone without cp
    g.tensor = {tensor.nccl, tensor.mpi, tensor.rank, tensor.size};
    g.pipeline.nccl = pipeline.nccl;
    g.pipeline.gradient_nccl = pipeline_gradients.nccl;
    g.pipeline.mpi = pipeline.mpi;
    g.pipeline.rank = pipeline.rank;
    g.pipeline.size = pipeline.size;
    if (pp > 1) {
        // The embedding group: the first and the last stage of each pipeline. Every rank makes one
        // communicator here, the middle stages one of their own that is released at once: NCCL needs only
        // the members to call ncclCommInitRank, the emulator (emu/nccl.cpp) every rank of the world.
        const bool member = g.pipeline.first() || g.pipeline.last();
        GridCoordinates first = grid_position(world.rank, shape);
        first.pipeline = 0;
        MPI_Comm split = MPI_COMM_NULL;
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, 2 * grid_rank(first, shape) + (member ? 1 : 0), g.pipeline.rank, &split));
        int rank = 0, size = 1;
        MPI_CHECK(MPI_Comm_rank(split, &rank));
        MPI_CHECK(MPI_Comm_size(split, &size));
        ncclUniqueId id;
        if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, split));
        ncclComm_t comm = nullptr;
        NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
        MPI_CHECK(MPI_Comm_free(&split));
        if (member) g.pipeline.embedding_nccl = comm;
        else NCCL_CHECK(ncclCommDestroy(comm));
    }
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, data.rank, world.rank, &g.model_mpi));
    g.data.mpi = data.mpi;
    g.data.nccl = data.nccl;
    g.data.rank = data.rank;
    g.data.world_size = data.size;
    g.data.local_rank = world.local_rank;
    g.data.local_size = world.local_size;
    CUDA_CHECK(cudaStreamCreate(&g.data.comm_stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&g.data.compute_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&g.data.comm_done, cudaEventDisableTiming));
    g.owns_data = true;
    return g;
}

inline void release_parallel_groups(ParallelGroups& g) {
    if (g.context.nccl) release_process_group(g.context);
    if (g.tensor.nccl) NCCL_CHECK(ncclCommDestroy(g.tensor.nccl));
    if (g.tensor.mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&g.tensor.mpi));
    if (g.pipeline.nccl) NCCL_CHECK(ncclCommDestroy(g.pipeline.nccl));
    if (g.pipeline.gradient_nccl) NCCL_CHECK(ncclCommDestroy(g.pipeline.gradient_nccl));
    if (g.pipeline.embedding_nccl) NCCL_CHECK(ncclCommDestroy(g.pipeline.embedding_nccl));
    if (g.pipeline.mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&g.pipeline.mpi));
    if (g.owns_data) {
        MPI_Comm data_mpi = g.data.mpi;
        distributed_release(g.data);
        if (data_mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&data_mpi));
        if (g.model_mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&g.model_mpi));
    }
    g = ParallelGroups{};
}
