// host/hellaswag.h: llm.c's eval file (layout from llm.c dev/data/data_common.py write_evalfile) read
// back and each bad input rejected; completions packed into rows; scoring; the deal of examples to
// ranks. Then, through train_gpt.cu: the packed evaluation gives every completion bitwise the losses
// of its row alone in a pass of the same shape (rows of a batch never see each other), and within
// GEMM rounding those of its row alone with B = 1.
// built into: test_model_suite
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"

#include "host/hellaswag.h"
#include "model_test_util.h"
#include "mpi_test_util.h"

namespace {

struct Spec {
    int label;
    std::vector<int> context;
    std::vector<std::vector<int>> completions;
};

// One example's uint16 values as llm.c writes them (the length field in bytes, these fields included).
std::vector<uint16_t> example_values(const Spec& s, int index) {
    std::vector<uint16_t> v = {65535, 0, uint16_t(index), uint16_t(s.label), uint16_t(s.completions.size())};
    v.push_back(uint16_t(s.context.size()));
    v.insert(v.end(), s.context.begin(), s.context.end());
    for (const std::vector<int>& c : s.completions) {
        v.push_back(uint16_t(c.size()));
        v.insert(v.end(), c.begin(), c.end());
    }
    v[1] = uint16_t(2 * v.size());
    return v;
}

struct EvalFile {
    int32_t header[256] = {20240522, 1, 0, 0};
    std::vector<std::vector<uint16_t>> examples;
    explicit EvalFile(const std::vector<Spec>& specs) {
        for (size_t i = 0; i < specs.size(); ++i) examples.push_back(example_values(specs[i], int(i)));
        header[2] = int32_t(examples.size());
        for (const auto& e : examples) header[3] = std::max<int32_t>(header[3], int32_t(2 * e.size()));
    }
    std::string bytes() const {
        std::string b(reinterpret_cast<const char*>(header), sizeof(header));
        for (const auto& e : examples) b.append(reinterpret_cast<const char*>(e.data()), 2 * e.size());
        return b;
    }
};

const std::vector<Spec> kSpecs = {{2, {10, 11, 12}, {{20, 21}, {22}, {23, 24, 25}, {26}}},
                                  {0, {30}, {{40}, {41, 42}, {43}, {44, 45, 46, 47}}},
                                  {3, {50, 51}, {{60}, {61}, {62}, {63}}}};

std::string tiny_fixture() { return repo_root() + "/test/fixtures/hellaswag_tiny.bin"; }

}  // namespace

TEST_CASE("hellaswag: the reader returns what was written, also data/hellaswag.py's fixture") {
    TempDir dir;
    const HellaSwagSet set = read_hellaswag(dir.write("hs.bin", EvalFile(kSpecs).bytes()));
    REQUIRE(set.examples.size() == kSpecs.size());
    for (size_t i = 0; i < kSpecs.size(); ++i) {
        CHECK(set.examples[i].label == kSpecs[i].label);
        CHECK(set.examples[i].context == kSpecs[i].context);
        CHECK(set.examples[i].completions == kSpecs[i].completions);
    }
    CHECK(set.examples[0].row_tokens(2) == 5);  // 3 context + 3 completion - 1
    CHECK(set.examples[1].longest_row() == 4);

    // test/fixtures/hellaswag_tiny.bin: data/hellaswag.py on test/fixtures/hellaswag_tiny.jsonl; ids
    // of "Hello world!" and " The quick brown fox" as data/test_prepare.py knows them.
    const HellaSwagSet tiny = read_hellaswag(tiny_fixture(), 50257);
    REQUIRE(tiny.examples.size() == 3);
    CHECK(tiny.examples[0].label == 1);
    CHECK(tiny.examples[1].label == 0);
    CHECK(tiny.examples[2].label == 3);
    CHECK(tiny.examples[0].context == std::vector<int>{15496, 995, 0});
    CHECK(tiny.examples[0].completions[0] == std::vector<int>{383, 2068, 7586, 21831});
    for (const HellaSwagExample& e : tiny.examples) CHECK(e.completions.size() == 4);
}

