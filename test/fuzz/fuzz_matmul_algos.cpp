// The file of autotune's matmul picks (--matmul-algos, -o's matmul_algos.json; host/matmul_algos.cpp
// read_matmul_algos): the JSON, the origin fields, every pick's 16 key fields and its 128 hex digits.
#include <stdexcept>

#include "host/matmul_algos.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("matmul_algos.json");
    write_fuzz_file(path, data, size);
    try {
        (void)read_matmul_algos(path);
    } catch (const std::runtime_error&) {
    }
    return 0;
}
