// GPT-2 embeddings (Radford et al. 2019): a token embedding (wte, V x C) plus a learned position
// embedding (wpe, maxT x C). The backward pass is deterministic without atomics: the host groups
// positions by token, and each token's gradient row is summed by one thread per channel group.
// Positions: by default token t of a row is at position t. A (B, T) array, token_positions, may say
// otherwise: --doc-positions (host/documents.h) restarts them at each document (t - doc_start[t]);
// context parallelism (parallel/context.h) holds rows made of two chunks of the sequence (zigzag),
// whose tokens keep their places in the whole sequence. wpe's gradient goes to each token's position,
// grouped on the host the same way as by token.
#pragma once

#include <limits>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common.cuh"

// Every thread owns 8 channels (one BF16 Packed128, two FP32 ones), so C must be a multiple of 8
// in both precisions.
constexpr int kEncoderChannelsPerThread = 8;

inline std::string encoder_requirements(int C) {
    if (C <= 0 || C % kEncoderChannelsPerThread != 0)
        return "encoder: C = " + std::to_string(C) + " is not a positive multiple of 8";
    return "";
}

inline std::string encoder_batch_problem(int B, int T) {
    if (B >= 0 && T >= 0) return "";
    return "encoder: B = " + std::to_string(B) + ", T = " + std::to_string(T) + ": negative size";
}

// ---------------------------------------------------------------------------------------------
// Forward: out[b,t,:] = wte[inp[b,t],:] + wpe[token_positions[b,t],:] (null: wpe[t,:]), one
// Packed128 per thread. Vocabulary-parallel (Shoeybi et al. 2019: the input embedding split by
// vocabulary over the tensor ranks): wte holds only rows [vocab_first, vocab_first + vocab_rows), a
// token outside them contributes zeros, and wpe may be null (no position part): the tensor group's
// sum of its ranks' outputs, one of them with wpe, is the embedding.

static __global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                              const int* token_positions, int T, int C, size_t total_packs, int vocab_first,
                                              int vocab_rows) {
    using Pack = Packed128<floatX>;
    const size_t pack = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (pack >= total_packs) return;
    const size_t packs_per_row = size_t(C) / Pack::size;
    const size_t position = pack / packs_per_row;  // b * T + t
    const int c = int(pack % packs_per_row) * Pack::size;
    const int t = token_positions != nullptr ? token_positions[position] : int(position % T);
    const int row = inp[position] - vocab_first;
    const bool mine = row >= 0 && row < vocab_rows;
    const Pack token_part = mine ? load128(wte + size_t(row) * C + c) : Pack::filled(0.0f);
    const Pack position_part = wpe != nullptr ? load128(wpe + size_t(t) * C + c) : Pack::filled(0.0f);
    Pack sum;
    for (int k = 0; k < Pack::size; ++k) sum[k] = from_float<floatX>(to_float(token_part[k]) + to_float(position_part[k]));
    store128(out + position * C + c, sum);
}

// token_positions: (B, T) positions (wpe rows) on the device, or null (t). vocab_first and vocab_rows:
// the rows of the vocabulary wte holds (vocabulary-parallel; default: all).
inline void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            cudaStream_t stream, const int* token_positions = nullptr, int vocab_first = 0,
                            int vocab_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_forward", encoder_requirements(C));
    require_supported("encoder_forward", encoder_batch_problem(B, T));
    const size_t total_packs = size_t(B) * T * C / Packed128<floatX>::size;
    if (total_packs == 0) return;
    const int block = 256;
    // One add per element. Bytes: the token ids, one wte row per position (a token seen twice is
    // read twice: rows are gathered), wpe once (each row is re-read by the B sequences, from cache),
    // the output once.
    const double btc = double(B) * T * C, X = sizeof(floatX);
    const KernelCost cost{btc, double(B) * T * sizeof(int) + 2 * btc * X + double(T) * C * X};
    launch<encoder_forward_kernel>(cost, dim3(ceil_div(total_packs, block)), dim3(block), 0, stream, out, inp, wte, wpe,
                                   token_positions, T, C, total_packs, vocab_first, vocab_rows);
}

// ---------------------------------------------------------------------------------------------
// Backward. The scratch buffer holds the grouping the host computed from the token ids, at offsets
// fixed by N = B*T alone (so that a captured CUDA graph replays for any batch; only the values change):
//   positions[N]        every position b*T+t, grouped by token, increasing within a group
//   group_start[N + 1]  group g owns positions[group_start[g] .. group_start[g+1]); G + 1 used
//   group_token[N]      the token of group g; G used
//   groups[1]           G, the number of distinct tokens (<= N)
// hence 3N + 2 ints. With token positions a second grouping follows, by position, laid out the same
// way (G' <= N groups: restarted per document under context parallelism, a rank's rows can hold more
// distinct positions than T), 3N + 2 ints more.

