// The roofline (dev/roofline.h) held against a GPU run's measurements: scripts/gpu_check.sh's
// profile.json (--profile-step's kernel table, every launch timed) and train.json (the step time).
// `build/cpu/roofline --fit DIR` prints, for a gpu_check output directory, each GEMM shape's
// measured time beside this model's, the GEMM traffic share that fits them best, and our share of
// what a roofline misses; test_roofline checks dev/roofline.h's constants against the first H100
// run's files (docs/gpu_check_2026-11-27_h100/) with the same functions.
#pragma once

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dev/roofline.h"
#include "host/model_config.h"
#include "kernels/attention_tc.cuh"

// One row of --profile-step's kernel table: all launches of one kernel name.
struct ProfileRow {
    std::string name, unit;
    long long launches = 0;
    double flops = 0, bytes = 0, estimate_s = 0, measured_s = 0;
};

struct ProfiledStep {
    std::string path, first_line;  // the report's first line: model, device, B, T
    int B = 0, T = 0;
    std::vector<ProfileRow> rows;
};

// A JSON file's contents; throws one line naming the file.
inline nlohmann::json read_json_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open '" + path + "'");
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error("'" + path + "': " + e.what());
    }
}

// read(), any error it throws (a field missing or of another type, a value refused) prefixed with the
// file it reads, `where`.
template <typename Read> auto naming_file(const std::string& where, Read&& read) -> decltype(read()) {
    try {
        return read();
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error("'" + where + "': " + e.what());
    } catch (const std::runtime_error& e) {
        throw std::runtime_error("'" + where + "': " + e.what());
    }
}

// One row of --profile-step's kernel table: the name in the first 46 columns (names hold spaces), then
// unit, launches, GFLOP, GB, FLOP/B, estimated ms, bound, measured ms, ...
inline ProfileRow profile_row_of(const std::string& line) {
    ProfileRow r;
    r.name = line.substr(0, 46);
    r.name.erase(r.name.find_last_not_of(' ') + 1);
    char unit[16], bound[16];
    double gflop, gb, intensity, estimate_ms, measured_ms;
    if (line.size() <= 46 || std::sscanf(line.c_str() + 46, "%15s %lld %lf %lf %lf %lf %15s %lf", unit, &r.launches, &gflop,
                                         &gb, &intensity, &estimate_ms, bound, &measured_ms) != 8 ||
        r.launches <= 0)
        throw std::runtime_error("a kernel row without a measured time: '" + line + "'");
    r.unit = unit;
    r.flops = gflop * 1e9, r.bytes = gb * 1e9, r.estimate_s = estimate_ms / 1e3, r.measured_s = measured_ms / 1e3;
    return r;
}

// profile.json's kernel table, as --profile-step printed it (profile_row_of).
// `section` names another step's table in the file (gpu_check's "d48": its B and report; T as the file's).
inline ProfiledStep profiled_step_of(const nlohmann::json& file, const std::string& path, const std::string& section = "") {
    ProfiledStep step;
    step.path = section.empty() ? path : path + " (" + section + ")";
    return naming_file(step.path, [&] {
        if (!section.empty() && !(file.contains(section) && file.at(section).is_object()))
            throw std::runtime_error("field '" + section + "' is not a profiled step");
        const nlohmann::json& profile = section.empty() ? file : file.at(section);
        step.B = profile.at("B").get<int>(), step.T = profile.value("T", file.at("T").get<int>());
        if (step.B < 1 || step.T < 1) throw std::runtime_error("fields 'B' and 'T' must be positive");
        const nlohmann::json& report = profile.at("report");
        if (!report.is_array() || report.empty()) throw std::runtime_error("field 'report' is not a list of lines");
        step.first_line = report.front().get<std::string>();
        bool in_table = false;
        for (const nlohmann::json& entry : report) {
            const std::string line = entry.get<std::string>();
            if (line.rfind("kernel ", 0) == 0) {
                if (line.find(" GPU ms") == std::string::npos)  // the emulator's profile times its own clock
                    throw std::runtime_error("field 'report': the kernel table was not timed on a GPU (no 'GPU ms' column)");
                in_table = true;
                continue;
            }
            if (!in_table) continue;
            if (line.rfind("total", 0) == 0) break;
            try {
                step.rows.push_back(profile_row_of(line));
            } catch (const std::runtime_error& e) {
                throw std::runtime_error(std::string("field 'report': ") + e.what());
            }
        }
        if (step.rows.empty()) throw std::runtime_error("field 'report' holds no timed kernel table");
        return step;
    });
}
inline ProfiledStep read_profiled_step(const std::string& path, const std::string& section = "") {
    return profiled_step_of(read_json_file(path), path, section);
}

