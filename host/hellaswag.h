// HellaSwag (Zellers et al. 2019) in llm.c's eval file format: the reader, the packing of completions
// into (inputs, targets) rows, and completion-style scoring, independent of the model (the forward
// pass is a callable), so train_gpt.cu and the tests share it.
//
// The file (llm.c dev/data/data_common.py, write_evalfile; read by llmc/dataloader.h EvalLoader), all
// little-endian: a header of 256 int32 ([0] magic 20240522, [1] version 1, [2] example count, [3] the
// longest example in bytes, the rest 0), then the examples back to back, each a run of uint16:
//   65535 (start delimiter), the example's length in bytes (these fields included), its index (0, 1,
//   ...), the label (index of the right completion), the completion count, the context length and
//   its tokens, then per completion its length and its tokens.
//
// Scoring (llm.c's completion style, "acc_norm" in dev/data/hellaswag.py): each completion follows the
// context in a row of its own; its score is the mean cross-entropy of the completion's tokens (the
// losses at the positions that predict them); the prediction is the completion with the lowest mean
// loss, the lowest index on ties (llm.c's strict `<`). Accuracy = right predictions / examples.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

struct HellaSwagExample {
    int label = 0;
    std::vector<int> context;
    std::vector<std::vector<int>> completions;
    // Positions a row needs: the context and every completion token but the last (which predicts nothing).
    int row_tokens(int completion) const { return int(context.size() + completions[completion].size()) - 1; }
    int longest_row() const {
        int longest = 0;
        for (int c = 0; c < int(completions.size()); ++c) longest = std::max(longest, row_tokens(c));
        return longest;
    }
};

struct HellaSwagSet {
    std::string path;
    std::vector<HellaSwagExample> examples;
};

constexpr int32_t kHellaSwagMagic = 20240522;
constexpr int32_t kHellaSwagVersion = 1;
constexpr uint16_t kHellaSwagDelimiter = 65535;

// Reads and validates the whole file, every token below vocab_size (the model's; 65535 is the
// delimiter); throws std::runtime_error with one line naming the file, the example and the field.
inline HellaSwagSet read_hellaswag(const std::string& path, int vocab_size = kHellaSwagDelimiter) {
    const std::string where = "hellaswag: '" + path + "': ";
    const auto fail = [&](const std::string& why) { throw std::runtime_error(where + why); };
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open the file");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);
    if (bytes.size() < kHeaderBytes)
        fail("length " + std::to_string(bytes.size()) + " bytes is shorter than the " + std::to_string(kHeaderBytes) +
             "-byte header");
    int32_t header[256];
    std::memcpy(header, bytes.data(), kHeaderBytes);
    if (header[0] != kHellaSwagMagic)
        fail("magic " + std::to_string(header[0]) + ", expected " + std::to_string(kHellaSwagMagic) + " (an llm.c eval file)");
    if (header[1] != kHellaSwagVersion)
        fail("version " + std::to_string(header[1]) + ", expected " + std::to_string(kHellaSwagVersion));
    if (header[2] <= 0) fail("example count " + std::to_string(header[2]) + " is not positive");
    if ((bytes.size() - kHeaderBytes) % 2 != 0) fail("the body is not a whole number of uint16 values");

    std::vector<uint16_t> body((bytes.size() - kHeaderBytes) / 2);
    if (!body.empty()) std::memcpy(body.data(), bytes.data() + kHeaderBytes, body.size() * 2);  // (null when empty)
    HellaSwagSet set;
    set.path = path;
    size_t at = 0;  // in uint16 values
    int longest_bytes = 0;
    for (int i = 0; i < header[2]; ++i) {
        const size_t start = at;
        const std::string example = "example " + std::to_string(i) + " (byte " + std::to_string(kHeaderBytes + 2 * at) + "): ";
        // The next value of the example, or a "truncated" error naming what was expected.
        const auto next = [&](const char* field) -> int {
            if (at >= body.size())
                fail(example + "truncated: the file ends before its " + field + " (header: " + std::to_string(header[2]) +
                     " examples)");
            return body[at++];
        };
        const int delimiter = next("start delimiter");
        if (delimiter != kHellaSwagDelimiter)
            fail(example + "start delimiter " + std::to_string(delimiter) + ", expected 65535");
        const int length_bytes = next("length");
        const int index = next("index");
        if (index != i) fail(example + "index " + std::to_string(index) + ", expected " + std::to_string(i));
        HellaSwagExample e;
        e.label = next("label");
        const int completions = next("completion count");
        if (completions < 1) fail(example + "completion count is 0");
        if (e.label >= completions)
            fail(example + "label " + std::to_string(e.label) + " is not below the completion count " +
                 std::to_string(completions));
        const auto tokens = [&](const std::string& what, std::vector<int>& out) {
            const int n = next((what + " length").c_str());
            if (n == 0) fail(example + what + " length is 0");
            for (int k = 0; k < n; ++k) {
                out.push_back(next((what + " tokens").c_str()));
                if (out.back() >= vocab_size)
                    fail(example + what + " token " + std::to_string(out.back()) + " is outside the vocabulary [0, " +
                         std::to_string(vocab_size) + ")");
            }
        };
        tokens("context", e.context);
        e.completions.resize(completions);
        for (int c = 0; c < completions; ++c) tokens("completion " + std::to_string(c), e.completions[c]);
        const int actual_bytes = int(2 * (at - start));
        if (length_bytes != actual_bytes)
            fail(example + "length field " + std::to_string(length_bytes) + " bytes, but its fields take " +
                 std::to_string(actual_bytes));
        longest_bytes = std::max(longest_bytes, actual_bytes);
        set.examples.push_back(std::move(e));
    }
    if (at != body.size())
        fail(std::to_string(2 * (body.size() - at)) + " bytes after the " + std::to_string(header[2]) +
             " examples the header counts");
    if (header[3] != longest_bytes)
        fail("longest-example field " + std::to_string(header[3]) + " bytes, but the longest example takes " +
             std::to_string(longest_bytes));
    return set;
}

