// Pipeline schedules (issue 15): the order in which each pipeline stage runs the forward (F) and
// backward (B) passes of the step's micro-batches, and that order played out in time.
//   afab         GPipe (Huang et al. 2019): all forwards, then all backwards.
//   1f1b         PipeDream-Flush / Megatron's 1F1B (Narayanan et al. 2021, section 2.2): stage s runs
//                p - s - 1 forwards first, then alternates one forward and one backward, then drains
//                the backwards: at most p - s micro-batches' activations held, not m.
//   interleaved  Megatron's interleaved 1F1B (Narayanan et al. 2021, section 2.2.1): each rank holds v
//                model chunks (virtual stages r, r + p, ..., r + (v-1)p) and cycles through them p
//                micro-batches at a time; the bubble shrinks by v. Needs m a multiple of p.
// Bubble fraction with F and B of one time slot each (the formulas' assumption): (p - 1) / (m + p - 1)
// for afab and 1f1b, (p - 1) / (v m + p - 1) interleaved (the bubble (p - 1)/v against m slots of
// work per chunk pass). simulate() plays a schedule out under its dependencies (F of a micro-batch
// after its F on the previous virtual stage; B after its B on the next one and its own F) and
// reports the timeline, the bubble it measures and the activations each rank holds at most.
#pragma once

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

enum class PipelineSchedule { afab, one_f_one_b, interleaved };

inline PipelineSchedule pipeline_schedule_of(const std::string& name) {
    if (name == "afab") return PipelineSchedule::afab;
    if (name == "1f1b") return PipelineSchedule::one_f_one_b;
    if (name == "interleaved") return PipelineSchedule::interleaved;
    throw std::invalid_argument("--pp-schedule must be afab, 1f1b or interleaved, got '" + name + "'");
}
inline const char* pipeline_schedule_name(PipelineSchedule s) {
    return s == PipelineSchedule::afab ? "afab" : s == PipelineSchedule::one_f_one_b ? "1f1b" : "interleaved";
}

struct PipelineOp {
    bool forward;
    int micro_batch;
    int chunk;  // the rank's model chunk (0 unless interleaved); virtual stage = chunk * stages + rank
    bool operator==(const PipelineOp&) const = default;
};

// "" when the schedule can be built for p stages, m micro-batches and v chunks per rank, else why not
// (naming the flags).
inline std::string pipeline_problem(PipelineSchedule s, int stages, int micro_batches, int chunks) {
    if (stages < 1) return "--pp " + std::to_string(stages) + " must be at least 1";
    if (micro_batches < 1) return "the step has " + std::to_string(micro_batches) + " micro-batches; at least 1 is needed";
    if (chunks < 1) return "--pp-virtual " + std::to_string(chunks) + " must be at least 1";
    if (s != PipelineSchedule::interleaved && chunks != 1)
        return "--pp-virtual " + std::to_string(chunks) + " needs --pp-schedule interleaved";
    if (s == PipelineSchedule::interleaved && micro_batches % stages != 0)
        return "--pp-schedule interleaved needs the micro-batches per step (" + std::to_string(micro_batches) +
               ") to be a multiple of --pp " + std::to_string(stages);
    return "";
}

// Rank `rank`'s operations in the order it runs them.
inline std::vector<PipelineOp> pipeline_ops(PipelineSchedule s, int stages, int rank, int micro_batches, int chunks = 1) {
    if (const std::string problem = pipeline_problem(s, stages, micro_batches, chunks); !problem.empty())
        throw std::invalid_argument(problem);
    const int p = stages, m = micro_batches, v = chunks;
    std::vector<PipelineOp> ops;
    if (s == PipelineSchedule::afab) {
        for (int j = 0; j < m; ++j) ops.push_back({true, j, 0});
        for (int j = 0; j < m; ++j) ops.push_back({false, j, 0});
        return ops;
    }
    // The k-th forward (backward) of the rank: micro-batch and chunk. 1F1B is interleaved with v = 1.
    auto forward_at = [&](int k) {
        const int group = k / (p * v), within = k % (p * v);
        return PipelineOp{true, group * p + within % p, within / p};
    };
    auto backward_at = [&](int k) {
        PipelineOp op = forward_at(k);
        op.forward = false;
        op.chunk = v - 1 - op.chunk;
        return op;
    };
    const int total = m * v;
    // Forwards before the first backward: the last virtual stage's first backward needs its forward;
    // rank r's first backward waits for p - r - 1 later stages, plus v - 1 rounds of p chunks ahead.
    const int warmup = s == PipelineSchedule::one_f_one_b ? std::min(p - rank - 1, m)
                                                          : std::min((p - rank - 1) * 2 + (v - 1) * p, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) ops.push_back(forward_at(f));
    while (f < total) {
        ops.push_back(forward_at(f++));
        ops.push_back(backward_at(b++));
    }
    while (b < total) ops.push_back(backward_at(b++));
    return ops;
}