// Whether a gpu_check profile.json holds a profiled step under `section` (the d48 one, where it ran).
inline bool has_profiled_section(const nlohmann::json& file, const std::string& section) {
    return file.is_object() && file.contains(section) && file.at(section).is_object() &&
           file.at(section).value("exit_code", 1) == 0;
}

// A profiled GEMM row as one launch of this model: m, n, k from the launcher's name and B x T
// (kernels/matmul.cuh: forward (BT, OC) = (BT, C) x W^T; dinp (BT, C) over k = OC; dweight (OC, C) over BT).
inline LaunchRecord gemm_launch_of(const ProfileRow& row, int B, int T) {
    int C = 0, OC = 0;
    const size_t open = row.name.find('(');
    if (open == std::string::npos || std::sscanf(row.name.c_str() + open, "(C=%d, OC=%d", &C, &OC) != 2)
        throw std::runtime_error("GEMM row '" + row.name + "' does not name its shape as (C=..., OC=...)");
    const std::string kind = row.name.substr(0, open);
    LaunchRecord r{row.name, WorkKind::matmul, dim3(0, 0, 0), dim3(0, 0, 0), 0, row.flops / row.launches,
                   row.bytes / row.launches};
    const int BT = B * T;
    if (kind == "matmul_forward") r.gemm_m = BT, r.gemm_n = OC, r.gemm_k = C;
    else if (kind == "matmul_backward_dinp") r.gemm_m = BT, r.gemm_n = C, r.gemm_k = OC;
    else if (kind == "matmul_backward_dweight") r.gemm_m = OC, r.gemm_n = C, r.gemm_k = BT;
    else throw std::runtime_error("GEMM row '" + row.name + "' is not a forward, dinp or dweight launch");
    return r;
}

inline bool is_gemm_row(const ProfileRow& row) { return row.unit == "cublasLt"; }

// This model's time for a profiled GEMM row (all its launches), with `unhidden_share` of its bytes unhidden.
inline double gemm_row_estimate(const ProfiledStep& step, const ProfileRow& row,
                                double unhidden_share = H100Model::kGemmUnhiddenBytes) {
    return row.launches * roofline_time(gemm_launch_of(row, step.B, step.T), H100Model::kFlashAttention2, unhidden_share).seconds;
}

struct GemmFit {
    double unhidden_share = 0, rms_log_error = 0, max_log_error = 0;
    int shapes = 0;
};

// The errors of this model over the profiled GEMM shapes of one or more steps, log(estimate / measured).
inline GemmFit gemm_fit_errors(const std::vector<ProfiledStep>& steps, double unhidden_share) {
    GemmFit f;
    f.unhidden_share = unhidden_share;
    double sum = 0;
    for (const ProfiledStep& step : steps)
        for (const ProfileRow& row : step.rows) {
            if (!is_gemm_row(row)) continue;
            const double e = std::log(gemm_row_estimate(step, row, unhidden_share) / row.measured_s);
            sum += e * e, f.max_log_error = std::max(f.max_log_error, std::abs(e)), ++f.shapes;
        }
    f.rms_log_error = f.shapes ? std::sqrt(sum / f.shapes) : 0;
    return f;
}
inline GemmFit gemm_fit_errors(const ProfiledStep& step, double unhidden_share) {
    return gemm_fit_errors(std::vector<ProfiledStep>{step}, unhidden_share);
}