inline size_t encoder_backward_scratch_ints(int B, int T, bool token_positions = false) {
    const size_t N = size_t(B) * size_t(T);
    return 3 * N + 2 + (token_positions ? 3 * N + 2 : 0);
}

// Blocks of the grouped sums: each takes groups blockIdx.x, + gridDim.x, ... of the *groups there
// are (the largest first, see write_grouping). A fixed grid, so the launch does not depend on G.
constexpr unsigned kEncoderGroupBlocks = 1024;
// Rows of a group loaded before any is added. One block sums a whole group, so the most frequent
// token is a serial tail: on an H100 (d12, B=64, Shakespeare, 2026-11-27) its 8,238 rows took 3.5 ms,
// 0.43 us a row, each row two dependent loads (its position, then its values). With 8 rows' loads in
// flight the tail should take about an eighth; the sums still add the rows in position order.
constexpr int kEncoderRowsInFlight = 8;

// dgrad[group_token[g],:] += group g's dout rows summed in increasing position order: dwte by token,
// or dwpe by restarted position. grid.y * blockDim.x threads of 8 channels each cover C. Vocabulary-
// parallel: dgrad holds rows [key_first, key_first + key_rows) only; other groups are skipped.
static __global__ void encoder_backward_wte_kernel(floatX* dwte, const int* positions, const int* group_start,
                                            const int* group_token, const int* groups, const floatX* dout, int C,
                                            int key_first, int key_rows) {
    using Pack = Packed128<floatX>;
    constexpr int kPacks = kEncoderChannelsPerThread / Pack::size;
    const int c0 = int(blockIdx.y * blockDim.x + threadIdx.x) * kEncoderChannelsPerThread;
    if (c0 >= C) return;
    const int group_count = *groups;
    for (int group = int(blockIdx.x); group < group_count; group += int(gridDim.x)) {
        const int key_row = group_token[group] - key_first;
        if (key_row < 0 || key_row >= key_rows) continue;  // another rank's row
        float sum[kEncoderChannelsPerThread] = {};
        const int end = group_start[group + 1];
        int i = group_start[group];
        for (; i + kEncoderRowsInFlight <= end; i += kEncoderRowsInFlight) {
            Pack d[kEncoderRowsInFlight][kPacks];
            for (int r = 0; r < kEncoderRowsInFlight; ++r)
                for (int p = 0; p < kPacks; ++p) d[r][p] = load128(dout + size_t(positions[i + r]) * C + c0 + p * Pack::size);
            for (int r = 0; r < kEncoderRowsInFlight; ++r)
                for (int p = 0; p < kPacks; ++p)
                    for (int k = 0; k < Pack::size; ++k) sum[p * Pack::size + k] += to_float(d[r][p][k]);
        }
        for (; i < end; ++i) {
            const floatX* row = dout + size_t(positions[i]) * C + c0;
            for (int p = 0; p < kPacks; ++p) {
                const Pack d = load128(row + p * Pack::size);
                for (int k = 0; k < Pack::size; ++k) sum[p * Pack::size + k] += to_float(d[k]);
            }
        }
        floatX* grad = dwte + size_t(key_row) * C + c0;
        for (int p = 0; p < kPacks; ++p) {
            Pack g = load128(grad + p * Pack::size);
            for (int k = 0; k < Pack::size; ++k) g[k] = from_float<floatX>(to_float(g[k]) + sum[p * Pack::size + k]);
            store128(grad + p * Pack::size, g);
        }
    }
}

// dwpe[t,:] += sum over b of dout[b,t,:], in increasing b; one Packed128 of one t per thread.
static __global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    using Pack = Packed128<floatX>;
    const size_t pack = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t row_elements = size_t(T) * C;  // one t..C slab of wpe, and the stride between batches
    if (pack * Pack::size >= row_elements) return;
    const size_t offset = pack * Pack::size;  // t * C + c
    float sum[Pack::size] = {};
    for (int b = 0; b < B; ++b) {
        const Pack d = load128(dout + size_t(b) * row_elements + offset);
        for (int k = 0; k < Pack::size; ++k) sum[k] += to_float(d[k]);
    }
    Pack g = load128(dwpe + offset);
    for (int k = 0; k < Pack::size; ++k) g[k] = from_float<floatX>(to_float(g[k]) + sum[k]);
    store128(dwpe + offset, g);
}

