// The option table and the parsing of host/config.h: flags (cxxopts), --config files and config.json
// (nlohmann/json), --help. Compiled once per precision into the host library (RunConfig's
// --attention default depends on it).
#include "host/config.h"
#include "host/model_config.h"

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <type_traits>
#include <variant>

namespace config_detail {

using Field = std::variant<std::string RunConfig::*, int RunConfig::*, int64_t RunConfig::*, double RunConfig::*,
                           bool RunConfig::*>;

struct Option {
    const char* group;
    char short_name;  // 0: long name only
    const char* long_name;
    Field field;
    const char* help;
    const char* arg = nullptr;          // placeholder in --help; derived from the type when null
    std::vector<std::string> choices{};  // the allowed values of a string setting
};

// -e's help: the presets (host/model_config.h) and what a model file must hold.
inline const std::string kModelHelpText = std::string("an llm.c model file (its padded vocabulary Vp a multiple of 128), "
                                                      "or a preset: ") + kPresetNames;
inline const char* const kModelHelp = kModelHelpText.c_str();

inline const std::vector<Option>& options() {
    using R = RunConfig;
    static const std::vector<Option> table = {
        {"Data and model", 'i', "train-data", &R::train_data, "training token shards", "GLOB"},
        {"Data and model", 'j', "val-data", &R::val_data, "validation token shards", "GLOB"},
        {"Data and model", 'e', "model", &R::model, kModelHelp, "PATH|PRESET"},
        {"Data and model", 0, "layers", &R::layers,
         "transformer blocks L of a preset's shape, changed (trained from scratch; a model file's shape is its own); "
         "0 = the preset's", "N"},
        {"Data and model", 0, "heads", &R::heads, "attention heads NH of a preset's shape, changed; 0 = the preset's", "N"},
        {"Data and model", 0, "channels", &R::channels,
         "channels C of a preset's shape, changed (a multiple of the heads; head size C/NH as the attention kernels "
         "allow); 0 = the preset's", "N"},
        {"Data and model", 'o', "output-dir", &R::output_dir, "where config.json, metrics.jsonl, checkpoints go", "DIR"},
        {"Data and model", 0, "doc-mask", &R::doc_mask,
         "documents packed in a row attend only within themselves: token t's document starts at the last EOT "
         "(50256) at or before t, or at the row's start (the EOT belongs to the document it opens)"},
        {"Data and model", 0, "doc-positions", &R::doc_positions,
         "position embeddings restart at 0 at each document's start (the same documents as --doc-mask; either flag "
         "works without the other)"},
        {"Batch and schedule", 'b', "batch-size", &R::batch_size, "micro-batch size B (sequences per rank)"},
        {"Batch and schedule", 't', "seq-len", &R::seq_len, "sequence length T"},
        {"Batch and schedule", 'd', "total-batch-tokens", &R::total_batch_tokens,
         "tokens per optimizer step (gradient accumulation); -1 = B*T*world size"},
        {"Batch and schedule", 0, "batch-ramp", &R::batch_ramp,
         "batch-size ramp START:N1,N2,...: START tokens per step, doubled at N1, N2... tokens seen, at most -d "
         "(e.g. 65536:1e8,2e8); empty = off",
         "SPEC"},
        {"Batch and schedule", 'x', "max-steps", &R::max_steps, "optimizer steps; -1 = one epoch"},
        {"Batch and schedule", 'l', "learning-rate", &R::learning_rate, "peak learning rate"},
        {"Batch and schedule", 'u', "warmup-steps", &R::warmup_steps, "linear warmup steps"},
        {"Batch and schedule", 'q', "final-lr-fraction", &R::final_lr_fraction,
         "final learning rate as a fraction of the peak"},
        {"Batch and schedule", 'k', "lr-schedule", &R::lr_schedule, "learning-rate decay", nullptr,
         {"cosine", "linear", "constant", "wsd"}},
        {"Batch and schedule", 0, "wsd-decay-fraction", &R::wsd_decay_fraction,
         "wsd: share of the steps spent in the final linear decay"},
        {"AdamW optimizer", 'c', "weight-decay", &R::weight_decay, "weight decay"},
        {"AdamW optimizer", 0, "beta1", &R::beta1, "first-moment decay"},
        {"AdamW optimizer", 0, "beta2", &R::beta2, "second-moment decay"},
        {"AdamW optimizer", 0, "eps", &R::eps, "denominator epsilon"},
        {"AdamW optimizer", 0, "grad-clip", &R::grad_clip, "clip the global gradient norm to this; 0 = off"},
        {"AdamW optimizer", 0, "seed", &R::seed, "random seed (initialization, sampling)"},
        {"Divergence", 0, "skip-loss-z", &R::skip_loss_z,
         "skip the update of a step whose loss has a z-score above this over the last 128 steps; 0 = off"},
        {"Divergence", 0, "skip-norm-z", &R::skip_norm_z,
         "skip the update of a step whose gradient norm has a z-score above this over the last 128 steps; 0 = off"},
        {"Divergence", 0, "max-skipped-steps", &R::max_skipped_steps,
         "stop with an error after this many skipped steps in a row (non-finite loss or norm, outliers); 0 = never"},
        {"Divergence", 0, "on-divergence", &R::on_divergence,
         "when the run diverges (--max-skipped-steps): stop, or rollback: reload the newest checkpoint before the "
         "skips began, skip the data the diverged steps read, and go on",
         nullptr, {"stop", "rollback"}},
        {"Divergence", 0, "max-rollbacks", &R::max_rollbacks, "rollbacks a run may take before it stops; 0 = none"},
        {"Parallelism and memory", 'z', "zero-stage", &R::zero_stage, "ZeRO stage: 0, 1 or 2"},
        {"Parallelism and memory", 0, "tp", &R::tp,
         "tensor parallelism: each block's weights and heads split over this many consecutive ranks (world = data x "
         "tp; ZeRO shards over the data ranks); must divide the heads", "N"},
        {"Parallelism and memory", 0, "sequence-parallel", &R::sequence_parallel,
         "with --tp: the LayerNorm and residual regions hold 1/tp of the tokens per rank (all-gather before "
         "the column-parallel matmuls, reduce-scatter after the row-parallel ones); auto = on when --tp > 1",
         nullptr, {"auto", "on", "off"}},
        {"Parallelism and memory", 0, "pp", &R::pp,
         "pipeline stages: the layers split over this many ranks in contiguous ranges, the embedding on the first, "
         "the classifier on the last (world = data x pipeline); the micro-batches are the step's accumulation count", "N"},
        {"Parallelism and memory", 0, "pp-schedule", &R::pp_schedule,
         "pipeline schedule: afab (all forwards, then all backwards), 1f1b, interleaved (--pp-virtual chunks per rank)",
         nullptr, {"afab", "1f1b", "interleaved"}},
        {"Parallelism and memory", 0, "pp-virtual", &R::pp_virtual, "model chunks per rank (interleaved schedule)", "V"},
        {"Parallelism and memory", 0, "cp", &R::cp,
         "context parallelism: each sequence split over this many consecutive ranks, 2 cp chunks dealt zigzag "
         "(rank r: chunks r and 2cp-1-r), keys and values passed around a ring (world = data x cp; ZeRO shards over "
         "both); -t must be a multiple of 2 cp", "N"},
        {"Parallelism and memory", 0, "pp-print-schedule", &R::pp_print_schedule,
         "print the pipeline schedule (one row per rank, F/B and the micro-batch per time slot, the bubble measured "
         "beside the formula's, the activations each rank holds) and exit; the micro-batches are the step's "
         "accumulation count per data rank"},
        {"Parallelism and memory", 'r', "recompute", &R::recompute, "activation recomputation", nullptr,
         {"none", "selective", "full"}},
        {"Parallelism and memory", 0, "world-size", &R::world_size,
         "ranks; 0 = those launched (another value plans for that size with --dry-run)"},
        {"Parallelism and memory", 0, "max-memory", &R::max_memory, "GPU memory budget in GiB; 0 = the device's"},
        {"Parallelism and memory", 0, "attention", &R::attention, "attention kernels: tc (tensor cores, BF16 build), simt (CUDA cores), or auto: tc on a GPU in the BF16 build, "
         "simt otherwise (the FP32 build; the CPU emulator, where simt is ~4x faster)", nullptr, {"auto", "tc", "simt"}},
        {"Parallelism and memory", 0, "attention-backward", &R::attention_backward,
         "the tensor-core attention backward: split (a dK/dV and a dQ kernel, 7 products per tile pair) or fused (one "
         "kernel, 5 products, dQ summed in float scratch of B x T x C floats; needs --attention tc, not --cp). Both "
         "deterministic; dK and dV agree exactly, dQ to rounding", nullptr, {"split", "fused"}},
        {"Parallelism and memory", 0, "matmul-autotune", &R::matmul_autotune,
         "at each GEMM shape's first use, time cuBLASLt's best candidates (up to 8) and keep the fastest; off: the "
         "heuristic's first. Picks by timing can differ between runs and ranks, and so can the results' last bits; "
         "--matmul-algos keeps them"},
        {"Parallelism and memory", 0, "matmul-algos", &R::matmul_algos,
         "with --matmul-autotune: a JSON file of the algorithm picked per GEMM shape, read at the start (its shapes "
         "are not timed again: the same algorithms, the same bits) and written when new shapes were timed; per "
         "rank '<name>.rank<r>.json' with several ranks; a file written with another cuBLASLt, device or precision "
         "is timed over. Empty: matmul_algos.json in -o (so -y resumes with the same algorithms), none without -o",
         "FILE"},
        {"Parallelism and memory", 0, "bias-grad", &R::bias_grad,
         "the bias gradients the matmuls sum: auto (in the weight gradient's GEMM, cuBLASLt's BGRADB epilogue, "
         "where it takes FP32 sums: the FP32 build; else our column-sum kernels), epilogue (also BGRADB's sums in "
         "BF16 where FP32 ones are refused, one rounding more; not yet timed on a GPU), kernels (always ours). "
         "ln2's backward sums the projections' biases either way", nullptr, {"auto", "epilogue", "kernels"}},
        {"Parallelism and memory", 0, "cuda-graphs", &R::cuda_graphs,
         "after the first step, capture each micro-step's forward, backward and gradient reduction into a CUDA "
         "graph once and replay it (one launch instead of one per kernel); off: launch every kernel",
         nullptr, {"on", "off"}},
        {"Checkpoint", 'n', "checkpoint-every", &R::checkpoint_every, "write a checkpoint every N steps; 0 = never"},
        {"Checkpoint", 0, "keep-last", &R::keep_last, "checkpoints to keep; 0 = all"},
        {"Checkpoint", 'y', "resume", &R::resume, "resume from the latest checkpoint in -o"},
        {"Checkpoint", 0, "overwrite", &R::overwrite,
         "start a fresh run in an -o that holds checkpoints, deleting them first"},
        {"Checkpoint", 0, "resume-override", &R::resume_override,
         "with -y: run-identity settings the resume may change (comma-separated: model, seq-len, seed, train-data, "
         "batch-ramp, tokens-per-step, doc-mask, doc-positions)",
         "KEYS"},
        {"Evaluation and sampling", 'v', "val-every", &R::val_every, "validation loss every N steps; 0 = never"},
        {"Evaluation and sampling", 'm', "val-batches", &R::val_batches,
         "batches per validation on each data rank; 0 = the whole validation split (each rank's share of one pass "
         "over it). More than the split holds is an error"},
        {"Evaluation and sampling", 0, "final-val-batches", &R::final_val_batches,
         "batches of the validation after the run's last step, as -m (0 = the whole split); -1 = -m's"},
        {"Evaluation and sampling", 's', "sample-every", &R::sample_every, "generate a sample every N steps; 0 = never"},
        {"Evaluation and sampling", 'g', "gen-tokens", &R::gen_tokens,
         "tokens per sample, at most -t - 1 (a sample fits one context window; more is clipped with a note)"},
        {"Evaluation and sampling", 0, "temperature", &R::temperature, "sampling temperature; 0 = greedy (the most likely token)"},
        {"Evaluation and sampling", 0, "top-k", &R::top_k, "sample from the k most likely tokens; 0 = all"},
        {"Evaluation and sampling", 0, "top-p", &R::top_p,
         "sample from the fewest most likely tokens whose probabilities add up to p (nucleus); 1 = all"},
        {"Evaluation and sampling", 'h', "hellaswag", &R::hellaswag, "HellaSwag eval file; empty = off", "PATH"},
        {"Generation", 0, "generate", &R::generate,
         "generate text from -e (a model file, the newest complete checkpoint of a run directory, or a preset) "
         "instead of training; needs no training data. Prints the text (token ids without a tokenizer.bin beside "
         "-i's shards), then tokens/s"},
        {"Generation", 0, "prompt", &R::prompt,
         "text to continue, after an end-of-text token (GPT-2 BPE through data/encode.py: needs python3 and tiktoken); "
         "empty = start from an end-of-text token", "TEXT"},
        {"Generation", 0, "prompt-ids", &R::prompt_ids, "token ids to continue, used as they are", "ID,ID,..."},
        {"Generation", 0, "max-tokens", &R::max_tokens,
         "tokens to generate; fewer at an end-of-text token, or where the model's context ends (with a note)"},
        {"Generation", 0, "kv-cache", &R::kv_cache,
         "on: cache keys and values, one forward pass of one token per new token; off: a forward pass over "
         "every token so far per new token (the same tokens; for checking and comparing)",
         nullptr, {"on", "off"}},
        {"Run control", 0, "dry-run", &R::dry_run, "print the resolved config and memory plan, then exit"},
        {"Run control", 0, "json", &R::json, "with --dry-run: print it as JSON"},
        {"Run control", 0, "profile-step", &R::profile_step, "time one step in detail, then exit"},
        {"Run control", 0, "log-every", &R::log_every, "print a step line every N steps"},
        {"Run control", 0, "collective-timeout", &R::collective_timeout,
         "seconds without progress (a stuck rank, a hung collective) before the watchdog ends the job; 0 = off"},
    };
    return table;
}

inline const Option* find_option(const std::string& long_name) {
    for (const Option& o : options())
        if (long_name == o.long_name) return &o;
    return nullptr;
}

// "-b/--batch-size", or "--beta1" for long-only flags.
inline std::string flag_name(const Option& o) {
    std::string name = std::string("--") + o.long_name;
    return o.short_name ? std::string("-") + o.short_name + "/" + name : name;
}

// The flag of a setting, for messages; a name missing from the table is a bug, caught by the tests.
std::string flag(const char* long_name) {
    const Option* o = find_option(long_name);
    if (!o) throw std::logic_error(std::string("config: no option named '") + long_name + "'");
    return flag_name(*o);
}

template <typename T> constexpr const char* type_word() {
    if constexpr (std::is_same_v<T, bool>) return "a boolean";
    else if constexpr (std::is_same_v<T, std::string>) return "a string";
    else if constexpr (std::is_same_v<T, double>) return "a number";
    else return "an integer";
}

// Command-line text -> setting. Integers must be whole and in range; numbers finite.
template <typename T> T from_text(const Option& o, const std::string& text) {
    const auto bad = [&]() {
        return ConfigError(flag_name(o) + " expects " + type_word<T>() + ", got '" + text + "'");
    };
    if constexpr (std::is_same_v<T, std::string>) {
        return text;
    } else if constexpr (std::is_same_v<T, double>) {
        char* end = nullptr;
        const double value = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) throw bad();
        return value;
    } else {
        T value{};
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error != std::errc() || end != text.data() + text.size()) throw bad();
        return value;
    }
}

