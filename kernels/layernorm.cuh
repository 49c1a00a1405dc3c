// LayerNorm over the last dimension (Ba, Kiros, Hinton 2016, "Layer Normalization"):
//   mean = sum(x) / C,  var = sum((x - mean)^2) / C (biased),  rstd = 1 / sqrt(var + 1e-5),
//   out = (x - mean) * rstd * weight + bias.
// The fused variant first forms the residual stream, residual = inp1 + inp2, and normalizes that.
// Backward recomputes xhat = (x - mean) * rstd and reduces the parameter gradients
// deterministically: fixed per-block partial sums, then one kernel sums them in block order.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "common.cuh"

constexpr float kLayernormEps = 1e-5f;
// Backward: one thread per 8 channels and one block per row, so C <= 8 * 1024 threads.
constexpr int kLayernormChannelsPerThread = 8;
constexpr int kLayernormMaxC = kLayernormChannelsPerThread * 1024;

inline std::string layernorm_requirements(int C) {
    if (C <= 0 || C % kLayernormChannelsPerThread != 0)
        return "layernorm: C = " + std::to_string(C) + " is not a positive multiple of 8";
    if (C > kLayernormMaxC)
        return "layernorm: C = " + std::to_string(C) + " exceeds " + std::to_string(kLayernormMaxC) +
               " (backward uses one thread per 8 channels, 1024 threads per block)";
    return "";
}

inline std::string layernorm_rows_problem(int N) {
    return N < 0 ? "layernorm: N = " + std::to_string(N) + " is negative" : "";
}

// ---------------------------------------------------------------------------------------------
// Forward: a warp's lanes per row, in two forms with the same arithmetic in the same order (so the
// same bits). Lane l handles Packed128 number l, l + 32, ... of the row; in the register form a
// warp takes a group of rows (layernorm_rows_per_group), one reduction for all of them. Rows of at
// most 16 (or 8) packs take half (or a quarter) of a warp each in the register form: the lanes a
// whole warp would add beyond them hold zeros, whose adds change nothing, so the sums are the same;
// the CPU emulator pays a fiber switch per thread for each reduction, and `make train`'s C = 128
// (16 packs) left half the threads idle. Mean first, then the variance about the mean (the two-pass
// form does not cancel catastrophically like E[x^2] - mean^2), then the output; the multiply-adds
// are explicit fmaf, so that the compiler's contraction choices (g++ -O3 vectorizes the two forms
// differently) cannot make their bits differ. Rows of up to kLayernormMaxRegisterPacks packs per
// lane (C <= 2048 in BF16, 1024 in FP32) are held in registers, so the row is read from memory once,
// and the fused variant never reads back the residual it writes; wider rows stream the row three
// times (the re-reads mostly from cache).

constexpr int kLayernormMaxRegisterPacks = 8;

// The packs per lane of the register form for a row of C (the smallest instantiated count that
// holds it), or 0: the streaming form; and the lanes per row (32, or 16 or 8 for rows that fit one
// pack per lane).
struct LayernormForm {
    int packs, lanes;
};
inline LayernormForm layernorm_form(int C) {
    const int row_packs = int(ceil_div(C, Packed128<floatX>::size));
    for (int lanes : {8, 16})
        if (row_packs <= lanes) return {1, lanes};
    const int needed = int(ceil_div(row_packs, 32));
    for (int packs : {2, 3, 4, kLayernormMaxRegisterPacks})
        if (needed <= packs) return {packs, 32};
    return {0, 32};
}