struct PipelineTimeline {
    int slots = 0;                               // the step's length in time slots
    std::vector<std::vector<int>> op_at;         // [rank][slot]: index into ops[rank], -1 idle
    std::vector<std::vector<PipelineOp>> ops;    // [rank]
    std::vector<int> max_in_flight;              // [rank]: most micro-batch chunks forwarded, not yet backwarded
    double bubble_fraction = 0;                  // idle rank-slots over all rank-slots
};

// Plays every rank's operations (ops[rank], in order) each taking one slot, each starting as soon as
// its rank is free and its dependencies are done. Throws when the orders deadlock (no rank can move).
inline PipelineTimeline play_pipeline(std::vector<std::vector<PipelineOp>> ops, int micro_batches, int chunks = 1,
                                      const char* name = "given") {
    const int p = int(ops.size()), v = chunks, m = micro_batches;
    PipelineTimeline t;
    t.ops = std::move(ops);
    // done_f/done_b[virtual stage][micro-batch]: finished in an earlier slot (this slot's finishes are
    // marked after every rank has chosen, so nothing starts on an input finished in the same slot).
    std::vector<std::vector<bool>> done_f(size_t(p) * v, std::vector<bool>(m, false)), done_b = done_f;
    std::vector<size_t> next(p, 0);
    std::vector<int> held(p, 0);
    t.max_in_flight.assign(p, 0);
    t.op_at.assign(p, {});
    size_t total = 0;
    for (const auto& ops : t.ops) total += ops.size();
    for (size_t remaining = total, slot = 0; remaining > 0; ++slot) {
        std::vector<std::pair<int, const PipelineOp*>> started;
        for (int r = 0; r < p; ++r) {
            int chosen = -1;
            if (next[r] < t.ops[r].size()) {
                const PipelineOp& op = t.ops[r][next[r]];
                const int vs = op.chunk * p + r, j = op.micro_batch;
                const bool ready = op.forward ? vs == 0 || done_f[vs - 1][j]
                                              : done_f[vs][j] && (vs == p * v - 1 || done_b[vs + 1][j]);
                if (ready) {
                    chosen = int(next[r]);
                    started.push_back({r, &op});
                }
            }
            t.op_at[r].push_back(chosen);
        }
        if (started.empty())
            throw std::logic_error(std::string("pipeline schedule ") + name + " deadlocks at slot " + std::to_string(slot) +
                                   ": no rank's next operation has its inputs");
        for (const auto& [r, op] : started) {  // done at the end of this slot
            (op->forward ? done_f : done_b)[op->chunk * p + r][op->micro_batch] = true;
            held[r] += op->forward ? 1 : -1;
            t.max_in_flight[r] = std::max(t.max_in_flight[r], held[r]);
            ++next[r];
            --remaining;
        }
        t.slots = int(slot) + 1;
    }
    t.bubble_fraction = 1.0 - double(total) / (double(p) * t.slots);  // each operation is one busy rank-slot
    return t;
}

inline PipelineTimeline simulate_pipeline(PipelineSchedule s, int stages, int micro_batches, int chunks = 1) {
    std::vector<std::vector<PipelineOp>> ops;
    for (int r = 0; r < stages; ++r) ops.push_back(pipeline_ops(s, stages, r, micro_batches, chunks));
    return play_pipeline(std::move(ops), micro_batches, chunks, pipeline_schedule_name(s));
}

// The formulas' bubble fraction (F and B one slot each).
inline double pipeline_bubble_formula(PipelineSchedule s, int stages, int micro_batches, int chunks = 1) {
    const double p = stages, m = micro_batches, v = s == PipelineSchedule::interleaved ? chunks : 1;
    return (p - 1) / (v * m + p - 1);
}