// JSON value -> setting, or an error naming the file, the key and the expected type.
template <typename T> T from_json(const Option& o, const nlohmann::json& value, const std::string& file) {
    const auto bad = [&](const std::string& why) {
        return ConfigError("--config '" + file + "': key '" + o.long_name + "' " + why);
    };
    const std::string expected = std::string("expects ") + type_word<T>() + ", got " + value.type_name();
    if constexpr (std::is_same_v<T, bool>) {
        if (!value.is_boolean()) throw bad(expected);
        return value.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
        if (!value.is_string()) throw bad(expected);
        return value.get<std::string>();
    } else if constexpr (std::is_same_v<T, double>) {
        if (!value.is_number()) throw bad(expected);
        return value.get<double>();
    } else {
        if (!value.is_number_integer()) throw bad(expected + " " + value.dump());
        const bool fits = value.is_number_unsigned()
                              ? value.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                              : value.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                    value.get<int64_t>() <= std::numeric_limits<T>::max();
        if (!fits) throw bad("value " + value.dump() + " is out of range");
        return T(value.get<int64_t>());
    }
}

inline void load_json_file(RunConfig& c, const std::string& file) {
    std::ifstream in(file);
    if (!in) throw ConfigError("--config '" + file + "': cannot open the file");
    nlohmann::json root;
    try {
        root = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number past double's range
        throw ConfigError("--config '" + file + "': not valid JSON: " + e.what());
    }
    if (!root.is_object()) throw ConfigError("--config '" + file + "': expects a JSON object keyed by long flag names");
    for (const auto& item : root.items()) {  // not a structured binding: lambdas capture those only from clang 16
        const std::string key = item.key();
        const nlohmann::json& value = item.value();
        const Option* o = find_option(key);
        if (!o) throw ConfigError("--config '" + file + "': unknown key '" + key + "' (keys are long flag names)");
        std::visit([&](auto member) {
            using T = std::remove_reference_t<decltype(c.*member)>;
            c.*member = from_json<T>(*o, value, file);
        }, o->field);
        c.given.push_back(key);
    }
}