// The arithmetic both forms share, pack by pack, so that it lives in one place.
namespace layernorm_detail {
using Pack = Packed128<floatX>;
__device__ inline void add_values(float& sum, const Pack& v) {
    float x[Pack::size];
    unpack_floats(x, v);
    for (int k = 0; k < Pack::size; ++k) sum += x[k];
}
__device__ inline void add_squared_deviations(float& squares, const Pack& v, float mean) {
    float x[Pack::size];
    unpack_floats(x, v);
    for (int k = 0; k < Pack::size; ++k) {
        const float d = x[k] - mean;
        squares = fmaf(d, d, squares);
    }
}
// The sums over a row's kLanes lanes (aligned groups of a warp) of each of kCount values (the rows
// of a group, layernorm_rows_in_registers), in one collective: warp_sum's butterfly without its
// steps across groups.
template <int kLanes, int kCount> __device__ inline void row_lanes_sum_each(float (&v)[kCount]) {
    static_assert(kLanes == 8 || kLanes == 16 || kLanes == 32, "a row takes 8, 16 or 32 lanes");
    if constexpr (kLanes == 32) warp_sum_each(v);
    else if constexpr (kLanes == 16) warp_xor_chain_each<AddOp, kCount, 8, 4, 2, 1>(v);
    else warp_xor_chain_each<AddOp, kCount, 4, 2, 1>(v);
}
// The row's mean and rstd from its lanes' summed sums.
__device__ inline float mean_of(float sum, int C) { return sum / float(C); }
__device__ inline float rstd_of(float squares, int C) { return rsqrtf(squares / float(C) + kLayernormEps); }
// out[c .. c + Pack::size) = (v - mean) * rstd * weight + bias.
__device__ inline void store_normalized(floatX* out, const floatX* weight, const floatX* bias, int c, const Pack& v,
                                        float mean, float rstd) {
    float x[Pack::size], w[Pack::size], b[Pack::size];
    unpack_floats(x, v);
    unpack_floats(w, load128(weight + c));
    unpack_floats(b, load128(bias + c));
    LANE_LOOP
    for (int k = 0; k < Pack::size; ++k) x[k] = fmaf((x[k] - mean) * rstd, w[k], b[k]);
    store128(out + c, pack_floats<floatX>(x));
}
template <int kLanes = 32> __device__ inline void store_statistics(float* mean_out, float* rstd_out, float mean, float rstd) {
    if (threadIdx.x % kLanes != 0) return;
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}
}  // namespace layernorm_detail

// Rows a warp's lanes take together in the register form: kPacks packs of each in registers. Their
// sums cross the lanes in one shuffle collective per reduction (a fiber switch per thread each in the
// CPU emulator, which were most of its cost at one row a warp: GPT-2 124M's residual LayerNorms 15 ms
// a step); 2 rows at 8 packs a lane keep the registers those rows need at 64 for the packs.
__host__ __device__ constexpr int layernorm_rows_per_group(int packs) { return packs == 0 ? 1 : packs <= 4 ? 4 : 2; }

// The statistics and output of kRows rows whose packs are in `rows` (lane's pack p of row r is pack
// lane + kLanes p of row r), row r at out + r C, mean_out[r], rstd_out[r]. Rows from `valid_rows` on
// (past the last row of the batch) compute on zeros, so that their lanes take part in the reductions,
// and store nothing. Each row's sums are the one-row form's, in its order.
template <int kPacks, int kLanes, int kRows>
__device__ inline void layernorm_rows_in_registers(floatX* out, float* mean_out, float* rstd_out,
                                                   const Packed128<floatX> (&rows)[kRows][kPacks], const floatX* weight,
                                                   const floatX* bias, int C, int valid_rows) {
    using namespace layernorm_detail;
    const int lane = int(threadIdx.x % kLanes);
    const auto column = [&](int p) { return (lane + kLanes * p) * Pack::size; };
    float mean[kRows], rstd[kRows];
    for (int r = 0; r < kRows; ++r) {
        mean[r] = 0.0f;
        for (int p = 0; p < kPacks; ++p)
            if (column(p) < C) add_values(mean[r], rows[r][p]);
    }
    row_lanes_sum_each<kLanes>(mean);
    for (int r = 0; r < kRows; ++r) mean[r] = mean_of(mean[r], C);
    for (int r = 0; r < kRows; ++r) {
        rstd[r] = 0.0f;  // the squares first
        for (int p = 0; p < kPacks; ++p)
            if (column(p) < C) add_squared_deviations(rstd[r], rows[r][p], mean[r]);
    }
    row_lanes_sum_each<kLanes>(rstd);
    for (int r = 0; r < kRows; ++r) rstd[r] = rstd_of(rstd[r], C);
    for (int r = 0; r < kRows && r < valid_rows; ++r) {
        for (int p = 0; p < kPacks; ++p)
            if (column(p) < C) store_normalized(out + size_t(r) * C, weight, bias, column(p), rows[r][p], mean[r], rstd[r]);
        store_statistics<kLanes>(mean_out ? mean_out + r : nullptr, rstd_out ? rstd_out + r : nullptr, mean[r], rstd[r]);
    }
}

