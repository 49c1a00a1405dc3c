// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), the
// checksum of the checkpoint files (host/checkpoint.h). The SSE4.2 crc32 instruction computes it
// where the CPU has one (about 8 bytes per 3 cycles here, so several GB/s: small next to the write);
// elsewhere a byte-wise table does. Check value: crc32c("123456789") = 0xE3069283.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace checksum_detail {

constexpr uint32_t kCrc32cPolynomial = 0x82F63B78u;  // reflected

constexpr std::array<uint32_t, 256> crc32c_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kCrc32cPolynomial : 0u);
        t[i] = c;
    }
    return t;
}
inline constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table();

inline uint32_t crc32c_bytes(uint32_t state, const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) state = kCrc32cTable[(state ^ p[i]) & 0xFFu] ^ (state >> 8);
    return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) inline uint32_t crc32c_sse42(uint32_t state, const unsigned char* p, size_t n) {
    uint64_t s = state;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        std::memcpy(&word, p, 8);
        s = __builtin_ia32_crc32di(s, word);
    }
    uint32_t s32 = uint32_t(s);
    for (; n > 0; --n, ++p) s32 = __builtin_ia32_crc32qi(s32, *p);
    return s32;
}
inline bool have_sse42() {
    static const bool have = __builtin_cpu_supports("sse4.2");
    return have;
}
#endif

}  // namespace checksum_detail

// Continues a CRC-32C over `bytes` more bytes: crc32c(b, n2, crc32c(a, n1)) = crc32c(a ++ b). Start at 0.
inline uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0) {
    const auto* p = static_cast<const unsigned char*>(data);
    const uint32_t state = ~crc;
#if defined(__x86_64__)
    if (checksum_detail::have_sse42()) return ~checksum_detail::crc32c_sse42(state, p, bytes);
#endif
    return ~checksum_detail::crc32c_bytes(state, p, bytes);
}

// The table path alone, for tests that compare both paths.
inline uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0) {
    return ~checksum_detail::crc32c_bytes(~crc, static_cast<const unsigned char*>(data), bytes);
}
