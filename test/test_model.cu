// The whole model against the PyTorch reference (dev/gpt2_reference.py, float64): logits, loss and
// every parameter gradient, in the build's precision; determinism; GPT-2 initialization; and the
// configurations the kernels cannot take.
// built into: test_model_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "model_test_util.h"

namespace {

struct Result {
    double loss = 0;
    std::vector<float> logits;  // (B, T, V): the real vocabulary's columns
    std::vector<float> grads;   // every parameter gradient, in buffer order
};

// Logits (inference forward), then loss and gradients (forward with targets + backward).
Result run_model(GPT2& model, const Fixture& fx) {
    const FixtureConfig& c = fx.config;
    const std::vector<int32_t>& inputs = fx.at("inputs").i32;
    const std::vector<int32_t>& targets = fx.at("targets").i32;
    Result r;
    gpt2_forward(model, inputs.data(), nullptr, c.B, c.T, 0.0f);
    std::vector<float> padded = download_as_float(model.acts.logits, size_t(c.B) * c.T * c.Vp);
    for (size_t row = 0; row < size_t(c.B) * c.T; ++row)
        r.logits.insert(r.logits.end(), padded.begin() + row * c.Vp, padded.begin() + row * c.Vp + c.V);
    const int valid = int(std::count_if(targets.begin(), targets.end(), [](int t) { return t != -1; }));
    gpt2_zero_grad(model);
    double loss_sum = gpt2_forward(model, inputs.data(), targets.data(), c.B, c.T, 1.0f / float(valid));
    REQUIRE(model.valid_targets == valid);
    r.loss = loss_sum / valid;
    gpt2_backward(model);
    r.grads = download_as_float(model.grads_memory, model.num_parameters);
    return r;
}

// Tolerances, from the errors measured against the float64 reference over the three fixtures
// (printed by this test; `build/cpu/test_model_fp32` / `build/cpu/test_model` show the table):
// - FP32: worst tensor 6.1e-7 of its scale (grad.fcprojw, masked fixture), loss 2.3e-7 relative,
//   logits 2.7e-7. FP32 rounding (6e-8) compounded through two layers and the backward pass;
//   tolerance 5e-6, 8x the worst measured. (Measured again with the fourth fixture: worst 8.3e-7,
//   grad.ln2b of d2_c96_odd, logits 3.0e-7; the same before it was added. Still 6x below.)
// - BF16: parameters, activations and gradients are rounded to 8-bit mantissas (2^-8 = 3.9e-3
//   relative per rounding) at every kernel boundary. Measured worst: gradients 1.08e-2 with SIMT
//   attention, 1.21e-2 with tensor cores (grad.ln2w, d2_c64), logits 4.9e-3, loss 1.7e-4 absolute.
//   Tolerances 2.5-3x those: gradients 3e-2, logits 1.5e-2, loss 2e-3 (inside the model issue's 1e-2).
// - The fourth fixture, d2_c64_docmask (packed documents, --doc-mask --doc-positions), is within
//   them unchanged: FP32 worst gradient 7.4e-7, logits 2.6e-7, loss 1.8e-8; BF16 worst gradient
//   8.8e-3 (SIMT) and 9.1e-3 (tensor cores), logits 5.0e-3, loss 2.6e-5.
constexpr double kFP32Tolerance = 5e-6;
constexpr double kBF16LossTolerance = 2e-3;  // absolute, on losses of ~6
constexpr double kBF16LogitsTolerance = 1.5e-2;
constexpr double kBF16GradTolerance = 3e-2;

// How a fixture's model runs: the packed documents of d2_c64_docmask (dev/gpt2_reference.py, its
// metadata's "documents") are masked and their positions restarted, as --doc-mask --doc-positions do.
ModelOptions fixture_options(const Fixture& fx, Attention attention, Recompute recompute = Recompute::none) {
    ModelOptions options{recompute, attention};
    if (fx.meta.contains("documents")) {
        options.doc_mask = options.doc_positions = true;
        options.eot_token = fx.meta.at("documents").at("eot").get<int>();
    }
    return options;
}

}  // namespace

