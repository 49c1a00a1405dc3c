// The command line and JSON config (host/config.h): defaults, every flag in long and short form,
// --config files and their precedence, bad values and contradictions (one line naming the flags),
// and the config.json round trip.
#include "test_util.h"

#include <unistd.h>

#include <fstream>
#include <set>

#include "host/config.h"

#include <nlohmann/json.hpp>

namespace {

RunConfig parse(std::vector<std::string> args) {
    args.insert(args.begin(), "train_gpt");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return parse_config(int(argv.size()), argv.data());
}

// The ConfigError message of a parse that must fail; it must be one line.
std::string error_of(const std::vector<std::string>& args) {
    try {
        parse(args);
    } catch (const ConfigError& e) {
        const std::string message = e.what();
        INFO(message);
        CHECK(message.find('\n') == std::string::npos);
        CHECK(!message.empty());
        return message;
    }
    FAIL("parse succeeded, expected a ConfigError");
    return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A scratch folder under the system temp directory, removed afterwards.

}  // namespace

TEST_CASE("no flags give the documented defaults", "[config]") {
    const RunConfig c = parse({});
    CHECK(c.train_data == "data/shakespeare/train_*.bin");
    CHECK(c.val_data == "data/shakespeare/val_*.bin");
    CHECK(c.model == "d12");
    CHECK(c.output_dir.empty());
    CHECK(c.batch_size == 4);
    CHECK(c.seq_len == 1024);
    CHECK(c.total_batch_tokens == -1);
    CHECK(c.max_steps == -1);
    CHECK(c.learning_rate == 3e-4);
    CHECK(c.warmup_steps == 0);
    CHECK(c.final_lr_fraction == 1.0);
    CHECK(c.weight_decay == 0.0);
    CHECK(c.lr_schedule == "cosine");
    CHECK(c.wsd_decay_fraction == 0.2);
    CHECK(c.zero_stage == 0);
    CHECK(c.recompute == "none");
    CHECK(c.checkpoint_every == 0);
    CHECK(c.keep_last == 0);
    CHECK_FALSE(c.resume);
    CHECK_FALSE(c.overwrite);
    CHECK(c.resume_override.empty());
    CHECK(c.val_every == 20);
    CHECK(c.val_batches == 20);
    CHECK(c.sample_every == 20);
    CHECK(c.gen_tokens == 64);
    CHECK(c.temperature == 1.0);
    CHECK(c.top_k == 0);
    CHECK(c.hellaswag.empty());
    CHECK(c.beta1 == 0.9);
    CHECK(c.beta2 == 0.95);
    CHECK(c.eps == 1e-8);
    CHECK(c.grad_clip == 1.0);
    CHECK(c.seed == 1337);
    CHECK(c.skip_loss_z == 0.0);  // off, as llm.c's -sl
    CHECK(c.skip_norm_z == 0.0);  // off, as llm.c's -sg
    CHECK(c.max_skipped_steps == 5);
    CHECK(c.on_divergence == "stop");
    CHECK(c.max_rollbacks == 3);
    CHECK(c.batch_ramp.empty());
    CHECK_FALSE(c.dry_run);
    CHECK_FALSE(c.json);
    CHECK(c.world_size == 0);
    CHECK(c.max_memory == 0.0);
    CHECK(c.attention == "auto");
    CHECK_FALSE(c.profile_step);
    CHECK(c.log_every == 1);
    CHECK(c.collective_timeout == 300.0);
    CHECK_FALSE(c.help);
    CHECK(to_json(c) == to_json(RunConfig{}));
}

// One non-default value per setting, with the flags it needs to be consistent.
struct FlagCase {
    const char* long_name;
    char short_name;       // 0: long only
    const char* value;     // nullptr: a boolean flag
    nlohmann::json expected;
    std::vector<std::string> context = {};
};

const std::vector<FlagCase> flag_cases = {
    {"train-data", 'i', "fineweb/train_*.bin", "fineweb/train_*.bin"},
    {"val-data", 'j', "fineweb/val_*.bin", "fineweb/val_*.bin"},
    {"model", 'e', "tiny", "tiny"},
    {"layers", 0, "24", 24},
    {"heads", 0, "16", 16},
    {"channels", 0, "2048", 2048},
    {"output-dir", 'o', "runs/a", "runs/a"},
    {"doc-mask", 0, nullptr, true},
    {"doc-positions", 0, nullptr, true},
    {"batch-size", 'b', "8", 8},
    {"seq-len", 't', "256", 256},
    {"total-batch-tokens", 'd', "-1", -1, {"-d", "8192"}},  // back to -1: a negative value is taken as the argument
    {"total-batch-tokens", 'd', "16384", 16384},
    {"batch-ramp", 0, "4096:1e6,2e6", "4096:1e6,2e6", {"-d", "16384"}},
    {"max-steps", 'x', "500", 500},
    {"learning-rate", 'l', "6e-4", 6e-4},
    {"warmup-steps", 'u', "700", 700},
    {"final-lr-fraction", 'q', "0.1", 0.1},
    {"lr-schedule", 'k', "wsd", "wsd"},
    {"wsd-decay-fraction", 0, "0.3", 0.3},
    {"weight-decay", 'c', "0.1", 0.1},
    {"beta1", 0, "0.8", 0.8},
    {"beta2", 0, "0.99", 0.99},
    {"eps", 0, "1e-6", 1e-6},
    {"grad-clip", 0, "0", 0.0},
    {"seed", 0, "42", 42},
    {"skip-loss-z", 0, "5", 5.0},
    {"skip-norm-z", 0, "6.5", 6.5},
    {"max-skipped-steps", 0, "0", 0},
    {"on-divergence", 0, "rollback", "rollback", {"-o", "out", "-n", "100"}},
    {"max-rollbacks", 0, "7", 7},
    {"zero-stage", 'z', "2", 2},
    {"tp", 0, "4", 4},
    {"sequence-parallel", 0, "off", "off"},
    {"pp", 0, "4", 4, {"--pp-print-schedule"}},
    {"pp-schedule", 0, "interleaved", "interleaved"},
    {"pp-virtual", 0, "2", 2, {"--pp-schedule", "interleaved"}},
    {"pp-print-schedule", 0, nullptr, true},
    {"cp", 0, "4", 4},
    {"recompute", 'r', "selective", "selective"},
    {"world-size", 0, "8", 8},
    {"max-memory", 0, "40.5", 40.5},
    {"attention", 0, "tc", "tc"},
    {"attention-backward", 0, "fused", "fused"},
    {"matmul-autotune", 0, nullptr, true},
    {"matmul-algos", 0, "algos.json", "algos.json", {"--matmul-autotune"}},
    {"bias-grad", 0, "epilogue", "epilogue"},
    {"cuda-graphs", 0, "off", "off"},
    {"checkpoint-every", 'n', "1000", 1000, {"-o", "out"}},
    {"keep-last", 0, "3", 3, {"-o", "out", "-n", "100"}},
    {"resume", 'y', nullptr, true, {"-o", "out"}},
    {"overwrite", 0, nullptr, true, {"-o", "out"}},
    {"resume-override", 0, "seed,seq-len", "seed,seq-len", {"-o", "out", "-y"}},
    {"val-every", 'v', "250", 250},
    {"val-batches", 'm', "5", 5},
    {"final-val-batches", 0, "0", 0},
    {"sample-every", 's', "0", 0},
    {"gen-tokens", 'g', "128", 128},
    {"temperature", 0, "0.7", 0.7},
    {"top-k", 0, "40", 40},
    {"top-p", 0, "0.9", 0.9},
    {"generate", 0, nullptr, true},
    {"prompt", 0, "Once upon a time", "Once upon a time", {"--generate"}},
    {"prompt-ids", 0, "1,2,3", "1,2,3", {"--generate"}},
    {"max-tokens", 0, "100", 100, {"--generate"}},
    {"kv-cache", 0, "off", "off", {"--generate"}},
    {"hellaswag", 'h', "data/hellaswag_val.bin", "data/hellaswag_val.bin"},
    {"dry-run", 0, nullptr, true},
    {"json", 0, nullptr, true, {"--dry-run"}},
    {"profile-step", 0, nullptr, true},
    {"log-every", 0, "10", 10},
    {"collective-timeout", 0, "60", 60.0},
};

TEST_CASE("every flag sets its setting in long and short form", "[config]") {
    std::set<std::string> covered;
    for (const FlagCase& f : flag_cases) {
        covered.insert(f.long_name);
        std::vector<std::string> forms = {std::string("--") + f.long_name};
        if (f.short_name) forms.push_back(std::string("-") + f.short_name);
        for (const std::string& form : forms) {
            std::vector<std::string> args = f.context;
            args.push_back(form);
            if (f.value) args.push_back(f.value);
            INFO("flags: " << nlohmann::json(args).dump());
            const nlohmann::json got = to_json(parse(args))[f.long_name];
            CHECK(got == f.expected);
            // The other settings keep their defaults unless the context set them.
            if (f.context.empty()) {
                nlohmann::json rest = to_json(parse(args)), defaults = to_json(RunConfig{});
                rest.erase(f.long_name);
                defaults.erase(f.long_name);
                CHECK(rest == defaults);
            }
        }
        if (f.value) {  // --name=value also works
            std::vector<std::string> args = f.context;
            args.push_back(std::string("--") + f.long_name + "=" + f.value);
            CHECK(to_json(parse(args))[f.long_name] == f.expected);
        }
    }
    // Every setting in to_json (the option table) has a case above, and nothing else is there.
    std::set<std::string> keys;
    const nlohmann::json defaults = to_json(RunConfig{});  // a named object: items() must not outlive it
    for (const auto& item : defaults.items()) keys.insert(item.key());
    CHECK(keys == covered);
}

TEST_CASE("short flags match llm.c's letters", "[config]") {
    const RunConfig c = parse({"-i", "a", "-j", "b", "-e", "d24", "-o", "out", "-b", "16", "-t", "512", "-d", "65536",
                               "-x", "10", "-l", "1e-3", "-u", "2", "-q", "0", "-c", "0.1", "-z", "1", "-y", "-v", "5",
                               "-m", "3", "-s", "7", "-g", "32", "-h", "hs.bin", "-n", "4", "-k", "linear", "-r", "full"});
    CHECK(c.train_data == "a");
    CHECK(c.val_data == "b");
    CHECK(c.model == "d24");
    CHECK(c.batch_size == 16);
    CHECK(c.seq_len == 512);
    CHECK(c.total_batch_tokens == 65536);
    CHECK(c.max_steps == 10);
    CHECK(c.learning_rate == 1e-3);
    CHECK(c.warmup_steps == 2);
    CHECK(c.final_lr_fraction == 0.0);
    CHECK(c.weight_decay == 0.1);
    CHECK(c.zero_stage == 1);
    CHECK(c.resume);
    CHECK(c.val_every == 5);
    CHECK(c.val_batches == 3);
    CHECK(c.sample_every == 7);
    CHECK(c.gen_tokens == 32);
    CHECK(c.hellaswag == "hs.bin");
    CHECK(c.checkpoint_every == 4);
    CHECK(c.lr_schedule == "linear");
    CHECK(c.recompute == "full");
}

TEST_CASE("--help is long-only and lists every flag with its default", "[config]") {
    CHECK(parse({"--help"}).help);
    CHECK(parse({"--help", "-b", "0"}).help);  // help never fails on the other flags' values
    CHECK_FALSE(parse({"-h", "x.bin"}).help);  // -h is --hellaswag, as in llm.c
    CHECK(contains(error_of({"-h"}), "help is --help"));
    const std::string help = help_text();
    INFO(help);
    CHECK(contains(help, "--help"));
    CHECK(contains(help, "--config"));
    CHECK(contains(help, "-h, --hellaswag"));
    CHECK(contains(help, "cosine|linear|constant|wsd"));
    CHECK(contains(help, "(default: 1024)"));
    CHECK(contains(help, "(default: d12)"));
    const nlohmann::json defaults = to_json(RunConfig{});
    for (const auto& item : defaults.items()) CHECK(contains(help, "--" + item.key()));
}

TEST_CASE("--config loads a JSON file and command-line flags override it", "[config]") {
    TempDir dir;
    const std::string file = dir.write("run.json", R"({"batch-size": 8, "learning-rate": 0.001, "lr-schedule": "linear",
                                                      "resume": true, "output-dir": "runs/x", "max-memory": 20})");
    const RunConfig from_file = parse({"--config", file});
    CHECK(from_file.batch_size == 8);
    CHECK(from_file.learning_rate == 1e-3);
    CHECK(from_file.lr_schedule == "linear");
    CHECK(from_file.resume);
    CHECK(from_file.output_dir == "runs/x");
    CHECK(from_file.max_memory == 20.0);  // an integer is a fine number
    CHECK(from_file.seq_len == 1024);     // absent keys keep their defaults

