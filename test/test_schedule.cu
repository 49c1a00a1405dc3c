// Learning-rate and batch-size schedules (host/schedule.h) and step reporting (host/metrics.h):
// boundary values, monotonicity, the ramp's doubling points and cap, the step line, the peak-FLOPs
// table, and metrics.jsonl lines that parse back.
#include "test_util.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <random>

#include "host/metrics.h"

#include <nlohmann/json.hpp>
#include "host/schedule.h"

namespace {

LrSchedule schedule(LrKind kind, int64_t warmup, double final_fraction, double wsd_fraction = 0.2) {
    return {kind, 1e-3, warmup, final_fraction, wsd_fraction};
}

// The schedules are computed in double and returned as float: compare with the float of the
// double-precision expectation, to within one float rounding (relative 2^-24, so 1e-6 is ample).
constexpr double kFloatRel = 1e-6;

}  // namespace

TEST_CASE("warmup follows llm.c: peak * (step + 1) / warmup", "[schedule]") {
    for (LrKind kind : {LrKind::cosine, LrKind::linear, LrKind::constant, LrKind::wsd}) {
        const LrSchedule s = schedule(kind, 10, 0.1);
        CHECK(learning_rate(s, 0, 100) == Approx(1e-4).epsilon(kFloatRel));  // the first step already trains
        CHECK(learning_rate(s, 4, 100) == Approx(5e-4).epsilon(kFloatRel));
        CHECK(learning_rate(s, 9, 100) == float(1e-3));  // the last warmup step reaches the peak
        for (int64_t step = 1; step < 10; ++step) CHECK(learning_rate(s, step, 100) > learning_rate(s, step - 1, 100));
    }
    // A run shorter than its warmup never reaches the peak.
    CHECK(learning_rate(schedule(LrKind::cosine, 10, 0.1), 4, 5) == Approx(5e-4).epsilon(kFloatRel));
}

TEST_CASE("cosine and linear decay from the peak at the end of warmup to peak * final at the last step", "[schedule]") {
    for (LrKind kind : {LrKind::cosine, LrKind::linear}) {
        const LrSchedule s = schedule(kind, 10, 0.1);
        const int64_t total = 101;  // decay over steps 10..100: a span of 90
        CHECK(learning_rate(s, 10, total) == float(1e-3));
        CHECK(learning_rate(s, 100, total) == float(1e-3 * 0.1));  // exactly the final value
        CHECK(learning_rate(s, 55, total) == Approx(0.55e-3).epsilon(kFloatRel));  // halfway: the mean, both shapes
        CHECK(learning_rate(s, 500, total) == float(1e-4));  // past the end: stays final
        for (int64_t step = 11; step < total; ++step)
            CHECK(learning_rate(s, step, total) < learning_rate(s, step - 1, total));
    }
    // The shapes differ a quarter of the way: cosine weight 0.5 * (1 + cos(pi/4)), linear 0.75.
    const int64_t total = 101;  // no warmup: a span of 100
    CHECK(learning_rate(schedule(LrKind::cosine, 0, 0.0), 25, total) ==
          Approx(1e-3 * 0.5 * (1 + std::cos(M_PI / 4))).epsilon(kFloatRel));
    CHECK(learning_rate(schedule(LrKind::linear, 0, 0.0), 25, total) == Approx(0.75e-3).epsilon(kFloatRel));
    CHECK(learning_rate(schedule(LrKind::cosine, 0, 0.0), 0, total) == float(1e-3));  // no warmup: starts at the peak
    CHECK(learning_rate(schedule(LrKind::cosine, 0, 0.0), 100, total) == 0.0f);
    // final fraction 1 (the default) keeps the peak throughout, as in llm.c.
    for (int64_t step : {0, 50, 100}) CHECK(learning_rate(schedule(LrKind::cosine, 0, 1.0), step, total) == float(1e-3));
    // A one-step run: that step is the last one.
    CHECK(learning_rate(schedule(LrKind::linear, 0, 0.5), 0, 1) == float(5e-4));
}

TEST_CASE("constant holds the peak after warmup", "[schedule]") {
    const LrSchedule s = schedule(LrKind::constant, 5, 1.0);
    for (int64_t step : {5, 50, 99, 1000}) CHECK(learning_rate(s, step, 100) == float(1e-3));
}

