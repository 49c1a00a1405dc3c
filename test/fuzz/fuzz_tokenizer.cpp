// The tokenizer file reader (host/tokenizer.h) and decoding with it.
#include <stdexcept>
#include <vector>

#include "host/tokenizer.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("tokenizer.bin");
    write_fuzz_file(path, data, size);
    try {
        const Tokenizer tok(path);
        (void)tok.decode({0, 1, 2, tok.eot_token(), 50256, 70000, -1});
    } catch (const std::runtime_error&) {
    }
    return 0;
}
