// Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", section 3): each block's weights split across
// the ranks of a tensor group, so each rank holds and multiplies 1/tp of them.
//  Attention: qkvw column-parallel (rank r computes the queries, keys and values of heads
//    [r NH/tp, (r+1) NH/tp)), attention on those heads alone, attprojw row-parallel (rank r multiplies
//    its heads' slice of the input dimension); the partial projections are summed by one all-reduce.
//  MLP: fcw column-parallel (rank r computes hidden units [r 4C/tp, (r+1) 4C/tp), GELU fused as before),
//    fcprojw row-parallel; one all-reduce.
// Megatron's two operators: "g" sums a row-parallel output over the group in the forward pass (its
// backward is the identity), "f" sums the gradient of a column-parallel input in the backward pass
// (its forward is the identity). So each block half costs one all-reduce forward and one backward
// (with sequence parallelism, train_gpt.cu: a reduce-scatter, and all-gathers of the inputs).
// The token embedding, tied to the output head, is split by vocabulary (section 3 of the paper): rank r
// holds rows [r Vr, (r+1) Vr) of the vocabulary padded to a multiple of 128 tp (Megatron's padding, so
// every shard keeps the matmuls' alignment; rows past the model file's padded vocabulary exist only
// here and stay zero). The embedding is the group's sum of each rank's rows; the logits of each rank
// are its columns (kernels/classifier.cuh, the vocabulary-parallel classifier).
// Everything else (the position embedding, LayerNorms, the biases added after a sum) is replicated:
// every rank of the group computes it identically from identical inputs, so its gradients agree
// bitwise across the group and need no reduction there (with sequence parallelism the LayerNorms' and
// the projection biases' that ln2's backward sums over its rows are summed over the group, train_gpt.cu).
//
// The flat parameter buffer of a rank holds its slices in llm.c's tensor order (tensor_parallel_sizes);
// parallel/pipeline.h's model_shard / model_unshard convert between it and the whole model's buffer
// (checkpoints hold the whole model).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "host/memory_plan.h"
#include "host/model_config.h"
#include "parallel/process_groups.h"
#include "parallel/zero.h"

// A rank's place in its tensor group and the group's communicator (size 1: no tensor parallelism).
struct TensorParallel {
    ncclComm_t nccl = nullptr;
    MPI_Comm mpi = MPI_COMM_NULL;
    int rank = 0, size = 1;
};

// How tensor i is split: not at all (replicated), by output rows (column-parallel: the weight's rows
// are the layer's outputs), or by input columns (row-parallel). qkvw and qkvb hold three parts
// (queries, keys, values) of C rows each; each part is split, so a rank's slice is again [q; k; v].
struct TensorSplit {
    enum Kind { replicated, rows, columns } kind = replicated;
    int parts = 1;
};
inline TensorSplit tensor_split_of(int tensor) {
    const std::string name = kParameterNames[tensor];
    if (name == "wte") return {TensorSplit::rows, 1};  // by vocabulary, padded: vocab_rows_per_rank
    if (name == "qkvw" || name == "qkvb") return {TensorSplit::rows, 3};
    if (name == "fcw" || name == "fcb") return {TensorSplit::rows, 1};
    if (name == "attprojw" || name == "fcprojw") return {TensorSplit::columns, 1};
    return {};
}

// The vocabulary rows (of wte, and logit columns) each of `tp` ranks holds: the padded vocabulary
// rounded up to a multiple of 128 tp, split evenly (without tensor parallelism: the padded vocabulary).
constexpr int kVocabularyRowAlignment = 128;
inline int vocab_rows_per_rank(const GPT2Config& c, int tp) {
    if (tp == 1) return c.padded_vocab_size;
    const int unit = kVocabularyRowAlignment * tp;
    return (c.padded_vocab_size + unit - 1) / unit * unit / tp;
}

// "" when the model splits over `tp` ranks, else why not (naming --tp and the shape).
inline std::string tensor_parallel_problem(const GPT2Config& c, int tp) {
    if (tp < 1) return "--tp " + std::to_string(tp) + " must be at least 1";
    if (c.num_heads % tp != 0)
        return "--tp " + std::to_string(tp) + " does not divide the model's " + std::to_string(c.num_heads) +
               " heads (--heads): each tensor rank attends over whole heads";
    // Every rank's slices are matmul operands: 8-element (16-byte) rows (kernels/matmul.cuh).
    if ((c.channels / tp) % 8 != 0)
        return "--tp " + std::to_string(tp) + ": channels " + std::to_string(c.channels) + " / " + std::to_string(tp) +
               " = " + std::to_string(c.channels / tp) + " per rank is not a multiple of 8 (--channels)";
    return "";
}

// One rank's tensor sizes: the replicated tensors whole, the split ones 1/tp (a consistent shape,
// tensor_parallel_problem() == "").
inline void tensor_parallel_sizes(const GPT2Config& c, int tp, size_t sizes[kNumParameterTensors]) {
    parameter_sizes(c, sizes);
    for (int i = 0; i < kNumParameterTensors; ++i)
        if (tensor_split_of(i).kind != TensorSplit::replicated) sizes[i] /= size_t(tp);
    sizes[0] = size_t(vocab_rows_per_rank(c, tp)) * size_t(c.channels);  // wte, by padded vocabulary
}

