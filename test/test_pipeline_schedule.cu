// Pipeline schedules (host/pipeline_schedule.h): every rank runs each micro-batch's forward and
// backward once per chunk; played out with F and B one slot each, the idle share of the rank-slots is
// the published bubble fraction -- (p-1)/(m+p-1) for GPipe's all-forward-all-backward and 1F1B
// (Narayanan et al. 2021, section 2.2), (p-1)/(vm+p-1) interleaved (section 2.2.1) -- and 1F1B holds
// at most p - r micro-batches' activations on rank r where all-forward-all-backward holds m. A planted
// order that cannot run is reported as a deadlock.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "host/pipeline_schedule.h"

namespace {
const PipelineSchedule kSchedules[] = {PipelineSchedule::afab, PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved};
}

TEST_CASE("every rank runs each micro-batch's forward and backward once per chunk, forward first") {
    for (PipelineSchedule s : kSchedules)
        for (int p : {1, 2, 3, 4, 8})
            for (int m : {1, 2, 4, 6, 8, 16, 32})
                for (int v : {1, 2, 3}) {
                    if (!pipeline_problem(s, p, m, v).empty()) continue;
                    for (int r = 0; r < p; ++r) {
                        INFO(pipeline_schedule_name(s) << " p=" << p << " m=" << m << " v=" << v << " rank " << r);
                        const std::vector<PipelineOp> ops = pipeline_ops(s, p, r, m, v);
                        REQUIRE(ops.size() == size_t(2 * m * v));
                        std::map<std::pair<int, int>, int> forward_at, backward_at;  // (micro-batch, chunk) -> position
                        for (size_t i = 0; i < ops.size(); ++i)
                            (ops[i].forward ? forward_at : backward_at)[{ops[i].micro_batch, ops[i].chunk}] = int(i);
                        CHECK(forward_at.size() == size_t(m * v));
                        CHECK(backward_at.size() == size_t(m * v));
                        for (const auto& [key, i] : backward_at) CHECK(forward_at.count(key) == 1);
                        for (const auto& [key, i] : forward_at) {
                            CHECK(key.first < m);
                            CHECK(key.second < v);
                            CHECK(backward_at[key] > i);
                        }
                    }
                }
}

TEST_CASE("the bubble played out equals the published fraction") {
    for (PipelineSchedule s : kSchedules)
        for (int p : {1, 2, 3, 4, 8})
            for (int m : {1, 2, 4, 8, 16, 32})
                for (int v : {1, 2, 4}) {
                    if (!pipeline_problem(s, p, m, v).empty()) continue;
                    INFO(pipeline_schedule_name(s) << " p=" << p << " m=" << m << " v=" << v);
                    const PipelineTimeline t = simulate_pipeline(s, p, m, v);
                    const double vv = s == PipelineSchedule::interleaved ? v : 1;
                    const double formula = (p - 1.0) / (vv * m + p - 1.0);
                    CHECK(t.bubble_fraction == Approx(formula).margin(1e-12));
                    CHECK(t.slots == 2 * (int(vv) * m + p - 1));
                }
    // Interleaving shrinks it: 4 stages, 8 micro-batches.
    CHECK(simulate_pipeline(PipelineSchedule::interleaved, 4, 8, 2).bubble_fraction <
          simulate_pipeline(PipelineSchedule::one_f_one_b, 4, 8).bubble_fraction);
}

TEST_CASE("activations held: 1F1B at most p - r on rank r, all-forward-all-backward all m") {
    for (int p : {2, 4, 8})
        for (int m : {1, 4, 8, 32}) {
            const PipelineTimeline f1b1 = simulate_pipeline(PipelineSchedule::one_f_one_b, p, m);
            const PipelineTimeline afab = simulate_pipeline(PipelineSchedule::afab, p, m);
            for (int r = 0; r < p; ++r) {
                INFO("p=" << p << " m=" << m << " rank " << r);
                CHECK(f1b1.max_in_flight[r] == std::min(p - r, m));
                CHECK(afab.max_in_flight[r] == m);
            }
        }
}

TEST_CASE("an order that cannot run is reported as a deadlock; bad settings name the flags") {
    // Rank 1 puts micro-batch 0's backward before its forward: it waits for itself.
    std::vector<std::vector<PipelineOp>> ops = {pipeline_ops(PipelineSchedule::one_f_one_b, 2, 0, 2),
                                                pipeline_ops(PipelineSchedule::one_f_one_b, 2, 1, 2)};
    REQUIRE(ops[1].front() == PipelineOp{true, 0, 0});
    std::swap(ops[1][0], ops[1][1]);
    REQUIRE_FALSE(ops[1].front().forward);
    CHECK_THROWS_WITH(play_pipeline(ops, 2), Catch::Contains("deadlocks at slot"));
    CHECK(pipeline_problem(PipelineSchedule::interleaved, 4, 6, 2) ==
          "--pp-schedule interleaved needs the micro-batches per step (6) to be a multiple of --pp 4");
    CHECK(pipeline_problem(PipelineSchedule::one_f_one_b, 4, 8, 2) == "--pp-virtual 2 needs --pp-schedule interleaved");
    CHECK_THROWS_WITH(pipeline_schedule_of("gpipe"), Catch::Contains("--pp-schedule must be afab, 1f1b or interleaved"));
    // 1F1B on 2 stages, 2 micro-batches, worked by hand: rank 1 (the last stage) runs F0 B0 F1 B1 as
    // soon as each input arrives; rank 0 waits one slot for each backward.
    const std::string table = pipeline_schedule_table(PipelineSchedule::one_f_one_b, 2, 2);
    CHECK(table.find("rank 0  | F0 F1  . B0  . B1 | activations held at most: 2\n") != std::string::npos);
    CHECK(table.find("rank 1  |  . F0 B0 F1 B1  . | activations held at most: 1\n") != std::string::npos);
    CHECK(table.find("bubble: 0.3333 of the rank-slots idle, formula 0.3333") != std::string::npos);
}