    // Flags win wherever they stand relative to --config.
    for (const auto& args : std::vector<std::vector<std::string>>{{"--config", file, "-b", "16", "--lr-schedule", "wsd"},
                                                                  {"-b", "16", "--lr-schedule", "wsd", "--config", file}}) {
        const RunConfig c = parse(args);
        CHECK(c.batch_size == 16);
        CHECK(c.lr_schedule == "wsd");
        CHECK(c.learning_rate == 1e-3);
    }
    // The merged result is validated: a file value can contradict a flag.
    CHECK(contains(error_of({"--config", file, "-o", ""}), "--resume"));
}

TEST_CASE("--config rejects unknown keys, wrong types and broken files, naming them", "[config]") {
    TempDir dir;
    const auto error_for = [&](const std::string& json) { return error_of({"--config", dir.write("c.json", json)}); };
    std::string e = error_for(R"({"batch-size": 8, "batch_size": 8})");
    CHECK(contains(e, "unknown key 'batch_size'"));
    CHECK(contains(e, "c.json"));
    CHECK(contains(error_for(R"({"b": 8})"), "unknown key 'b'"));  // keys are long names
    CHECK(contains(error_for(R"({"config": "other.json"})"), "unknown key 'config'"));
    e = error_for(R"({"batch-size": "8"})");
    CHECK(contains(e, "'batch-size' expects an integer, got string"));
    CHECK(contains(error_for(R"({"batch-size": 8.5})"), "'batch-size' expects an integer"));
    CHECK(contains(error_for(R"({"batch-size": 10000000000})"), "'batch-size' value 10000000000 is out of range"));
    CHECK(contains(error_for(R"({"learning-rate": "3e-4"})"), "'learning-rate' expects a number, got string"));
    CHECK(contains(error_for(R"({"resume": 1})"), "'resume' expects a boolean, got number"));
    CHECK(contains(error_for(R"({"model": null})"), "'model' expects a string, got null"));
    CHECK(contains(error_for(R"([1, 2])"), "expects a JSON object"));
    CHECK(contains(error_for(R"({"batch-size": 8,)"), "not valid JSON"));
    // A number past double's range (found by make fuzz): nlohmann throws out_of_range, not parse_error.
    CHECK(contains(error_for(R"({"learning-rate": 1e999})"), "not valid JSON: [json.exception.out_of_range.406] number overflow"));
    CHECK(contains(error_for(R"({"batch-size": 0})"), "-b/--batch-size must be > 0"));  // values are checked too
    CHECK(contains(error_of({"--config", (dir.path / "missing.json").string()}), "cannot open"));
}