// One row per rank, one column per slot: F3 / B3 (micro-batch 3), with the chunk as a suffix when
// interleaved (F3.1), '.' idle; then the bubble measured beside the formula's and the activations held.
inline std::string pipeline_schedule_table(PipelineSchedule s, int stages, int micro_batches, int chunks = 1) {
    const PipelineTimeline t = simulate_pipeline(s, stages, micro_batches, chunks);
    const bool show_chunk = s == PipelineSchedule::interleaved;
    auto cell = [&](int r, int slot) {
        const int i = t.op_at[r][slot];
        if (i < 0) return std::string(".");
        const PipelineOp& op = t.ops[r][i];
        return std::string(op.forward ? "F" : "B") + std::to_string(op.micro_batch) +
               (show_chunk ? "." + std::to_string(op.chunk) : "");
    };
    size_t width = 1;
    for (int r = 0; r < stages; ++r)
        for (int slot = 0; slot < t.slots; ++slot) width = std::max(width, cell(r, slot).size());
    char line[256];
    std::snprintf(line, sizeof line, "pipeline schedule %s: %d stages, %d micro-batches%s, %d slots (F and B one slot each)\n",
                  pipeline_schedule_name(s), stages, micro_batches,
                  show_chunk ? (", " + std::to_string(chunks) + " chunks per rank").c_str() : "", t.slots);
    std::string out = line;
    for (int r = 0; r < stages; ++r) {
        std::snprintf(line, sizeof line, "rank %-3d|", r);
        out += line;
        for (int slot = 0; slot < t.slots; ++slot) {
            const std::string c = cell(r, slot);
            out += " " + std::string(width - c.size(), ' ') + c;
        }
        std::snprintf(line, sizeof line, " | activations held at most: %d\n", t.max_in_flight[r]);
        out += line;
    }
    std::snprintf(line, sizeof line, "bubble: %.4f of the rank-slots idle, formula %.4f\n", t.bubble_fraction,
                  pipeline_bubble_formula(s, stages, micro_batches, chunks));
    return out + line;
}

// ---------------------------------------------------------------------------------------------
// Messages between stages. A forward pass on a stage after the first needs the previous stage's output
// (an activation, from rank - 1); a backward pass on a stage before the last needs the gradient of its
// output (from rank + 1). A send waits for its receive (NCCL's ncclSend, and the emulator's), so a stage
// that sent its forward output while the next stage sends it a gradient would wait forever (1F1B's
// steady state does exactly that). Each send is therefore posted together with the receive of the
// stage's next operation (and, before a forward-backward pair, with both operations' receives), in
// one ncclGroupStart/End (as Megatron batches them), or alone after the last operation. The plan below is what train_gpt.cu runs; check_pipeline_exchanges
// plays every rank's plan out under the send-waits-for-receive rule (tests, every schedule).

struct PipelineMessage {
    bool activation = true;  // forward output (to the next virtual stage), or gradient (to the previous)
    int micro_batch = 0;
    int peer = 0;    // the rank sent to or received from
    int chunk = 0;   // the sender's model chunk (interleaved; 0 otherwise)
    bool operator==(const PipelineMessage&) const = default;
};

// One step of a rank's plan: a group of messages (posted together, waited for together), then an
// operation (none after the last group).
struct PipelineAction {
    std::vector<PipelineMessage> sends, receives;
    bool has_op = false;
    PipelineOp op{};
};

// With v chunks (interleaved), chunk c of rank r is virtual stage c p + r: its forward input comes from
// rank r - 1's chunk c (rank p - 1's chunk c - 1 on rank 0), its output goes to the next virtual stage;
// gradients the other way. The first virtual stage receives no activation, the last no gradient.
inline std::vector<PipelineAction> pipeline_actions(PipelineSchedule s, int stages, int rank, int micro_batches, int chunks = 1) {
    const int p = stages, last_virtual = p * chunks - 1;
    const std::vector<PipelineOp> ops = pipeline_ops(s, stages, rank, micro_batches, chunks);
    const int previous = (rank + p - 1) % p, next = (rank + 1) % p;
    const auto input_of = [&](const PipelineOp& op, std::vector<PipelineMessage>& to) {
        const int vs = op.chunk * p + rank;  // the operation's virtual stage
        if (op.forward && vs > 0) to.push_back({true, op.micro_batch, previous, (vs - 1) / p});
        if (!op.forward && vs < last_virtual) to.push_back({false, op.micro_batch, next, (vs + 1) / p});
    };
    const auto output_of = [&](const PipelineOp& op, std::vector<PipelineMessage>& to) {
        const int vs = op.chunk * p + rank;
        if (op.forward && vs < last_virtual) to.push_back({true, op.micro_batch, next, op.chunk});
        if (!op.forward && vs > 0) to.push_back({false, op.micro_batch, previous, op.chunk});
    };
    std::vector<PipelineAction> plan;
    std::vector<PipelineMessage> pending;  // outputs not sent yet: they go with the next receives
    for (size_t i = 0; i < ops.size(); ++i) {
        PipelineAction a;
        a.sends = std::move(pending);
        pending.clear();
        input_of(ops[i], a.receives);
        // Interleaved: a forward followed by a backward (the steady state) receives both inputs in this
        // group and sends both outputs in the next (as Megatron's interleaved schedule batches them);
        // with the wrap from the last rank to the first, one send per group deadlocks (two stages each
        // sending the other a gradient, each receive posted one group later).
        // 1F1B needs no pairs (and with fewer micro-batches than stages must not: there the backward's
        // gradient can depend on this very forward's output downstream); nor a backward of the same
        // micro-batch, whose gradient waits for this forward.
        const bool pair = s == PipelineSchedule::interleaved && ops[i].forward && i + 1 < ops.size() && !ops[i + 1].forward &&
                          ops[i + 1].micro_batch != ops[i].micro_batch;
        if (pair) input_of(ops[i + 1], a.receives);
        a.has_op = true;
        a.op = ops[i];
        plan.push_back(std::move(a));
        output_of(ops[i], pending);
        if (pair) {
            plan.push_back({{}, {}, true, ops[++i]});
            output_of(ops[i], pending);
        }
    }
    if (!pending.empty()) plan.push_back({pending, {}, false, {}});
    return plan;
}