// The unhidden share (0 to 1.5, in steps of 0.001) with the least squared log error in time over the
// profiled GEMM shapes; the BF16 peak fraction follows from the 8192^3 anchor for each candidate.
inline GemmFit fit_gemm_unhidden_share(const std::vector<ProfiledStep>& steps) {
    GemmFit best = gemm_fit_errors(steps, 0);
    for (int i = 1; i <= 1500; ++i) {
        const GemmFit f = gemm_fit_errors(steps, i / 1000.0);
        if (f.rms_log_error < best.rms_log_error) best = f;
    }
    if (best.shapes == 0) throw std::runtime_error("no cuBLASLt rows to fit in " + steps.front().path);
    return best;
}
inline GemmFit fit_gemm_unhidden_share(const ProfiledStep& step) { return fit_gemm_unhidden_share(std::vector<ProfiledStep>{step}); }

inline bool is_attention_row(const ProfileRow& row) { return row.unit == "tensor"; }
inline bool is_attention_forward(const ProfileRow& row) { return H100Model::is_attention_forward(row.name); }

// This model's time for a profiled tensor-core attention row: compute-bound at the attention rates
// (its grid is not in the table; these kernels' grids fill the GPU at the profiled shapes).
inline double attention_row_estimate(const ProfileRow& row, const AttentionRates& rates = H100Model::kOurAttention) {
    const LaunchRecord r{row.name, WorkKind::tensor_cores, dim3(H100Model::kSms), dim3(128), 0, row.flops / row.launches,
                         row.bytes / row.launches};
    return row.launches * roofline_time(r, rates).seconds;
}

// The tensor-core attention rates a profile measured: FLOPs executed over time, forward and backward.
inline AttentionRates measured_attention_rates(const ProfiledStep& step) {
    double flops[2] = {0, 0}, seconds[2] = {0, 0};
    for (const ProfileRow& row : step.rows) {
        if (!is_attention_row(row)) continue;
        const int backward = is_attention_forward(row) ? 0 : 1;
        flops[backward] += row.flops, seconds[backward] += row.measured_s;
    }
    if (!(seconds[0] > 0 && seconds[1] > 0))
        throw std::runtime_error("'" + step.path + "' holds no timed tensor-core attention forward and backward rows");
    return {flops[0] / seconds[0], flops[1] / seconds[1], 1.0};
}

// The profiled step replayed (one stream, as one GPU runs it): GEMM and attention rows at this model,
// the rest at the profile's own estimates (the roofs it was printed with; dev/roofline.h's
// memory-bound roofs have not changed since the first H100 run).
inline double profiled_step_replay_s(const ProfiledStep& step) {
    double s = 0;
    for (const ProfileRow& row : step.rows)
        s += is_gemm_row(row) ? gemm_row_estimate(step, row) : is_attention_row(row) ? attention_row_estimate(row) : row.estimate_s;
    return s;
}

// train.json's median step time (the default run: CUDA graphs), in seconds, and the B and T it ran.
struct MeasuredStep {
    double seconds = 0;
    int B = 0, T = 0;
};
inline MeasuredStep measured_step_of(const nlohmann::json& train, const std::string& train_json) {
    return naming_file(train_json, [&] {
        const MeasuredStep m{train.at("ms_per_step").get<double>() / 1e3, train.at("B").get<int>(), train.at("T").get<int>()};
        if (!(m.seconds > 0)) throw std::runtime_error("field 'ms_per_step' is not a positive time");
        return m;
    });
}
inline MeasuredStep read_measured_step(const std::string& train_json) {
    return measured_step_of(read_json_file(train_json), train_json);
}

// ---------------------------------------------------------------------------------------------
// The options a GPU run decides: gpu_check's profile stage profiles the d12 step again with each
// option not yet on by default (profile.json's fused_backward, bias_grad_epilogue and autotune: the
// kernel rows each changes and its step lines), and its train stage trains with each (train.json's
// medians, prefixed fused_backward_, bias_grad_epilogue_, autotune_).