TEST_CASE("unknown flags and stray arguments are errors naming them", "[config]") {
    CHECK(contains(error_of({"--bogus", "1"}), "'bogus'"));
    CHECK(contains(error_of({"-Q"}), "'Q'"));
    CHECK(contains(error_of({"d12"}), "unexpected argument 'd12'"));
    CHECK(contains(error_of({"-b"}), "'b'"));  // missing its value
    CHECK(contains(error_of({"--resume", "false"}), "unexpected argument 'false'"));  // flags take no value
    CHECK(error_of({"--bogus"}).find("\xe2\x80") == std::string::npos);  // plain ASCII quotes
}

TEST_CASE("bad values name the flag", "[config]") {
    struct Bad {
        std::vector<std::string> args;
        const char* expected;
    };
    const std::vector<Bad> cases = {
        {{"-b", "0"}, "-b/--batch-size must be > 0, got 0"},
        {{"-b", "abc"}, "-b/--batch-size expects an integer, got 'abc'"},
        {{"-b", "4.5"}, "-b/--batch-size expects an integer"},
        {{"-b", "99999999999"}, "-b/--batch-size expects an integer"},  // beyond int
        {{"-t", "-5"}, "-t/--seq-len must be > 0"},
        {{"-d", "0"}, "-d/--total-batch-tokens must be -1 or > 0"},
        {{"-x", "0"}, "-x/--max-steps must be -1 or > 0"},
        {{"-l", "-1e-4"}, "-l/--learning-rate must be >= 0"},
        {{"-l", "nan"}, "-l/--learning-rate expects a number, got 'nan'"},
        {{"-l", "inf"}, "-l/--learning-rate expects a number"},
        {{"-l", ""}, "-l/--learning-rate expects a number"},
        {{"-u", "-1"}, "-u/--warmup-steps must be >= 0"},
        {{"-q", "1.5"}, "-q/--final-lr-fraction must be in [0, 1]"},
        {{"-q", "-0.1"}, "-q/--final-lr-fraction must be in [0, 1]"},
        {{"--wsd-decay-fraction", "2"}, "--wsd-decay-fraction must be in [0, 1]"},
        {{"-c", "-0.1"}, "-c/--weight-decay must be >= 0"},
        {{"--beta1", "1"}, "--beta1 must be in [0, 1)"},
        {{"--beta2", "-0.5"}, "--beta2 must be in [0, 1)"},
        {{"--eps", "0"}, "--eps must be > 0"},
        {{"--grad-clip", "-1"}, "--grad-clip must be >= 0"},
        {{"--seed", "-3"}, "--seed must be >= 0"},
        {{"--layers", "-1"}, "--layers must be >= 0"},
        {{"--pp", "0"}, "--pp must be >= 1"},
        {{"--tp", "0"}, "--tp must be >= 1"},
        {{"--pp-virtual", "0"}, "--pp-virtual must be >= 1"},
        {{"--heads", "-2"}, "--heads must be >= 0"},
        {{"--channels", "-8"}, "--channels must be >= 0"},
        {{"--collective-timeout", "-1"}, "--collective-timeout must be >= 0"},
        {{"--skip-loss-z", "-1"}, "--skip-loss-z must be >= 0"},
        {{"--skip-norm-z", "-0.5"}, "--skip-norm-z must be >= 0"},
        {{"--max-skipped-steps", "-1"}, "--max-skipped-steps must be >= 0"},
        {{"--max-rollbacks", "-1"}, "--max-rollbacks must be >= 0"},
        {{"--on-divergence", "retry"}, "--on-divergence must be one of stop|rollback"},
        {{"-z", "3"}, "-z/--zero-stage must be 0, 1 or 2, got 3"},
        {{"-k", "step"}, "-k/--lr-schedule must be one of cosine|linear|constant|wsd, got 'step'"},
        {{"-r", "partial"}, "-r/--recompute must be one of none|selective|full"},
        {{"--attention", "flash"}, "--attention must be one of auto|tc|simt"},
        {{"--attention-backward", "fast"}, "--attention-backward must be one of split|fused"},
        {{"--bias-grad", "cublas"}, "--bias-grad must be one of auto|epilogue|kernels"},
        {{"--world-size", "-2"}, "--world-size must be >= 0"},
        {{"--max-memory", "-1"}, "--max-memory must be >= 0"},
        {{"-n", "-1"}, "-n/--checkpoint-every must be >= 0"},
        {{"-v", "-1"}, "-v/--val-every must be >= 0"},
        {{"-m", "-1"}, "-m/--val-batches must be >= 0"},
        {{"--final-val-batches", "-2"}, "--final-val-batches must be >= -1"},
        {{"-g", "0"}, "-g/--gen-tokens must be > 0"},
        {{"--temperature", "-1"}, "--temperature must be >= 0"},
        {{"--top-p", "1.5"}, "--top-p must be in (0, 1]"},
        {{"--max-tokens", "0", "--generate"}, "--max-tokens must be > 0"},
        {{"--prompt", "Hi"}, "--prompt needs --generate"},
        {{"--max-tokens", "9"}, "--max-tokens needs --generate"},
        {{"--generate", "--prompt", "a", "--prompt-ids", "1"}, "--prompt and --prompt-ids cannot go together"},
        {{"--generate", "-o", "out"}, "--generate trains nothing"},
        {{"--generate", "--doc-mask"}, "--doc-mask and --doc-positions do not apply"},
        {{"--top-k", "-1"}, "--top-k must be >= 0"},
        {{"--log-every", "0"}, "--log-every must be > 0"},
        {{"-e", ""}, "-e/--model must not be empty"},
        {{"-i", ""}, "-i/--train-data must not be empty"},
        {{"-d", "8192", "--batch-ramp", "4096"}, "--batch-ramp: batch ramp '4096': missing ':'"},
        {{"-d", "8192", "--batch-ramp", "4096:1e8,5e7"}, "token counts must increase"},
    };
    for (const Bad& bad : cases) {
        INFO("flags: " << nlohmann::json(bad.args).dump());
        const std::string message = error_of(bad.args);
        INFO("message: " << message);
        CHECK(contains(message, bad.expected));
    }
}

