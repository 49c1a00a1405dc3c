// Generation (train_gpt.cu's gpt2_forward_cached, host/generation.h): the key/value-cached forward
// pass gives the PyTorch reference's logits at every position, fed a prompt and then one token at a
// time; generation with the cache draws exactly the tokens generation without it draws; the
// sampler's temperature, top-k and top-p rules.
// built into: test_model_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "model_test_util.h"

#include <map>
#include <set>

namespace {

// The logits tolerances of test_model.cu's fixture checks (relative to the max |ref|): FP32 5e-6;
// BF16 1.5e-2 (bf16 activations through two layers).
constexpr double kLogitsTolerance = kFP32 ? 5e-6 : 1.5e-2;

struct InferenceModel {
    GPT2 model;
    InferenceModel(const Fixture& fx, Attention attention, int T) {
        gpt2_build(model, config_of(fx.config), 1, T, 0, 1, 0, ModelOptions{.recompute = Recompute::full, .attention = attention, .inference = true});
        load_parameters(model, fx);
    }
    ~InferenceModel() { gpt2_free(model); }
};

}  // namespace

TEST_CASE("the cached forward pass gives the reference's logits at every position: a prompt, then one token at a time") {
    const Fixture fx = load_fixture(repo_root() + "/test/fixtures/d2_c64.bin");
    const FixtureConfig& c = fx.config;
    const std::vector<int32_t>& inputs = fx.at("inputs").i32;
    const std::vector<float>& ref_logits = fx.at("logits").f32;  // (B, T, V) from the float64 PyTorch model
    const std::vector<Attention> kinds = kFP32 ? std::vector<Attention>{Attention::simt}
                                               : std::vector<Attention>{Attention::simt, Attention::tc};
    for (Attention kind : kinds)
    for (int b = 0; b < c.B; ++b)
    for (int prompt : {1, 7, c.T - 1}) {
        INFO("sequence " << b << ", prompt of " << prompt << " tokens, attention " << attention_name(kind));
        InferenceModel m(fx, kind, c.T);
        const int* row = inputs.data() + size_t(b) * c.T;
        std::vector<float> got, ref;
        for (int t = prompt - 1; t < c.T; ++t) {
            const std::vector<float> logits = t == prompt - 1 ? gpt2_forward_cached(m.model, row, prompt)
                                                              : gpt2_forward_cached(m.model, row + t, 1);
            REQUIRE(logits.size() == size_t(c.V));
            got.insert(got.end(), logits.begin(), logits.end());
            const float* r = ref_logits.data() + (size_t(b) * c.T + t) * c.V;
            ref.insert(ref.end(), r, r + c.V);
        }
        CHECK(m.model.kv_length == c.T);
        const TensorError err = tensor_error(got, ref);
        std::printf("cached logits [%s, %s], sequence %d, prompt %d: err %.2e\n", kPrecisionName, attention_name(kind), b,
                    prompt, err.value);
        CHECK(err <= kLogitsTolerance);
        // The cache is full: one more position is refused, naming the limit.
        CHECK_THROWS_WITH(gpt2_forward_cached(m.model, row, 1),
                          Catch::Matchers::Contains(std::to_string(c.T) + " positions in all"));
    }
}

TEST_CASE("generation with the cache draws the tokens generation without it draws, for every sampling rule") {
    const Fixture fx = load_fixture(repo_root() + "/test/fixtures/d2_c64.bin");
    const FixtureConfig& c = fx.config;
    const std::vector<int> prompt = {3, 141, 59, 26, 5};
    const int count = c.maxT - int(prompt.size());
    const SamplingSettings rules[] = {{1.0f, 0, 1.0f}, {0.0f, 0, 1.0f}, {0.8f, 20, 1.0f}, {1.2f, 0, 0.9f}, {1.0f, 50, 0.5f}};
    for (const SamplingSettings& rule : rules)
    for (uint64_t seed : {1, 2}) {
        INFO("temperature " << rule.temperature << ", top-k " << rule.top_k << ", top-p " << rule.top_p << ", seed " << seed);
        std::vector<int> with_cache, without_cache;
        {
            InferenceModel m(fx, Attention::simt, c.maxT);
            Rng rng = sampling_rng(int64_t(seed));
            with_cache = generate_tokens([&](const std::vector<int>& t, int fresh) {
                return gpt2_forward_cached(m.model, t.data() + t.size() - fresh, fresh);
            }, prompt, count, -1, rule, rng);
        }
        {
            InferenceModel m(fx, Attention::simt, c.maxT);
            Rng rng = sampling_rng(int64_t(seed));
            without_cache = generate_tokens([&](const std::vector<int>& t, int) {
                return next_token_logits(m.model, t.data(), int(t.size()));
            }, prompt, count, -1, rule, rng);
        }
        REQUIRE(with_cache.size() == size_t(count));
        CHECK(with_cache == without_cache);
        // Not a constant: the tokens depend on the draws (greedy takes none: this model repeats one token).
        if (rule.temperature > 0) CHECK(std::set<int>(with_cache.begin(), with_cache.end()).size() > 1);
    }
}

