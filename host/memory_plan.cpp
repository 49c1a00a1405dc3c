// The reports of host/memory_plan.h: the table and the JSON of --dry-run.
#include "host/memory_plan.h"

#include <nlohmann/json.hpp>

#include <cstdio>

std::string MemoryPlan::table() const {
    std::string out;
    char line[256];
    auto gib = [](size_t b) { return double(b) / double(size_t(1) << 30); };
    std::snprintf(line, sizeof line, "%-28s %-14s %16s %10s\n", "item", "group", "bytes", "GiB");
    out += line;
    for (const MemoryItem& i : items) {
        std::snprintf(line, sizeof line, "%-28s %-14s %16zu %10.4f\n", i.name.c_str(), i.group.c_str(), i.bytes,
                      gib(i.bytes));
        out += line;
    }
    out += "\n";
    for (const std::string& g : groups()) {
        std::snprintf(line, sizeof line, "%-28s %-14s %16zu %10.4f\n", ("total " + g).c_str(), "", group_bytes(g),
                      gib(group_bytes(g)));
        out += line;
    }
    std::snprintf(line, sizeof line, "%-28s %-14s %16zu %10.4f\n", "total", "", total(), gib(total()));
    return out + line;
}

namespace {
// {"<group>": bytes..., "total": bytes, "items": {"<name>": bytes...}}
nlohmann::json bytes_json(const MemoryPlan& plan) {
    nlohmann::json j;
    for (const std::string& g : MemoryPlan::groups()) j[g] = plan.group_bytes(g);
    j["total"] = plan.total();
    nlohmann::json items_json = nlohmann::json::object();
    for (const MemoryItem& i : plan.items) items_json[i.name] = i.bytes;
    j["items"] = items_json;
    return j;
}
}  // namespace

std::string dry_run_report(const RunConfig& rc, const MemoryPlan& plan, size_t num_parameters, int world,
                           size_t budget, const LargestBatches& fits, const char* precision, const char* attention,
                           const TensorTraffic& traffic, const PipelinePlan& pipeline) {
    const bool sequence_parallel = rc.tp > 1 && rc.sequence_parallel != "off";
    const double traffic_seconds = traffic.collectives() > 0 ? traffic.bus_bytes_per_rank / traffic.link_bytes_per_second : 0.0;
    if (rc.json) {
        const nlohmann::json largest = {{"none", fits.none}, {"selective", fits.selective}, {"full", fits.full}};
        nlohmann::json j = {{"model", model_label(rc)},       {"parameters", num_parameters}, {"world_size", world},
                                  {"tensor_parallel", rc.tp},     {"sequence_parallel", sequence_parallel},
                                  {"context_parallel", rc.cp},
                                  {"zero_stage", rc.zero_stage},  {"recompute", rc.recompute},
                                  {"attention", attention},      {"micro_batch", rc.batch_size},
                                  {"doc_mask", rc.doc_mask},      {"doc_positions", rc.doc_positions},
                                  {"seq_len", rc.seq_len},        {"precision", precision},
                                  {"bytes", bytes_json(plan)},    {"memory_budget_bytes", budget},
                                  {"largest_micro_batch", largest},
                                  {"tensor_parallel_traffic",
                                   {{"all_reduces_per_micro_step", traffic.all_reduces},
                                    {"all_gathers_per_micro_step", traffic.all_gathers},
                                    {"reduce_scatters_per_micro_step", traffic.reduce_scatters},
                                    {"bytes_per_collective", traffic.bytes_each},
                                    {"bus_bytes_per_rank_per_micro_step", traffic.bus_bytes_per_rank},
                                    {"assumed_link_bytes_per_second", traffic.link_bytes_per_second},
                                    {"seconds_per_micro_step", traffic_seconds}}}};
        if (pipeline.stages > 1) {
            nlohmann::json stages = nlohmann::json::array();
            for (const PipelineStagePlan& s : pipeline.per_stage)
                stages.push_back({{"first_layer", s.first_layer}, {"layers", s.layers},
                                  {"micro_batches_in_flight", s.micro_batches_in_flight}, {"bytes", s.total_bytes},
                                  {"activation_bytes", s.activation_bytes}});
            j["pipeline"] = {{"stages", pipeline.stages},          {"schedule", pipeline.schedule},
                             {"micro_batches", pipeline.micro_batches}, {"virtual_chunks", pipeline.virtual_chunks},
                             {"bubble_measured", pipeline.bubble_measured}, {"bubble_formula", pipeline.bubble_formula},
                             {"boundary_bytes_per_micro_batch", pipeline.boundary_bytes}, {"per_stage", stages}};
        }
        return j.dump(2) + "\n";
    }
    char line[512];
    char context[64] = "";  // --cp: each rank's share of the sequence (parallel/context.h)
    if (rc.cp > 1) std::snprintf(context, sizeof context, ", cp %d: %d tokens of each sequence per rank", rc.cp, rc.seq_len / rc.cp);
    std::snprintf(line, sizeof line, ", %zu parameters, B=%d T=%d, %d rank(s) (tp %d%s, pp %d%s), ZeRO-%d, recompute %s, attention %s%s%s, %s\n",
                  num_parameters, rc.batch_size, rc.seq_len, world, rc.tp, sequence_parallel ? ", sequence parallel" : "", rc.pp, context,
                  rc.zero_stage, rc.recompute.c_str(), attention,
                  rc.doc_mask ? " + doc-mask" : "", rc.doc_positions ? ", doc-positions" : "", precision);
    std::string out = "memory plan per rank: " + model_label(rc) + line + plan.table();
    std::snprintf(line, sizeof line, "largest micro-batch within %.2f GiB: none %d, selective %d, full %d\n",
                  double(budget) / double(size_t(1) << 30), fits.none, fits.selective, fits.full);
    out += line;
    if (traffic.collectives() > 0) {
        std::snprintf(line, sizeof line,
                      "tensor group traffic per micro-step: %d all-reduces, %d all-gathers, %d reduce-scatters of %.1f MB; "
                      "%.2f GB sent per rank (ring), %.1f ms at %.0f GB/s (NVLink, assumed)\n",
                      traffic.all_reduces, traffic.all_gathers, traffic.reduce_scatters, traffic.bytes_each / 1e6,
                      traffic.bus_bytes_per_rank / 1e9, traffic_seconds * 1e3, traffic.link_bytes_per_second / 1e9);
        out += line;
    }
    if (pipeline.stages > 1) {
        std::snprintf(line, sizeof line,
                      "pipeline: %d stages, schedule %s, %d micro-batches per step: bubble %.4f played out (formula %.4f); "
                      "%.1f MB per micro-batch across each stage boundary and way\n",
                      pipeline.stages, pipeline.schedule.c_str(), pipeline.micro_batches, pipeline.bubble_measured,
                      pipeline.bubble_formula, pipeline.boundary_bytes / 1e6);
        out += line;
        for (size_t k = 0; k < pipeline.per_stage.size(); ++k) {
            const PipelineStagePlan& s = pipeline.per_stage[k];
            std::snprintf(line, sizeof line, "  stage %zu: layers %d-%d, keeps %d micro-batch(es) in flight, %.2f GiB (activations %.2f GiB)\n",
                          k, s.first_layer, s.first_layer + s.layers - 1, s.micro_batches_in_flight,
                          double(s.total_bytes) / double(size_t(1) << 30), double(s.activation_bytes) / double(size_t(1) << 30));
            out += line;
        }
    }
    return out;
}
