// Divergence guard of the training loop: which steps are skipped (no optimizer update) and when a
// run has diverged and must stop.
//
// A step is skipped when its loss or its gradient norm is not finite, or when either is an outlier:
// its z-score (x - mean) / stddev over the finite values of the last kWindow steps exceeds the
// threshold (--skip-loss-z, --skip-norm-z; 0 = off), once the window holds kMinValues values. This is
// llm.c's -sl/-sg rule (train_gpt2.cu, OutlierDetector, a 128-step window); a skipped step's finite
// values still enter the window, as there, so the window follows a real shift of the loss.
// --max-skipped-steps K: K skips in a row mean the run has diverged (RunDiverged); run() then stops with
// an error naming the step, before any checkpoint of it is written, or with --on-divergence rollback
// reloads an earlier checkpoint and goes on past the data the diverged steps read.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <stdexcept>
#include <string>

// The last kWindow finite values, and the z-score of a new one against them.
class OutlierWindow {
  public:
    static constexpr size_t kWindow = 128;
    static constexpr size_t kMinValues = 32;  // fewer: no z-score (NaN), never an outlier

    void add(double x) {
        if (!std::isfinite(x)) return;
        values_.push_back(x);
        if (values_.size() > kWindow) values_.pop_front();
    }
    size_t size() const { return values_.size(); }
    // (x - mean) / population stddev of the window; NaN while it holds fewer than kMinValues values;
    // +-inf for a value off a window of identical values.
    double zscore(double x) const {
        if (values_.size() < kMinValues) return NAN;
        double sum = 0;
        for (double v : values_) sum += v;
        const double mean = sum / double(values_.size());
        double sq = 0;
        for (double v : values_) sq += (v - mean) * (v - mean);
        const double stddev = std::sqrt(sq / double(values_.size()));
        if (stddev == 0) return x == mean ? 0.0 : (x > mean ? INFINITY : -INFINITY);
        return (x - mean) / stddev;
    }

  private:
    std::deque<double> values_;
};

// Thrown by DivergenceGuard::record when a run has diverged: `step` is the skip that made K in a row,
// `first_skipped` the first of them.
struct RunDiverged : std::runtime_error {
    RunDiverged(const std::string& message, int64_t step, int64_t first_skipped)
        : std::runtime_error(message), step(step), first_skipped(first_skipped) {}
    int64_t step, first_skipped;
};

struct DivergenceSettings {
    double skip_loss_z = 0;     // 0 = off
    double skip_norm_z = 0;     // 0 = off
    int64_t max_skipped_steps = 5;  // consecutive skips that stop the run; 0 = never stop
};

class DivergenceGuard {
  public:
    explicit DivergenceGuard(const DivergenceSettings& s) : settings_(s) {}

    // Why a step with this loss and gradient norm must not update the model ("" = it may). Every rank
    // passes the same values (both are reduced over ranks), so every rank decides alike.
    std::string skip_reason(double loss, double grad_norm) const {
        if (!std::isfinite(loss)) return "loss is " + number(loss);
        if (!std::isfinite(grad_norm)) return "gradient norm is " + number(grad_norm);
        if (settings_.skip_loss_z > 0) {
            const double z = loss_.zscore(loss);
            if (z > settings_.skip_loss_z)
                return "loss " + number(loss) + " is an outlier (z-score " + number(z) + " > " +
                       number(settings_.skip_loss_z) + ")";
        }
        if (settings_.skip_norm_z > 0) {
            const double z = norm_.zscore(grad_norm);
            if (z > settings_.skip_norm_z)
                return "gradient norm " + number(grad_norm) + " is an outlier (z-score " + number(z) + " > " +
                       number(settings_.skip_norm_z) + ")";
        }
        return "";
    }

    // After step `step` (1-based): its values enter the windows, and a skip is counted. Throws
    // RunDiverged when this skip makes max_skipped_steps in a row.
    void record(int64_t step, double loss, double grad_norm, const std::string& skipped_because) {
        loss_.add(loss);
        norm_.add(grad_norm);
        if (skipped_because.empty()) {
            consecutive_ = 0;
            return;
        }
        ++consecutive_;
        if (settings_.max_skipped_steps > 0 && consecutive_ >= settings_.max_skipped_steps)
            throw RunDiverged("step " + std::to_string(step) + ": " + std::to_string(consecutive_) +
                                  " steps in a row skipped (last: " + skipped_because +
                                  "); the run has diverged, stopping without writing a checkpoint of it "
                                  "(--max-skipped-steps)",
                              step, step - consecutive_ + 1);
    }
    int64_t consecutive_skips() const { return consecutive_; }
    // After a rollback: the skips in a row start again from 0 (the trailing windows keep their values).
    void rolled_back() {
        consecutive_ = 0;
        ++rollbacks_;
    }
    int64_t rollbacks() const { return rollbacks_; }

  private:
    static std::string number(double x) {
        char text[32];
        std::snprintf(text, sizeof text, "%.6g", x);
        return text;
    }
    DivergenceSettings settings_;
    OutlierWindow loss_, norm_;
    int64_t consecutive_ = 0, rollbacks_ = 0;
};
