// GPT-2 embeddings (Radford et al. 2019): a token embedding (wte, V x C) plus a learned position
// embedding (wpe, maxT x C). The backward pass is deterministic without atomics: the host groups
// positions by token, and each token's gradient row is summed by one thread per channel group (a
// frequent token's rows in pieces by several blocks, their sums then added in order).
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
// fixed by N = B*T alone (so that a captured CUDA graph replays for any batch; only the values change).
// A group is the positions of one token; a work item is a group, or a piece of one: a group of more
// than kEncoderRowsPerPiece rows is cut into pieces of that many rows (the last one shorter), each
// summed into a float partial row ("slot"), and a second kernel adds a split group's slots in piece
// order. With I items and S split groups (offsets with M = N and S_max = encoder_max_split_groups(N)):
//   positions[N]                every position b*T+t, grouped by token, increasing within a group
//   item_start[M + 1]           item i sums positions[item_start[i] .. item_start[i+1]); I + 1 used
//   item_key[M]                 item i's token
//   item_slot[M]                -1: item i is a whole group, added into its gradient row; else its slot
//   items[1]                    I (<= N)
//   split_slot_start[S_max + 1] split group s owns slots split_slot_start[s] .. [s+1]; S + 1 used
//   split_key[S_max]            its token
//   splits[1]                   S
// hence 4N + 2 S_max + 4 ints. With token positions a second grouping follows, by position, laid out
// the same way (G' <= N groups: restarted per document under context parallelism, a rank's rows can
// hold more distinct positions than T).

// Rows of a work item at most. One block sums a whole item, so without pieces the most frequent token
// is a serial tail: on an H100 (d12, B=64, Shakespeare, 2026-11-27) its 8,238 rows took 3.5 ms, 0.43 us
// a row, against 0.05 ms for the whole kernel on the roofline. At 64 rows, 8 rounds of 8 rows in flight,
// an item is a few microseconds, and the slots of a d12 B=64 batch take at most 2N/65 rows of C floats
// (6.2 MB; 129 for that token).
constexpr int kEncoderRowsPerPiece = 64;
// Rows of an item loaded before any is added (their loads in flight together); the sums still add
// the rows in position order.
constexpr int kEncoderRowsInFlight = 8;
// Blocks of the item and combining kernels: each takes items blockIdx.x, + gridDim.x, ... of the items
// there are (the largest first, see write_grouping). A fixed grid, so the launch does not depend on I.
constexpr unsigned kEncoderGroupBlocks = 1024;

// A split group has more than kEncoderRowsPerPiece rows, so there are at most N / 65 of them; its n
// rows make ceil(n / 64) <= (n + 63) / 64 pieces, at most 2N / 65 over all split groups.
inline int encoder_max_split_groups(int N) { return std::max(N, 0) / (kEncoderRowsPerPiece + 1); }
inline int encoder_max_slots(int N) { return int(2 * int64_t(std::max(N, 0)) / (kEncoderRowsPerPiece + 1)); }

namespace encoder_detail {

// The ints of one grouping of N positions (see above).
inline size_t grouping_ints(int N) { return 4 * size_t(N) + 2 * size_t(encoder_max_split_groups(N)) + 4; }

// The parts of a grouping at `base` (host or device memory), at the offsets fixed by N.
template <typename Int> struct GroupingParts {
    Int *positions, *item_start, *item_key, *item_slot, *items, *split_slot_start, *split_key, *splits;
};
template <typename Int> GroupingParts<Int> grouping_parts(Int* base, int N) {
    const size_t n = size_t(N), s = size_t(encoder_max_split_groups(N));
    GroupingParts<Int> g;
    g.positions = base;
    g.item_start = g.positions + n;
    g.item_key = g.item_start + n + 1;
    g.item_slot = g.item_key + n;
    g.items = g.item_slot + n;
    g.split_slot_start = g.items + 1;
    g.split_key = g.split_slot_start + s + 1;
    g.splits = g.split_key + s;
    return g;
}

}  // namespace encoder_detail

inline size_t encoder_backward_scratch_ints(int B, int T, bool token_positions = false) {
    const size_t one = encoder_detail::grouping_ints(B * T);
    return token_positions ? 2 * one : one;
}

