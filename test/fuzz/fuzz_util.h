// Shared by the libFuzzer targets (test/fuzz/fuzz_*.cpp, `make fuzz`): each writes the fuzzer's bytes
// to a file, as the program would meet them on disk, and runs one reader on it. A reader may refuse
// the input with an exception (the one-line errors the program prints); a crash, a sanitizer report, a
// hang or an allocation past libFuzzer's limit is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

// A file of this process's own under /dev/shm (memory, not disk), rewritten for every input.
inline std::string fuzz_file(const char* name) {
    return "/dev/shm/train_gpt_fuzz_" + std::to_string(::getpid()) + "_" + name;
}

inline void write_fuzz_file(const std::string& path, const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();  // the harness itself failed, not the reader
    if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
}