TEST_CASE("wsd: warmup, stable at the peak, linear decay over the last fraction of steps", "[schedule]") {
    const LrSchedule s = schedule(LrKind::wsd, 5, 0.1, 0.2);
    const int64_t total = 100;  // round(0.2 * 100) = 20 decay steps: 80..99
    for (int64_t step = 5; step <= 80; ++step) CHECK(learning_rate(s, step, total) == float(1e-3));
    for (int64_t step = 81; step < total; ++step) CHECK(learning_rate(s, step, total) < learning_rate(s, step - 1, total));
    CHECK(learning_rate(s, 99, total) == float(1e-4));
    CHECK(learning_rate(s, 89, total) ==
          Approx(1e-3 - (9.0 / 19.0) * 0.9e-3).epsilon(kFloatRel));  // linear: 9 of 19 steps into the decay
    // The decay never starts inside warmup; a decay share of 0 stays at the peak to the end.
    CHECK(learning_rate(schedule(LrKind::wsd, 90, 0.1, 0.2), 90, total) == float(1e-3));
    CHECK(learning_rate(schedule(LrKind::wsd, 90, 0.1, 0.2), 99, total) == float(1e-4));
    CHECK(learning_rate(schedule(LrKind::wsd, 0, 0.1, 0.0), 99, total) == float(1e-3));
    // A decay share of 1 is the linear schedule.
    for (int64_t step : {0, 17, 60, 99})
        CHECK(learning_rate(schedule(LrKind::wsd, 0, 0.1, 1.0), step, total) ==
              learning_rate(schedule(LrKind::linear, 0, 0.1), step, total));
}

TEST_CASE("learning_rate and lr_kind_from_name reject bad input with a message", "[schedule]") {
    const LrSchedule s = schedule(LrKind::cosine, 0, 0.1);
    CHECK_THROWS_WITH(learning_rate(s, -1, 10), Catch::Contains("learning_rate: step must be >= 0"));
    CHECK_THROWS_WITH(learning_rate(s, 0, 0), Catch::Contains("learning_rate: total_steps must be >= 1"));
    CHECK_THROWS_WITH(lr_kind_from_name("step"), Catch::Contains("unknown schedule 'step'"));
    CHECK(lr_kind_from_name("wsd") == LrKind::wsd);
}

TEST_CASE("batch ramp: syntax, doubling points and the cap", "[schedule]") {
    const BatchRamp ramp = parse_batch_ramp("65536:1e8,2e8");
    CHECK(ramp.start_tokens == 65536);
    CHECK(ramp.double_at == std::vector<int64_t>{100000000, 200000000});
    const int64_t cap = 524288;
    CHECK(total_batch_tokens_at(0, ramp, cap) == 65536);
    CHECK(total_batch_tokens_at(99999999, ramp, cap) == 65536);
    CHECK(total_batch_tokens_at(100000000, ramp, cap) == 131072);  // doubles at exactly the count
    CHECK(total_batch_tokens_at(199999999, ramp, cap) == 131072);
    CHECK(total_batch_tokens_at(200000000, ramp, cap) == 262144);
    CHECK(total_batch_tokens_at(int64_t(1) << 60, ramp, cap) == 262144);  // no more doubling points
    CHECK(total_batch_tokens_at(200000000, ramp, 131072) == 131072);      // never above the cap
    CHECK(total_batch_tokens_at(0, ramp, 32768) == 32768);                // even at the start
    CHECK(total_batch_tokens_at(123, parse_batch_ramp(""), cap) == cap);  // off

    // Many doublings stop at the cap instead of overflowing.
    std::string spec = "1099511627776:1";
    for (int i = 2; i <= 100; ++i) spec += "," + std::to_string(i);
    CHECK(total_batch_tokens_at(1000, parse_batch_ramp(spec), int64_t(1) << 62) == int64_t(1) << 62);

    CHECK(parse_batch_ramp("4096:1000").double_at == std::vector<int64_t>{1000});
    for (const char* bad : {"65536", "abc:1e8", "0:1e8", "-4096:1e8", "65536:", "65536:1e8,", "65536:2e8,1e8",
                            "65536:1e8,1e8", "65536:1.5", "65536:1e8;2e8", "65536:1e30"}) {
        INFO(bad);
        CHECK_THROWS_WITH(parse_batch_ramp(bad), Catch::Contains(std::string("batch ramp '") + bad + "'"));
    }
}