// Value and cross-flag checks; those that need the world size are in total_batch_tokens_for().
inline void validate(const RunConfig& c) {
    const auto value = [](auto v) {
        if constexpr (std::is_same_v<decltype(v), std::string>) return "'" + v + "'";
        else {
            std::ostringstream s;
            s << v;
            return s.str();
        }
    };
    const auto check = [&](bool ok, const char* name, auto v, const char* rule) {
        require(ok, flag(name) + " " + rule + ", got " + value(v));
    };
    for (const Option& o : options()) {  // enumerated settings
        if (o.choices.empty()) continue;
        const std::string& v = c.*std::get<std::string RunConfig::*>(o.field);
        std::string list;
        bool found = false;
        for (const std::string& choice : o.choices) {
            found |= v == choice;
            list += (list.empty() ? "" : "|") + choice;
        }
        require(found, flag_name(o) + " must be one of " + list + ", got '" + v + "'");
    }
    check(!c.train_data.empty(), "train-data", c.train_data, "must not be empty");
    check(!c.model.empty(), "model", c.model, "must not be empty");
    check(c.layers >= 0, "layers", c.layers, "must be >= 0");
    check(c.heads >= 0, "heads", c.heads, "must be >= 0");
    check(c.channels >= 0, "channels", c.channels, "must be >= 0");
    check(c.batch_size > 0, "batch-size", c.batch_size, "must be > 0");
    check(c.seq_len > 0, "seq-len", c.seq_len, "must be > 0");
    check(c.total_batch_tokens == -1 || c.total_batch_tokens > 0, "total-batch-tokens", c.total_batch_tokens,
          "must be -1 or > 0");
    check(c.max_steps == -1 || c.max_steps > 0, "max-steps", c.max_steps, "must be -1 or > 0");
    check(c.learning_rate >= 0, "learning-rate", c.learning_rate, "must be >= 0");
    check(c.warmup_steps >= 0, "warmup-steps", c.warmup_steps, "must be >= 0");
    check(c.final_lr_fraction >= 0 && c.final_lr_fraction <= 1, "final-lr-fraction", c.final_lr_fraction,
          "must be in [0, 1]");
    check(c.wsd_decay_fraction >= 0 && c.wsd_decay_fraction <= 1, "wsd-decay-fraction", c.wsd_decay_fraction,
          "must be in [0, 1]");
    check(c.weight_decay >= 0, "weight-decay", c.weight_decay, "must be >= 0");
    check(c.beta1 >= 0 && c.beta1 < 1, "beta1", c.beta1, "must be in [0, 1)");
    check(c.beta2 >= 0 && c.beta2 < 1, "beta2", c.beta2, "must be in [0, 1)");
    check(c.eps > 0, "eps", c.eps, "must be > 0");
    check(c.grad_clip >= 0, "grad-clip", c.grad_clip, "must be >= 0");
    check(c.seed >= 0, "seed", c.seed, "must be >= 0");
    check(c.skip_loss_z >= 0, "skip-loss-z", c.skip_loss_z, "must be >= 0");
    check(c.skip_norm_z >= 0, "skip-norm-z", c.skip_norm_z, "must be >= 0");
    check(c.max_skipped_steps >= 0, "max-skipped-steps", c.max_skipped_steps, "must be >= 0");
    check(c.max_rollbacks >= 0, "max-rollbacks", c.max_rollbacks, "must be >= 0");
    check(c.zero_stage >= 0 && c.zero_stage <= 2, "zero-stage", c.zero_stage, "must be 0, 1 or 2");
    check(c.world_size >= 0, "world-size", c.world_size, "must be >= 0");
    check(c.tp >= 1, "tp", c.tp, "must be >= 1");
    check(c.pp >= 1, "pp", c.pp, "must be >= 1");
    check(c.pp_virtual >= 1, "pp-virtual", c.pp_virtual, "must be >= 1");
    check(c.cp >= 1, "cp", c.cp, "must be >= 1");
    check(c.max_memory >= 0, "max-memory", c.max_memory, "must be >= 0");
    check(c.checkpoint_every >= 0, "checkpoint-every", c.checkpoint_every, "must be >= 0");
    check(c.keep_last >= 0, "keep-last", c.keep_last, "must be >= 0");
    check(c.val_every >= 0, "val-every", c.val_every, "must be >= 0");
    check(c.val_batches >= 0, "val-batches", c.val_batches, "must be >= 0");
    check(c.final_val_batches >= -1, "final-val-batches", c.final_val_batches, "must be >= -1");
    check(c.sample_every >= 0, "sample-every", c.sample_every, "must be >= 0");
    check(c.gen_tokens > 0, "gen-tokens", c.gen_tokens, "must be > 0");
    check(c.temperature >= 0, "temperature", c.temperature, "must be >= 0");
    check(c.top_p > 0 && c.top_p <= 1, "top-p", c.top_p, "must be in (0, 1]");
    check(c.max_tokens > 0, "max-tokens", c.max_tokens, "must be > 0");
    check(c.top_k >= 0, "top-k", c.top_k, "must be >= 0");
    check(c.log_every > 0, "log-every", c.log_every, "must be > 0");
    check(c.collective_timeout >= 0, "collective-timeout", c.collective_timeout, "must be >= 0");

    // Contradictions: name every flag involved.
    const int64_t bt = int64_t(c.batch_size) * c.seq_len;
    require(c.total_batch_tokens == -1 || c.total_batch_tokens % bt == 0,
            flag("total-batch-tokens") + " " + std::to_string(c.total_batch_tokens) + " must be a multiple of " +
                flag("batch-size") + " * " + flag("seq-len") + " = " + std::to_string(bt));
    require(!c.json || c.dry_run, flag("json") + " needs " + flag("dry-run"));
    require(c.pp == 1 || !c.generate, flag("generate") + " runs one sequence on one rank: it cannot go with " + flag("pp") +
                                          " " + std::to_string(c.pp));
    require(c.tp == 1 || !c.generate, flag("generate") + " runs one sequence on one rank: it cannot go with " + flag("tp") + " " +
                                          std::to_string(c.tp));
    require(c.cp == 1 || !c.generate, flag("generate") + " runs one sequence on one rank: it cannot go with " + flag("cp") +
                                          " " + std::to_string(c.cp));
    require(c.sequence_parallel != "on" || c.tp > 1,
            flag("sequence-parallel") + " on splits the tokens over the tensor ranks: it needs " + flag("tp") + " > 1");
    require(c.pp_virtual == 1 || c.pp_schedule == "interleaved",
            flag("pp-virtual") + " " + std::to_string(c.pp_virtual) + " needs " + flag("pp-schedule") + " interleaved");
    require(!c.resume || !c.output_dir.empty(), flag("resume") + " needs " + flag("output-dir") + " (where checkpoints are)");
    require(!c.overwrite || !c.resume, flag("overwrite") + " starts a fresh run: it cannot go with " + flag("resume"));
    require(!c.overwrite || !c.output_dir.empty(), flag("overwrite") + " needs " + flag("output-dir"));
    const RunConfig defaults;  // generation's settings changed without --generate: a mistake, not a no-op
    const std::pair<const char*, bool> generation_settings[] = {{"prompt", !c.prompt.empty()},
                                                                {"prompt-ids", !c.prompt_ids.empty()},
                                                                {"max-tokens", c.max_tokens != defaults.max_tokens},
                                                                {"kv-cache", c.kv_cache != defaults.kv_cache}};
    for (const auto& [name, changed] : generation_settings)
        require(c.generate || !changed, flag(name) + " needs " + flag("generate"));
    require(!c.generate || (!c.doc_mask && !c.doc_positions),
            flag("generate") + " continues one document (the prompt follows one end-of-text token): " + flag("doc-mask") +
                " and " + flag("doc-positions") + " do not apply");
    require(c.prompt.empty() || c.prompt_ids.empty(), flag("prompt") + " and " + flag("prompt-ids") + " cannot go together");
    require(!c.generate || (!c.resume && !c.dry_run && !c.profile_step && c.output_dir.empty()),
            flag("generate") + " trains nothing: it cannot go with " + flag("resume") + ", " + flag("dry-run") + ", " +
                flag("profile-step") + " or " + flag("output-dir"));
    require(c.resume_override.empty() || c.resume, flag("resume-override") + " needs " + flag("resume"));
    for (const std::string& key : split_list(c.resume_override)) {
        bool known = false;
        std::string list;
        for (const char* k : kRunIdentityKeys) {
            known |= key == k;
            list += (list.empty() ? "" : ", ") + std::string(k);
        }
        require(known, flag("resume-override") + ": '" + key + "' is not a run-identity setting (" + list + ")");
    }
    require(c.matmul_algos.empty() || c.matmul_autotune,
            flag("matmul-algos") + " needs " + flag("matmul-autotune") + " (the file holds autotune's picks)");
    require(c.checkpoint_every == 0 || !c.output_dir.empty(),
            flag("checkpoint-every") + " needs " + flag("output-dir") + " (where checkpoints go)");
    require(c.keep_last == 0 || c.checkpoint_every > 0, flag("keep-last") + " needs " + flag("checkpoint-every") + " > 0");
    require(c.on_divergence != "rollback" || (c.checkpoint_every > 0 && c.max_skipped_steps > 0),
            flag("on-divergence") + " rollback needs checkpoints to roll back to (" + flag("checkpoint-every") +
                " > 0) and a divergence to act on (" + flag("max-skipped-steps") + " > 0)");
    require(c.lr_schedule != "constant" || c.final_lr_fraction == 1.0,
            flag("final-lr-fraction") + " " + value(c.final_lr_fraction) + " has no effect with " + flag("lr-schedule") +
                " constant");
    if (!c.batch_ramp.empty()) {
        BatchRamp ramp;
        try {
            ramp = parse_batch_ramp(c.batch_ramp);
        } catch (const std::invalid_argument& e) {
            throw ConfigError(flag("batch-ramp") + ": " + e.what());
        }
        require(c.total_batch_tokens > 0, flag("batch-ramp") + " needs " + flag("total-batch-tokens") + " (its cap)");
        require(ramp.start_tokens <= c.total_batch_tokens && ramp.start_tokens % bt == 0,
                flag("batch-ramp") + " start " + std::to_string(ramp.start_tokens) + " must be a multiple of " +
                    flag("batch-size") + " * " + flag("seq-len") + " = " + std::to_string(bt) + " and <= " +
                    flag("total-batch-tokens") + " " + std::to_string(c.total_batch_tokens));
    }
}