namespace encoder_detail {

// The ints of one grouping of N positions into at most M groups: positions[N], group_start[M + 1],
// group_key[M], groups[1] (see above).
inline size_t grouping_ints(int N, int M) { return size_t(N) + 2 * size_t(M) + 2; }

// The parts of a grouping at `base` (host or device memory), at the offsets fixed by N and M.
struct GroupingParts {
    const int *positions, *group_start, *group_key, *groups;
};
inline GroupingParts grouping_parts(const int* base, int N, int M) {
    return {base, base + N, base + size_t(N) + M + 1, base + size_t(N) + 2 * size_t(M) + 1};
}

// Writes at `out` the positions 0..N-1 grouped by key (keys[i] = key << 32 | position, sorted) in the
// layout above for at most M groups; returns G. The largest groups go first: their blocks have the
// longest sums, and blocks start roughly in blockIdx order, so this balances the GPU. Ties keep key
// order (deterministic).
inline int write_grouping(int* out, const std::vector<uint64_t>& keys, int M) {
    const int N = int(keys.size());
    std::vector<int> run_start;  // start of each key's run in keys
    for (int i = 0; i < N; ++i)
        if (i == 0 || keys[i] >> 32 != keys[i - 1] >> 32) run_start.push_back(i);
    const int G = int(run_start.size());
    if (G > M) throw TrainGptError("encoder_backward: " + std::to_string(G) + " groups exceed the " + std::to_string(M) + " planned");
    run_start.push_back(N);
    std::vector<int> order(G);
    for (int g = 0; g < G; ++g) order[g] = g;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return run_start[a + 1] - run_start[a] > run_start[b + 1] - run_start[b];
    });
    int* positions = out;
    int* group_start = positions + N;
    int* group_key = group_start + M + 1;
    int filled = 0;
    for (int g = 0; g < G; ++g) {
        const int run = order[g];
        group_start[g] = filled;
        group_key[g] = int(keys[run_start[run]] >> 32);
        for (int i = run_start[run]; i < run_start[run + 1]; ++i) positions[filled++] = int(uint32_t(keys[i]));
    }
    group_start[G] = filled;
    group_key[M] = G;  // groups[0]
    return G;
}

}  // namespace encoder_detail

// The grouping of one micro-batch's token ids (and, with token_positions_host, the (B, T) positions of
// its tokens: grouped by position), written to `grouping` (encoder_backward_scratch_ints ints, the
// layout above). It needs only the host's copy of the batch, so it is made when the batch is known,
// and copied to the device with the batch. wpe_rows: the positions there are (max_seq_len).
struct EncoderGrouping {
    const int* ints = nullptr;  // host memory: by token, then (token positions) by position
    size_t count = 0;           // ints to copy: encoder_backward_scratch_ints
    int groups = 0;             // G
    int position_groups = -1;   // G'; -1: dwpe by t (no token positions)
};

inline EncoderGrouping encoder_backward_grouping(int* grouping, const int* inp_host, int B, int T,
                                                 const int* token_positions_host = nullptr,
                                                 int wpe_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_backward", encoder_batch_problem(B, T));
    const int N = B * T;
    // Sort (token, position) pairs: positions of one token become contiguous and increasing.
    std::vector<uint64_t> keys(N);
    for (int i = 0; i < N; ++i) {
        if (inp_host[i] < 0)
            require_supported("encoder_backward",
                              "inp_host[" + std::to_string(i) + "] = " + std::to_string(inp_host[i]) + " is not a token id");
        keys[i] = uint64_t(uint32_t(inp_host[i])) << 32 | uint32_t(i);
    }
    std::sort(keys.begin(), keys.end());
    EncoderGrouping g;
    g.ints = grouping;
    g.groups = encoder_detail::write_grouping(grouping, keys, N);
    g.count = encoder_backward_scratch_ints(B, T, token_positions_host != nullptr);
    if (token_positions_host != nullptr) {
        for (int i = 0; i < N; ++i) {
            const int position = token_positions_host[i];
            if (position < 0 || position >= wpe_rows)
                require_supported("encoder_backward", "token_positions_host[" + std::to_string(i) + "] = " +
                                                          std::to_string(position) + " is not a position in [0, " +
                                                          std::to_string(wpe_rows) + ")");
            keys[i] = uint64_t(uint32_t(position)) << 32 | uint32_t(i);
        }
        std::sort(keys.begin(), keys.end());
        g.position_groups = encoder_detail::write_grouping(grouping + encoder_detail::grouping_ints(N, N), keys, N);
    }
    return g;
}

