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
#include "host/hellaswag.h"
#include "host/metrics.h"
#include "host/rng.h"
#include "host/tokenizer.h"
#include "parallel/process_groups.h"

// Mean loss over `batches` validation batches of B x T on every rank: the sum of all token losses
// over the count of all valid targets. forward(inputs, targets) returns {loss sum, valid targets}.
inline double mean_validation_loss(DataLoader& val, int batches, int B, int T, const Distributed& d,
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
    return total > 0 ? all_ranks_sum(d, sum) / double(total) : 0.0;
}

// HellaSwag accuracy over every rank: each scores its share of the examples (host/hellaswag.h).
inline HellaSwagResult hellaswag_all_ranks(const HellaSwagSet& set, int B, int T, const Distributed& d,
                                           const HellaSwagForward& forward_losses) {
    HellaSwagResult r = hellaswag_evaluate(set, B, T, d.rank, d.world_size, forward_losses);
    r.correct = all_ranks_sum(d, r.correct);
    r.total = all_ranks_sum(d, r.total);
    r.skipped = all_ranks_sum(d, r.skipped);
    return r;
}

// The next token from one position's logits (the real vocabulary): divide by the temperature, keep
// the top_k largest (0: all), then draw from their softmax with `rng`.
inline int sample_from_logits(const std::vector<float>& logits, float temperature, int top_k, Rng& rng) {
    const int V = int(logits.size());
    std::vector<std::pair<float, int>> scored(V);
    for (int v = 0; v < V; ++v) scored[v] = {logits[v] / std::max(temperature, 1e-6f), v};
    if (top_k > 0 && top_k < V) {
        std::partial_sort(scored.begin(), scored.begin() + top_k, scored.end(), std::greater<>());
        scored.resize(top_k);
    }
    float max_logit = -INFINITY;
    for (auto& [logit, v] : scored) max_logit = std::max(max_logit, logit);
    double total = 0;
    for (auto& [logit, v] : scored) total += std::exp(double(logit - max_logit));
    double draw = rng.uniform() * total;
    for (auto& [logit, v] : scored) {
        draw -= std::exp(double(logit - max_logit));
        if (draw <= 0) return v;
    }
    return scored.back().second;
}

// What a run evaluates with: the validation loader (--val-every > 0), the HellaSwag set, the tokenizer
// beside the training data (to decode samples; token ids are printed without one), the sampling RNG.
struct Evaluation {
    std::optional<DataLoader> val;
    std::optional<HellaSwagSet> hellaswag;
    std::optional<Tokenizer> tokenizer;
    Rng sample_rng{0};
};

// Opens the run's evaluation data; every validation token is checked against the vocabulary first.
// Two defaults give way with a one-line note (rank 0) instead of an error: validation when -v was not
// given and no shard matches -j, and the sample length when -g exceeds -t - 1.
inline Evaluation evaluation_of(const RunConfig& rc, const Distributed& d, int vocab_size) {
    Evaluation e;
    const bool no_val_shards = rc.val_every > 0 && !rc.was_given("val-every") && !any_file_matches(rc.val_data);
    if (no_val_shards && d.rank == 0)
        std::printf("note: no validation shard matches -j/--val-data '%s': validation is off (an explicit -v makes "
                    "this an error)\n", rc.val_data.c_str());
    if (rc.sample_every > 0 && rc.gen_tokens > rc.seq_len - 1 && d.rank == 0)
        std::printf("note: samples are %d tokens, not -g/--gen-tokens %d: a sample fits one -t/--seq-len %d window\n",
                    rc.seq_len - 1, rc.gen_tokens, rc.seq_len);
    if (rc.val_every > 0 && !no_val_shards) {
        e.val.emplace(rc.val_data, rc.batch_size, rc.seq_len, d.rank, d.world_size, uint64_t(rc.seed), false);
        e.val->check_tokens(vocab_size);
    }
    if (!rc.hellaswag.empty()) e.hellaswag = read_hellaswag(rc.hellaswag, vocab_size);
    const std::string tokenizer_path = (std::filesystem::path(rc.train_data).parent_path() / "tokenizer.bin").string();
    if (std::filesystem::exists(tokenizer_path)) e.tokenizer.emplace(tokenizer_path);
    e.sample_rng = Rng(uint64_t(rc.seed) ^ 0x5A4D504C45ull);
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
};

// `count` tokens generated after an end-of-text token `eot`, each drawn from the logits at the last
// position of a window of at most max_tokens (sample_from_logits).
inline std::vector<int> sample_tokens(const EvaluatedModel& model, int eot, int count, float temperature, int top_k,
                                      Rng& rng) {
    std::vector<int> tokens = {eot};
    for (int i = 0; i < count; ++i) {
        const int window = std::min<int>(int(tokens.size()), model.max_tokens);
        const std::vector<float> logits = model.next_token_logits(tokens.data() + tokens.size() - window, window);
        tokens.push_back(sample_from_logits(logits, temperature, top_k, rng));
    }
    return std::vector<int>(tokens.begin() + 1, tokens.end());
}

// After step `done` (`last`: the run's last step): the validation loss and HellaSwag every --val-every
// steps and after the last step (every rank takes part), a sample every --sample-every steps and
// after the last step (rank 0 only), each logged; after the last, the command that plots the log.
inline void evaluate_when_due(const RunConfig& rc, Evaluation& e, const EvaluatedModel& model, RunLog& log,
                              const Distributed& d, int64_t done, bool last) {
    const int B = rc.batch_size, T = rc.seq_len;
    if (e.val && (done % rc.val_every == 0 || last))  // e.val is set only when val_every > 0
        log.val(done, mean_validation_loss(*e.val, rc.val_batches, B, T, d, model.batch_loss));
    if (e.hellaswag && ((rc.val_every > 0 && done % rc.val_every == 0) || last)) {
        const HellaSwagResult hs = hellaswag_all_ranks(*e.hellaswag, B, T, d, model.token_losses);
        log.hellaswag(done, hs.accuracy(), hs.correct, hs.total, hs.skipped);
    }
    if (rc.sample_every > 0 && (done % rc.sample_every == 0 || last) && d.rank == 0) {
        const std::vector<int> tokens = sample_tokens(model, e.tokenizer ? e.tokenizer->eot_token() : 50256,
                                                      std::min(rc.gen_tokens, rc.seq_len - 1), float(rc.temperature),
                                                      rc.top_k, e.sample_rng);
        std::string text;
        if (e.tokenizer) text = e.tokenizer->decode(tokens);
        else for (int t : tokens) text += std::to_string(t) + " ";
        log.sample(done, text);
    }
    if (last) log.finished();
}