TEST_CASE("contradictory flags are errors naming every flag involved", "[config]") {
    std::string e = error_of({"--json"});
    CHECK(contains(e, "--json needs --dry-run"));
    e = error_of({"-y"});
    CHECK(contains(e, "-y/--resume needs -o/--output-dir"));
    e = error_of({"-d", "5000"});  // B*T = 4096
    CHECK(contains(e, "-d/--total-batch-tokens 5000 must be a multiple of -b/--batch-size * -t/--seq-len = 4096"));
    CHECK(contains(error_of({"-n", "100"}), "-n/--checkpoint-every needs -o/--output-dir"));
    CHECK(contains(error_of({"-o", "out", "-y", "--overwrite"}), "--overwrite starts a fresh run: it cannot go with -y/--resume"));
    CHECK(contains(error_of({"--overwrite"}), "--overwrite needs -o/--output-dir"));
    CHECK(contains(error_of({"-o", "out", "--resume-override", "seed"}), "--resume-override needs -y/--resume"));
    CHECK(contains(error_of({"--matmul-algos", "a.json"}), "--matmul-algos needs --matmul-autotune"));
    CHECK(contains(error_of({"--pp", "2", "--generate"}), "--generate runs one sequence on one rank: it cannot go with --pp 2"));
    CHECK(contains(error_of({"--pp-virtual", "2"}), "--pp-virtual 2 needs --pp-schedule interleaved"));
    CHECK(contains(error_of({"--sequence-parallel", "on"}),
                   "--sequence-parallel on splits the tokens over the tensor ranks: it needs --tp > 1"));
    CHECK(contains(error_of({"--tp", "2", "--generate"}), "--generate runs one sequence on one rank: it cannot go with --tp 2"));
    CHECK(contains(error_of({"-o", "out", "-y", "--resume-override", "seed,lr"}),
                   "--resume-override: 'lr' is not a run-identity setting (model, layers, heads, channels, seq-len, seed, "
                   "train-data, batch-ramp, tokens-per-step, doc-mask, doc-positions)"));
    CHECK(contains(error_of({"--keep-last", "2", "-o", "out"}), "--keep-last needs -n/--checkpoint-every > 0"));
    CHECK(contains(error_of({"--on-divergence", "rollback", "-o", "out"}),
                   "--on-divergence rollback needs checkpoints to roll back to (-n/--checkpoint-every > 0)"));
    CHECK(contains(error_of({"--on-divergence", "rollback", "-o", "out", "-n", "5", "--max-skipped-steps", "0"}),
                   "and a divergence to act on (--max-skipped-steps > 0)"));
    CHECK(parse({"-t", "32"}).gen_tokens == 64);  // longer than a window: clipped at run time, with a note
    CHECK(contains(error_of({"-k", "constant", "-q", "0.1"}),
                   "-q/--final-lr-fraction 0.1 has no effect with -k/--lr-schedule constant"));
    CHECK(contains(error_of({"--batch-ramp", "4096:1e6"}), "--batch-ramp needs -d/--total-batch-tokens"));
    e = error_of({"--batch-ramp", "6000:1e6", "-d", "16384"});
    CHECK(contains(e, "--batch-ramp start 6000 must be a multiple of -b/--batch-size * -t/--seq-len = 4096"));
    CHECK(contains(error_of({"--batch-ramp", "32768:1e6", "-d", "16384"}), "<= -d/--total-batch-tokens 16384"));
}

