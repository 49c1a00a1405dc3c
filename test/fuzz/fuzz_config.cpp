// The JSON config reader (--config, host/config.cpp config_from_file): parsing, the keys, every value's
// type and range, and the cross-flag checks. (parse_config adds only the command line on top.)
#include <stdexcept>

#include "host/config.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("config.json");
    write_fuzz_file(path, data, size);
    try {
        (void)config_from_file(path);
    } catch (const ConfigError&) {
    }
    return 0;
}