// dwte (and dwpe) from a grouping made by encoder_backward_grouping and copied to the device at
// `device_grouping`. The kernels read G (and G') there, and the launches depend only on B, T and C,
// so a CUDA graph that captured this call replays for every batch. `grouping` (host) gives G, G'
// for the cost estimate and whether wpe goes by token position.
// vocab_first, vocab_rows: the rows of the vocabulary dwte holds (vocabulary-parallel; default: all).
inline void encoder_backward(floatX* dwte, floatX* dwpe, const int* device_grouping, const floatX* dout,
                             const EncoderGrouping& grouping, int B, int T, int C, cudaStream_t stream, int vocab_first = 0,
                             int vocab_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_backward", encoder_requirements(C));
    require_supported("encoder_backward", encoder_batch_problem(B, T));
    const int N = B * T;
    if (N == 0) return;
    const int G = grouping.groups, G_positions = grouping.position_groups;
    const bool by_position = G_positions >= 0;

    const unsigned threads_per_row = ceil_div(C, kEncoderChannelsPerThread);
    const unsigned block = std::min(256u, ceil_div(threads_per_row, 32) * 32);
    const dim3 by_token_grid(std::min<unsigned>(N, kEncoderGroupBlocks), ceil_div(threads_per_row, block));
    // wte: every dout row added once into its token's sum, then G rows of dwte read, added, written;
    // the grouping's ints read once.
    const double X = sizeof(floatX), btc = double(N) * C;
    const auto wte = encoder_detail::grouping_parts(device_grouping, N, N);
    const KernelCost wte_cost{btc + double(G) * C, btc * X + 2.0 * G * C * X + (double(N) + 2.0 * G + 2) * sizeof(int)};
    launch<encoder_backward_wte_kernel>(wte_cost, by_token_grid, dim3(block), 0, stream, dwte, wte.positions,
                                        wte.group_start, wte.group_key, wte.groups, dout, C, vocab_first, vocab_rows);
    if (by_position) {
        // wpe by token position: the same grouped sums, G' rows of dwpe (positions checked on the host).
        const auto wpe = encoder_detail::grouping_parts(device_grouping + encoder_detail::grouping_ints(N, N), N, N);
        const KernelCost cost{btc + double(G_positions) * C,
                              btc * X + 2.0 * G_positions * C * X + (double(N) + 2.0 * G_positions + 2) * sizeof(int)};
        const dim3 by_position_grid(std::min<unsigned>(N, kEncoderGroupBlocks), ceil_div(threads_per_row, block));
        launch<encoder_backward_wte_kernel>(cost, by_position_grid, dim3(block), 0, stream, dwpe, wpe.positions,
                                            wpe.group_start, wpe.group_key, wpe.groups, dout, C, 0,
                                            std::numeric_limits<int>::max());
        return;
    }
    // wpe: dout read once (B additions per element), dwpe read and written once.
    const size_t wpe_packs = size_t(T) * C / Packed128<floatX>::size;
    const KernelCost wpe_cost{btc, btc * X + 2.0 * T * C * X};
    launch<encoder_backward_wpe_kernel>(wpe_cost, dim3(ceil_div(wpe_packs, 256)), dim3(256), 0, stream, dwpe, dout, B, T,
                                        C);
}

// The grouping made here, from pageable memory (tests and callers without staging memory of their own).
inline void encoder_backward(floatX* dwte, floatX* dwpe, int* scratch, const floatX* dout, const int* inp_host, int B,
                             int T, int C, cudaStream_t stream, const int* token_positions_host = nullptr, int vocab_first = 0,
                             int vocab_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_backward", encoder_batch_problem(B, T));
    if (B * T == 0) return;
    std::vector<int> grouping(encoder_backward_scratch_ints(B, T, token_positions_host != nullptr));
    const EncoderGrouping g = encoder_backward_grouping(grouping.data(), inp_host, B, T, token_positions_host);
    // From pageable memory the copy is staged before the call returns (CUDA Runtime API, "API
    // synchronization behavior"), so `grouping` may go when it does.
    CUDA_CHECK(cudaMemcpyAsync(scratch, g.ints, g.count * sizeof(int), cudaMemcpyHostToDevice, stream));
    encoder_backward(dwte, dwpe, scratch, dout, g, B, T, C, stream, vocab_first, vocab_rows);
}