TEST_CASE("the world-size checks: -d and the ramp per rank, --world-size against the launch", "[config]") {
    CHECK(total_batch_tokens_for(parse({}), 1) == 4096);
    CHECK(total_batch_tokens_for(parse({}), 8) == 8 * 4096);
    const RunConfig c = parse({"-d", "16384", "--batch-ramp", "8192:1e6"});
    CHECK(total_batch_tokens_for(c, 2) == 16384);
    try {
        total_batch_tokens_for(c, 3);
        FAIL("expected a ConfigError");
    } catch (const ConfigError& e) {
        CHECK(contains(e.what(), "-d/--total-batch-tokens 16384 must be a multiple of -b/--batch-size * -t/--seq-len * "
                                 "world size 3 = 12288"));
    }
    try {
        total_batch_tokens_for(c, 4);  // -d is a multiple of 4 * 4096, the ramp start 8192 is not
        FAIL("expected a ConfigError");
    } catch (const ConfigError& e) {
        CHECK(contains(e.what(), "--batch-ramp start 8192 must be a multiple of"));
    }
    CHECK_THROWS_AS(total_batch_tokens_for(c, 0), std::invalid_argument);

    CHECK(planned_world_size(parse({}), 4) == 4);
    CHECK(planned_world_size(parse({"--world-size", "4"}), 4) == 4);
    CHECK(planned_world_size(parse({"--world-size", "64", "--dry-run"}), 1) == 64);
    CHECK_THROWS_WITH(planned_world_size(parse({"--world-size", "64"}), 2),
                      Catch::Contains("--world-size 64 but 2 ranks were launched"));
}

