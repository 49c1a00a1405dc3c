// The llm.c model file reader (host/checkpoint.h): header, length, parameters and their checksum.
#include <stdexcept>
#include <vector>

#include "host/checkpoint.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("model.bin");
    write_fuzz_file(path, data, size);
    try {
        const ModelHeader h = read_model_header(path);
        verify_model_checkpoint(path);
        const std::vector<float> params = read_model_parameters_as_float(path, h);
        if (params.size() != gpt2_parameter_count(h)) std::abort();
    } catch (const std::runtime_error&) {
    } catch (const std::overflow_error&) {
    }
    return 0;
}