struct ProfiledOption {
    bool present = false;  // the section is in profile.json (gpu_check ran the option)
    int exit_code = 0;
    std::vector<ProfileRow> rows;
    double wall_s = 0;  // its measured step line's s/step; 0: none
};

// The "measured (wall clock ...): X s/step" line among `lines`; 0 when there is none.
inline double measured_wall_s(const nlohmann::json& lines) {
    for (const nlohmann::json& entry : lines) {
        const std::string line = entry.get<std::string>();
        const size_t colon = line.find("): ");
        double s = 0;
        if (line.rfind("measured", 0) == 0 && colon != std::string::npos && std::sscanf(line.c_str() + colon + 3, "%lf s/step", &s) == 1)
            return s;
    }
    return 0;
}

inline ProfiledOption profiled_option_of(const nlohmann::json& file, const std::string& path, const std::string& section) {
    ProfiledOption o;
    if (!file.contains(section) || file.at(section).is_null()) return o;
    return naming_file(path + " (" + section + ")", [&] {
        o.present = true;
        const nlohmann::json& j = file.at(section);
        o.exit_code = j.at("exit_code").get<int>();
        const nlohmann::json& rows = j.at("rows");
        if (!rows.is_array()) throw std::runtime_error("field 'rows' is not a list of lines");
        o.wall_s = measured_wall_s(rows);
        for (const nlohmann::json& entry : rows) {
            const std::string line = entry.get<std::string>();
            if (line.rfind("measured", 0) == 0 || line.rfind("H100 SXM roofline estimate", 0) == 0 ||
                line.rfind("matmul autotune:", 0) == 0)
                continue;
            try {
                o.rows.push_back(profile_row_of(line));
            } catch (const std::runtime_error& e) {
                throw std::runtime_error(std::string("field 'rows': ") + e.what());
            }
        }
        return o;
    });
}

// The measured time of the rows `pick` selects.
template <typename Pick> double measured_s_of(const std::vector<ProfileRow>& rows, Pick&& pick) {
    double s = 0;
    for (const ProfileRow& row : rows)
        if (pick(row)) s += row.measured_s;
    return s;
}

inline bool is_attention_backward_row(const ProfileRow& row) { return is_attention_row(row) && !is_attention_forward(row); }
inline bool is_weight_gradient_row(const ProfileRow& row) {  // what --bias-grad changes: dweight GEMMs, bias-gradient kernels
    return row.name.rfind("matmul_backward_dweight", 0) == 0 || row.name.rfind("matmul_detail::bias_grad", 0) == 0;
}

// One option's line: its profiled rows against the default profile's, its profiled step, and its
// trained step (train.json) against the default's.
inline std::string option_line(const char* flag, const char* what, const ProfiledOption& option, double option_rows_s,
                               double default_rows_s, double default_wall_s, const nlohmann::json* train, const std::string& prefix,
                               const std::string& extra = "") {
    std::string out = std::string("  ") + flag + ": ";
    char line[512];
    if (!option.present) {
        out += "not profiled in this run";
    } else if (option.exit_code != 0) {
        std::snprintf(line, sizeof line, "its profile failed (exit code %d)", option.exit_code);
        out += line;
    } else {
        std::snprintf(line, sizeof line, "%s %.3f ms against the default's %.3f (%+.1f%%)", what, option_rows_s * 1e3,
                      default_rows_s * 1e3, 100 * (option_rows_s / default_rows_s - 1));
        out += line + extra;
        if (option.wall_s > 0 && default_wall_s > 0) {
            std::snprintf(line, sizeof line, "; profiled step %.1f ms against %.1f", option.wall_s * 1e3, default_wall_s * 1e3);
            out += line;
        }
    }
    if (train && train->contains(prefix + "ms_per_step") && train->at(prefix + "ms_per_step").is_number() &&
        train->contains("ms_per_step")) {
        const double ms = train->at(prefix + "ms_per_step").get<double>(), base = train->at("ms_per_step").get<double>();
        std::snprintf(line, sizeof line, "; trained %.2f ms/step against %.2f (%+.1f%%)", ms, base, 100 * (ms / base - 1));
        out += line;
        if (train->contains(prefix + "final_loss") && train->at(prefix + "final_loss").is_number() &&
            train->contains("final_loss") && train->at("final_loss").is_number()) {
            std::snprintf(line, sizeof line, ", last loss %.4f against %.4f", train->at(prefix + "final_loss").get<double>(),
                          train->at("final_loss").get<double>());
            out += line;
        }
    } else {
        out += "; not trained in this run";
    }
    return out + "\n";
}