// The messages train_gpt.cu exchanges between stages (pipeline_actions): played out with sends that
// wait for their receives, every rank's plan runs to its end, each stage receiving exactly the
// activations and gradients it needs, in the order it needs them.
TEST_CASE("the exchange plan of every schedule runs without deadlock, each message matched to its own") {
    for (PipelineSchedule s : kSchedules)
        for (int p : {1, 2, 3, 4, 5, 8})
            for (int m : {1, 2, 3, 4, 7, 8, 16})
                for (int v : {1, 2, 3}) {
                if (!pipeline_problem(s, p, m, v).empty() || (s == PipelineSchedule::interleaved && p == 1)) continue;
                INFO(pipeline_schedule_name(s) << " p=" << p << " m=" << m << " v=" << v);
                std::vector<std::vector<PipelineAction>> plans;
                for (int r = 0; r < p; ++r) plans.push_back(pipeline_actions(s, p, r, m, v));
                if (s == PipelineSchedule::interleaved && m == p) {
                    // One micro-batch per stage: from 3 stages on, the steady state's pairs wait on their
                    // own outputs downstream (2 stages run). train_gpt checks the plan before the first
                    // step and refuses a deadlock; never a message taken for another.
                    const std::string problem = check_pipeline_exchanges(plans);
                    CHECK((problem.empty() || problem.find("deadlock") == 0));
                    if (p >= 3) CHECK(problem.find("deadlock") == 0);
                    continue;
                }
                CHECK(check_pipeline_exchanges(plans) == "");
                for (int r = 0; r < p; ++r) {
                    int receives = 0, sends = 0, ops = 0;
                    for (size_t i = 0; i < plans[r].size(); ++i) {
                        const PipelineAction& a = plans[r][i];
                        receives += int(a.receives.size());
                        sends += int(a.sends.size());
                        ops += a.has_op;
                        for (const PipelineMessage& msg : a.receives) {  // what the operation after it needs, or the next one
                            const bool mine = a.has_op && msg.micro_batch == a.op.micro_batch && msg.activation == a.op.forward;
                            const bool next = i + 1 < plans[r].size() && plans[r][i + 1].receives.empty() &&
                                              plans[r][i + 1].sends.empty() && !plans[r][i + 1].op.forward &&
                                              msg.micro_batch == plans[r][i + 1].op.micro_batch && !msg.activation;
                            CHECK((mine || next));
                        }
                    }
                    CHECK(ops == 2 * m * v);
                    // Activations in from the previous virtual stage (none on the first), gradients from the
                    // next (none on the last): every chunk's but those two.
                    CHECK(receives == m * (2 * v - (r == 0) - (r == p - 1)));
                    CHECK(sends == receives);
                }
            }
}

TEST_CASE("exchanges that cannot complete are reported: each stage sending first, or out of order") {
    // 1F1B's steady state with every send posted alone, before any receive (no groups): rank 0 sends
    // micro-batch 1's activation while rank 1 sends micro-batch 0's gradient, and both wait.
    const int p = 2, m = 4;
    std::vector<std::vector<PipelineAction>> plans;
    for (int r = 0; r < p; ++r) {
        std::vector<PipelineAction> split;
        for (const PipelineAction& a : pipeline_actions(PipelineSchedule::one_f_one_b, p, r, m)) {
            if (!a.sends.empty()) split.push_back({a.sends, {}, false, {}});
            split.push_back({{}, a.receives, a.has_op, a.op});
        }
        plans.push_back(split);
    }
    const std::string deadlock = check_pipeline_exchanges(plans);
    CHECK(deadlock.find("deadlock: rank 0 waits") == 0);
    CHECK(deadlock.find("rank 1 waits") != std::string::npos);

    // Rank 1 receiving micro-batch 1's activation first: rank 0 sends micro-batch 0's, which would be
    // taken for it (the same size: NCCL would not notice).
    std::vector<std::vector<PipelineAction>> swapped;
    for (int r = 0; r < p; ++r) swapped.push_back(pipeline_actions(PipelineSchedule::afab, p, r, m));
    std::swap(swapped[1][0].receives[0].micro_batch, swapped[1][1].receives[0].micro_batch);
    CHECK(check_pipeline_exchanges(swapped) ==
          "rank 1 receives the activation of micro-batch 0 from rank 0 as the activation of micro-batch 1");
}
