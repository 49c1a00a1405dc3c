// Evaluation during training: the validation loss, HellaSwag accuracy over every rank, and sampling.
// The model comes in as a callable, so these know nothing of it (train_gpt.cu binds them).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "host/dataloader.h"
#include "host/hellaswag.h"
#include "host/rng.h"
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