// cxxopts reports unknown flags with typographic quotes; keep messages plain ASCII.
inline std::string ascii_quotes(std::string s) {
    for (const char* quote : {"\u2018", "\u2019"})
        for (size_t at; (at = s.find(quote)) != std::string::npos;) s.replace(at, std::string(quote).size(), "'");
    return s;
}

inline nlohmann::json setting_json(const RunConfig& c, const Option& o) {
    return std::visit([&](auto member) { return nlohmann::json(c.*member); }, o.field);
}

inline cxxopts::Options make_cxxopts() {
    cxxopts::Options cli("train_gpt", "GPT-2 pretraining (one CUDA source: nvcc for GPUs, g++ + emu/ for the CPU)");
    cli.custom_help("[flags]");
    cli.add_options()("config", "load settings from a JSON object keyed by long flag names; flags override it",
                      cxxopts::value<std::string>(), "FILE.json")("help", "print this help and exit");
    const RunConfig defaults;
    for (const Option& o : options()) {
        const std::string spec = o.short_name ? std::string(1, o.short_name) + "," + o.long_name : o.long_name;
        std::string help = o.help;
        std::string arg = o.arg ? o.arg : "";
        if (!o.choices.empty()) {
            for (const std::string& choice : o.choices) arg += (arg.empty() ? "" : "|") + choice;
        }
        const nlohmann::json d = setting_json(defaults, o);
        if (d.is_boolean()) {
            cli.add_options(o.group)(spec, help, cxxopts::value<bool>());
        } else {
            if (arg.empty()) arg = d.is_number_float() ? "X" : "N";
            cli.add_options(o.group)(spec, help,
                                     cxxopts::value<std::string>()->default_value(d.is_string() ? d.get<std::string>()
                                                                                                : d.dump()),
                                     arg);
        }
    }
    return cli;
}

