// Evaluation during training: the validation loss, HellaSwag accuracy over every rank, and sampling,
// each when due. The model comes in as callables, so these know nothing of it (train_gpt.cu binds them).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include <filesystem>
#include <optional>
#include <string>

#include "host/config.h"
#include "host/dataloader.h"
#include "host/generation.h"
#include "host/hellaswag.h"
#include "host/metrics.h"
#include "host/rng.h"
#include "host/tokenizer.h"
#include "parallel/process_groups.h"

// The validation loss and what it averaged over.
struct ValidationLoss {
    double loss = 0;        // the mean over `tokens`
    long long tokens = 0;  // valid targets, every rank's
};

// Mean loss over `batches` validation batches of B x T on every rank: the sum of all token losses
// over the count of all valid targets. forward(inputs, targets) returns {loss sum, valid targets}.
inline ValidationLoss mean_validation_loss(DataLoader& val, int batches, int B, int T, const Distributed& d,
                                           const std::function<std::pair<double, long long>(const int*, const int*)>& forward) {
    std::vector<int> inputs(size_t(B) * T), targets(size_t(B) * T);
    val.reset();
    double sum = 0;
    long long valid = 0;
    for (int i = 0; i < batches; ++i) {
        val.next_batch(inputs.data(), targets.data());
        const auto [batch_sum, batch_valid] = forward(inputs.data(), targets.data());
        sum += batch_sum;
        valid += batch_valid;
    }
    const long long total = all_ranks_sum(d, valid);
    const double all_sum = all_ranks_sum(d, sum);
    return {total > 0 ? all_sum / double(total) : 0.0, total};
}

// HellaSwag accuracy over every rank: each group of `sequence_ranks` consecutive ranks (one rank, or a
// context group) scores its share of the examples (host/hellaswag.h), counted once.
inline HellaSwagResult hellaswag_all_ranks(const HellaSwagSet& set, int B, int T, const Distributed& d,
                                           const HellaSwagForward& forward_losses, int sequence_ranks = 1) {
    HellaSwagResult r = hellaswag_evaluate(set, B, T, d.rank / sequence_ranks, d.world_size / sequence_ranks, forward_losses);
    const bool counts = d.rank % sequence_ranks == 0;
    r.correct = all_ranks_sum(d, counts ? r.correct : 0LL);
    r.total = all_ranks_sum(d, counts ? r.total : 0LL);
    r.skipped = all_ranks_sum(d, counts ? r.skipped : 0LL);
    return r;
}

// The tokenizer.bin beside the training shards (data/prepare.py writes it there), if there is one.
inline std::optional<Tokenizer> tokenizer_beside(const std::string& train_data) {
    const std::string path = (std::filesystem::path(train_data).parent_path() / "tokenizer.bin").string();
    if (!std::filesystem::exists(path)) return std::nullopt;
    return Tokenizer(path);
}

// The sampling settings of the flags.
inline SamplingSettings sampling_settings_of(const RunConfig& rc) {
    return {float(rc.temperature), rc.top_k, float(rc.top_p)};
}

// What a run evaluates with: the validation loader (--val-every > 0), the HellaSwag set, the tokenizer
// beside the training data (to decode samples; token ids are printed without one), the sampling RNG.
struct Evaluation {
    std::optional<DataLoader> val;
    int val_batches = 0;  // batches per validation on each rank (-m, or the whole split's share for -m 0)
    int final_val_batches = 0;  // the same for the validation after the last step (--final-val-batches)
    std::optional<HellaSwagSet> hellaswag;
    std::optional<Tokenizer> tokenizer;
    Rng sample_rng{0};
};

// Batches per validation on each rank for a count asked by `flag` (-m, or --final-val-batches): 0 is
// each rank's share of one pass over the split. More batches than the split holds would read some of
// them twice (the loader wraps to the split's start) and weigh them double: that is an error naming
// both counts, unless the count is a default that may give way to the whole split with a note
// (`note`: this rank prints it).
inline int validation_batches(const RunConfig& rc, const DataLoader& val, int batch_ranks, int requested,
                              const std::string& flag, bool may_give_way, bool note) {
    const size_t whole = val.samples_per_epoch_per_rank() / size_t(rc.batch_size);  // >= 1: the loader checks
    if (requested == 0) return int(whole);
    if (size_t(requested) <= whole) return requested;
    const std::string split = "the validation split -j/--val-data '" + rc.val_data + "' holds " + std::to_string(whole) +
                              " batches of " + std::to_string(rc.batch_size) + " x " + std::to_string(rc.seq_len) +
                              " tokens per rank over " + std::to_string(batch_ranks) + (batch_ranks == 1 ? " rank" : " ranks");
    if (!may_give_way)
        throw ConfigError(flag + " " + std::to_string(requested) + " is more than " + split + "; " +
                          flag.substr(0, flag.find('/')) + " 0 takes all of them");
    if (note) std::printf("note: validation reads %zu batches, not %s %d: %s\n", whole, flag.c_str(), requested, split.c_str());
    return int(whole);
}