TEST_CASE("hellaswag: each bad input is one line naming the file and the field") {
    TempDir dir;
    const auto message_for = [&](const std::string& bytes, int vocab = 65535) {
        const std::string path = dir.write("bad.bin", bytes);
        const std::string message = error_of([&] { read_hellaswag(path, vocab); });
        CHECK(message.find("hellaswag: '" + path + "': ") == 0);
        return message;
    };
    const auto edited = [](const std::function<void(EvalFile&)>& edit) {
        EvalFile f(kSpecs);
        edit(f);
        return f.bytes();
    };
    const auto contains = [](const std::string& message, const std::string& needle) {
        INFO("message: " << message);
        CHECK(message.find(needle) != std::string::npos);
    };
    contains(error_of([&] { read_hellaswag(dir.file("missing.bin")); }), "cannot open the file");
    contains(message_for(EvalFile(kSpecs).bytes().substr(0, 1000)), "shorter than the 1024-byte header");
    // The header alone (found by make fuzz: the empty body was copied from a null pointer, UB under UBSan).
    contains(message_for(EvalFile(kSpecs).bytes().substr(0, 1024)), "example 0 (byte 1024): truncated");
    contains(message_for(edited([](EvalFile& f) { f.header[0] = 20240520; })), "magic 20240520, expected 20240522");
    contains(message_for(edited([](EvalFile& f) { f.header[1] = 2; })), "version 2, expected 1");
    contains(message_for(edited([](EvalFile& f) { f.header[2] = 0; })), "example count 0");
    contains(message_for(edited([](EvalFile& f) { f.header[2] = 4; })), "example 3 (byte 1134): truncated");
    contains(message_for(edited([](EvalFile& f) { f.header[3] = 100; })), "longest-example field 100 bytes");
    contains(message_for(EvalFile(kSpecs).bytes().substr(0, 1100)), "truncated: the file ends before its completion 3 tokens");
    contains(message_for(EvalFile(kSpecs).bytes() + "x"), "not a whole number of uint16");
    contains(message_for(EvalFile(kSpecs).bytes() + "xy"), "2 bytes after the 3 examples");
    contains(message_for(edited([](EvalFile& f) { f.examples[1][0] = 65534; })),
             "example 1 (byte 1064): start delimiter 65534, expected 65535");
    contains(message_for(edited([](EvalFile& f) { f.examples[1][1] += 2; })), "length field 40 bytes, but its fields take 38");
    contains(message_for(edited([](EvalFile& f) { f.examples[2][2] = 5; })), "example 2 (byte 1102): index 5, expected 2");
    contains(message_for(edited([](EvalFile& f) { f.examples[0][3] = 4; })), "label 4 is not below the completion count 4");
    contains(message_for(edited([](EvalFile& f) { f.examples[0][4] = 0; })), "completion count is 0");
    Spec empty_context = kSpecs[1], empty_completion = kSpecs[1];
    empty_context.context.clear();
    empty_completion.completions[2].clear();
    contains(message_for(EvalFile({kSpecs[0], empty_context}).bytes()), "example 1 (byte 1064): context length is 0");
    contains(message_for(EvalFile({empty_completion}).bytes()), "completion 2 length is 0");
    contains(message_for(EvalFile(kSpecs).bytes(), 50), "example 2 (byte 1102): context token 50 is outside the vocabulary [0, 50)");
}

TEST_CASE("hellaswag: a row is the context then the completion; targets only where completion tokens are predicted") {
    const HellaSwagExample e{0, {10, 11, 12}, {{20, 21}}};
    std::vector<int> inputs(6, 7), targets(6, 7);
    REQUIRE(hellaswag_pack_row(e, 0, 6, inputs.data(), targets.data()));
    CHECK(inputs == std::vector<int>{10, 11, 12, 20, 21, 0});
    CHECK(targets == std::vector<int>{-1, -1, 20, 21, -1, -1});  // position 2 predicts 20, position 3 predicts 21
    // Exactly fitting: the last completion token is a target, never an input (it predicts nothing).
    std::vector<int> in4(4), tg4(4);
    REQUIRE(hellaswag_pack_row(e, 0, 4, in4.data(), tg4.data()));
    CHECK(in4 == std::vector<int>{10, 11, 12, 20});
    CHECK(tg4 == std::vector<int>{-1, -1, 20, 21});
    std::vector<int> in3(3, 7), tg3(3, 7);
    CHECK_FALSE(hellaswag_pack_row(e, 0, 3, in3.data(), tg3.data()));
    CHECK(in3 == std::vector<int>(3, 7));  // untouched
    const HellaSwagExample no_context{0, {}, {{20}}};
    CHECK_THROWS_AS(hellaswag_pack_row(no_context, 0, 4, in4.data(), tg4.data()), std::invalid_argument);
}