TEST_CASE("steps_for_tokens agrees with stepping through the ramp one step at a time", "[schedule]") {
    std::mt19937_64 random(7);
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t unit = 1 + int64_t(random() % 50);
        BatchRamp ramp;
        if (trial % 4 != 0) {  // every fourth trial: no ramp
            ramp.start_tokens = unit * (1 + int64_t(random() % 4));
            int64_t at = 0;
            for (int i = int(random() % 4); i >= 0; --i) ramp.double_at.push_back(at += 1 + int64_t(random() % 3000));
        }
        const int64_t cap = unit * (1 + int64_t(random() % 64));
        const int64_t tokens = int64_t(random() % 20000);
        int64_t seen = 0, steps = 0;
        while (seen < tokens) seen += total_batch_tokens_at(seen, ramp, cap), ++steps;
        INFO("trial " << trial);
        CHECK(steps_for_tokens(tokens, ramp, cap) == steps);
    }
    CHECK(steps_for_tokens(10500, BatchRamp{}, 1000) == 11);
    CHECK(steps_for_tokens(3000, parse_batch_ramp("300:1000"), 1 << 20) == 4 + 3);  // 4 * 300 passes 1000, then 600s
    CHECK_THROWS_WITH(steps_for_tokens(10, BatchRamp{}, 0), Catch::Contains("steps_for_tokens: cap must be >= 1"));
}

// ---------------------------------------------------------------------------------------------
// Reporting

TEST_CASE("FLOPs per token and MFU", "[metrics]") {
    CHECK(flops_per_token(1000, 2, 64, 128) == 6.0 * 1000 + 6.0 * 2 * 64 * 128);
    // GPT-2 124M (124,475,904 parameters with the padded vocabulary) at T = 1024.
    const double fpt = flops_per_token(124475904, 12, 768, 1024);
    CHECK(fpt == Approx(6.0 * 124475904 + 6.0 * 12 * 768 * 1024));
    // 8 H100s at 1.5M tok/s: the achieved FLOP/s over 8 peaks.
    const auto mfu = model_flops_utilization(fpt, 1.5e6, peak_bf16_flops("NVIDIA H100 80GB HBM3"), 8);
    REQUIRE(mfu);
    CHECK(*mfu == Approx(fpt * 1.5e6 / (8 * 989e12)));
    CHECK_FALSE(model_flops_utilization(fpt, 1.5e6, 0.0, 8));
    CHECK_FALSE(model_flops_utilization(fpt, 1.5e6, 989e12, 0));
}

TEST_CASE("peak BF16 FLOP/s by device name", "[metrics]") {
    struct Known {
        const char* name;
        double peak;
    };
    for (const Known& k : std::vector<Known>{{"NVIDIA H100 80GB HBM3", 989e12},
                                             {"NVIDIA H100 PCIe", 756e12},
                                             {"NVIDIA H100 NVL", 835e12},
                                             {"NVIDIA H200", 989e12},
                                             {"NVIDIA H200 NVL", 835e12},
                                             {"NVIDIA GH200 480GB", 989e12},
                                             {"NVIDIA A100-SXM4-80GB", 312e12},
                                             {"NVIDIA A100-PCIE-40GB", 312e12},
                                             {"NVIDIA A100 80GB PCIe", 312e12},
                                             {"NVIDIA L40S", 362e12},
                                             {"NVIDIA L40", 181e12},
                                             {"NVIDIA L4", 121e12},
                                             {"NVIDIA GeForce RTX 4090", 165e12},
                                             {"NVIDIA GeForce RTX 3090", 71e12},
                                             {"nvidia h100 pcie", 756e12},  // case-insensitive
                                             {"Tesla V100-SXM2-16GB", 0.0},  // no BF16 tensor cores
                                             {"CUDA emulator on the CPU (emu/)", 0.0},
                                             {"", 0.0}}) {
        INFO(k.name);
        CHECK(peak_bf16_flops(k.name) == k.peak);
    }
#ifndef __CUDACC__
    // The CPU build's device is unknown to the table: MFU is always n/a there.
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    CHECK(peak_bf16_flops(prop.name) == 0.0);
#endif
}

TEST_CASE("durations and thousands separators", "[metrics]") {
    CHECK(format_duration(0) == "0s");
    CHECK(format_duration(59.4) == "59s");
    CHECK(format_duration(59.6) == "1m00s");
    CHECK(format_duration(372) == "6m12s");
    CHECK(format_duration(3599) == "59m59s");
    CHECK(format_duration(3600) == "1h00m");
    CHECK(format_duration(3 * 3600 + 5 * 60 + 59) == "3h05m");
    CHECK(format_duration(2 * 86400 + 7 * 3600) == "2d07h");
    CHECK(format_duration(-1) == "n/a");
    CHECK(format_duration(NAN) == "n/a");
    CHECK(format_duration(INFINITY) == "n/a");
    CHECK(with_thousands(0) == "0");
    CHECK(with_thousands(999) == "999");
    CHECK(with_thousands(1000) == "1,000");
    CHECK(with_thousands(64512) == "64,512");
    CHECK(with_thousands(1234567) == "1,234,567");
    CHECK(with_thousands(-1234) == "-1,234");
}