TEST_CASE("the model matches the PyTorch reference: logits, loss and every gradient") {
    const std::string root = repo_root();
    // Both attention kernel families in BF16 (the tensor-core ones take no FP32 operands), the tensor-core
    // backward split and fused (--attention-backward).
    struct Kernels {
        Attention attention;
        bool fused_backward;
        const char* name;
    };
    const std::vector<Kernels> kinds = kFP32 ? std::vector<Kernels>{{Attention::simt, false, "simt"}}
                                             : std::vector<Kernels>{{Attention::simt, false, "simt"},
                                                                    {Attention::tc, false, "tc"},
                                                                    {Attention::tc, true, "tc, fused backward"}};
    for (const Kernels& kind : kinds)
    for (const char* name : {"d2_c64", "d2_c96_odd", "d2_c96_masked", "d2_c64_docmask"}) {
        const Fixture fx = load_fixture(root + "/test/fixtures/" + name + ".bin");
        const FixtureConfig& c = fx.config;
        GPT2 model;
        ModelOptions options = fixture_options(fx, kind.attention);
        options.fused_attention_backward = kind.fused_backward;
        gpt2_build(model, config_of(c), c.B, c.T, 0, 1, 0, options);
        load_parameters(model, fx);
        Result r = run_model(model, fx);
        const char* kind_name = kind.name;

        const double ref_loss = fx.at("loss").f32[0];
        const double loss_err = std::fabs(r.loss - ref_loss);
        const TensorError logits_err = tensor_error(r.logits, fx.at("logits").f32);
        std::printf("%s [%s, attention %s]: loss %.6f (ref %.6f, |err| %.2e), logits err %.2e\n", name, kPrecisionName,
                    kind_name, r.loss, ref_loss, loss_err, logits_err.value);
        INFO(name << " [" << kPrecisionName << ", attention " << kind_name << "]");
        CHECK(loss_err <= (kFP32 ? kFP32Tolerance * std::fabs(ref_loss) : kBF16LossTolerance));
        CHECK(logits_err <= (kFP32 ? kFP32Tolerance : kBF16LogitsTolerance));

        size_t offset = 0;
        for (int i = 0; i < kNumParameterTensors; ++i) {
            const size_t n = model.param_sizes[i];
            std::vector<float> got(r.grads.begin() + offset, r.grads.begin() + offset + n);
            const std::vector<float>& ref = fx.at(std::string("grad.") + kParameterNames[i]).f32;
            const TensorError err = tensor_error(got, ref);
            std::printf("  grad.%-9s err %.2e\n", kParameterNames[i], err.value);
            INFO("grad." << kParameterNames[i]);
            CHECK(err <= (kFP32 ? kFP32Tolerance : kBF16GradTolerance));
            offset += n;
        }
        // Padded vocabulary rows: never trained.
        const size_t real = size_t(c.V) * c.C, padded = size_t(c.Vp) * c.C;
        for (size_t j = real; j < padded; ++j) REQUIRE(r.grads[j] == 0.0f);
        gpt2_free(model);
    }
}