TEST_CASE("hellaswag: a completion scores its mean loss; the lowest wins, ties to the lowest index") {
    const float losses[6] = {9, 9, 1.0f, 2.0f, 9, 9};
    const int targets[6] = {-1, -1, 5, 6, -1, -1};
    CHECK(hellaswag_completion_loss(losses, targets, 6) == 1.5);  // the 9s sit outside the completion
    CHECK(std::isnan(hellaswag_completion_loss(losses, std::vector<int>(6, -1).data(), 6)));
    CHECK(hellaswag_prediction({3.0, 1.0, 2.0, 1.5}) == 1);
    CHECK(hellaswag_prediction({2.0, 1.0, 1.0, 1.0}) == 1);  // a tie: the lowest index (llm.c's strict <)
    CHECK(hellaswag_prediction({NAN, 4.0, NAN, 5.0}) == 1);  // NaN never wins
    CHECK(hellaswag_prediction({NAN, NAN}) == -1);           // never right
}

TEST_CASE("hellaswag: examples dealt round-robin to ranks, rows packed B to a pass, counts add up") {
    // Fake forward: the loss at a targeted position is the target token / 1000, so a completion's
    // score is its mean token id. Every pass is checked: B rows of T_eval positions, targets = the
    // next input token where both are in the row.
    std::vector<Spec> specs;
    int expected_correct = 0;
    for (int i = 0; i < 9; ++i) {
        Spec s{i % 4, {100 + i, 101 + i}, {}};
        for (int c = 0; c < 4; ++c) s.completions.push_back(std::vector<int>(1 + (i + c) % 3, 200 + 10 * ((c + i) % 4)));
        const int best = (4 - i % 4) % 4;  // the completion with the lowest token id: (c + i) % 4 == 0
        expected_correct += best == s.label;
        specs.push_back(s);
    }
    specs.push_back({0, std::vector<int>(70, 1), {{2}, {3}}});  // needs 70 positions: skipped at T = 64
    TempDir dir;
    const HellaSwagSet set = read_hellaswag(dir.write("hs.bin", EvalFile(specs).bytes()));
    int longest = 0;
    for (int i = 0; i < 9; ++i) longest = std::max(longest, set.examples[i].longest_row());
    for (int B : {1, 3, 4, 8}) {
        for (int world : {1, 2, 3}) {
            HellaSwagResult sum;
            int passes = 0;
            for (int rank = 0; rank < world; ++rank) {
                const HellaSwagResult r = hellaswag_evaluate(set, B, 64, rank, world,
                    [&](const int* inputs, const int* targets, int b, int t, float* losses) {
                        ++passes;
                        REQUIRE(b == B);
                        REQUIRE(t == longest);  // the longest row that fits, not T
                        for (int p = 0; p < b * t; ++p) {
                            losses[p] = targets[p] == -1 ? 0.0f : float(targets[p]) / 1000.0f;
                            if (targets[p] != -1 && (p + 1) % t != 0) REQUIRE(inputs[p + 1] == targets[p]);
                        }
                    });
                sum.correct += r.correct;
                sum.total += r.total;
                sum.skipped += r.skipped;
            }
            INFO("B = " << B << ", world = " << world);
            CHECK(sum.correct == expected_correct);
            CHECK(sum.total == 9);
            CHECK(sum.skipped == 1);
            CHECK(passes >= 36 / B);
            CHECK(passes <= 36 / B + world);  // each rank's last pass may be partly padding
        }
    }
    CHECK(expected_correct == 5);  // i % 4 in {0, 2}: neither all nor none, so the counts above mean something
    CHECK_THROWS_AS(hellaswag_evaluate(set, 4, 64, 2, 2, {}), std::invalid_argument);
}

TEST_CASE("hellaswag: metrics.jsonl record") {
    TempDir dir;
    {
        MetricsWriter writer(dir.path.string());
        writer.log_hellaswag(40, 3, 8);
    }
    std::ifstream in(dir.file("metrics.jsonl"));
    std::string line;
    REQUIRE(std::getline(in, line));
    CHECK(line == R"({"step":40,"hellaswag_accuracy":0.375,"hellaswag_correct":3,"hellaswag_examples":8})");
}

namespace {

// MPI once per process (hellaswag_accuracy sums over the run's ranks): this process alone.
Distributed single_process() {
    mpi_init_once();
    Distributed d;
    d.mpi = MPI_COMM_SELF;
    return d;
}

}  // namespace

