// Fused AdamW step with FP32 master weights, the gradient-clipping scale and stochastic rounding
// of the BF16 parameters, in one pass over memory.
//
// AdamW: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", with the update order
// of torch.optim.AdamW (decay applied to the old weight, then the bias-corrected Adam step):
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   master = master (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// Stochastic rounding (Gupta et al. 2015, "Deep Learning with Limited Numerical Precision"):
// rounds up with probability equal to the distance from the lower neighbour in ulps, so
// E[round(x)] = x and small updates survive on average in BF16 parameters.
//
// Every multiply-add is an explicit fmaf and sqrtf/division are IEEE-rounded on both builds, so
// the GPU and the CPU build compute the same bits. Random bits are a pure function of (seed,
// step, global element index): results do not depend on launch configuration, schedule, or how
// the flat parameter buffer is split into calls or ZeRO shards.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "common.cuh"

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
};

// ---------------------------------------------------------------------------------------------
// Counter-based random bits.

// SplitMix64's output function (Steele, Lea & Flood 2014, "Fast Splittable Pseudorandom Number
// Generators"): a bijection of 64-bit words with full avalanche.
__host__ __device__ inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;  // the generator's increment, 2^64 / golden ratio

// One generator per (seed, step): its start state is the step-th output of SplitMix64 seeded with
// mix(seed). Computed once per launch on the host.
__host__ __device__ inline uint64_t rounding_key(uint64_t seed, uint64_t step) {
    return splitmix64_mix(splitmix64_mix(seed) + (step + 1) * kSplitMix64Gamma);
}
// SplitMix64 is counter-based: the generator whose state starts at `key` is in state key + (i + 1)
// gamma for its index-th output, and the state advances by gamma from one index to the next.
__host__ __device__ inline uint64_t rounding_state(uint64_t key, uint64_t index) {
    return key + (index + 1) * kSplitMix64Gamma;
}
// The output for a state, high half.
__host__ __device__ inline uint32_t rounding_bits_of_state(uint64_t state) { return uint32_t(splitmix64_mix(state) >> 32); }
// The index-th output of the generator whose state starts at `key`.
__host__ __device__ inline uint32_t rounding_bits_for_key(uint64_t key, uint64_t index) {
    return rounding_bits_of_state(rounding_state(key, index));
}
__host__ __device__ inline uint32_t rounding_bits(uint64_t seed, uint64_t step, uint64_t index) {
    return rounding_bits_for_key(rounding_key(seed, step), index);
}

// FP32 -> BF16, unbiased: add 16 uniform random bits to the 16 bits BF16 drops and truncate. The
// carry reaches bf16's last bit with probability dropped / 2^16 (exactly the fraction of an ulp
// that x lies above its lower neighbour in magnitude); a carry out of the mantissa gives the
// next binade's first value, which is the correct upper neighbour (and +-inf past the largest
// finite value, as round-to-nearest would). A NaN could carry into inf, so it becomes the
// canonical BF16 NaN 0x7FFF (what __float2bfloat16 gives). A select, not a branch: the CPU
// build's loop over a chunk then vectorizes.
__host__ __device__ inline __nv_bfloat16 stochastic_round_bf16(float x, uint32_t random_bits) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const uint32_t rounded = (bits + (random_bits >> 16)) >> 16;
    return __ushort_as_bfloat16(static_cast<unsigned short>(nan ? 0x7FFFu : rounded));
}

// ---------------------------------------------------------------------------------------------
// The kernel.

// Per-step coefficients, computed once on the host.
struct AdamWStepCoefficients {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
    float decay;  // 1 - lr * weight_decay
    float inv_bias_correction1, inv_bias_correction2;  // 1 / (1 - beta^t)
    float grad_scale;
    uint64_t rounding_key;
    uint64_t element_offset;  // index of element 0 of this call in the flat parameter buffer
};

__device__ inline void adamw_update_element(float grad, float& master, float& m, float& v,
                                            const AdamWStepCoefficients& c) {
    const float g = grad * c.grad_scale;
    m = fmaf(c.beta1, m, c.one_minus_beta1 * g);
    v = fmaf(c.beta2, v, c.one_minus_beta2 * g * g);
    const float step = (m * c.inv_bias_correction1) / (sqrtf(v * c.inv_bias_correction2) + c.eps);
    master = fmaf(-c.lr, step, master * c.decay);
}

// The parameter the forward pass uses: the master weight itself in FP32, stochastically rounded
// in BF16 with the bits of its global index.
__device__ inline floatX adamw_param_from_master(float master, const AdamWStepCoefficients& c, size_t i) {
    if constexpr (std::is_same_v<floatX, float>) {
        return master;
    } else {
        return stochastic_round_bf16(master, rounding_bits_for_key(c.rounding_key, c.element_offset + i));
    }
}