TEST_CASE("generate_tokens stops after an end-of-text token and gives each token to on_token") {
    int calls = 0;
    const NextTokenLogits next = [&](const std::vector<int>& tokens, int fresh) {
        ++calls;
        CHECK(fresh == (calls == 1 ? 2 : 1));  // the prompt, then one new token per call
        std::vector<float> logits(10, 0.0f);
        logits[tokens.size() < 5 ? 3 : 9] = 100.0f;  // 3, 3, 3, then the end-of-text token 9
        return logits;
    };
    Rng rng(1);
    std::vector<int> seen;
    const std::vector<int> got = generate_tokens(next, {1, 2}, 50, 9, {0.0f, 0, 1.0f}, rng, [&](int t) { seen.push_back(t); });
    CHECK(got == std::vector<int>{3, 3, 3, 9});
    CHECK(seen == got);
    CHECK(calls == 4);
}

TEST_CASE("sampling rules: temperature 0 is greedy, top-k and top-p keep the most likely tokens, draws follow the softmax") {
    const std::vector<float> logits = {std::log(0.1f), std::log(0.5f), std::log(0.3f), std::log(0.1f)};
    Rng rng(42);
    const uint64_t before = rng.state;
    CHECK(sample_from_logits(logits, {0.0f, 0, 1.0f}, rng) == 1);
    CHECK(rng.state == before);  // greedy draws nothing
    const auto frequencies = [&](const SamplingSettings& s) {
        std::map<int, double> f;
        const int draws = 20000;
        for (int i = 0; i < draws; ++i) f[sample_from_logits(logits, s, rng)] += 1.0 / draws;
        return f;
    };
    // A frequency of p over 20000 draws has a standard deviation <= 0.0036: bounds of 0.015 are > 4 sigma.
    const auto near = [](double got, double want) { return std::fabs(got - want) <= 0.015; };
    std::map<int, double> all = frequencies({1.0f, 0, 1.0f});
    CHECK((near(all[0], 0.1) && near(all[1], 0.5) && near(all[2], 0.3) && near(all[3], 0.1)));
    // top-p 0.75: 0.5 + 0.3 reach it, so tokens 1 and 2 only, renormalized to 0.625 and 0.375.
    std::map<int, double> nucleus = frequencies({1.0f, 0, 0.75f});
    CHECK(nucleus.size() == 2);
    CHECK((near(nucleus[1], 0.625) && near(nucleus[2], 0.375)));
    // top-p 0.5: the most likely token alone reaches it.
    const std::map<int, double> alone = frequencies({1.0f, 0, 0.5f});
    CHECK((alone.size() == 1 && alone.count(1) == 1));
    // top-k 2 keeps the same two; temperature 0.5 squares the odds: 25:9.
    std::map<int, double> sharp = frequencies({0.5f, 2, 1.0f});
    CHECK(sharp.size() == 2);
    CHECK(near(sharp[1], 25.0 / 34.0));
}

TEST_CASE("an inference model allocates no gradients or optimizer state, and plans its cache") {
    GPT2Config config;
    REQUIRE(small_preset("tiny", 64, &config));
    const ShardLayout shard = shard_layout(gpt2_num_parameters(config), 0, 1, 0);
    const MemoryPlan training = gpt2_memory_plan(config, 1, 64, shard, ModelOptions{Recompute::full});
    const MemoryPlan inference = gpt2_memory_plan(config, 1, 64, shard, ModelOptions{.recompute = Recompute::full, .inference = true});
    const auto has = [](const MemoryPlan& plan, const char* name) {
        return std::any_of(plan.items.begin(), plan.items.end(), [&](const MemoryItem& i) { return i.name == name; });
    };
    CHECK(has(training, "grads"));
    CHECK(has(training, "adam_m"));
    CHECK_FALSE(has(inference, "grads"));
    CHECK_FALSE(has(inference, "master"));
    CHECK_FALSE(has(inference, "dresidual"));
    CHECK(inference.bytes_of("kv_cache") == 2 * size_t(config.num_layers) * 64 * config.channels * sizeof(floatX));
}