// "" when every rank's plan (plans[rank]) runs to its end with sends that wait for their receives and
// messages between two ranks matched in order (as NCCL matches them), else the first problem: a
// deadlock (naming each waiting rank's group) or a message received as another (a mismatch).
inline std::string check_pipeline_exchanges(const std::vector<std::vector<PipelineAction>>& plans) {
    const int p = int(plans.size());
    struct Posted {
        PipelineMessage message;
        int rank;
    };
    // sent[kind][from][to], received[...]: messages posted so far on each channel, in order; matched
    // pairs by index. Activations and gradients travel on two communicators (kind 1, 0), each matched
    // in order between two ranks.
    std::vector<std::vector<std::vector<std::vector<PipelineMessage>>>> sent(
        2, std::vector<std::vector<std::vector<PipelineMessage>>>(p, std::vector<std::vector<PipelineMessage>>(p))),
        received = sent;
    std::vector<size_t> at(p, 0);
    std::vector<bool> posted(p, false);
    std::vector<std::vector<std::tuple<int, int, size_t>>> my_sends(p), my_receives(p);  // (kind, peer, index) of the group's
    const auto describe = [](const PipelineMessage& m) {
        return std::string(m.activation ? "activation" : "gradient") + " of micro-batch " + std::to_string(m.micro_batch) +
               (m.chunk > 0 ? " (chunk " + std::to_string(m.chunk) + ")" : "");
    };
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < p; ++r) {
            if (at[r] >= plans[r].size() || posted[r]) continue;
            const PipelineAction& a = plans[r][at[r]];
            my_sends[r].clear();
            my_receives[r].clear();
            for (const PipelineMessage& m : a.sends) {
                if (m.peer < 0 || m.peer >= p || m.peer == r) return "rank " + std::to_string(r) + " sends to rank " + std::to_string(m.peer);
                auto& channel = sent[m.activation][r][m.peer];
                channel.push_back(m);
                my_sends[r].push_back({m.activation, m.peer, channel.size() - 1});
            }
            for (const PipelineMessage& m : a.receives) {
                if (m.peer < 0 || m.peer >= p || m.peer == r) return "rank " + std::to_string(r) + " receives from rank " + std::to_string(m.peer);
                auto& channel = received[m.activation][m.peer][r];
                channel.push_back(m);
                my_receives[r].push_back({m.activation, m.peer, channel.size() - 1});
            }
            posted[r] = true;
            moved = true;
        }
        for (int r = 0; r < p; ++r) {
            if (!posted[r]) continue;
            bool done = true;
            for (const auto& [kind, peer, i] : my_sends[r]) done = done && received[kind][r][peer].size() > i;
            for (const auto& [kind, peer, i] : my_receives[r]) {
                if (sent[kind][peer][r].size() <= i) {
                    done = false;
                    continue;
                }
                const PipelineMessage& s = sent[kind][peer][r][i];
                const PipelineMessage& want = received[kind][peer][r][i];
                if (s.activation != want.activation || s.micro_batch != want.micro_batch || s.chunk != want.chunk)
                    return "rank " + std::to_string(r) + " receives the " + describe(s) + " from rank " + std::to_string(peer) +
                           " as the " + describe(want);
            }
            if (done) {
                posted[r] = false;
                ++at[r];
                moved = true;
            }
        }
    }
    std::string waiting;
    for (int r = 0; r < p; ++r) {
        if (at[r] >= plans[r].size()) continue;
        const PipelineAction& a = plans[r][at[r]];
        waiting += (waiting.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits in step " +
                   std::to_string(at[r]) + " (" + std::to_string(a.sends.size()) + " sends, " +
                   std::to_string(a.receives.size()) + " receives" +
                   (a.receives.empty() ? "" : ": " + describe(a.receives[0]) + " from rank " + std::to_string(a.receives[0].peer)) + ")";
    }
    return waiting.empty() ? "" : "deadlock: " + waiting;
}
