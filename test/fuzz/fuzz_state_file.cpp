// The training-state reader (host/checkpoint.h): header, layout, checksum records, ranges. The
// ".done" marker is written to name the fuzzed file's own step and length, so inputs reach the
// header's deeper checks and the range reads instead of stopping at a missing marker.
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "host/checkpoint.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("state.bin");
    write_fuzz_file(path, data, size);
    int64_t step = 0;
    if (size >= 32) std::memcpy(&step, data + 24, sizeof step);  // header slot 3: the step
    std::ofstream(path + ".done") << "train_gpt state step=" << step << " bytes=" << size << "\n";
    try {
        const TrainingState s = read_state_header(path);
        const uint64_t n = s.num_parameters, half = n / 2;
        std::vector<float> master(n), m(n), v(n);
        read_state_range(path, s, 0, n, master.data(), m.data(), v.data());
        read_state_range(path, s, half, n - half, nullptr, m.data(), nullptr);  // a part: records read whole
    } catch (const std::runtime_error&) {
    }
    return 0;
}
