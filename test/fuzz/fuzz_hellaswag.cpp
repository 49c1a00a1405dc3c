// The HellaSwag eval file reader (host/hellaswag.h): llm.c's format, checked against a vocabulary.
#include <stdexcept>

#include "host/hellaswag.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("hellaswag.bin");
    write_fuzz_file(path, data, size);
    try {
        (void)read_hellaswag(path, 50257);
    } catch (const std::runtime_error&) {
    }
    return 0;
}