// The streaming form: the row read three times.
__device__ inline void layernorm_row_streamed(floatX* out, float* mean_out, float* rstd_out, const floatX* x,
                                              const floatX* weight, const floatX* bias, int C) {
    using namespace layernorm_detail;
    const int first = int(threadIdx.x % 32) * Pack::size;
    constexpr int kStride = 32 * Pack::size;
    float sum[1] = {0.0f};
    for (int c = first; c < C; c += kStride) add_values(sum[0], load128(x + c));
    row_lanes_sum_each<32>(sum);
    const float mean = mean_of(sum[0], C);
    float squares[1] = {0.0f};
    for (int c = first; c < C; c += kStride) add_squared_deviations(squares[0], load128(x + c), mean);
    row_lanes_sum_each<32>(squares);
    const float rstd = rstd_of(squares[0], C);
    for (int c = first; c < C; c += kStride) store_normalized(out, weight, bias, c, load128cs(x + c), mean, rstd);
    store_statistics(mean_out, rstd_out, mean, rstd);
}

constexpr int kLayernormForwardBlock = 256;  // 8 warps; a warp takes a group of rows (16 or 32 in the sub-warp forms)

// The forward kernels' grid for N rows in the form (packs, lanes): groups of layernorm_rows_per_group
// rows, kLayernormForwardBlock / lanes groups a block.
inline dim3 layernorm_forward_grid(int N, int packs, int lanes) {
    return dim3(unsigned(ceil_div(N, kLayernormForwardBlock / lanes * layernorm_rows_per_group(packs))));
}

// kPacks: packs per lane held in registers; 0: the streaming form. kLanes: lanes per row (32 for the
// streaming form). The kLanes lanes of group g take rows g kRows .. g kRows + kRows - 1.
template <int kPacks, int kLanes>
static __global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    using Pack = Packed128<floatX>;
    static_assert(kPacks > 0 || kLanes == 32, "the streaming form takes a warp a row");
    constexpr int kRows = layernorm_rows_per_group(kPacks);
    const int first = int(blockIdx.x * (blockDim.x / kLanes) + threadIdx.x / kLanes) * kRows;
    if (kLanes == 32 && first >= N) return;  // whole warps leave; no block-wide barrier follows
    const int valid_rows = N - first;        // (rows sharing a warp all take part in its reductions)
    float* first_mean = mean && valid_rows > 0 ? mean + first : nullptr;
    float* first_rstd = rstd && valid_rows > 0 ? rstd + first : nullptr;
    if constexpr (kPacks == 0) {
        const size_t offset = size_t(first) * C;
        layernorm_row_streamed(out + offset, first_mean, first_rstd, inp + offset, weight, bias, C);
    } else {
        const int lane = int(threadIdx.x % kLanes);
        Pack x[kRows][kPacks];
        for (int r = 0; r < kRows; ++r)  // every load issued before the first use
            for (int p = 0; p < kPacks; ++p) {
                const int c = (lane + kLanes * p) * Pack::size;
                x[r][p] = r < valid_rows && c < C ? load128cs(inp + size_t(first + r) * C + c) : Pack::filled(0.0f);
            }
        const size_t offset = size_t(valid_rows > 0 ? first : 0) * C;
        layernorm_rows_in_registers<kPacks, kLanes, kRows>(out + offset, first_mean, first_rstd, x, weight, bias, C, valid_rows);
    }
}

template <int kPacks, int kLanes>
static __global__ void fused_residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                        const floatX* inp1, const floatX* inp2, const floatX* weight,
                                                        const floatX* bias, int N, int C) {
    using Pack = Packed128<floatX>;
    static_assert(kPacks > 0 || kLanes == 32, "the streaming form takes a warp a row");
    constexpr int kRows = layernorm_rows_per_group(kPacks);
    const int first = int(blockIdx.x * (blockDim.x / kLanes) + threadIdx.x / kLanes) * kRows;
    if (kLanes == 32 && first >= N) return;
    const int valid_rows = N - first;  // (see layernorm_forward_kernel)
    const int lane = int(threadIdx.x % kLanes);
    float* first_mean = mean && valid_rows > 0 ? mean + first : nullptr;
    float* first_rstd = rstd && valid_rows > 0 ? rstd + first : nullptr;
    // The statistics come from the rounded residual that the next layer reads.
    const auto residual_pack = [&](size_t offset) {
        float a[Pack::size], b[Pack::size];
        unpack_floats(a, load128cs(inp1 + offset));
        unpack_floats(b, load128cs(inp2 + offset));
        LANE_LOOP
        for (int k = 0; k < Pack::size; ++k) a[k] += b[k];
        const Pack r = pack_floats<floatX>(a);
        store128(residual + offset, r);
        return r;
    };
    if constexpr (kPacks == 0) {
        // Each lane writes the very packs it reads back (the same lane-to-pack map), so it sees its
        // own stores without any synchronization.
        const size_t offset = size_t(first) * C;
        for (int c = lane * Pack::size; c < C; c += 32 * Pack::size) residual_pack(offset + c);
        layernorm_row_streamed(out + offset, first_mean, first_rstd, residual + offset, weight, bias, C);
    } else {
        Pack r[kRows][kPacks];
        for (int row = 0; row < kRows; ++row)
            for (int p = 0; p < kPacks; ++p) {
                const int c = (lane + kLanes * p) * Pack::size;
                r[row][p] = row < valid_rows && c < C ? residual_pack(size_t(first + row) * C + c) : Pack::filled(0.0f);
            }
        const size_t offset = size_t(valid_rows > 0 ? first : 0) * C;
        layernorm_rows_in_registers<kPacks, kLanes, kRows>(out + offset, first_mean, first_rstd, r, weight, bias, C, valid_rows);
    }
}

