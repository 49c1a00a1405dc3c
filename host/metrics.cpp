// metrics.jsonl (host/metrics.h): one JSON object per line, fields in a fixed order.
#include "host/metrics.h"

#include <nlohmann/json.hpp>

namespace {

// A float as the shortest decimal that reads back to it (3e-4f -> 0.0003, not 0.000300000014).
double tidy(float value) {
    if (!std::isfinite(value)) return value;
    char text[32];
    const auto result = std::to_chars(text, text + sizeof(text), value);
    *result.ptr = '\0';
    return std::strtod(text, nullptr);
}

// Fields in the order given (ordered_json), so lines read step first. Samples are decoded tokens and
// may cut a UTF-8 sequence: bad bytes are replaced, never thrown on.
std::string line_of(const nlohmann::ordered_json& record) {
    return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& output_dir)
    : path_((std::filesystem::path(output_dir) / "metrics.jsonl").string()) {
    std::error_code error;
    std::filesystem::create_directories(output_dir, error);
    file_ = std::fopen(path_.c_str(), "a+");
    if (!file_) throw std::runtime_error("MetricsWriter: cannot open '" + path_ + "' for appending: " + std::strerror(errno));
    // A run killed mid-write leaves a partial last line: end it, so the next record starts a line of
    // its own and only the torn one is unreadable.
    const bool torn = std::fseek(file_, -1, SEEK_END) == 0 && std::fgetc(file_) != '\n';
    std::fseek(file_, 0, SEEK_END);  // C requires a seek between reading and writing a stream
    if (torn) write_line("\n");
}

MetricsWriter::~MetricsWriter() {
    if (file_) std::fclose(file_);
}

void MetricsWriter::log_step(const StepReport& r) {
    write_line(line_of({{"step", r.step},
                        {"loss", tidy(r.loss)},
                        {"lr", tidy(r.lr)},
                        {"grad_norm", tidy(r.grad_norm)},
                        {"ms", r.ms},
                        {"tokens_per_second", r.tokens_per_second},
                        {"mfu", r.mfu ? nlohmann::ordered_json(*r.mfu) : nlohmann::ordered_json(nullptr)},
                        {"batch_tokens", r.batch_tokens}}));
}

void MetricsWriter::log_val(int64_t step, float val_loss, long long val_tokens) {
    write_line(line_of({{"step", step}, {"val_loss", tidy(val_loss)}, {"val_tokens", val_tokens}}));
}

void MetricsWriter::log_sample(int64_t step, const std::string& text) {
    write_line(line_of({{"step", step}, {"sample", text}}));
}

void MetricsWriter::log_hellaswag(int64_t step, long long correct, long long examples) {
    const double accuracy = examples > 0 ? double(correct) / double(examples) : 0.0;
    write_line(line_of({{"step", step}, {"hellaswag_accuracy", accuracy}, {"hellaswag_correct", correct},
                        {"hellaswag_examples", examples}}));
}

void MetricsWriter::write_line(const std::string& line) {
    if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0)
        throw std::runtime_error("MetricsWriter: writing '" + path_ + "' failed: " + std::strerror(errno));
}
