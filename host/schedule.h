// Learning-rate and batch-size schedules: pure functions of the step (or tokens seen), so a resumed
// run recomputes exactly the values an uninterrupted run would have used.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Learning rate

enum class LrKind { cosine, linear, constant, wsd };

inline LrKind lr_kind_from_name(const std::string& name) {
    if (name == "cosine") return LrKind::cosine;
    if (name == "linear") return LrKind::linear;
    if (name == "constant") return LrKind::constant;
    if (name == "wsd") return LrKind::wsd;
    throw std::invalid_argument("lr_kind_from_name: unknown schedule '" + name + "' (cosine|linear|constant|wsd)");
}

struct LrSchedule {
    LrKind kind = LrKind::cosine;
    double peak_lr = 3e-4;
    int64_t warmup_steps = 0;
    double final_fraction = 1.0;      // the decay ends at peak_lr * final_fraction
    double wsd_decay_fraction = 0.2;  // wsd: the share of all steps spent decaying
};

// The learning rate of optimizer step `step` (0-based) of a run of `total_steps` steps.
// - Warmup (llm.c's convention): peak * (step + 1) / warmup for step < warmup, so the first step
//   already trains and the last warmup step reaches the peak.
// - Decay from the peak to peak * final_fraction over [decay_start, total_steps - 1]: it starts at
//   exactly the peak and the last step trains at exactly the final value (llm.c reaches the final
//   value one step past the end instead). decay_start is the end of warmup for cosine and linear;
//   for wsd (warmup-stable-decay) the last round(wsd_decay_fraction * total_steps) steps decay
//   linearly and the steps between warmup and them stay at the peak. constant never decays.
// - Steps at or past the end keep the final value.
inline float learning_rate(const LrSchedule& s, int64_t step, int64_t total_steps) {
    if (step < 0) throw std::invalid_argument("learning_rate: step must be >= 0, got " + std::to_string(step));
    if (total_steps < 1)
        throw std::invalid_argument("learning_rate: total_steps must be >= 1, got " + std::to_string(total_steps));
    if (step < s.warmup_steps) return float(s.peak_lr * double(step + 1) / double(s.warmup_steps));
    if (s.kind == LrKind::constant) return float(s.peak_lr);

    int64_t decay_start = s.warmup_steps;
    if (s.kind == LrKind::wsd) {
        const int64_t decay_steps = std::llround(s.wsd_decay_fraction * double(total_steps));
        decay_start = std::max(decay_start, total_steps - decay_steps);
        if (decay_steps == 0) return float(s.peak_lr);  // a zero decay share: stable to the end
    }
    if (step < decay_start) return float(s.peak_lr);
    const int64_t span = total_steps - 1 - decay_start;  // steps after the first decay step
    const double progress = span > 0 ? std::min(1.0, double(step - decay_start) / double(span)) : 1.0;
    const double final_lr = s.peak_lr * s.final_fraction;
    const double weight = s.kind == LrKind::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
    return float(final_lr + weight * (s.peak_lr - final_lr));
}

// ---------------------------------------------------------------------------------------------
// Batch-size ramp
//
// Small batches early, large ones later: the critical batch size grows as the loss falls, so the
// batch starts small and doubles at chosen token counts (the batch-size schedule of the MiniMax-01
// report, arXiv:2501.08313, which doubled its batch in steps from 16M to 128M tokens).
//
// Syntax of --batch-ramp: "START:N1,N2,..." means START tokens per optimizer step at first, twice
// that once N1 tokens have been trained on, twice again at N2, and so on, never above the cap
// (-d/--total-batch-tokens). Counts are integers, written plainly or in exponent form ("1e8").
// Example: "65536:1e8,2e8" = 65536 tokens per step, 131072 from 1e8 tokens seen, 262144 from 2e8.
// "" turns the ramp off (every step uses the cap).

struct BatchRamp {
    int64_t start_tokens = 0;       // 0: no ramp
    std::vector<int64_t> double_at;  // strictly increasing token counts
};

namespace schedule_detail {
// A positive integer written plainly or in exponent form; -1 when `text` is not one.
inline int64_t parse_count(const std::string& text) {
    if (text.empty() || text.find_first_not_of("0123456789eE+.") != std::string::npos) return -1;
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !(value >= 1) || value > 9.0e15 || value != std::floor(value)) return -1;
    return int64_t(value);  // exact: below 2^53
}
}  // namespace schedule_detail

// Throws std::invalid_argument naming the bad part when `spec` does not follow the syntax above.
inline BatchRamp parse_batch_ramp(const std::string& spec) {
    BatchRamp ramp;
    if (spec.empty()) return ramp;
    const auto fail = [&](const std::string& why) {
        throw std::invalid_argument("batch ramp '" + spec + "': " + why +
                                    " (syntax START:N1,N2,...: START tokens per step, doubled at N1, N2... tokens seen)");
    };
    const size_t colon = spec.find(':');
    if (colon == std::string::npos) fail("missing ':'");
    ramp.start_tokens = schedule_detail::parse_count(spec.substr(0, colon));
    if (ramp.start_tokens < 1) fail("START '" + spec.substr(0, colon) + "' is not a positive integer");
    size_t begin = colon + 1;
    while (true) {
        const size_t comma = spec.find(',', begin);
        const std::string item = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
        const int64_t count = schedule_detail::parse_count(item);
        if (count < 1) fail("token count '" + item + "' is not a positive integer");
        if (!ramp.double_at.empty() && count <= ramp.double_at.back()) fail("token counts must increase");
        ramp.double_at.push_back(count);
        if (comma == std::string::npos) break;
        begin = comma + 1;
    }
    return ramp;
}

// Tokens per optimizer step once `tokens_seen` tokens have been trained on: the ramp's value,
// never above `cap`; the cap itself when there is no ramp.
inline int64_t total_batch_tokens_at(int64_t tokens_seen, const BatchRamp& ramp, int64_t cap) {
    if (ramp.start_tokens == 0) return cap;
    int64_t tokens = ramp.start_tokens;
    for (int64_t threshold : ramp.double_at)
        if (tokens_seen >= threshold && tokens < cap) tokens *= 2;  // stops doubling at the cap: no overflow
    return std::min(tokens, cap);
}

// Tokens trained on before step `step` (0-based) under the ramp: where a resumed or rolled-back run
// continues it.
inline int64_t tokens_before_step(int64_t step, const BatchRamp& ramp, int64_t cap) {
    int64_t seen = 0;
    for (int64_t s = 0; s < step; ++s) seen += total_batch_tokens_at(seen, ramp, cap);
    return seen;
}

// Optimizer steps needed to train on at least `tokens` tokens under the ramp (for -x -1: one epoch).
// Each step's batch is fixed when it starts, so one step may carry the count past a doubling point.
inline int64_t steps_for_tokens(int64_t tokens, const BatchRamp& ramp, int64_t cap) {
    if (cap < 1) throw std::invalid_argument("steps_for_tokens: cap must be >= 1, got " + std::to_string(cap));
    int64_t seen = 0, steps = 0;
    while (seen < tokens) {
        const int64_t batch = total_batch_tokens_at(seen, ramp, cap);
        int64_t segment_end = tokens;  // the next doubling point, or the goal
        for (int64_t threshold : ramp.double_at)
            if (threshold > seen) { segment_end = std::min(segment_end, threshold); break; }
        const int64_t n = (segment_end - seen + batch - 1) / batch;
        seen += n * batch;
        steps += n;
    }
    return steps;
}