// The share of its waves the fused backward's grid (a block per (b, h), the heads past the last whole wave
// split into shorter blocks: attention_tc_detail::fused_grid_plan; kFusedBlocksPerSm an SM) keeps busy in
// the profiled step (no documents), whose rate includes it; 0 where the report's first line names no
// GPT-2 preset ("train_gpt: d12 on ...").
inline double fused_backward_wave_use(const ProfiledStep& step) {
    const std::string lead = "train_gpt: ";
    const size_t end = step.first_line.find(" on ");
    GPT2Config c;
    if (step.first_line.rfind(lead, 0) != 0 || end == std::string::npos ||
        !gpt2_preset(step.first_line.substr(lead.size(), end - lead.size()), &c))
        return 0;
    // Over both launches, as the roofline charges each (equal_blocks_wave_use): the heads' work over the
    // time the two grids take, in a whole head's block time (a split block does 1/groups of it).
    namespace at = attention_tc_detail;
    const at::FusedGrid grid = at::fused_grid_plan(step.B, c.num_heads, step.T, false);
    const auto busy_time = [](dim3 blocks, double work_per_block) {
        const double n = double(blocks.x) * blocks.y * blocks.z;
        return n > 0 ? n * work_per_block / H100Model::equal_blocks_wave_use(blocks, at::kFusedBlocksPerSm) : 0.0;
    };
    const double whole = double(grid.whole_rows) * c.num_heads, split = double(grid.split_rows) * c.num_heads;
    return (whole + split) / (busy_time(dim3(1, c.num_heads, grid.whole_rows), 1.0) +
                              busy_time(dim3(grid.groups, c.num_heads, grid.split_rows), 1.0 / grid.groups));
}