// The document fixture checks the masks only if they matter there: a model that ignored the document
// mask, or the restarted positions, must land far outside the tolerances above.
TEST_CASE("the document fixture tells the masks apart: without either, far outside the tolerance") {
    const Fixture fx = load_fixture(repo_root() + "/test/fixtures/d2_c64_docmask.bin");
    const FixtureConfig& c = fx.config;
    const std::vector<Attention> kinds = kFP32 ? std::vector<Attention>{Attention::simt}
                                               : std::vector<Attention>{Attention::simt, Attention::tc};
    for (Attention kind : kinds)
    for (const bool without_mask : {true, false}) {
        ModelOptions options = fixture_options(fx, kind);
        (without_mask ? options.doc_mask : options.doc_positions) = false;
        GPT2 model;
        gpt2_build(model, config_of(c), c.B, c.T, 0, 1, 0, options);
        load_parameters(model, fx);
        const Result r = run_model(model, fx);
        gpt2_free(model);
        const TensorError logits_err = tensor_error(r.logits, fx.at("logits").f32);
        TensorError worst_grad;
        size_t offset = 0;
        for (int i = 0; i < kNumParameterTensors; ++i) {
            const std::vector<float> got(r.grads.begin() + offset, r.grads.begin() + offset + model.param_sizes[i]);
            worst_grad = worse(worst_grad, tensor_error(got, fx.at(std::string("grad.") + kParameterNames[i]).f32));
            offset += model.param_sizes[i];
        }
        std::printf("d2_c64_docmask without %s [%s, attention %s]: logits err %.2e, worst gradient err %.2e\n",
                    without_mask ? "the document mask" : "restarted positions", kPrecisionName,
                    kind == Attention::tc ? "tc" : "simt", logits_err.value, worst_grad.value);
        INFO((without_mask ? "without the document mask" : "without restarted positions") << " [" << kPrecisionName << "]");
        // Measured (both precisions, both kernels): without the mask logits 0.128-0.129 and the worst
        // gradient 0.44; without restarted positions 0.44 and 0.89: 8.5x the BF16 logits tolerance at
        // least, 14x its gradient tolerance. Asked: 5x both, so a fixture whose masks stopped mattering
        // (documents too short, EOTs lost) fails here instead of passing everything vacuously.
        CHECK(logits_err.value > 5 * (kFP32 ? kFP32Tolerance : kBF16LogitsTolerance));
        CHECK(worst_grad.value > 5 * (kFP32 ? kFP32Tolerance : kBF16GradTolerance));
    }
}

TEST_CASE("forward and backward are bitwise deterministic, also on several OS threads") {
    const Fixture fx = load_fixture(repo_root() + "/test/fixtures/d2_c96_masked.bin");
    const FixtureConfig& c = fx.config;
    GPT2 model;
    gpt2_build(model, config_of(c), c.B, c.T);
    load_parameters(model, fx);
    Result first = run_model(model, fx);
    Result second = run_model(model, fx);
    REQUIRE(first.loss == second.loss);
    REQUIRE(first.logits == second.logits);
    REQUIRE(first.grads == second.grads);
#ifndef __CUDACC__
    const int threads = cuemu::threads();
    cuemu::set_threads(3);  // blocks of every launch spread over three OS threads
    Result spread = run_model(model, fx);
    cuemu::set_threads(threads);
    REQUIRE(first.loss == spread.loss);
    REQUIRE(first.grads == spread.grads);
#endif
    gpt2_free(model);
}

TEST_CASE("recompute selective and full give bitwise the gradients of none") {
    for (const char* name : {"d2_c96_odd", "d2_c96_masked", "d2_c64_docmask"}) {
        const Fixture fx = load_fixture(repo_root() + "/test/fixtures/" + name + ".bin");
        const FixtureConfig& c = fx.config;
        Result results[3];
        for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
            GPT2 model;
            // Room for one more sequence than is run: layer slices follow the batch actually run.
            gpt2_build(model, config_of(c), c.B + 1, c.T, 0, 1, 0, fixture_options(fx, kDefaultAttention, mode));
            load_parameters(model, fx);
            results[int(mode)] = run_model(model, fx);
            gpt2_free(model);
        }
        INFO(name << " [" << kPrecisionName << "]");
        for (Recompute mode : {Recompute::selective, Recompute::full}) {
            INFO("recompute " << recompute_name(mode));
            CHECK(results[int(mode)].loss == results[0].loss);
            CHECK(results[int(mode)].logits == results[0].logits);
            CHECK(results[int(mode)].grads == results[0].grads);
        }
        // And none itself is the reference model (tested above): the gradients are not all zero.
        CHECK(std::any_of(results[0].grads.begin(), results[0].grads.end(), [](float g) { return g != 0.0f; }));
    }
}