// The float partial rows (slots) of the pieces: one grouping's at a time (the two run one after the other).
inline size_t encoder_backward_partial_floats(int B, int T, int C) {
    return size_t(encoder_max_slots(B * T)) * size_t(std::max(C, 0));
}

// A thread's 8 channels of a gradient row += its float sums, rounded once.
__device__ inline void add_into_row(floatX* row, const float (&sum)[kEncoderChannelsPerThread]) {
    using Pack = Packed128<floatX>;
    for (int p = 0; p < kEncoderChannelsPerThread / Pack::size; ++p) {
        Pack g = load128(row + p * Pack::size);
        for (int k = 0; k < Pack::size; ++k) g[k] = from_float<floatX>(to_float(g[k]) + sum[p * Pack::size + k]);
        store128(row + p * Pack::size, g);
    }
}

// The rows of work item `item` summed in increasing position order: added into grad[item_key[item],:]
// (dwte by token, or dwpe by restarted position) when it is a whole group, else written to its slot of
// `partials` (rows of C floats). grid.y * blockDim.x threads of 8 channels each cover C. Vocabulary-
// parallel: grad holds rows [key_first, key_first + key_rows) only; other items are skipped.
static __global__ void encoder_backward_wte_kernel(floatX* grad, float* partials, const int* positions, const int* item_start,
                                                   const int* item_key, const int* item_slot, const int* items,
                                                   const floatX* dout, int C, int key_first, int key_rows) {
    using Pack = Packed128<floatX>;
    using FloatPack = Packed128<float>;
    constexpr int kPacks = kEncoderChannelsPerThread / Pack::size;
    const int c0 = int(blockIdx.y * blockDim.x + threadIdx.x) * kEncoderChannelsPerThread;
    if (c0 >= C) return;
    const int item_count = *items;
    for (int item = int(blockIdx.x); item < item_count; item += int(gridDim.x)) {
        const int key_row = item_key[item] - key_first;
        if (key_row < 0 || key_row >= key_rows) continue;  // another rank's row
        float sum[kEncoderChannelsPerThread] = {};
        const int end = item_start[item + 1];
        int i = item_start[item];
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
        const int slot = item_slot[item];
        if (slot >= 0) {  // a piece: its sum goes to its slot, for the combining kernel
            float* partial = partials + size_t(slot) * C + c0;
            for (int p = 0; p < kEncoderChannelsPerThread / FloatPack::size; ++p) {
                FloatPack v;
                for (int k = 0; k < FloatPack::size; ++k) v[k] = sum[p * FloatPack::size + k];
                store128(partial + p * FloatPack::size, v);
            }
            continue;
        }
        add_into_row(grad + size_t(key_row) * C + c0, sum);
    }
}