// What a run says of each option not yet on by default, and the fused backward's rate beside the model's.
inline std::string options_report(const nlohmann::json& file, const std::string& path, const ProfiledStep& step,
                                  const nlohmann::json* train) {
    const double default_wall_s = naming_file(path, [&] { return measured_wall_s(file.value("summary", nlohmann::json::array())); });
    std::string out = "the options not yet on by default (profile.json's sections, train.json's medians):\n";
    // A section that ran must hold timed rows of what its option changes.
    const auto require_rows = [&](const ProfiledOption& option, double rows_s, const char* section, const char* what) {
        if (option.present && option.exit_code == 0 && !(rows_s > 0))
            throw std::runtime_error("'" + path + " (" + section + ")': no timed " + what + " row");
    };
    const auto is_fused = [](const ProfileRow& r) { return H100Model::is_fused_attention_backward(r.name); };
    const ProfiledOption fused = profiled_option_of(file, path, "fused_backward");
    std::string rate;
    double fused_flops = 0;
    for (const ProfileRow& row : fused.rows)
        if (is_fused(row)) fused_flops += row.flops;
    const double fused_s = measured_s_of(fused.rows, is_fused);
    require_rows(fused, fused_s, "fused_backward", "fused attention backward");
    if (fused.present && fused.exit_code == 0) {
        // The rate to set in kOurAttention.fused_backward_flops is the one at full waves: the roofline
        // charges each grid its own waves' use.
        char line[320];
        const double executed = fused_flops / fused_s, waves = fused_backward_wave_use(step);
        const double charged = H100Model::backward_rate(H100Model::kOurAttention, "attention_tc_backward_fused_kernel");
        if (waves > 0)
            std::snprintf(line, sizeof line,
                          " (%.1f TFLOP/s executed, %.1f at full waves: its grid kept %.1f%% of its waves busy; dev/roofline.h "
                          "charges %.1f at full waves)",
                          executed / 1e12, executed / waves / 1e12, 100 * waves, charged / 1e12);
        else
            std::snprintf(line, sizeof line, " (%.1f TFLOP/s executed; dev/roofline.h charges %.1f at full waves)",
                          executed / 1e12, charged / 1e12);
        rate = line;
    }
    out += option_line("--attention-backward fused", "the attention backward", fused, fused_s,
                       measured_s_of(step.rows, is_attention_backward_row), default_wall_s, train, "fused_backward_", rate);
    const ProfiledOption epilogue = profiled_option_of(file, path, "bias_grad_epilogue");
    const double epilogue_s = measured_s_of(epilogue.rows, is_weight_gradient_row);
    require_rows(epilogue, epilogue_s, "bias_grad_epilogue", "weight-gradient");
    out += option_line("--bias-grad epilogue", "the weight-gradient GEMMs and bias-gradient kernels", epilogue, epilogue_s,
                       measured_s_of(step.rows, is_weight_gradient_row), default_wall_s, train, "bias_grad_epilogue_");
    const ProfiledOption autotune = profiled_option_of(file, path, "autotune");
    const double autotune_s = measured_s_of(autotune.rows, is_gemm_row);
    require_rows(autotune, autotune_s, "autotune", "GEMM");
    out += option_line("--matmul-autotune", "the GEMMs", autotune, autotune_s, measured_s_of(step.rows, is_gemm_row),
                       default_wall_s, train, "autotune_");
    return out;
}

// One step's GEMM shapes, measured and this model's, as `roofline --fit` prints them.
inline std::string gemm_shape_table(const ProfiledStep& step) {
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%s\n  %s\n%-46s %8s %11s %11s %9s\n", step.path.c_str(), step.first_line.c_str(),
                  "GEMM shape", "launches", "measured ms", "model ms", "model/meas");
    out += line;
    double measured = 0, estimated = 0;
    for (const ProfileRow& row : step.rows) {
        if (!is_gemm_row(row)) continue;
        const double e = gemm_row_estimate(step, row);
        std::snprintf(line, sizeof line, "%-46s %8lld %11.3f %11.3f %9.2f\n", row.name.c_str(), row.launches,
                      row.measured_s * 1e3, e * 1e3, e / row.measured_s);
        out += line;
        measured += row.measured_s, estimated += e;
    }
    std::snprintf(line, sizeof line, "%-46s %8s %11.3f %11.3f %9.2f\n\n", "all GEMMs", "", measured * 1e3,
                  estimated * 1e3, estimated / measured);
    return out + line;
}

// gpu_check's d48_best section (d48 with --attention-backward fused --bias-grad epilogue, where it ran):
// the fused kernel measured at d48's grid (one block per (b, h): 200 at B=8, 2 waves for 1.52) beside
// the estimate that run printed, and its rate at full waves; "" without the section.
inline std::string d48_best_report(const nlohmann::json& file, const std::string& path) {
    if (!file.is_object() || !file.contains("d48_best") || file.at("d48_best").is_null()) return "";
    const int exit_code = naming_file(path + " (d48_best)", [&] { return file.at("d48_best").at("exit_code").get<int>(); });
    if (exit_code != 0) return "d48 best configuration: its profile failed (exit code " + std::to_string(exit_code) + ")\n";
    const ProfiledStep step = profiled_step_of(file, path, "d48_best");
    double flops = 0, measured_s = 0, estimate_s = 0;
    for (const ProfileRow& row : step.rows)
        if (H100Model::is_fused_attention_backward(row.name)) flops += row.flops, measured_s += row.measured_s, estimate_s += row.estimate_s;
    if (!(measured_s > 0)) throw std::runtime_error("'" + step.path + "': no timed fused attention backward row");
    const double waves = fused_backward_wave_use(step);
    char line[400], rate[160];
    if (waves > 0)
        std::snprintf(rate, sizeof rate, "%.1f TFLOP/s executed, %.1f at full waves: its grid kept %.1f%% of its waves busy",
                      flops / measured_s / 1e12, flops / measured_s / waves / 1e12, 100 * waves);
    else
        std::snprintf(rate, sizeof rate, "%.1f TFLOP/s executed", flops / measured_s / 1e12);
    std::snprintf(line, sizeof line, "d48 best configuration (B=%d): the fused attention backward %.3f ms measured, %.3f estimated (%s)\n",
                  step.B, measured_s * 1e3, estimate_s * 1e3, rate);
    std::string out = line;
    for (const nlohmann::json& l : file.at("d48_best").value("summary", nlohmann::json::array())) out += "  " + l.get<std::string>() + "\n";
    return out;
}