TEST_CASE("GPT-2 initialization: seeded, right scales, zero biases and padding") {
    GPT2Config config{32, 301, pad_vocab(301), 3, 4, 64};
    GPT2 model;
    gpt2_build(model, config, 1, 8);
    gpt2_init_weights(model, 7);
    std::vector<float> a = download_as_float(model.params_memory, model.num_parameters);
    gpt2_init_weights(model, 7);
    REQUIRE(download_as_float(model.params_memory, model.num_parameters) == a);
    gpt2_init_weights(model, 8);
    REQUIRE(download_as_float(model.params_memory, model.num_parameters) != a);

    size_t offset = 0;
    for (int i = 0; i < kNumParameterTensors; ++i) {
        const std::string name = kParameterNames[i];
        size_t n = model.param_sizes[i];
        if (name == "wte") {  // padded rows are zero; statistics over the real rows
            for (size_t j = size_t(config.vocab_size) * config.channels; j < n; ++j) REQUIRE(a[offset + j] == 0.0f);
            n = size_t(config.vocab_size) * config.channels;
        }
        double sum = 0, sum_sq = 0;
        for (size_t j = 0; j < n; ++j) {
            sum += a[offset + j];
            sum_sq += double(a[offset + j]) * a[offset + j];
        }
        const double mean = sum / n, std_dev = std::sqrt(sum_sq / n - mean * mean);
        INFO(name << ": mean " << mean << " std " << std_dev << " over " << n);
        if (name == "ln1w" || name == "ln2w" || name == "lnfw") {
            for (size_t j = 0; j < n; ++j) REQUIRE(a[offset + j] == 1.0f);
        } else if (name.back() == 'b') {
            for (size_t j = 0; j < n; ++j) REQUIRE(a[offset + j] == 0.0f);
        } else {
            const double expect = (name == "attprojw" || name == "fcprojw") ? 0.02 / std::sqrt(2.0 * config.num_layers) : 0.02;
            // n >= 2048 samples: the sample std of a normal is within ~3% of sigma (5 standard errors,
            // sigma / sqrt(2n)); bf16 rounding adds < 0.4%.
            REQUIRE(std::fabs(std_dev / expect - 1.0) < 0.08);
            REQUIRE(std::fabs(mean) < 5 * expect / std::sqrt(double(n)));
        }
        offset += model.param_sizes[i];
    }
    gpt2_free(model);
}

// Drawn in pieces by several threads, each skipping the generator to its first draw: the same bits as
// one thread, and as the plain serial stream (one Rng, every normal in tensor order).
TEST_CASE("GPT-2 initialization: any thread count draws the serial stream, bit for bit") {
    GPT2Config config{64, 301, pad_vocab(301), 2, 4, 128};
    const std::vector<floatX> one = gpt2_initial_parameters(config, 11, 1);
    size_t sizes[kNumParameterTensors];
    parameter_sizes(config, sizes);
    std::vector<floatX> serial;
    Rng rng(11);
    for (int i = 0; i < kNumParameterTensors; ++i) {
        const std::string name = kParameterNames[i];
        const bool ln_weight = name == "ln1w" || name == "ln2w" || name == "lnfw", bias = name.back() == 'b';
        const double std_dev = (name == "attprojw" || name == "fcprojw") ? 0.02 / std::sqrt(2.0 * config.num_layers) : 0.02;
        const size_t drawn = name == "wte" ? size_t(config.vocab_size) * config.channels : sizes[i];
        for (size_t j = 0; j < sizes[i]; ++j)
            serial.push_back(from_float<floatX>(ln_weight ? 1.0f : !bias && j < drawn ? float(rng.normal(0.0, std_dev)) : 0.0f));
    }
    REQUIRE(serial.size() == one.size());
    CHECK(bitwise_equal(one, serial));
    for (unsigned threads : {2u, 3u, 7u, 64u}) {
        INFO(threads << " threads");
        CHECK(bitwise_equal(gpt2_initial_parameters(config, 11, threads), one));
    }
    CHECK_FALSE(bitwise_equal(gpt2_initial_parameters(config, 12, 3), one));
}