inline std::vector<std::string> groups() {
    std::vector<std::string> names = {""};
    for (const Option& o : options())
        if (names.back() != o.group) names.push_back(o.group);
    return names;
}

}  // namespace config_detail

std::string help_text() { return config_detail::make_cxxopts().help(config_detail::groups()); }

nlohmann::json to_json(const RunConfig& c) {
    nlohmann::json j = nlohmann::json::object();
    for (const config_detail::Option& o : config_detail::options()) j[o.long_name] = config_detail::setting_json(c, o);
    return j;
}

std::string to_json_text(const RunConfig& c) { return to_json(c).dump(2); }

RunConfig config_from_file(const std::string& path) {
    RunConfig c;
    config_detail::load_json_file(c, path);
    config_detail::validate(c);
    return c;
}

RunConfig parse_config(int argc, char** argv) {
    using namespace config_detail;
    cxxopts::Options cli = make_cxxopts();
    cxxopts::ParseResult given;
    try {
        given = cli.parse(argc, argv);
    } catch (const cxxopts::exceptions::exception& e) {
        std::string message = ascii_quotes(e.what());
        if (message == "Option 'h' is missing an argument") message += " (-h is --hellaswag PATH, as in llm.c; help is --help)";
        throw ConfigError(message);
    }
    RunConfig c;
    if (given.count("help")) {
        c.help = true;
        return c;
    }
    if (!given.unmatched().empty())
        throw ConfigError("unexpected argument '" + given.unmatched().front() + "' (every setting is a flag; see --help)");
    if (given.count("config")) load_json_file(c, given["config"].as<std::string>());
    for (const Option& o : options()) {
        if (!given.count(o.long_name)) continue;
        c.given.push_back(o.long_name);
        std::visit([&](auto member) {
            using T = std::remove_reference_t<decltype(c.*member)>;
            if constexpr (std::is_same_v<T, bool>) c.*member = given[o.long_name].as<bool>();
            else c.*member = from_text<T>(o, given[o.long_name].as<std::string>());
        }, o.field);
    }
    validate(c);
    return c;
}