// The same for the N elements from `first` on: the chunk's first state (rounding_state), then gamma
// added for each next element (a loop-carried sum, which g++ vectorizes as a vector induction;
// written as k * gamma, g++ folded it back into a multiply): one 64-bit multiply per element fewer
// than rounding_bits_for_key (the CPU build's AdamW spent over a third of its time in the hash).
template <int N> __device__ inline void adamw_chunk_params_from_master(floatX (&p)[N], const float (&master)[N],
                                                                    const AdamWStepCoefficients& c, size_t first) {
    if constexpr (std::is_same_v<floatX, float>) {
        for (int k = 0; k < N; ++k) p[k] = master[k];
    } else {
        uint64_t state = rounding_state(c.rounding_key, c.element_offset + first);
        LANE_LOOP
        for (int k = 0; k < N; ++k) {
            p[k] = stochastic_round_bf16(master[k], rounding_bits_of_state(state));
            state += kSplitMix64Gamma;
        }
    }
}

// Elements per vector work item: two Packed128 of BF16, four of FP32. 16 rather than 8 halves the
// threads, whose start is what the CPU emulator pays per thread (AdamW 114 -> 78 ms per d12 step
// there); 92 registers on sm_90 with the item loop below, no spills.
constexpr int kAdamWChunk = 16;
constexpr int kAdamWBlock = 256;

template <typename T> __device__ inline void adamw_load_chunk(float (&out)[kAdamWChunk], const T* p) {
    constexpr int width = Packed128<T>::size;
    for (int j = 0; j < kAdamWChunk; j += width) {
        const Packed128<T> packed = load128(p + j);
        for (int k = 0; k < width; ++k) out[j + k] = to_float(packed[k]);
    }
}
template <typename T> __device__ inline void adamw_store_chunk(T* p, const T (&values)[kAdamWChunk]) {
    constexpr int width = Packed128<T>::size;
    for (int j = 0; j < kAdamWChunk; j += width) {
        Packed128<T> packed;
        for (int k = 0; k < width; ++k) packed[k] = values[j + k];
        store128(p + j, packed);
    }
}

// Chunks a vector work item takes, one after another: 1 on a GPU (adjacent threads' loads coalesce),
// 2 in the CPU build, where the emulator's cost per thread showed (GPT-2 124M on its own, 2 threads,
// best of 8: 71 -> 62 ms; a plain OpenMP loop moving the same bytes 57 ms; 4 a thread no faster).
// What a thread holds in registers stays one chunk either way. The bits do not depend on it. Launches
// recorded for a GPU's roofline (record-only mode) keep this build's count: only the number of blocks
// differs, thousands either way for GPT-2.
constexpr int kAdamWChunksPerItem = kEmulatedDevice ? 2 : 1;

// Work items: vector items of up to `chunks_per_item` consecutive chunks of kAdamWChunk elements,
// `chunks` in all, from element `head` on (every pointer is 16-byte aligned there), then one item
// per remaining element: the `head` elements before the vectors and the tail after them.
static __global__ void __launch_bounds__(kAdamWBlock)
    adamw_kernel(floatX* params, float* master, float* m, float* v, const floatX* grads, size_t n, size_t head,
                 size_t chunks, int chunks_per_item, AdamWStepCoefficients c) {
    const size_t item = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t per_item = size_t(chunks_per_item);
    const size_t vector_items = (chunks + per_item - 1) / per_item, vector_elements = chunks * kAdamWChunk;
    if (item < vector_items) {
        const size_t chunk_end = (item + 1) * per_item < chunks ? (item + 1) * per_item : chunks;
        ROLLED_LOOP  // one chunk's registers at a time
        for (size_t chunk = item * per_item; chunk < chunk_end; ++chunk) {
            const size_t first = head + chunk * kAdamWChunk;
            float g[kAdamWChunk], w[kAdamWChunk], mm[kAdamWChunk], vv[kAdamWChunk];
            adamw_load_chunk(g, grads + first);
            adamw_load_chunk(w, master + first);
            adamw_load_chunk(mm, m + first);
            adamw_load_chunk(vv, v + first);
            floatX p[kAdamWChunk];
            // Two loops: g++ vectorizes the FP32 update and the 64-bit rounding hash each at its width.
            LANE_LOOP
            for (int k = 0; k < kAdamWChunk; ++k) adamw_update_element(g[k], w[k], mm[k], vv[k], c);
            adamw_chunk_params_from_master(p, w, c, first);
            adamw_store_chunk(master + first, w);
            adamw_store_chunk(m + first, mm);
            adamw_store_chunk(v + first, vv);
            adamw_store_chunk(params + first, p);
        }
        return;
    }
    const size_t scalar = item - vector_items;
    if (scalar >= n - vector_elements) return;
    const size_t i = scalar < head ? scalar : scalar + vector_elements;
    float w = master[i], mi = m[i], vi = v[i];
    adamw_update_element(to_float(grads[i]), w, mi, vi, c);
    master[i] = w;
    m[i] = mi;
    v[i] = vi;
    params[i] = adamw_param_from_master(w, c, i);
}