TEST_CASE("configurations the kernels cannot take are rejected naming the constraint") {
    GPT2Config good{64, 512, 512, 2, 4, 64};
    REQUIRE(gpt2_check_config(good).empty());
    for (const char* preset : {"d12", "d24", "d36", "d48"}) {
        GPT2Config c;
        REQUIRE(gpt2_preset(preset, &c));
        INFO(preset << ": " << gpt2_check_config(c));
        REQUIRE(gpt2_check_config(c).empty());
    }
    GPT2Config d12;
    REQUIRE(gpt2_preset("d12", &d12));
    REQUIRE(d12.padded_vocab_size == 50304);

    auto rejected = [](GPT2Config c, const std::string& needle) {
        const std::string message = gpt2_check_config(c);
        INFO("message: '" << message << "', expected to mention '" << needle << "'");
        REQUIRE(message.find(needle) != std::string::npos);
    };
    GPT2Config c = good;
    c.channels = 100;  // head size 25: not a multiple of the 16-byte vector width
    rejected(c, "100");
    c = good;
    c.channels = 66;
    c.num_heads = 3;  // C not a multiple of 8
    rejected(c, "66");
    c = good;
    c.num_heads = 5;  // 64 channels do not split into 5 heads
    rejected(c, "heads");
    c = good;
    c.channels = 1024;
    c.num_heads = 2;  // head size 512: above the attention kernels' maximum
    rejected(c, "head");
    c = good;
    c.padded_vocab_size = 500;  // not a multiple of 128
    rejected(c, "padded_vocab_size");
    // Documents start at GPT-2's EOT by default: a vocabulary without it cannot have them.
    ModelOptions documents;
    documents.doc_positions = true;
    CHECK(gpt2_check_build(good, 1, 8, 0, ModelOptions{}).empty());
    CHECK(gpt2_check_build(good, 1, 8, 0, documents) ==
          "model: documents (--doc-mask, --doc-positions) start at the end-of-text token 50256, outside the vocabulary of 512");
    // Context parallelism takes either attention kernel family (its ring steps are spans of both), but
    // splits training's sequences: an inference model (generation's KV cache) stays on one rank.
    ModelOptions context;
    context.context_parallel = 2;
    context.attention = Attention::simt;
    CHECK(gpt2_check_build(good, 1, 4, 0, context).empty());
    context.inference = true;
    CHECK(gpt2_check_build(good, 1, 4, 0, context) ==
          "model: context parallelism splits training's sequences; an inference model runs on one rank");
    // The fused attention backward is a tensor-core kernel for whole sequences: not with the SIMT
    // kernels, not over context parallelism's spans.
    ModelOptions fused;
    fused.fused_attention_backward = true;
    fused.attention = Attention::simt;
    CHECK(gpt2_check_build(good, 1, 8, 0, fused).rfind("--attention-backward fused: the fused backward is a tensor-core "
                                                         "kernel and needs --attention tc", 0) == 0);
    if (kBuildHasTensorCoreAttention) {
        fused.attention = Attention::tc;
        CHECK(gpt2_check_build(good, 1, 8, 0, fused).empty());
        fused.context_parallel = 2;
        CHECK(gpt2_check_build(good, 1, 4, 0, fused) ==
              "--attention-backward fused: context parallelism's ring steps run the split kernels over spans; use "
              "--attention-backward split with --cp");
    }
}
