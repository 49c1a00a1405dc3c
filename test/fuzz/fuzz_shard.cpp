// The token-shard reader (host/dataloader.h): shard header and length, the vocabulary scan, batches.
#include <stdexcept>
#include <vector>

#include "host/dataloader.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = fuzz_file("train_000000.bin");
    write_fuzz_file(path, data, size);
    try {
        constexpr int B = 2, T = 4;
        DataLoader loader(path, B, T, 0, 1, 7, true);
        loader.check_tokens(50257);
        std::vector<int> inputs(B * T), targets(B * T);
        for (int i = 0; i < 3; ++i) loader.next_batch(inputs.data(), targets.data());
        for (int t : inputs)
            if (t < 0 || t >= 50257) std::abort();  // check_tokens let a bad token through
    } catch (const std::runtime_error&) {
    }
    return 0;
}