TEST_CASE("to_json round trip: parsing the written config.json reproduces the config", "[config]") {
    TempDir dir;
    const std::vector<std::vector<std::string>> runs = {
        {},
        {"-i", "x/*.bin", "-e", "tiny", "-o", "out dir/with space", "-b", "2", "-t", "64", "-d", "1024", "-x", "30",
         "-l", "1.23456789012345e-3", "-u", "3", "-q", "0.1", "-k", "wsd", "--wsd-decay-fraction", "0.25", "-c", "0.1",
         "--beta1", "0.85", "--beta2", "0.999", "--eps", "1e-10", "--grad-clip", "0", "--seed", "9007199254740993",
         "-z", "2", "-r", "full", "--world-size", "2", "--max-memory", "0.1", "--attention", "tc", "-n", "10",
         "--keep-last", "2", "-y", "-v", "0", "-m", "1", "-s", "5", "-g", "16", "--temperature", "0.3", "--top-k", "5",
         "-h", "h\"s.bin", "--batch-ramp", "128:1000,1e4", "--dry-run", "--json", "--profile-step", "--log-every", "7"},
    };
    for (const auto& args : runs) {
        const RunConfig original = parse(args);
        const nlohmann::json written = to_json(original);
        const std::string file = dir.write("config.json", written.dump(2));
        const RunConfig reread = parse({"--config", file});
        CHECK(to_json(reread) == written);
        CHECK(reread.learning_rate == original.learning_rate);  // doubles survive exactly
        CHECK(reread.seed == original.seed);                    // beyond 2^53: stored as an integer
        CHECK(reread.output_dir == original.output_dir);
        CHECK(reread.hellaswag == original.hellaswag);
    }
}