// grad[split_key[s],:] += the split group's slots summed in piece order (from zero), for every split
// group s; the same channels per thread and vocabulary-parallel skip as the item kernel.
static __global__ void encoder_backward_combine_kernel(floatX* grad, const float* partials, const int* split_slot_start,
                                                       const int* split_key, const int* splits, int C, int key_first,
                                                       int key_rows) {
    using FloatPack = Packed128<float>;
    const int c0 = int(blockIdx.y * blockDim.x + threadIdx.x) * kEncoderChannelsPerThread;
    if (c0 >= C) return;
    const int split_count = *splits;
    for (int s = int(blockIdx.x); s < split_count; s += int(gridDim.x)) {
        const int key_row = split_key[s] - key_first;
        if (key_row < 0 || key_row >= key_rows) continue;
        float sum[kEncoderChannelsPerThread] = {};
        for (int slot = split_slot_start[s]; slot < split_slot_start[s + 1]; ++slot) {
            const float* partial = partials + size_t(slot) * C + c0;
            for (int p = 0; p < kEncoderChannelsPerThread / FloatPack::size; ++p) {
                const FloatPack v = load128(partial + p * FloatPack::size);
                for (int k = 0; k < FloatPack::size; ++k) sum[p * FloatPack::size + k] += v[k];
            }
        }
        add_into_row(grad + size_t(key_row) * C + c0, sum);
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

// What one grouping holds: G groups, I work items, S split groups owning `slots` partial rows.
struct EncoderGroupingCounts {
    int groups = 0, items = 0, splits = 0, slots = 0;
};

namespace encoder_detail {

// The positions 0..N-1 ordered by (key, position), keys non-negative: a least-significant-digit radix
// sort (Knuth, TAOCP vol. 3, 5.2.5) of 16-bit digits, each pass a stable counting sort, so a key's
// positions stay increasing. One pass when every key is below 2^16 (GPT-2's vocabulary, positions),
// two otherwise. O(N + 2^16) a pass: a d12 B=64 batch (65,536 tokens) took 3.2-4.3 ms with std::sort of
// (key, position) pairs, 0.19-0.33 ms so (2-core AMD VM), time in which the GPU waits for the host.
inline void order_by_key(std::vector<int>& order, const int* keys, int N) {
    constexpr int kDigitBits = 16, kBuckets = 1 << kDigitBits;
    std::vector<int> from(static_cast<size_t>(N)), bucket_start(kBuckets + 1);
    order.resize(size_t(N));
    unsigned all_bits = 0;
    for (int i = 0; i < N; ++i) {
        order[size_t(i)] = i;
        all_bits |= unsigned(keys[i]);
    }
    for (int shift = 0; shift < 32 && (shift == 0 || (all_bits >> shift) != 0); shift += kDigitBits) {
        order.swap(from);
        std::fill(bucket_start.begin(), bucket_start.end(), 0);
        for (int i = 0; i < N; ++i) ++bucket_start[((unsigned(keys[from[size_t(i)]]) >> shift) & (kBuckets - 1)) + 1];
        for (int d = 0; d < kBuckets; ++d) bucket_start[d + 1] += bucket_start[d];
        for (int i = 0; i < N; ++i) {
            const int position = from[size_t(i)];
            order[size_t(bucket_start[(unsigned(keys[position]) >> shift) & (kBuckets - 1)]++)] = position;
        }
    }
}

// Writes at `out` the positions 0..N-1 grouped by keys[position] (`order`: order_by_key's) in the
// layout above. The longest items go first: blocks start roughly in blockIdx order, so this balances
// the GPU. Items of equal length keep key order, and a group's pieces their order (deterministic): a
// stable counting sort by length, which is at most kEncoderRowsPerPiece.
inline EncoderGroupingCounts write_grouping(int* out, const std::vector<int>& order, const int* keys) {
    const int N = int(order.size());
    const GroupingParts<int> g = grouping_parts(out, N);
    EncoderGroupingCounts counts;
    // The items in key order: (first index into order, rows, key, slot).
    struct Item {
        int first, rows, key, slot;
    };
    std::vector<Item> items;
    items.reserve(size_t(N));
    for (int first = 0; first < N;) {
        const int key = keys[order[size_t(first)]];
        int end = first + 1;
        while (end < N && keys[order[size_t(end)]] == key) ++end;
        const int rows = end - first;
        ++counts.groups;
        if (rows <= kEncoderRowsPerPiece) {
            items.push_back({first, rows, key, -1});
        } else {
            g.split_slot_start[counts.splits] = counts.slots;
            g.split_key[counts.splits] = key;
            ++counts.splits;
            for (int piece = first; piece < end; piece += kEncoderRowsPerPiece)
                items.push_back({piece, std::min(kEncoderRowsPerPiece, end - piece), key, counts.slots++});
        }
        first = end;
    }
    if (counts.splits > encoder_max_split_groups(N) || counts.slots > encoder_max_slots(N))
        throw TrainGptError("encoder_backward: " + std::to_string(counts.splits) + " split groups with " +
                            std::to_string(counts.slots) + " slots exceed the bounds for " + std::to_string(N) + " positions");
    g.split_slot_start[counts.splits] = counts.slots;
    *g.splits = counts.splits;
    counts.items = int(items.size());
    // Item i's place: after every longer item and the items of its length before it.
    std::vector<int> place_of_length(kEncoderRowsPerPiece + 1, 0);  // [rows], 1..64: the first place of that length
    for (const Item& item : items) ++place_of_length[size_t(item.rows)];
    for (int rows = kEncoderRowsPerPiece, place = 0; rows >= 1; --rows) {
        const int n = place_of_length[size_t(rows)];
        place_of_length[size_t(rows)] = place;
        place += n;
    }
    std::vector<int> item_at(size_t(counts.items));
    for (int i = 0; i < counts.items; ++i) item_at[size_t(place_of_length[size_t(items[size_t(i)].rows)]++)] = i;
    int filled = 0;  // positions in item order, so that item i's are item_start[i] .. item_start[i+1]
    for (int i = 0; i < counts.items; ++i) {
        const Item& item = items[size_t(item_at[size_t(i)])];
        g.item_start[i] = filled;
        g.item_key[i] = item.key;
        g.item_slot[i] = item.slot;
        for (int k = item.first; k < item.first + item.rows; ++k) g.positions[filled++] = order[size_t(k)];
    }
    g.item_start[counts.items] = filled;
    *g.items = counts.items;
    return counts;
}

}  // namespace encoder_detail

// The grouping of one micro-batch's token ids (and, with token_positions_host, the (B, T) positions of
// its tokens: grouped by position), written to `grouping` (encoder_backward_scratch_ints ints, the
// layout above). It needs only the host's copy of the batch, so it is made when the batch is known,
// and copied to the device with the batch. wpe_rows: the positions there are (max_seq_len).
struct EncoderGrouping {
    const int* ints = nullptr;          // host memory: by token, then (token positions) by position
    size_t count = 0;                   // ints to copy: encoder_backward_scratch_ints
    EncoderGroupingCounts by_token;     // what the kernels will find there (the launches' cost estimates)
    EncoderGroupingCounts by_position;  // with token positions
    bool has_positions = false;         // false: dwpe by t (no token positions)
};

inline EncoderGrouping encoder_backward_grouping(int* grouping, const int* inp_host, int B, int T,
                                                 const int* token_positions_host = nullptr,
                                                 int wpe_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_backward", encoder_batch_problem(B, T));
    const int N = B * T;
    for (int i = 0; i < N; ++i)
        if (inp_host[i] < 0)
            require_supported("encoder_backward",
                              "inp_host[" + std::to_string(i) + "] = " + std::to_string(inp_host[i]) + " is not a token id");
    std::vector<int> order;  // positions by (token, position): each token's contiguous and increasing
    encoder_detail::order_by_key(order, inp_host, N);
    EncoderGrouping g;
    g.ints = grouping;
    g.by_token = encoder_detail::write_grouping(grouping, order, inp_host);
    g.count = encoder_backward_scratch_ints(B, T, token_positions_host != nullptr);
    if (token_positions_host != nullptr) {
        for (int i = 0; i < N; ++i) {
            const int position = token_positions_host[i];
            if (position < 0 || position >= wpe_rows)
                require_supported("encoder_backward", "token_positions_host[" + std::to_string(i) + "] = " +
                                                          std::to_string(position) + " is not a position in [0, " +
                                                          std::to_string(wpe_rows) + ")");
        }
        encoder_detail::order_by_key(order, token_positions_host, N);
        g.by_position = encoder_detail::write_grouping(grouping + encoder_detail::grouping_ints(N), order, token_positions_host);
        g.has_positions = true;
    }
    return g;
}

namespace encoder_detail {

// The grouped sums of one grouping at `device_grouping` into grad (rows [key_first, key_first +
// key_rows)): the item kernel, then, when pieces are possible at this N, the combining kernel. Both
// grids depend on N and C alone.
inline void grouped_sums(floatX* grad, float* partials, const int* device_grouping, const floatX* dout,
                         const EncoderGroupingCounts& counts, int N, int C, cudaStream_t stream, int key_first, int key_rows) {
    const unsigned threads_per_row = ceil_div(C, kEncoderChannelsPerThread);
    const unsigned block = std::min(256u, ceil_div(threads_per_row, 32) * 32);
    const unsigned column_blocks = ceil_div(threads_per_row, block);
    const auto g = grouping_parts(device_grouping, N);
    // Every dout row added once into its item's sum; whole groups' gradient rows read, added, written;
    // pieces' slots written (floats); the grouping's ints read once.
    const double X = sizeof(floatX), F = sizeof(float), btc = double(N) * C;
    const double whole = double(counts.items - counts.slots), slots = counts.slots;  // a slot per piece
    const KernelCost item_cost{btc + whole * C, btc * X + 2.0 * whole * C * X + slots * C * F +
                                                    (double(N) + 3.0 * counts.items + 1) * sizeof(int)};
    launch<encoder_backward_wte_kernel>(item_cost, dim3(std::min<unsigned>(N, kEncoderGroupBlocks), column_blocks), dim3(block),
                                        0, stream, grad, partials, g.positions, g.item_start, g.item_key, g.item_slot,
                                        g.items, dout, C, key_first, key_rows);
    const int max_splits = encoder_max_split_groups(N);
    if (max_splits == 0) return;
    // The slots read and added; S gradient rows read and written.
    const KernelCost combine_cost{slots * C + double(counts.splits) * C,
                                  slots * C * F + 2.0 * counts.splits * C * X + (2.0 * counts.splits + 2) * sizeof(int)};
    launch<encoder_backward_combine_kernel>(combine_cost, dim3(std::min<unsigned>(max_splits, kEncoderGroupBlocks), column_blocks),
                                            dim3(block), 0, stream, grad, partials, g.split_slot_start, g.split_key, g.splits, C,
                                            key_first, key_rows);
}

}  // namespace encoder_detail

// dwte (and dwpe) from a grouping made by encoder_backward_grouping and copied to the device at
// `device_grouping`; `partials`: encoder_backward_partial_floats(B, T, C) floats of scratch. The
// kernels read the counts there, and the launches depend only on B, T and C, so a CUDA graph that
// captured this call replays for every batch. `grouping` (host) gives the counts for the cost
// estimates and whether wpe goes by token position.
// vocab_first, vocab_rows: the rows of the vocabulary dwte holds (vocabulary-parallel; default: all).
inline void encoder_backward(floatX* dwte, floatX* dwpe, const int* device_grouping, float* partials, const floatX* dout,
                             const EncoderGrouping& grouping, int B, int T, int C, cudaStream_t stream, int vocab_first = 0,
                             int vocab_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_backward", encoder_requirements(C));
    require_supported("encoder_backward", encoder_batch_problem(B, T));
    const int N = B * T;
    if (N == 0) return;
    encoder_detail::grouped_sums(dwte, partials, device_grouping, dout, grouping.by_token, N, C, stream, vocab_first,
                                 vocab_rows);
    if (grouping.has_positions) {  // wpe by token position: the same grouped sums (positions checked on the host)
        encoder_detail::grouped_sums(dwpe, partials, device_grouping + encoder_detail::grouping_ints(N), dout,
                                     grouping.by_position, N, C, stream, 0, std::numeric_limits<int>::max());
        return;
    }
    // wpe: dout read once (B additions per element), dwpe read and written once.
    const double btc = double(N) * C, X = sizeof(floatX);
    const size_t wpe_packs = size_t(T) * C / Packed128<floatX>::size;
    const KernelCost wpe_cost{btc, btc * X + 2.0 * T * C * X};
    launch<encoder_backward_wpe_kernel>(wpe_cost, dim3(ceil_div(wpe_packs, 256)), dim3(256), 0, stream, dwpe, dout, B, T,
                                        C);
}

// The grouping made here, from pageable memory (tests and callers without staging memory of their own).
inline void encoder_backward(floatX* dwte, floatX* dwpe, int* scratch, float* partials, const floatX* dout, const int* inp_host,
                             int B, int T, int C, cudaStream_t stream, const int* token_positions_host = nullptr,
                             int vocab_first = 0, int vocab_rows = std::numeric_limits<int>::max()) {
    require_supported("encoder_backward", encoder_batch_problem(B, T));
    if (B * T == 0) return;
    std::vector<int> grouping(encoder_backward_scratch_ints(B, T, token_positions_host != nullptr));
    const EncoderGrouping g = encoder_backward_grouping(grouping.data(), inp_host, B, T, token_positions_host);
    // From pageable memory the copy is staged before the call returns (CUDA Runtime API, "API
    // synchronization behavior"), so `grouping` may go when it does.
    CUDA_CHECK(cudaMemcpyAsync(scratch, g.ints, g.count * sizeof(int), cudaMemcpyHostToDevice, stream));
    encoder_backward(dwte, dwpe, scratch, partials, dout, g, B, T, C, stream, vocab_first, vocab_rows);
}
