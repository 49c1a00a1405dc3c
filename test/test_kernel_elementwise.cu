// dst += src, rounded once to floatX, for sizes with partial blocks and unaligned starts.
#include "kernels/elementwise.cuh"
#include "test_util.h"

TEST_CASE("accumulate adds elementwise in FP32 and rounds once to floatX") {
    for (size_t n : {size_t(1), size_t(255), size_t(257), size_t(5003)}) {
        for (size_t offset : {size_t(0), size_t(3)}) {
            std::vector<floatX> dst(n + offset), src(n + offset);
            for (size_t i = 0; i < n + offset; ++i) {
                dst[i] = from_float<floatX>(0.001f * float(int(i % 97) - 48));
                src[i] = from_float<floatX>(0.37f * float(int(i % 13) - 6));
            }
            DeviceBuffer<floatX> d(dst), s(src);
            accumulate(d.ptr + offset, s.ptr + offset, n, nullptr);
            std::vector<floatX> got = d.download();
            for (size_t i = 0; i < n + offset; ++i) {
                const float want = i < offset ? to_float(dst[i]) : to_float(from_float<floatX>(to_float(dst[i]) + to_float(src[i])));
                INFO("n " << n << " offset " << offset << " i " << i);
                REQUIRE(to_float(got[i]) == want);  // untouched before the offset; one rounding after
            }
        }
    }
}