TEST_CASE("hellaswag through the model: packed rows get exactly the losses of each row alone") {
    // The tiny fixture (3 examples, 12 rows) at B = 5: passes of 5, 5 and 2 rows (+3 padding rows),
    // so examples straddle passes and rows sit next to other examples' rows.
    const HellaSwagSet set = read_hellaswag(tiny_fixture(), 50257);
    const int B = 5, T = 64;
    Trainer tr;
    trainer_build(tr, single_process(), GPT2Config{64, 50257, pad_vocab(50257), 2, 4, 64}, B, T, 0, OptimizerConfig{});
    gpt2_init_weights(tr.model, 42);
    GPT2& m = tr.model;

    struct Pass {
        std::vector<int> inputs, targets;
        std::vector<float> losses;
        int T;
    };
    std::vector<Pass> passes;
    const HellaSwagResult packed = hellaswag_evaluate(set, B, T, 0, 1,
        [&](const int* inputs, const int* targets, int b, int t, float* losses) {
            forward_token_losses(m, inputs, targets, b, t, losses);
            passes.push_back({{inputs, inputs + b * t}, {targets, targets + b * t}, {losses, losses + b * t}, t});
        });
    REQUIRE(passes.size() == 3);
    CHECK(packed.total == 3);

    std::vector<double> scores;  // per row evaluated alone, in pass order: example-major, completion-minor
    for (const Pass& p : passes) {
        const int t = p.T;
        for (int r = 0; r < B; ++r) {
            const std::vector<int> in(p.inputs.begin() + r * t, p.inputs.begin() + (r + 1) * t);
            const std::vector<int> tg(p.targets.begin() + r * t, p.targets.begin() + (r + 1) * t);
            const std::vector<float> got(p.losses.begin() + r * t, p.losses.begin() + (r + 1) * t);
            if (std::all_of(tg.begin(), tg.end(), [](int x) { return x == -1; })) continue;  // padding
            INFO("row " << scores.size() << " [" << kPrecisionName << "]");
            // Alone in a pass of the same shape (the other rows padding): bitwise on any device.
            std::vector<int> in_b(size_t(B) * t, 0), tg_b(size_t(B) * t, -1);
            std::copy(in.begin(), in.end(), in_b.begin() + r * t);
            std::copy(tg.begin(), tg.end(), tg_b.begin() + r * t);
            std::vector<float> alone_b(size_t(B) * t);
            forward_token_losses(m, in_b.data(), tg_b.data(), B, t, alone_b.data());
            CHECK(bitwise_equal(got, std::vector<float>(alone_b.begin() + r * t, alone_b.begin() + (r + 1) * t)));
            // Alone with B = 1: the same up to the GEMMs' rounding, which depends on the matrix shape (M =
            // T rows instead of B*T): OpenBLAS behind the emulator gave FP32 losses 1 ulp apart (worst
            // 9.0e-8 relative) in 8 of the 12 rows, and BF16 losses bitwise equal (its roundings to 8-bit
            // mantissas absorbed those differences here). Tolerances: FP32 1e-6 relative (~10x the
            // measured); BF16 1e-3 relative, room for one intermediate rounding flipped by such a
            // difference (2^-8 on one activation moves a mean of many far less). Not run on a GPU, whose
            // shape-dependent cuBLASLt algorithms were not measured; the check above is the one that
            // proves rows do not see each other.
            std::vector<float> alone_1(t);
            forward_token_losses(m, in.data(), tg.data(), 1, t, alone_1.data());
#ifndef __CUDACC__
            std::vector<float> got_at_targets, alone_at_targets;  // rows with no target have loss 0
            for (int k = 0; k < t; ++k)
                if (tg[k] != -1) got_at_targets.push_back(got[k]), alone_at_targets.push_back(alone_1[k]);
            CHECK(tensor_error(got_at_targets, alone_at_targets, ErrorScale::element) <= (kFP32 ? 1e-6 : 1e-3));
#endif
            CHECK(std::count_if(got.begin(), got.end(), [](float l) { return l > 0; }) ==
                  std::count_if(tg.begin(), tg.end(), [](int x) { return x != -1; }));  // losses only at targets
            scores.push_back(hellaswag_completion_loss(alone_b.data() + r * t, tg.data(), t));
        }
    }
    REQUIRE(scores.size() == 12);
    long long correct = 0;
    for (int i = 0; i < 3; ++i) {
        std::vector<double> s;
        for (int c = 0; c < 4; ++c) s.push_back(scores[size_t(4 * i + c)]);
        correct += hellaswag_prediction(s) == set.examples[size_t(i)].label;
    }
    CHECK(packed.correct == correct);  // scored from the rows alone: the same predictions
    // What a run evaluates (host/evaluation.h through train_gpt.cu's evaluated_model): the same counts,
    // summed over the (one) rank.
    const HellaSwagResult run = hellaswag_all_ranks(set, B, T, tr.dist, evaluated_model(tr).token_losses);
    CHECK(run.correct == packed.correct);
    CHECK(run.total == 3);
    CHECK(run.skipped == 0);
    trainer_free(tr);
}