// Costs. FLOPs per element: forward 8 (mean 1; variance 3: subtract, multiply, add; output 4:
// subtract, two multiplies, add), the residual add 1 more; backward 14 (xhat 2, dxhat 1, the two
// row sums 3, the parameter-gradient sums 3, dx 4, the += 1). Bytes: every tensor once, which is
// what the register form moves; the streaming form (C past the register limit) reads each row three
// times (all but the first from cache) and the fused one reads back the residual it has just
// written; those re-reads are not counted.
inline KernelCost layernorm_forward_cost(int N, int C, bool stats, bool residual) {
    const double nc = double(N) * C, X = sizeof(floatX);
    const double tensors = residual ? 4 : 2;  // in: inp (or inp1, inp2); out: out (and residual)
    return {(residual ? 9.0 : 8.0) * nc, tensors * nc * X + 2.0 * C * X + (stats ? 2.0 * N * sizeof(float) : 0.0)};
}

// Calls f(std::integral_constant<int, packs>, std::integral_constant<int, lanes>) with the form of C
// (layernorm_form): the forward kernels are instantiated for these forms only.
template <typename F>
void with_layernorm_form(int C, F&& f) {
    using std::integral_constant;
    const LayernormForm form = layernorm_form(C);
    if (form.lanes == 8) return f(integral_constant<int, 1>{}, integral_constant<int, 8>{});
    if (form.lanes == 16) return f(integral_constant<int, 1>{}, integral_constant<int, 16>{});
    switch (form.packs) {
        case 2: f(integral_constant<int, 2>{}, integral_constant<int, 32>{}); break;
        case 3: f(integral_constant<int, 3>{}, integral_constant<int, 32>{}); break;
        case 4: f(integral_constant<int, 4>{}, integral_constant<int, 32>{}); break;
        case kLayernormMaxRegisterPacks: f(integral_constant<int, kLayernormMaxRegisterPacks>{}, integral_constant<int, 32>{}); break;
        default: f(integral_constant<int, 0>{}, integral_constant<int, 32>{}); break;
    }
}

// mean and rstd may be null when the backward pass will not need them.
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream) {
    require_supported("layernorm_forward", layernorm_requirements(C));
    require_supported("layernorm_forward", layernorm_rows_problem(N));
    if (N == 0) return;
    const KernelCost cost = layernorm_forward_cost(N, C, mean != nullptr, false);
    with_layernorm_form(C, [&](auto packs, auto lanes) {
        constexpr int P = decltype(packs)::value, L = decltype(lanes)::value;
        launch<layernorm_forward_kernel<P, L>>(cost, layernorm_forward_grid(N, P, L), dim3(kLayernormForwardBlock), 0, stream, out,
                                               mean, rstd, inp, weight, bias, N, C);
    });
}

inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream) {
    require_supported("fused_residual_layernorm_forward", layernorm_requirements(C));
    require_supported("fused_residual_layernorm_forward", layernorm_rows_problem(N));
    if (N == 0) return;
    const KernelCost cost = layernorm_forward_cost(N, C, mean != nullptr, true);
    with_layernorm_form(C, [&](auto packs, auto lanes) {
        constexpr int P = decltype(packs)::value, L = decltype(lanes)::value;
        launch<fused_residual_layernorm_forward_kernel<P, L>>(cost, layernorm_forward_grid(N, P, L), dim3(kLayernormForwardBlock), 0,
                                                              stream, residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    });
}

// ---------------------------------------------------------------------------------------------
// Backward. With xhat = (x - mean) * rstd and dxhat = dout * weight:
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
//   dweight = sum over rows of dout * xhat,  dbias = sum over rows of dout.
// A fixed number of blocks (at most kLayernormBackwardMaxBlocks, whatever N) each take rows
// blockIdx.x, blockIdx.x + gridDim.x, ...; a thread owns 8 channels for all of its block's rows,
// so its parameter-gradient sums stay in registers, and the block writes one partial row of 2C
// floats. layernorm_param_grads_kernel then sums the partials in block order.
//
// The residual stream's LayerNorm (dinp is the residual's gradient, added to) can also sum dinp's
// columns for the two linears around it (ResidualBiasGrads): dinp holds, on entry, the gradient of
// the output of the linear before it in the backward pass, and on return that of the linear after
// it, and a linear's bias gradient is the column sum of its output's gradient. In GPT-2's ln2 those
// are the MLP projection (fcprojb) and the attention projection (attprojb). The kernel reads and
// writes every dinp row anyway, so the sums cost registers, where the matmul's column-sum kernels
// read the gradient again (at d12 B=64 on an H100: 24 launches of 100 MB and their finishing
// launches a step). Their partial rows follow the LayerNorm's: 4C floats a block.

// At least 64 rows a block: a block's partial row (at most 4C floats, written here and read again by
// layernorm_param_grads_kernel) is then at most 3% of what its rows move (4 BF16 tensors of C a row),
// where at 8 rows it was a quarter: at d48, B=16 (16,384 rows) 1,024 blocks wrote 26 MB of partials a
// call; now 256 blocks, one wave of an H100 (two 224-thread blocks an SM at the 125 and 140 registers
// a thread that `make kernel-report` shows), write 6.6 MB. At d12, B=64 (65,536 rows) the cap keeps
// 1,024 blocks of 64 rows either way.
constexpr int kLayernormBackwardMaxBlocks = 1024;
constexpr int kLayernormBackwardMinRowsPerBlock = 64;

inline int layernorm_backward_blocks(int N) {
    return std::clamp(int(ceil_div(std::max(N, 1), kLayernormBackwardMinRowsPerBlock)), 1, kLayernormBackwardMaxBlocks);
}

// The bias gradients of the linears whose output gradients a residual LayerNorm's dinp holds: on entry
// (`incoming`) and as written (`outgoing`, the rounded values the next matmul reads). Both or neither.
struct ResidualBiasGrads {
    floatX* incoming = nullptr;
    floatX* outgoing = nullptr;
    bool any() const { return incoming != nullptr || outgoing != nullptr; }
};

// C-float sets in a block's partial row: dweight, dbias, and with the residual's bias gradients their two.
template <bool kResidualBias> constexpr int kLayernormPartialSets = kResidualBias ? 4 : 2;
inline int layernorm_partial_sets(bool residual_bias) {
    return residual_bias ? kLayernormPartialSets<true> : kLayernormPartialSets<false>;
}

inline size_t layernorm_backward_scratch_floats(int N, int C, bool residual_bias = false) {
    return size_t(layernorm_backward_blocks(N)) * layernorm_partial_sets(residual_bias) * size_t(std::max(C, 0));
}

// kRows: rows taken together. Their statistics and this thread's dout and inp packs are loaded
// before any is used (their loads in flight together), and their row sums cross the warp in one
// shuffle collective and the block through one barrier: a fiber switch per thread each in the CPU
// emulator, which were most of its cost at one row a round (GPT-2 124M's 25 launches a step: 27 ms).
// kLayernormRowsPerRound rows' packs fit in registers at blocks of up to kLayernormBatchedThreads
// (C <= 2048 in BF16); at 1024 threads (64 registers each) wider rows take one row a round. Every row's
// sums are the same values in the same order either way, so both forms give the same bits.
constexpr int kLayernormRowsPerRound = 4;
constexpr int kLayernormBatchedThreads = 256;

// The block size of the backward's form for rows of C: up to kLayernormBatchedThreads threads the
// batched form, past it the one-row form.
inline unsigned layernorm_backward_threads(int C) { return ceil_div(ceil_div(C, kLayernormChannelsPerThread), 32) * 32; }

// Whether the backward can sum the residual's bias gradients for rows of C: in the batched form only
// (C <= 2048; every GPT-2 size), whose 256-thread blocks leave registers for the two sums. The one-row
// form's blocks of up to 1024 threads have 64 registers a thread, and with the sums it spilled (sm_90:
// 90 bytes); wider models leave those gradients to the matmuls' column sums.
inline bool layernorm_sums_residual_bias(int C) { return layernorm_backward_threads(C) <= unsigned(kLayernormBatchedThreads); }
// Rows a round with those sums: 2. At 4 their 16 more registers a thread took the kernel to 166
// (sm_90), so a 224-thread block of d48 (C = 1600) would take a whole SM's registers (one block, 7
// warps, where the plain form runs two); at 2 rows it uses 125, and GPT-2's rows (768 to 1600 wide)
// keep the plain form's occupancy or better. Asking ptxas for two blocks at 4 rows spilled 20 bytes.
// The rows a round do not change a sum's order, so the bits are the same (test_kernel_layernorm).
constexpr int kLayernormResidualBiasRowsPerRound = 2;

template <int kRows, bool kResidualBias = false>
static __global__ void __launch_bounds__(kRows > 1 ? kLayernormBatchedThreads : 1024)
    layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp, const floatX* weight,
                              const float* mean, const float* rstd, int N, int C) {
    static_assert(!kResidualBias || kRows > 1,
                  "the residual's bias sums ride in the batched form only (layernorm_sums_residual_bias)");
    using Pack = Packed128<floatX>;
    constexpr int kChannels = kLayernormChannelsPerThread;
    constexpr int kPacks = kChannels / Pack::size;
    constexpr int kSums = 2 * kRows;  // per row of a round: sum(dxhat), sum(dxhat * xhat)
    // Per round, each warp's sums; two buffers so that one barrier per round suffices: a warp can
    // only overwrite buffer (round parity) after the next round's barrier, which every warp reaches
    // after it has read this round's sums.
    __shared__ float warp_sums[2][32][kSums];
    const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
    const int c0 = int(threadIdx.x) * kChannels;
    const bool owns_channels = c0 < C;  // the last warp may be partial: its idle lanes add zeros

    float dweight_sum[kChannels] = {}, dbias_sum[kChannels] = {};
    // kResidualBias: the column sums of dinp as read and as written (ResidualBiasGrads).
    float incoming_sum[kChannels] = {}, outgoing_sum[kChannels] = {};
    // The block's rows are blockIdx.x, blockIdx.x + gridDim.x, ...; a round takes kRows of them.
    const int stride = int(gridDim.x);
    int parity = 0;
    for (int first = int(blockIdx.x); first < N; first += kRows * stride, parity ^= 1) {
        float row_mean[kRows], row_rstd[kRows];
        Pack d[kRows][kPacks], x[kRows][kPacks];
        for (int r = 0; r < kRows; ++r) {  // rows past N read as zeros and store nothing
            const int row = first + r * stride;
            const bool load = row < N && owns_channels;
            row_mean[r] = row < N ? mean[row] : 0.0f;
            row_rstd[r] = row < N ? rstd[row] : 0.0f;
            const size_t offset = size_t(load ? row : 0) * C + c0;
            for (int p = 0; p < kPacks; ++p) {
                d[r][p] = load ? load128cs(dout + offset + p * Pack::size) : Pack::filled(0.0f);
                x[r][p] = load ? load128cs(inp + offset + p * Pack::size) : Pack::filled(0.0f);
            }
        }
        // xhat and dxhat are recomputed in the second pass from the packs (the same expressions, so
        // the same values) rather than kept: registers fewer. Pack by pack as float arrays, so that
        // the CPU build runs the per-channel math as SIMD (it was scalar, a 16-bit load per value); the
        // multiply-adds are explicit fmaf, as in the forward pass, so that the compiler's contraction
        // choices (scalar and SIMD code contract differently) cannot change the bits.
        Pack w[kPacks];  // the same every round, reloaded (from L1): kept, it spilled at 64 registers
        for (int p = 0; p < kPacks; ++p) w[p] = owns_channels ? load128(weight + c0 + p * Pack::size) : Pack::filled(0.0f);
        const auto values = [&](int r, int p, float (&dy)[Pack::size], float (&xhat)[Pack::size], float (&dxhat)[Pack::size]) {
            float wv[Pack::size];
            unpack_floats(dy, d[r][p]);
            unpack_floats(xhat, x[r][p]);
            unpack_floats(wv, w[p]);
            LANE_LOOP
            for (int k = 0; k < Pack::size; ++k) {
                xhat[k] = (xhat[k] - row_mean[r]) * row_rstd[r];
                dxhat[k] = dy[k] * wv[k];
            }
        };
        float sums[kSums];  // row r's at 2r and 2r + 1
        for (int r = 0; r < kRows; ++r) {
            float dxhat_sum = 0.0f, dxhat_xhat_sum = 0.0f;
            if (owns_channels && first + r * stride < N) {
                for (int p = 0; p < kPacks; ++p) {
                    float dy[Pack::size], xhat[Pack::size], dxhat[Pack::size];
                    values(r, p, dy, xhat, dxhat);
                    for (int k = 0; k < Pack::size; ++k) {  // the row sums: one chain each, in channel order
                        dxhat_sum += dxhat[k];
                        dxhat_xhat_sum = fmaf(dxhat[k], xhat[k], dxhat_xhat_sum);
                    }
                    LANE_LOOP
                    for (int k = 0; k < Pack::size; ++k) {
                        dbias_sum[p * Pack::size + k] += dy[k];
                        dweight_sum[p * Pack::size + k] = fmaf(dy[k], xhat[k], dweight_sum[p * Pack::size + k]);
                    }
                }
            }
            sums[2 * r] = dxhat_sum;
            sums[2 * r + 1] = dxhat_xhat_sum;
        }
        warp_sum_each(sums);
        float block_sums[kSums] = {};
        if (kRows > 1 && warps == 1) {
            // A one-warp block (C <= 256 in BF16): its sums are the warp's, added to 0 as below (the
            // same bits), with no shared memory and no barrier, which costs every thread a fiber
            // switch in the CPU emulator. Uniform over the block. (The one-row form's blocks are wider
            // than 256 threads; the path compiled there cost its FP32 build a spill at 64 registers.)
            if (!owns_channels) continue;
            for (int i = 0; i < kSums; ++i) block_sums[i] += sums[i];
        } else {
            if (lane == 0)
                for (int i = 0; i < kSums; ++i) warp_sums[parity][warp][i] = sums[i];
            __syncthreads();
            if (!owns_channels) continue;
            for (int wi = 0; wi < warps; ++wi)  // the same order in every thread: identical means
                for (int i = 0; i < kSums; ++i) block_sums[i] += warp_sums[parity][wi][i];
        }
        for (int r = 0; r < kRows; ++r) {
            const int row = first + r * stride;
            if (row >= N) break;
            const float mean_dxhat = block_sums[2 * r] / float(C), mean_dxhat_xhat = block_sums[2 * r + 1] / float(C);
            for (int p = 0; p < kPacks; ++p) {
                float dy[Pack::size], xhat[Pack::size], dxhat[Pack::size], g[Pack::size];
                values(r, p, dy, xhat, dxhat);
                floatX* grad = dinp + size_t(row) * C + c0 + p * Pack::size;
                unpack_floats(g, load128(grad));
                if constexpr (kResidualBias) {
                    LANE_LOOP
                    for (int k = 0; k < Pack::size; ++k) incoming_sum[p * Pack::size + k] += g[k];
                }
                LANE_LOOP
                for (int k = 0; k < Pack::size; ++k)
                    g[k] = fmaf(row_rstd[r], fmaf(-xhat[k], mean_dxhat_xhat, dxhat[k] - mean_dxhat), g[k]);
                const Pack written = pack_floats<floatX>(g);
                store128(grad, written);
                if constexpr (kResidualBias) {
                    unpack_floats(g, written);  // the rounded values: what the next matmul reads
                    LANE_LOOP
                    for (int k = 0; k < Pack::size; ++k) outgoing_sum[p * Pack::size + k] += g[k];
                }
            }
        }
    }
    if (!owns_channels) return;
    // partials row blockIdx.x: [dweight sums (C) | dbias sums (C)], then with kResidualBias
    // [incoming sums (C) | outgoing sums (C)]
    float* partial = partials + size_t(blockIdx.x) * kLayernormPartialSets<kResidualBias> * C + c0;
    for (int p = 0; p < kChannels / 4; ++p) {
        Packed128<float> w, b, in, out;
        for (int k = 0; k < 4; ++k) {
            w[k] = dweight_sum[p * 4 + k];
            b[k] = dbias_sum[p * 4 + k];
            in[k] = incoming_sum[p * 4 + k];
            out[k] = outgoing_sum[p * 4 + k];
        }
        store128(partial + p * 4, w);
        store128(partial + C + p * 4, b);
        if constexpr (kResidualBias) {
            store128(partial + 2 * C + p * 4, in);
            store128(partial + 3 * C + p * 4, out);
        }
    }
}

