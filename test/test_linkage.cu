// Kernel and host definitions that two translation units can include: this test is built from two
// (this file and test/second_unit_linkage.cu), each including train_gpt.cu whole. A header that
// defines a non-inline symbol with external linkage fails the link; the model run from each unit
// must give the same bits, and real ones (finite, not all zero).
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include <algorithm>
#include <cmath>

#include <catch2/catch.hpp>

#include "test/linkage_units.h"

TEST_CASE("two translation units that include every header run the same model") {
    const GPT2Config config{64, 301, pad_vocab(301), 2, 4, 64};
    const int B = 2, T = 64;
    const LinkageResult here = run_linkage_model(config, B, T, 42);
    const LinkageResult there = run_in_second_unit(config, B, T, 42);
    REQUIRE(std::isfinite(here.loss_sum));
    // The initial loss of a near-uniform model: about ln(V) per token.
    CHECK(std::abs(here.loss_sum / (B * T) - std::log(301.0)) < 0.5);
    CHECK(here.loss_sum == there.loss_sum);
    CHECK(here.logits == there.logits);
    CHECK(here.grads == there.grads);
    CHECK(std::all_of(here.grads.begin(), here.grads.end(), [](float g) { return std::isfinite(g); }));
    CHECK(std::any_of(here.grads.begin(), here.grads.end(), [](float g) { return g != 0.0f; }));
}