inline size_t tensor_parallel_num_parameters(const GPT2Config& c, int tp) {
    size_t sizes[kNumParameterTensors], n = 0;
    tensor_parallel_sizes(c, tp, sizes);
    for (size_t s : sizes) n += s;
    return n;
}

// Calls piece(whole_offset, local_offset, count) for every contiguous run of tensor `tensor` that rank
// `rank` of `tp` holds: offsets into the tensor in the whole model and in the rank's slice.
inline void for_each_tensor_piece(const GPT2Config& c, int tp, int rank, int tensor,
                                  const std::function<void(size_t, size_t, size_t)>& piece) {
    size_t sizes[kNumParameterTensors];
    parameter_sizes(c, sizes);
    const TensorSplit split = tensor_split_of(tensor);
    if (split.kind == TensorSplit::replicated) {
        piece(0, 0, sizes[tensor]);
        return;
    }
    const size_t C = size_t(c.channels);
    if (std::string(kParameterNames[tensor]) == "wte") {  // rows past the file's padded vocabulary: none
        const size_t rows = size_t(vocab_rows_per_rank(c, tp)), first = size_t(rank) * rows;
        const size_t end = std::min(size_t(c.padded_vocab_size), first + rows);
        if (end > first) piece(first * C, 0, (end - first) * C);
        return;
    }
    const size_t L = size_t(c.num_layers), per_layer = sizes[tensor] / L;
    // Per layer a matrix (out, in) = (rows, cols); a bias is (rows, 1).
    const std::string name = kParameterNames[tensor];
    const size_t cols = name == "qkvb" || name == "fcb" ? 1 : name == "fcprojw" ? 4 * C : C;
    const size_t rows = per_layer / cols;
    size_t local = 0;
    for (size_t l = 0; l < L; ++l) {
        const size_t layer = l * per_layer;
        if (split.kind == TensorSplit::rows) {
            const size_t part_rows = rows / size_t(split.parts), mine = part_rows / size_t(tp);
            for (int p = 0; p < split.parts; ++p) {
                piece(layer + (size_t(p) * part_rows + size_t(rank) * mine) * cols, local, mine * cols);
                local += mine * cols;
            }
        } else {
            const size_t mine = cols / size_t(tp);
            for (size_t r = 0; r < rows; ++r) {
                piece(layer + r * cols + size_t(rank) * mine, local, mine);
                local += mine;
            }
        }
    }
}

// The tensor group's traffic per micro-step of B x T tokens (memory plan, --dry-run), each collective
// on a (B, T, C) activation or gradient but one. Without sequence parallelism: all-reduces, two per
// block forward (g after attention and after the MLP), two backward (f before qkv and before fc), with
// full recomputation the attention's g again; and per micro-step the vocabulary-parallel embedding's
// sum and the output head's dlnf. With it (train_gpt.cu, gpt2_forward_kernels and gpt2_backward) those
// sums are reduce-scatters, and all-gathers bring inputs back: per block 2 forward (ln1, ln2) and 4
// backward (the residual gradient twice, ln2, ln1), selective recompute ln2 once more, full recompute
// the block's forward up to the MLP (2 all-gathers, 1 reduce-scatter); per micro-step lnf twice
// (forward, backward) and the residual gradient for the embeddings. Either way one small all-gather of
// the classifier's row statistics (3 floats a token). (The small all-reduces with sequence parallelism,
// the LayerNorm parameter gradients and the projections' biases, 6C per layer, are left out.) Timed at H100 NVLink 4's 450 GB/s per
// direction (an assumption: NCCL reaches less on small messages).
constexpr double kAssumedNvlinkBytesPerSecond = 450e9;
inline TensorTraffic tensor_traffic(const GPT2Config& c, int B, int T, int tp, bool sequence_parallel, Recompute recompute,
                                    size_t element_bytes) {
    TensorTraffic t;
    if (tp == 1) return t;
    const int L = c.num_layers, full = recompute == Recompute::full ? 1 : 0;
    const int sums = L * (4 + full) + 2;  // after row-parallel matmuls and of column-parallel inputs' gradients
    int gathers = 0;
    if (sequence_parallel) {
        gathers = L * (2 + 4 + (recompute == Recompute::selective ? 1 : 0) + 2 * full) + 3;
        t.reduce_scatters = sums;
    } else {
        t.all_reduces = sums;
    }
    t.all_gathers = gathers + 1;  // + the classifier's statistics
    t.bytes_each = double(B) * T * c.channels * double(element_bytes);
    const double share = double(tp - 1) / tp, statistics = double(B) * T * 3 * sizeof(float) * tp;
    t.bus_bytes_per_rank = ((2.0 * t.all_reduces + gathers + t.reduce_scatters) * t.bytes_each + statistics) * share;
    t.link_bytes_per_second = kAssumedNvlinkBytesPerSecond;
    return t;
}

// Megatron's g (forward) and f (backward): x (n elements, the same shape on every rank) becomes the sum
// of every rank's x, in place, on `stream`. Nothing on one rank.
inline void tensor_all_reduce(const TensorParallel& t, floatX* x, size_t n, cudaStream_t stream) {
    if (t.size == 1) return;
    NCCL_CHECK(ncclAllReduce(x, x, n, std::is_same_v<floatX, float> ? ncclFloat32 : ncclBfloat16, ncclSum, t.nccl, stream));
}