// Column sums of the partials (blocks x 2C): 32 columns per block, blockDim.y slices of the
// partial rows (partial_row_slices, kernels/common.cuh); then += into the grads.

// The gradients a partial row's C-float sets are added into, in the row's order.
struct LayernormGradTargets {
    floatX* sets[4];
};

static __global__ void layernorm_param_grads_kernel(LayernormGradTargets targets, const float* partials, int blocks, int C,
                                                    int sets) {
    __shared__ float slice_sums[kPartialRowSlices][32];
    const int column = int(blockIdx.x * 32 + threadIdx.x), row_floats = sets * C;
    const bool in_range = column < row_floats;
    float sum = 0.0f;
    if (in_range)
        for (int b = int(threadIdx.y); b < blocks; b += int(blockDim.y)) sum += partials[size_t(b) * row_floats + column];
    slice_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || !in_range) return;
    float total = 0.0f;
    for (int s = 0; s < int(blockDim.y); ++s) total += slice_sums[s][threadIdx.x];
    floatX* grad = targets.sets[column / C] + column % C;
    *grad = from_float<floatX>(to_float(*grad) + total);
}

// scratch: layernorm_backward_scratch_floats(N, C, residual_bias.any()) floats.
inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream, ResidualBiasGrads residual_bias = {}) {
    require_supported("layernorm_backward", layernorm_requirements(C));
    require_supported("layernorm_backward", layernorm_rows_problem(N));
    const bool with_bias = residual_bias.any();
    require_supported("layernorm_backward", with_bias && (!residual_bias.incoming || !residual_bias.outgoing)
                                                ? "layernorm: residual bias gradients need both incoming and outgoing"
                                                : "");
    require_supported("layernorm_backward", with_bias && !layernorm_sums_residual_bias(C)
                                                ? "layernorm: residual bias gradients need C <= " +
                                                      std::to_string(kLayernormBatchedThreads * kLayernormChannelsPerThread) +
                                                      " (C = " + std::to_string(C) + "; layernorm_sums_residual_bias)"
                                                : "");
    if (N == 0) return;
    const int blocks = layernorm_backward_blocks(N), sets = layernorm_partial_sets(with_bias);
    const unsigned threads = layernorm_backward_threads(C);
    // dout, inp read; dinp read and written (+=); weight, mean, rstd read; the partials written. The
    // residual's column sums: two adds an element, no bytes beyond their partials.
    const double nc = double(N) * C, X = sizeof(floatX), partial_floats = double(blocks) * sets * C;
    const KernelCost cost{(with_bias ? 16.0 : 14.0) * nc,
                          4.0 * nc * X + double(C) * X + 2.0 * N * sizeof(float) + partial_floats * sizeof(float)};
    auto run = [&](auto rows, auto bias) {
        launch<layernorm_backward_kernel<decltype(rows)::value, decltype(bias)::value>>(cost, dim3(blocks), dim3(threads), 0, stream,
                                                                                       dinp, scratch, dout, inp, weight, mean,
                                                                                       rstd, N, C);
    };
    using std::integral_constant;
    if (threads > unsigned(kLayernormBatchedThreads)) run(integral_constant<int, 1>{}, std::false_type{});
    else if (with_bias) run(integral_constant<int, kLayernormResidualBiasRowsPerRound>{}, std::true_type{});
    else run(integral_constant<int, kLayernormRowsPerRound>{}, std::false_type{});
    // The partials summed (one add each) and added into the gradients (read and written).
    const KernelCost reduce_cost{partial_floats + sets * double(C), partial_floats * sizeof(float) + 2.0 * sets * C * X};
    const LayernormGradTargets targets{{dweight, dbias, residual_bias.incoming, residual_bias.outgoing}};
    launch<layernorm_param_grads_kernel>(reduce_cost, dim3(ceil_div(size_t(sets) * C, 32)), dim3(32, partial_row_slices(blocks)),
                                         0, stream, targets, scratch, blocks, C, sets);
}