// Row `completion` of an example into T positions: inputs = context then completion (then 0), targets
// = the completion's tokens at the positions that predict them (context length - 1 onwards), -1
// elsewhere. False (row untouched) when the row needs more than T positions.
inline bool hellaswag_pack_row(const HellaSwagExample& e, int completion, int T, int* inputs, int* targets) {
    const std::vector<int>& ending = e.completions.at(size_t(completion));
    if (e.context.empty() || ending.empty())
        throw std::invalid_argument("hellaswag_pack_row: the context and the completion must not be empty");
    if (e.row_tokens(completion) > T) return false;
    const int context = int(e.context.size());
    std::fill(inputs, inputs + T, 0);
    std::fill(targets, targets + T, -1);
    std::copy(e.context.begin(), e.context.end(), inputs);
    for (int k = 0; k < int(ending.size()); ++k) {
        if (context + k < T) inputs[context + k] = ending[k];
        targets[context - 1 + k] = ending[k];
    }
    return true;
}

// Mean loss over a row's targeted positions (targets != -1): a completion's score.
inline double hellaswag_completion_loss(const float* losses, const int* targets, int T) {
    double sum = 0;
    int count = 0;
    for (int t = 0; t < T; ++t) {
        if (targets[t] == -1) continue;
        sum += losses[t];
        ++count;
    }
    return count > 0 ? sum / count : NAN;
}

// The completion with the lowest score; the lowest index on ties; NaN scores never win; -1 if all are NaN.
inline int hellaswag_prediction(const std::vector<double>& scores) {
    int best = -1;
    for (int c = 0; c < int(scores.size()); ++c)
        if (!std::isnan(scores[c]) && (best < 0 || scores[c] < scores[best])) best = c;
    return best;
}

struct HellaSwagResult {
    long long correct = 0;
    long long total = 0;    // examples scored
    long long skipped = 0;  // examples with a row longer than T
    double accuracy() const { return total > 0 ? double(correct) / double(total) : 0.0; }
};

// Per-token losses of B rows of T positions: forward_losses(inputs, targets, B, T, losses), all host
// arrays of B*T; losses where targets == -1 are ignored.
using HellaSwagForward = std::function<void(const int* inputs, const int* targets, int B, int T, float* losses)>;

// This rank's share of the set: examples rank, rank + world, ...; their rows (one per completion) are
// packed B to a forward pass (an example may straddle two passes; rows never see each other), padding
// rows having no targets. Rows take T_eval = the longest row of the set that fits T positions, not T:
// causal attention makes the positions after a row's end irrelevant to it, and it spares most of the
// work at long T. Examples with a row longer than T are skipped and counted. Sum the result over ranks.
inline HellaSwagResult hellaswag_evaluate(const HellaSwagSet& set, int B, int T, int rank, int world,
                                          const HellaSwagForward& forward_losses) {
    if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world)
        throw std::invalid_argument("hellaswag_evaluate: B = " + std::to_string(B) + ", T = " + std::to_string(T) +
                                    ", rank " + std::to_string(rank) + " of " + std::to_string(world) + " is not valid");
    int eval_T = 0;  // the same on every rank
    for (const HellaSwagExample& e : set.examples)
        if (e.longest_row() <= T) eval_T = std::max(eval_T, e.longest_row());
    HellaSwagResult result;
    struct Row {
        int example, completion;
    };
    std::vector<Row> rows;
    for (size_t i = size_t(rank); i < set.examples.size(); i += size_t(world)) {
        const HellaSwagExample& e = set.examples[i];
        if (e.longest_row() > T) {
            ++result.skipped;
            continue;
        }
        for (int c = 0; c < int(e.completions.size()); ++c) rows.push_back({int(i), c});
    }
    std::vector<std::vector<double>> scores(set.examples.size());
    const size_t BT = size_t(B) * eval_T;
    std::vector<int> inputs(BT), targets(BT);
    std::vector<float> losses(BT);
    for (size_t first = 0; first < rows.size(); first += size_t(B)) {
        std::fill(inputs.begin(), inputs.end(), 0);
        std::fill(targets.begin(), targets.end(), -1);
        const size_t count = std::min(rows.size() - first, size_t(B));
        for (size_t r = 0; r < count; ++r)
            hellaswag_pack_row(set.examples[rows[first + r].example], rows[first + r].completion, eval_T,
                               &inputs[r * eval_T], &targets[r * eval_T]);
        forward_losses(inputs.data(), targets.data(), B, eval_T, losses.data());
        for (size_t r = 0; r < count; ++r)
            scores[rows[first + r].example].push_back(
                hellaswag_completion_loss(&losses[r * eval_T], &targets[r * eval_T], eval_T));
    }
    for (size_t i = size_t(rank); i < set.examples.size(); i += size_t(world)) {
        if (scores[i].empty()) continue;  // skipped
        ++result.total;
        result.correct += hellaswag_prediction(scores[i]) == set.examples[i].label;
    }
    return result;
}