TEST_CASE("lr_schedule_of carries the schedule settings", "[config]") {
    const LrSchedule s = lr_schedule_of(parse({"-k", "wsd", "-l", "1e-3", "-u", "10", "-q", "0.1", "--wsd-decay-fraction", "0.3"}));
    CHECK(s.kind == LrKind::wsd);
    CHECK(s.peak_lr == 1e-3);
    CHECK(s.warmup_steps == 10);
    CHECK(s.final_fraction == 0.1);
    CHECK(s.wsd_decay_fraction == 0.3);
    for (const char* name : {"cosine", "linear", "constant", "wsd"}) CHECK_NOTHROW(lr_schedule_of(parse({"-k", name})));
}

TEST_CASE("the settings a flag or --config set are known as given", "[config]") {
    const RunConfig defaults = parse({});
    CHECK_FALSE(defaults.was_given("val-every"));
    const RunConfig flagged = parse({"-v", "20", "--seed", "3"});  // -v at its default value: still given
    CHECK(flagged.was_given("val-every"));
    CHECK(flagged.was_given("seed"));
    CHECK_FALSE(flagged.was_given("val-data"));
    TempDir dir;
    const std::string file = dir.file("c.json");
    std::ofstream(file) << R"({"val-data": "x/val_*.bin"})";
    const RunConfig from_file = parse({"--config", file});
    CHECK(from_file.was_given("val-data"));
    CHECK_FALSE(from_file.was_given("val-every"));
}
