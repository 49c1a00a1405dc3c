// Tensor-core and asynchronous-copy instructions on the CPU (declared in cuda_emu.h).
//
// mma.sync and ldmatrix are warp collectives (warp_exchange): every lane brings its fragment or
// row address, and the lane that arrives last computes the whole warp's result. Fragment layouts
// follow the PTX ISA: "Matrix Fragments for mma.m16n8k16 with floating point type" and
// "Warp-level matrix load instruction: ldmatrix" (figure "ldmatrix fragment layout for one 8x8
// Matrix with 16-bit elements"), with groupID = laneid >> 2 and threadID_in_group = laneid % 4.
//
// cp.async completes late on purpose: the destination is poisoned (0xFF bytes: NaN in bf16 and
// float) when the copy is issued and written when cp.async.wait_group retires its group, so a
// kernel that reads it too early reads NaN, as a GPU would read stale data.
#include "cuda_emu.h"
#include "emu_internal.h"

#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace cuemu {

namespace {

constexpr unsigned kFullWarp = 0xffffffffu;

float bf16_bits_to_float(uint32_t bits16) { return from_bits<float>(uint64_t(bits16 & 0xffffu) << 16); }
// Element `half` (0: low, the lower-indexed element; 1: high) of a .b32 register holding two b16.
uint32_t half_of(uint32_t reg, int half) { return half ? reg >> 16 : reg & 0xffffu; }

thread_local std::string problem_text;  // the message a combine function returns

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ----

struct MmaFragments {
    uint32_t a[4], b[2];
    float c[4];
};

const char* mma_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    if (members != kFullWarp) return "mma.sync needs all 32 lanes of the warp";
    float A[16][16], B[16][8], D[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const auto& f = *static_cast<const MmaFragments*>(inputs[lane]);
        const int group = lane >> 2, tig = lane % 4;
        for (int i = 0; i < 8; ++i) {  // a0..a7: rows groupID (+8 for a2, a3, a6, a7), cols 2 tig + (i & 1) (+8 for i >= 4)
            const int row = group + ((i & 2) ? 8 : 0), col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = bf16_bits_to_float(half_of(f.a[i / 2], i & 1));
        }
        for (int i = 0; i < 4; ++i) {  // b0..b3: rows 2 tig + (i & 1) (+8 for i >= 2), col groupID
            const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
            B[row][group] = bf16_bits_to_float(half_of(f.b[i / 2], i & 1));
        }
        for (int i = 0; i < 4; ++i)  // c0..c3: rows groupID (+8 for i >= 2), cols 2 tig + (i & 1)
            D[group + (i >= 2 ? 8 : 0)][tig * 2 + (i & 1)] = f.c[i];
    }
    // Products of bf16 values are exact in float; they are added to c one after another in k order,
    // in float. (The hardware's internal order and precision are unspecified; tests allow for that.)
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            float acc = D[m][n];
            for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
            D[m][n] = acc;
        }
    for (int lane = 0; lane < 32; ++lane) {
        float* d = static_cast<float*>(outputs[lane]);
        const int group = lane >> 2, tig = lane % 4;
        for (int i = 0; i < 4; ++i) d[i] = D[group + (i >= 2 ? 8 : 0)][tig * 2 + (i & 1)];
    }
    return nullptr;
}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 ----

template <int kCount, bool kTrans>
const char* ldmatrix_combine(const void* const inputs[32], void* const outputs[32], unsigned members) {
    if (members != kFullWarp) return "ldmatrix needs all 32 lanes of the warp";
    uint16_t rows[4][8][8];  // [matrix][row][col]
    // Lanes 8 i .. 8 i + 7 address the rows of matrix i; the addresses of the other lanes are unused.
    for (int lane = 0; lane < 8 * kCount; ++lane) {
        const void* row = *static_cast<const void* const*>(inputs[lane]);
        if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
            char where[32];
            std::snprintf(where, sizeof where, "%p", row);
            problem_text = "lane " + std::to_string(lane) + " gives row address " + where + ", not 16-byte aligned";
            return problem_text.c_str();
        }
        std::memcpy(rows[lane / 8][lane % 8], row, 16);
    }
    for (int lane = 0; lane < 32; ++lane) {
        uint32_t* r = static_cast<uint32_t*>(outputs[lane]);
        const int group = lane >> 2, tig = lane % 4;
        for (int i = 0; i < kCount; ++i) {
            // Plain: row groupID, columns 2 tig and 2 tig + 1. Transposed (column-major): column
            // groupID of rows 2 tig and 2 tig + 1.
            const uint16_t lo = kTrans ? rows[i][2 * tig][group] : rows[i][group][2 * tig];
            const uint16_t hi = kTrans ? rows[i][2 * tig + 1][group] : rows[i][group][2 * tig + 1];
            r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
    }
    return nullptr;
}

