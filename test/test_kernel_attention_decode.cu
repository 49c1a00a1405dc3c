// Generation's attention (kernels/attention_decode.cuh): the key/value cache append copies the k and
// v parts of qkv rows to the right cache rows, bit for bit and nothing else; the decode kernel's one
// query row per head over a cache of n positions equals row n - 1 of full causal attention, computed
// in double from the definitions (test/attention_reference.h), for every n.
#include "test_util.h"

#include "attention_reference.h"

#include "kernels/attention_decode.cuh"

#include <cstring>
#include <random>

using namespace attention_reference;

namespace {

// The caches (T, C each) of one sequence's qkv (T, 3C), filled by kv_cache_append in the chunks given
// (a prompt, then one position at a time, as generation appends them).
struct Cache {
    DeviceBuffer<floatX> keys, values;
    Cache(const DeviceBuffer<floatX>& qkv, int T, int C, const std::vector<int>& chunks)
        : keys(size_t(T) * C), values(size_t(T) * C) {
        keys.fill_bytes(0xFF);  // NaN in both precisions: a row left unwritten and then read shows
        values.fill_bytes(0xFF);
        int pos = 0;
        for (int n : chunks) {
            kv_cache_append(keys.ptr, values.ptr, qkv.ptr + size_t(pos) * 3 * C, pos, n, C, 0);
            pos += n;
        }
        REQUIRE(pos == T);
        CUDA_CHECK(cudaDeviceSynchronize());
    }
};

}  // namespace

TEST_CASE("kv_cache_append copies the k and v parts of each qkv row to its position, bit for bit") {
    const int T = 13, C = 64;
    std::mt19937 rng(7);
    const std::vector<floatX> qkv_host = random_floatX(size_t(T) * 3 * C, 1.0f, rng);
    const DeviceBuffer<floatX> qkv(qkv_host);
    const Cache cache(qkv, T, C, {5, 1, 1, 6});
    const std::vector<floatX> keys = cache.keys.download(), values = cache.values.download();
    bool exact = true;
    for (int t = 0; t < T; ++t)
        exact &= std::memcmp(&keys[size_t(t) * C], &qkv_host[size_t(t) * 3 * C + C], C * sizeof(floatX)) == 0 &&
                 std::memcmp(&values[size_t(t) * C], &qkv_host[size_t(t) * 3 * C + 2 * C], C * sizeof(floatX)) == 0;
    CHECK(exact);

    // A chunk at position 3 writes rows 3 and 4 and leaves the rest as they were.
    DeviceBuffer<floatX> keys2(size_t(T) * C), values2(size_t(T) * C);
    keys2.fill_bytes(0x11);
    values2.fill_bytes(0x22);
    kv_cache_append(keys2.ptr, values2.ptr, qkv.ptr, 3, 2, C, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<floatX> k2 = keys2.download(), v2 = values2.download();
    int changed_rows = 0;
    for (int t = 0; t < T; ++t) {
        const bool key_row_untouched = std::all_of(reinterpret_cast<const unsigned char*>(&k2[size_t(t) * C]),
                                                   reinterpret_cast<const unsigned char*>(&k2[size_t(t + 1) * C]),
                                                   [](unsigned char b) { return b == 0x11; });
        changed_rows += !key_row_untouched;
        if (t == 3 || t == 4) {
            CHECK(std::memcmp(&k2[size_t(t) * C], &qkv_host[size_t(t - 3) * 3 * C + C], C * sizeof(floatX)) == 0);
            CHECK(std::memcmp(&v2[size_t(t) * C], &qkv_host[size_t(t - 3) * 3 * C + 2 * C], C * sizeof(floatX)) == 0);
        }
    }
    CHECK(changed_rows == 2);
}

TEST_CASE("attention_decode over n cached positions equals row n - 1 of causal attention, for every n") {
    const Sizes cases[] = {
        {1, 37, 128, 2, 2.0f},    // hs 64 (GPT-2)
        {1, 33, 96, 3, 3.0f},     // hs 32, NH 3, sharper rows
        {1, 21, 256, 2, 1.5f},    // hs 128: one 16-byte vector per thread covers a whole value row (BF16)
        {1, 19, 1600, 25, 2.0f},  // GPT-2 1.5B heads: NH 25, hs 64
        {1, 300, 64, 1, 2.0f},    // more keys than threads: each thread scores several
        {1, 1, 128, 2, 2.0f},     // a cache of one: the query attends to itself only
    };
    for (const Sizes& s : cases) {
        CAPTURE(s.T, s.C, s.NH);
        std::mt19937 rng(99 + s.T * 5 + s.C);
        const std::vector<floatX> qkv_host = random_qkv(s, rng);
        const std::vector<floatX> unused_dout = random_floatX(size_t(s.T) * s.C, 1.0f, rng);
        const Reference ref = reference_attention(qkv_host, unused_dout, s);
        const DeviceBuffer<floatX> qkv(qkv_host);
        const Cache cache(qkv, s.T, s.C, {s.T});
        DeviceBuffer<floatX> out(size_t(s.T) * s.C);
        out.fill_bytes(0xFF);
        // Position n - 1's query over the first n positions: the cache rows beyond n are set but must not count.
        for (int n = 1; n <= s.T; ++n)
            attention_decode(out.ptr + size_t(n - 1) * s.C, qkv.ptr + size_t(n - 1) * 3 * s.C, cache.keys.ptr,
                             cache.values.ptr, n, s.C, s.NH, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        // Relative to the max |ref|. FP32: float accumulation over <= 300 keys, like the flash kernels
        // (their bound, 5e-6; measured 6.5e-7). BF16: the output is rounded to bf16, 2^-8 of an element
        // at most (measured 1.97e-3).
        const double tol = std::is_same_v<floatX, float> ? 5e-6 : 0x1p-8 + 5e-6;
        CHECK(tensor_error(out.download(), ref.out) <= tol);
    }
}

TEST_CASE("attention_decode is bitwise deterministic, also across more emulator threads") {
    const Sizes s{1, 150, 128, 2, 2.0f};
    std::mt19937 rng(5);
    const DeviceBuffer<floatX> qkv(random_qkv(s, rng));
    const Cache cache(qkv, s.T, s.C, {100, 50});
    DeviceBuffer<floatX> a(s.C), b(s.C);
    attention_decode(a.ptr, qkv.ptr + size_t(s.T - 1) * 3 * s.C, cache.keys.ptr, cache.values.ptr, s.T, s.C, s.NH, 0);
    attention_decode(b.ptr, qkv.ptr + size_t(s.T - 1) * 3 * s.C, cache.keys.ptr, cache.values.ptr, s.T, s.C, s.NH, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<floatX> x = a.download(), y = b.download();
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(floatX)) == 0);
}

TEST_CASE("attention_decode refuses head sizes and cache lengths it does not support, naming them") {
    CHECK(attention_decode_requirements(128, 2, 10).empty());
    CHECK_THAT(attention_decode_requirements(120, 3, 10), Catch::Matchers::Contains("head size C/NH = 40"));
    CHECK_THAT(attention_decode_requirements(128, 2, 0), Catch::Matchers::Contains("n = 0"));
    CHECK_THAT(attention_decode_requirements(128, 2, 1 << 20), Catch::Matchers::Contains("shared memory"));
    DeviceBuffer<floatX> buffer(1024);
    CHECK_THROWS_WITH(attention_decode(buffer.ptr, buffer.ptr, buffer.ptr, buffer.ptr, 0, 128, 2, 0),
                      Catch::Matchers::Contains("attention_decode"));
}