// `roofline --fit DIR`: what a gpu_check run's profile.json (and its d48 step, where it ran) and
// train.json say of this model.
inline std::string fit_report(const std::string& dir) {
    const std::string profile = dir + "/profile.json";
    const nlohmann::json file = read_json_file(profile);
    std::vector<ProfiledStep> steps{profiled_step_of(file, profile)};
    if (has_profiled_section(file, "d48")) steps.push_back(profiled_step_of(file, profile, "d48"));
    std::string out = "roofline fit:\n";
    for (const ProfiledStep& step : steps) out += gemm_shape_table(step);
    char line[512];
    const GemmFit now = gemm_fit_errors(steps, H100Model::kGemmUnhiddenBytes), fit = fit_gemm_unhidden_share(steps);
    std::snprintf(line, sizeof line,
                  "GEMM bytes not hidden (%d shapes): dev/roofline.h has %.3f (rms log error %.3f, worst %.3f); they fit "
                  "%.3f (rms %.3f, worst %.3f; peak fraction %.3f)\n",
                  now.shapes, H100Model::kGemmUnhiddenBytes, now.rms_log_error, now.max_log_error, fit.unhidden_share,
                  fit.rms_log_error, fit.max_log_error, H100Model::gemm_peak_fraction(fit.unhidden_share));
    out += line;
    const ProfiledStep& step = steps.front();
    const AttentionRates attention = measured_attention_rates(step);
    std::snprintf(line, sizeof line,
                  "tensor-core attention: measured %.1f (forward) / %.1f (backward) TFLOP/s executed; dev/roofline.h has "
                  "%.1f / %.1f\n",
                  attention.forward_flops / 1e12, attention.backward_flops / 1e12,
                  H100Model::kOurAttention.forward_flops / 1e12, H100Model::kOurAttention.backward_flops / 1e12);
    out += line;
    const std::string train = dir + "/train.json";
    nlohmann::json train_file;
    if (std::ifstream(train)) {
        train_file = read_json_file(train);
        const MeasuredStep measured = measured_step_of(train_file, train);
        const double replay_s = profiled_step_replay_s(step);
        if (measured.B != step.B || measured.T != step.T)
            std::snprintf(line, sizeof line, "what a roofline misses: not fitted, train.json ran B=%d T=%d and the profile B=%d T=%d\n",
                          measured.B, measured.T, step.B, step.T);
        else
            std::snprintf(line, sizeof line,
                          "what a roofline misses: the measured step %.2f ms (train.json) over the profiled launches' "
                          "replay %.2f ms = x %.3f; dev/roofline.h has x %.3f\n",
                          measured.seconds * 1e3, replay_s * 1e3, measured.seconds / replay_s,
                          1 + H100Model::kUnmodeledShareOurs);
        out += line;
    } else {
        out += "what a roofline misses: no " + train + " (gpu_check's train stage), not fitted\n";
    }
    return out + options_report(file, profile, step, train_file.is_object() ? &train_file : nullptr) +
           d48_best_report(file, profile);
}