// ---- cp.async: per thread of the running block, the copies not yet committed and the groups ----

struct PendingCopy {
    unsigned char* dst;
    int bytes;
    unsigned char data[16];
};

struct ThreadCopies {
    std::vector<PendingCopy> uncommitted;
    std::deque<std::vector<PendingCopy>> groups;  // oldest first
};

struct BlockCopies {
    uint64_t serial = 0;  // block_serial() of the block the state belongs to
    std::vector<ThreadCopies> threads;
};
thread_local BlockCopies block_copies;

// Copies still pending when a block ends target its shared memory, which ends with it: the next
// block on this OS thread starts from empty queues.
ThreadCopies& this_threads_copies() {
    const uint64_t serial = block_serial();
    const size_t nthreads = size_t(blockDim.x) * blockDim.y * blockDim.z;
    if (block_copies.serial != serial) {
        block_copies.serial = serial;
        block_copies.threads.resize(nthreads);
        for (ThreadCopies& t : block_copies.threads) {
            t.uncommitted.clear();
            t.groups.clear();
        }
    }
    const size_t linear = threadIdx.x + size_t(blockDim.x) * (threadIdx.y + size_t(blockDim.y) * threadIdx.z);
    return block_copies.threads[linear];
}

}  // namespace

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    MmaFragments in;
    std::memcpy(in.a, a, sizeof in.a);
    std::memcpy(in.b, b, sizeof in.b);
    std::memcpy(in.c, c, sizeof in.c);
    float out[4];
    warp_exchange(kFullWarp, &in, out, mma_combine, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
    std::memcpy(d, out, sizeof out);
}

void ldmatrix(uint32_t* r, int count, bool trans, const void* row_address) {
    // One combine function per form, so lanes that disagree on the form are reported as divergent.
    static constexpr WarpExchangeFn kForms[2][3] = {
        {ldmatrix_combine<1, false>, ldmatrix_combine<2, false>, ldmatrix_combine<4, false>},
        {ldmatrix_combine<1, true>, ldmatrix_combine<2, true>, ldmatrix_combine<4, true>}};
    static constexpr const char* kNames[2][3] = {
        {"ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x4.shared.b16"},
        {"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"}};
    const int form = count == 1 ? 0 : count == 2 ? 1 : 2;
    if (count != 1 && count != 2 && count != 4) kernel_error("ldmatrix: .x" + std::to_string(count) + " is not x1, x2 or x4");
    uint32_t out[4] = {0, 0, 0, 0};
    warp_exchange(kFullWarp, &row_address, out, kForms[trans][form], kNames[trans][form]);
    std::memcpy(r, out, sizeof(uint32_t) * size_t(count == 1 || count == 2 ? count : 4));
}

void cp_async(void* smem, const void* gmem, int bytes, int src_bytes) {
    if ((bytes != 4 && bytes != 8 && bytes != 16) || src_bytes < 0 || src_bytes > bytes) {
        kernel_error("cp.async: cp-size " + std::to_string(bytes) + " with src-size " + std::to_string(src_bytes) +
                     " (cp-size must be 4, 8 or 16, src-size at most cp-size)");
        return;
    }
    if (reinterpret_cast<uintptr_t>(smem) % bytes != 0 || reinterpret_cast<uintptr_t>(gmem) % bytes != 0) {
        kernel_error("cp.async: addresses must be aligned to the " + std::to_string(bytes) + "-byte copy size");
        return;
    }
    PendingCopy copy{static_cast<unsigned char*>(smem), bytes, {}};
    if (src_bytes > 0) std::memcpy(copy.data, gmem, size_t(src_bytes));
    std::memset(smem, 0xFF, size_t(bytes));  // indeterminate until the copy completes
    this_threads_copies().uncommitted.push_back(copy);
}

void cp_async_commit() {
    ThreadCopies& t = this_threads_copies();
    t.groups.push_back(std::move(t.uncommitted));  // possibly empty: an empty group is trivially complete
    t.uncommitted.clear();
}

void cp_async_wait(int max_pending) {
    ThreadCopies& t = this_threads_copies();
    while (t.groups.size() > size_t(max_pending < 0 ? 0 : max_pending)) {
        for (const PendingCopy& copy : t.groups.front()) std::memcpy(copy.dst, copy.data, size_t(copy.bytes));
        t.groups.pop_front();
    }
}

}  // namespace cuemu