TEST_CASE("the step line", "[metrics]") {
    StepReport r;
    r.step = 12;
    r.total_steps = 500;
    r.loss = 4.1234f;
    r.lr = 3e-4f;
    r.grad_norm = 1.23f;
    r.ms = 812.3;
    r.tokens_per_second = 64512.4;
    r.mfu = 0.412;
    r.eta_seconds = 372;
    CHECK(step_line(r) == "step 12/500 | loss 4.1234 | lr 3.00e-04 | norm 1.23 | 812.3 ms | 64,512 tok/s | MFU 41.2% | ETA 6m12s");
    r.mfu.reset();
    r.eta_seconds = -1;
    CHECK(step_line(r) == "step 12/500 | loss 4.1234 | lr 3.00e-04 | norm 1.23 | 812.3 ms | 64,512 tok/s | MFU n/a | ETA n/a");
}

TEST_CASE("metrics.jsonl: one JSON object per line, appended, parsing back", "[metrics]") {
    const auto dir = std::filesystem::temp_directory_path() / ("train_gpt_test_metrics_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    StepReport r;
    r.step = 1;
    r.total_steps = 2;
    r.loss = 4.25f;
    r.lr = 3e-4f;
    r.grad_norm = 0.5f;
    r.ms = 12.5;
    r.tokens_per_second = 1000.0;
    r.mfu = 0.25;
    r.batch_tokens = 8192;
    const std::string sample = "He said \"hi\"\nthen\xe2\x80 left";  // a quote, a newline, a cut UTF-8 sequence
    std::string path;
    {
        MetricsWriter writer((dir / "sub").string());  // creates the folder
        path = writer.path();
        writer.log_step(r);
        writer.log_val(1, 4.5f, 32768);
        writer.log_sample(1, sample);
        // Each line is on disk as soon as it is written (flushed), before the writer closes.
        std::ifstream early(path);
        CHECK(std::count(std::istreambuf_iterator<char>(early), std::istreambuf_iterator<char>(), '\n') == 3);
    }
    std::ofstream(path, std::ios::app) << R"({"step": 2, "lo)";  // killed mid-write
    {
        MetricsWriter resumed((dir / "sub").string());  // a resumed run appends, on a line of its own
        r.step = 2;
        r.loss = NAN;  // diverged: written as null, the line stays valid JSON
        r.mfu.reset();
        resumed.log_step(r);
    }
    std::ifstream in(path);
    std::vector<std::string> text;
    for (std::string line; std::getline(in, line);) text.push_back(line);
    REQUIRE(text.size() == 5);
    CHECK(text[3] == R"({"step": 2, "lo)");  // only the torn line is unreadable
    text.erase(text.begin() + 3);
    std::vector<nlohmann::json> lines;
    for (const std::string& line : text) lines.push_back(nlohmann::json::parse(line));
    CHECK(text[0].rfind(R"({"step":1,"loss":4.25,"lr":0.0003,)", 0) == 0);  // fields in a fixed order, step first
    const nlohmann::json& step = lines[0];
    CHECK(step["step"] == 1);
    CHECK(step["loss"] == 4.25);
    CHECK(step["lr"].get<double>() == 0.0003);  // the float's shortest decimal, not 0.000300000014...
    CHECK(step["grad_norm"] == 0.5);
    CHECK(step["ms"] == 12.5);
    CHECK(step["tokens_per_second"] == 1000.0);
    CHECK(step["mfu"] == 0.25);
    CHECK(step["batch_tokens"] == 8192);
    CHECK(step.size() == 8);
    CHECK(lines[1] == nlohmann::json{{"step", 1}, {"val_loss", 4.5}, {"val_tokens", 32768}});
    CHECK(lines[2]["step"] == 1);
    CHECK(lines[2]["sample"].get<std::string>() == "He said \"hi\"\nthen\xef\xbf\xbd left");  // U+FFFD
    CHECK(lines[3]["step"] == 2);
    CHECK(lines[3]["loss"].is_null());
    CHECK(lines[3]["mfu"].is_null());
    std::filesystem::remove_all(dir);

    // A path that cannot be a folder: a clear error naming it.
    const auto file = std::filesystem::temp_directory_path() / ("train_gpt_test_metrics_file_" + std::to_string(::getpid()));
    std::ofstream(file) << "x";
    CHECK_THROWS_WITH(MetricsWriter((file / "out").string()), Catch::Contains("MetricsWriter: cannot open '" + (file / "out").string()));
    std::filesystem::remove(file);
}
