// Sampling and generation on the host: how the next token is drawn from one position's logits
// (temperature, top-k, nucleus top-p), where a prompt comes from (text through data/encode.py, or
// token ids), and the generation loop over a model that returns the logits after each new token.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "host/rng.h"

extern char** environ;

struct SamplingSettings {
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0: all tokens
    float top_p = 1.0f;        // 1: all tokens (of the top k)
};

// The sampler's random numbers for a run's --seed (its own stream: initialization draws from another).
inline Rng sampling_rng(int64_t seed) { return Rng(uint64_t(seed) ^ 0x5A4D504C45ull); }

// The next token from one position's logits (the real vocabulary). Temperature 0 takes the most likely
// token (the first of equals) and draws nothing. Otherwise: divide by the temperature, keep the top_k
// largest (0: all), then the fewest most likely whose probabilities reach top_p (Holtzman et al. 2020,
// "The Curious Case of Neural Text Degeneration", nucleus sampling; 1: all), and draw from their
// softmax with one number of `rng`.
inline int sample_from_logits(const std::vector<float>& logits, const SamplingSettings& s, Rng& rng) {
    const int V = int(logits.size());
    if (s.temperature <= 0.0f) return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<std::pair<float, int>> scored(V);
    for (int v = 0; v < V; ++v) scored[v] = {logits[v] / s.temperature, v};
    if (s.top_k > 0 && s.top_k < V) {
        std::partial_sort(scored.begin(), scored.begin() + s.top_k, scored.end(), std::greater<>());
        scored.resize(s.top_k);
    }
    float max_logit = -INFINITY;
    for (auto& [logit, v] : scored) max_logit = std::max(max_logit, logit);
    if (s.top_p < 1.0f) {
        // Most likely first, ties by token id, so the kept set does not depend on the sort's whims.
        std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        double all = 0;
        for (auto& [logit, v] : scored) all += std::exp(double(logit - max_logit));
        double kept = 0;
        size_t n = 0;
        while (n < scored.size() && (n == 0 || kept < double(s.top_p) * all)) kept += std::exp(double(scored[n++].first - max_logit));
        scored.resize(n);
    }
    double total = 0;
    for (auto& [logit, v] : scored) total += std::exp(double(logit - max_logit));
    double draw = rng.uniform() * total;
    for (auto& [logit, v] : scored) {
        draw -= std::exp(double(logit - max_logit));
        if (draw <= 0) return v;
    }
    return scored.back().second;
}

// --prompt-ids "15496, 11,995": the ids, each in [0, vocab_size).
inline std::vector<int> parse_token_ids(const std::string& text, int vocab_size) {
    std::vector<int> ids;
    size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (text[i] == ',' || std::isspace(static_cast<unsigned char>(text[i])))) ++i;
        if (i == text.size()) break;
        size_t end = i;
        while (end < text.size() && text[end] != ',' && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
        const std::string item = text.substr(i, end - i);
        char* stop = nullptr;
        errno = 0;
        const long id = std::strtol(item.c_str(), &stop, 10);
        if (*stop != '\0' || errno != 0 || id < 0 || id >= vocab_size)
            throw std::runtime_error("--prompt-ids: '" + item + "' is not a token id in [0, " + std::to_string(vocab_size) + ")");
        ids.push_back(int(id));
        i = end;
    }
    if (ids.empty()) throw std::runtime_error("--prompt-ids: no token ids in '" + text + "'");
    return ids;
}

// data/encode.py: under $TRAIN_GPT_ROOT, else beside the running program or up to two folders above it
// (the repository root holds the root copies; build/cpu/ the built ones). "" when none is found.
inline std::string find_prompt_encoder() {
    namespace fs = std::filesystem;
    std::vector<fs::path> roots;
    if (const char* root = std::getenv("TRAIN_GPT_ROOT")) roots.emplace_back(root);
    std::error_code error;
    const fs::path exe = fs::read_symlink("/proc/self/exe", error);
    if (!error)
        for (fs::path dir = exe.parent_path(); roots.size() < 4 && !dir.empty(); dir = dir.parent_path()) {
            roots.push_back(dir);
            if (dir == dir.root_path()) break;
        }
    for (const fs::path& root : roots)
        if (fs::is_regular_file(root / "data" / "encode.py", error)) return (root / "data" / "encode.py").string();
    return "";
}

// The GPT-2 BPE ids of `text`, from data/encode.py (tiktoken over the BPE files data/prepare.py uses,
// so a prompt is encoded exactly as the training data was). Runs `python3 encode.py TEXT` directly,
// with no shell in between to misread the text; its own one-line error reaches stderr.
inline std::vector<int> encode_prompt(const std::string& text, int vocab_size) {
    const std::string encoder = find_prompt_encoder();
    if (encoder.empty())
        throw std::runtime_error("--prompt: data/encode.py not found (set TRAIN_GPT_ROOT to the repository, or give --prompt-ids)");
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error(std::string("--prompt: pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::string python = "python3", script = encoder, argument = text;
    char* argv[] = {python.data(), script.data(), argument.data(), nullptr};
    pid_t pid = 0;
    const int spawned = posix_spawnp(&pid, "python3", &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    std::string printed;
    if (spawned == 0) {
        char buffer[4096];
        for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) != 0;) {
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) break;
            printed.append(buffer, size_t(n));
        }
    }
    close(out[0]);
    int status = 0;
    if (spawned != 0) throw std::runtime_error(std::string("--prompt: cannot run python3: ") + std::strerror(spawned));
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error("--prompt: '" + encoder + "' failed (see its message above; it needs tiktoken: "
                                 "scripts/install_python_deps.sh), or give --prompt-ids");
    return parse_token_ids(printed, vocab_size);
}

// The logits (real vocabulary) after the last of `tokens`, for a model that has already seen all but
// the last `fresh` of them (one with a key/value cache runs only those; one without, all of them).
using NextTokenLogits = std::function<std::vector<float>(const std::vector<int>& tokens, int fresh)>;

// Up to `count` tokens after `context`, each drawn from the logits after the tokens before it; stops
// after an `eot` token (a new, unrelated document would follow). `on_token` sees each as it comes.
inline std::vector<int> generate_tokens(const NextTokenLogits& next, std::vector<int> context, int count, int eot,
                                        const SamplingSettings& settings, Rng& rng,
                                        const std::function<void(int)>& on_token = {}) {
    std::vector<int> generated;
    int fresh = int(context.size());
    for (int i = 0; i < count; ++i) {
        const int token = sample_from_logits(next(context, fresh), settings, rng);
        generated.push_back(token);
        if (on_token) on_token(token);
        if (token == eot) break;
        context.push_back(token);
        fresh = 1;
    }
    return generated;
}