// ---------------------------------------------------------------------------------------------
// Host side.

// torch.optim.AdamW's argument checks (0 <= lr, 0 <= eps, 0 <= beta < 1, 0 <= weight_decay), the
// step count t >= 1, and a finite non-negative grad_scale (a non-finite gradient norm means the
// caller skips the step). "" when fine.
inline std::string adamw_requirements(const AdamWHyper& hyper, int step, float grad_scale) {
    auto problem = [](const char* name, float value, const char* range) {
        return std::string("adamw: ") + name + " = " + std::to_string(value) + " is outside " + range;
    };
    if (!(hyper.lr >= 0.0f) || std::isinf(hyper.lr)) return problem("lr", hyper.lr, "[0, inf)");
    if (!(hyper.beta1 >= 0.0f && hyper.beta1 < 1.0f)) return problem("beta1", hyper.beta1, "[0, 1)");
    if (!(hyper.beta2 >= 0.0f && hyper.beta2 < 1.0f)) return problem("beta2", hyper.beta2, "[0, 1)");
    if (!(hyper.eps >= 0.0f) || std::isinf(hyper.eps)) return problem("eps", hyper.eps, "[0, inf)");
    if (!(hyper.weight_decay >= 0.0f) || std::isinf(hyper.weight_decay))
        return problem("weight_decay", hyper.weight_decay, "[0, inf)");
    if (!(grad_scale >= 0.0f) || std::isinf(grad_scale)) return problem("grad_scale", grad_scale, "[0, inf)");
    if (step < 1) return "adamw: step = " + std::to_string(step) + " must be >= 1 (the first step is 1)";
    return "";
}

// One AdamW step over n contiguous parameters (a tensor, or this rank's shard of the flat
// buffer); element_offset is params[0]'s index in the whole flat parameter buffer. chunks_per_item:
// the vector work items' chunks (tests vary it; the bits do not depend on it), or 0 for this
// build's kAdamWChunksPerItem.
inline void adamw_update(floatX* params, float* master, float* m, float* v, const floatX* grads, size_t n,
                         const AdamWHyper& hyper, int step, float grad_scale, uint64_t seed, size_t element_offset,
                         cudaStream_t stream, int chunks_per_item = 0) {
    require_supported("adamw_update", adamw_requirements(hyper, step, grad_scale));
    if (chunks_per_item < 0)
        require_supported("adamw_update", "adamw: chunks_per_item = " + std::to_string(chunks_per_item) + " must be >= 0");
    if (chunks_per_item == 0) chunks_per_item = kAdamWChunksPerItem;
    if (n == 0) return;
    if (!params || !master || !m || !v || !grads)
        require_supported("adamw_update", "adamw: null params, master, m, v or grads pointer with n > 0");

    AdamWStepCoefficients c;
    c.lr = hyper.lr;
    c.beta1 = hyper.beta1;
    c.beta2 = hyper.beta2;
    c.one_minus_beta1 = 1.0f - hyper.beta1;
    c.one_minus_beta2 = 1.0f - hyper.beta2;
    c.eps = hyper.eps;
    c.decay = 1.0f - hyper.lr * hyper.weight_decay;
    c.inv_bias_correction1 = float(1.0 / (1.0 - std::pow(double(hyper.beta1), step)));
    c.inv_bias_correction2 = float(1.0 / (1.0 - std::pow(double(hyper.beta2), step)));
    c.grad_scale = grad_scale;
    c.rounding_key = rounding_key(seed, uint64_t(step));
    c.element_offset = element_offset;

    // Vectors need all five arrays 16-byte aligned at the same element; shards that cut them at
    // different alignments (shard-local master next to an offset params slice) run all-scalar.
    size_t head = elements_to_align16(params), chunks = 0;
    if (head < n && is_aligned16(master + head) && is_aligned16(m + head) && is_aligned16(v + head) &&
        is_aligned16(grads + head)) {
        chunks = (n - head) / kAdamWChunk;
    }
    if (chunks == 0) head = 0;
    const size_t items = ceil_div(chunks, size_t(chunks_per_item)) + (n - chunks * kAdamWChunk);
    // Per element 16 FLOPs: adamw_update_element's 14 multiplies and adds (an fma counts 2), a
    // square root and a division (the rounding's integer hash not counted). Bytes: grads and
    // master, m, v read; master, m, v and params written.
    const double elements = double(n);
    const KernelCost cost{16.0 * elements, elements * (2.0 * sizeof(floatX) + 6.0 * sizeof(float))};
    launch<adamw_kernel>(cost, dim3(ceil_div(items, kAdamWBlock)), dim3(kAdamWBlock), 0, stream, params, master, m, v,
                         grads, n, head, chunks, chunks_per_item, c);
}
