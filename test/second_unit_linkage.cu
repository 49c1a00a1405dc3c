// The second translation unit of test_linkage (test/test_linkage.cu): it includes the whole program
// (train_gpt.cu and, through it, every kernel, host and parallel header) exactly as the first does.
// The two link into one binary only if no header defines a symbol with external linkage that is not
// inline (kernels are `static __global__`, functions `inline`).
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "test/linkage_units.h"

// A forward and backward pass of the model built in this unit: what test_linkage compares.
LinkageResult run_in_second_unit(const GPT2Config& config, int B, int T, uint64_t seed) {
    return run_linkage_model(config, B, T, seed);
}