// Opens the run's evaluation data; every validation token is checked against the vocabulary first.
// Three defaults give way with a one-line note (rank 0) instead of an error: validation when -v was not
// given and no shard matches -j, the sample length when -g exceeds -t - 1, and -m when the split holds
// fewer batches (validation_batches). Validation batches are
// split over `batch_ranks` readers (the ranks of `d` but with --cp, whose context groups share theirs).
// Under --cp each context group runs HellaSwag's rows and the samples' windows together, padded to -t
// (EvaluatedModel).
inline Evaluation evaluation_of(const RunConfig& rc, const Distributed& d, int vocab_size, int batch_rank, int batch_ranks) {
    Evaluation e;
    const bool no_val_shards = rc.val_every > 0 && !rc.was_given("val-every") && !any_file_matches(rc.val_data);
    if (no_val_shards && d.rank == 0)
        std::printf("note: no validation shard matches -j/--val-data '%s': validation is off (an explicit -v makes "
                    "this an error)\n", rc.val_data.c_str());
    if (rc.sample_every > 0 && rc.gen_tokens > rc.seq_len - 1 && d.rank == 0)
        std::printf("note: samples are %d tokens, not -g/--gen-tokens %d: a sample fits one -t/--seq-len %d window\n",
                    rc.seq_len - 1, rc.gen_tokens, rc.seq_len);
    if (rc.val_every > 0 && !no_val_shards) {
        e.val.emplace(rc.val_data, rc.batch_size, rc.seq_len, batch_rank, batch_ranks, uint64_t(rc.seed), false);
        e.val->check_tokens(vocab_size);
        e.val_batches = validation_batches(rc, *e.val, batch_ranks, rc.val_batches, "-m/--val-batches",
                                           !rc.was_given("val-batches"), d.rank == 0);
        e.final_val_batches = rc.final_val_batches == -1 ? e.val_batches
                                                         : validation_batches(rc, *e.val, batch_ranks, rc.final_val_batches,
                                                                              "--final-val-batches", false, d.rank == 0);
    }
    if (!rc.hellaswag.empty()) e.hellaswag = read_hellaswag(rc.hellaswag, vocab_size);
    e.tokenizer = tokenizer_beside(rc.train_data);
    e.sample_rng = sampling_rng(rc.seed);
    return e;
}

// The model, as evaluation calls it: forward passes over host token arrays.
struct EvaluatedModel {
    // {sum of the per-token losses, valid targets} of one forward pass over a B x T batch.
    std::function<std::pair<double, long long>(const int* inputs, const int* targets)> batch_loss;
    HellaSwagForward token_losses;  // per-token losses of b x t tokens (0 where a target is -1)
    // The logits over the real vocabulary at the last of n tokens (n <= max_tokens).
    std::function<std::vector<float>(const int* tokens, int n)> next_token_logits;
    int max_tokens = 0;
    // Ranks that run each sequence together (a context group, --cp): consecutive ranks of the evaluation's
    // group call token_losses and next_token_logits with the same rows. A sample is drawn by the first
    // `sequence_ranks`, each token the first rank's (shared_token; none: no exchange).
    int sequence_ranks = 1;
    std::function<int(int token)> shared_token;
};

// `count` tokens generated after an end-of-text token `eot`, each drawn from the logits at the last
// position of a window of at most max_tokens (sample_from_logits).
inline std::vector<int> sample_tokens(const EvaluatedModel& model, int eot, int count, const SamplingSettings& settings,
                                      Rng& rng) {
    std::vector<int> tokens = {eot};
    for (int i = 0; i < count; ++i) {
        const int window = std::min<int>(int(tokens.size()), model.max_tokens);
        const std::vector<float> logits = model.next_token_logits(tokens.data() + tokens.size() - window, window);
        const int token = sample_from_logits(logits, settings, rng);
        tokens.push_back(model.shared_token ? model.shared_token(token) : token);
    }
    return std::vector<int>(tokens.begin() + 1, tokens.end());
}

// After step `done` (`last`: the run's last step): the validation loss and HellaSwag every --val-every
// steps and after the last step (every rank takes part), a sample every --sample-every steps and
// after the last step (rank 0, with its context group under --cp), each logged; after the last, the
// command that plots the log.
inline void evaluate_when_due(const RunConfig& rc, Evaluation& e, const EvaluatedModel& model, RunLog& log,
                              const Distributed& d, int64_t done, bool last) {
    const int B = rc.batch_size, T = rc.seq_len;
    if (e.val && (done % rc.val_every == 0 || last)) {  // e.val is set only when val_every > 0
        const ValidationLoss v = mean_validation_loss(*e.val, last ? e.final_val_batches : e.val_batches, B, T, d, model.batch_loss);
        log.val(done, v.loss, v.tokens);
    }
    if (e.hellaswag && ((rc.val_every > 0 && done % rc.val_every == 0) || last)) {
        const HellaSwagResult hs = hellaswag_all_ranks(*e.hellaswag, B, T, d, model.token_losses, model.sequence_ranks);
        log.hellaswag(done, hs.accuracy(), hs.correct, hs.total, hs.skipped);
    }
    if (rc.sample_every > 0 && (done % rc.sample_every == 0 || last) && d.rank < model.sequence_ranks) {
        const std::vector<int> tokens = sample_tokens(model, e.tokenizer ? e.tokenizer->eot_token() : 50256,
                                                      std::min(rc.gen_tokens, rc.seq_len - 1), sampling_settings_of(rc),
                                                      e.sample_rng);
        std::string text;
        if (e.tokenizer) text = e.tokenizer->decode(tokens);
        else for (int t : tokens) text += std::to_string(t) + " ";
        log.sample(done, text);
    }
    if (last) log.finished();
}
