// The divergence guard (host/divergence.h): the trailing-window z-score, which steps are skipped,
// and when K skips in a row stop the run. The program-level behaviour (a blown-up run stops with a
// non-zero exit, no checkpoint of non-finite parameters, a NaN model refused) is test_divergence.sh.
#include "test_util.h"

#include <cmath>
#include <string>

#include "host/divergence.h"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("OutlierWindow: population z-score over the last 128 finite values, none below 32", "[divergence]") {
    OutlierWindow w;
    for (int i = 1; i <= 31; ++i) w.add(double(i));
    CHECK(std::isnan(w.zscore(1000.0)));  // 31 values: too few to judge
    w.add(32.0);
    // 1..32: mean 16.5, population variance (32^2 - 1) / 12 = 85.25 (the discrete uniform's).
    CHECK(w.zscore(40.0) == Approx((40.0 - 16.5) / std::sqrt(85.25)).epsilon(1e-12));
    CHECK(w.zscore(16.5) == 0.0);
    // Non-finite values never enter the window.
    w.add(NAN);
    w.add(INFINITY);
    CHECK(w.size() == 32);
    // Past 128 values the oldest leave: after 1..200 the window is 73..200 (mean 136.5, the same
    // variance as any 128 consecutive integers: (128^2 - 1) / 12).
    for (int i = 33; i <= 200; ++i) w.add(double(i));
    CHECK(w.size() == 128);
    CHECK(w.zscore(300.0) == Approx((300.0 - 136.5) / std::sqrt((128.0 * 128.0 - 1.0) / 12.0)).epsilon(1e-12));
    // A constant window: any other value is infinitely far.
    OutlierWindow flat;
    for (int i = 0; i < 40; ++i) flat.add(2.0);
    CHECK(flat.zscore(2.0) == 0.0);
    CHECK(flat.zscore(2.5) == INFINITY);
}

TEST_CASE("DivergenceGuard skips non-finite losses and norms whatever the thresholds", "[divergence]") {
    const DivergenceGuard guard({0.0, 0.0, 5});
    CHECK(guard.skip_reason(3.0, 1.0).empty());
    CHECK(contains(guard.skip_reason(NAN, 1.0), "loss is nan"));
    CHECK(contains(guard.skip_reason(INFINITY, 1.0), "loss is inf"));
    CHECK(contains(guard.skip_reason(3.0, NAN), "gradient norm is nan"));
    CHECK(contains(guard.skip_reason(3.0, -INFINITY), "gradient norm is -inf"));
}

TEST_CASE("DivergenceGuard skips outliers above the z-score thresholds once the window is full", "[divergence]") {
    DivergenceGuard guard({3.0, 4.0, 5});
    // Losses 4.0 +- 0.1 and norms 1.0 +- 0.1, alternating: mean 4.0 and 1.0, stddev 0.1.
    for (int step = 1; step <= 31; ++step) {
        const double sign = step % 2 ? 1.0 : -1.0;
        guard.record(step, 4.0 + 0.1 * sign, 1.0 + 0.1 * sign, "");
    }
    CHECK(guard.skip_reason(100.0, 100.0).empty());  // 31 values: no outlier test yet
    guard.record(32, 3.9, 0.9, "");
    CHECK(guard.skip_reason(4.29, 1.0).empty());   // loss z 2.9
    CHECK(contains(guard.skip_reason(4.31, 1.0), "loss 4.31 is an outlier (z-score 3.1"));
    CHECK(guard.skip_reason(4.0, 1.39).empty());   // norm z 3.9
    CHECK(contains(guard.skip_reason(4.0, 1.41), "gradient norm 1.41 is an outlier (z-score 4.1"));
    CHECK(guard.skip_reason(-100.0, 0.0).empty());  // low outliers are good news, not divergence
    // Thresholds 0 switch the outlier tests off.
    DivergenceGuard off({0.0, 0.0, 5});
    for (int step = 1; step <= 40; ++step) off.record(step, 4.0, 1.0, "");
    CHECK(off.skip_reason(1e9, 1e9).empty());
}

TEST_CASE("DivergenceGuard stops the run at max_skipped_steps skips in a row", "[divergence]") {
    DivergenceGuard guard({0.0, 0.0, 3});
    guard.record(1, 5.0, 1.0, "gradient norm is nan");
    guard.record(2, 5.0, 1.0, "gradient norm is nan");
    guard.record(3, 5.0, 1.0, "");  // an update in between starts the count again
    CHECK(guard.consecutive_skips() == 0);
    guard.record(4, NAN, NAN, "loss is nan");
    guard.record(5, NAN, NAN, "loss is nan");
    try {
        guard.record(6, NAN, NAN, "loss is nan");
        FAIL("the third skip in a row did not stop the run");
    } catch (const RunDiverged& e) {
        const std::string message = e.what();
        CHECK(contains(message, "step 6: 3 steps in a row skipped (last: loss is nan)"));
        CHECK(contains(message, "diverged"));
        CHECK(e.step == 6);
        CHECK(e.first_skipped == 4);  // what a rollback must go back before
    }
    // After a rollback the count starts again: two more skips are not a divergence, a third is.
    guard.rolled_back();
    CHECK(guard.consecutive_skips() == 0);
    CHECK(guard.rollbacks() == 1);
    guard.record(5, NAN, NAN, "loss is nan");
    guard.record(6, NAN, NAN, "loss is nan");
    CHECK_THROWS_AS(guard.record(7, NAN, NAN, "loss is nan"), RunDiverged);
    // 0: never stop.
    DivergenceGuard never({0.0, 0.0, 0});
    for (int step = 1; step <= 50; ++step) never.record(step, NAN, NAN, "loss is nan");
    CHECK(never.consecutive_skips() == 50);
}
