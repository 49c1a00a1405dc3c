// Reader for the reference fixtures that dev/gpt2_reference.py writes (format: its docstring and
// dev/README.md). Host-only; every malformed file is a std::runtime_error naming file and field.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

static_assert(std::endian::native == std::endian::little, "fixtures are little-endian");

inline constexpr int32_t kFixtureMagic = 20261121;
inline constexpr int32_t kFixtureVersion = 1;
inline constexpr int kFixtureHeaderInts = 256;
enum class FixtureDType : int32_t { f32 = 0, i32 = 1 };

struct FixtureTensor {
    FixtureDType dtype = FixtureDType::f32;
    std::vector<int64_t> dims;  // empty for a scalar
    std::vector<float> f32;     // filled when dtype == f32
    std::vector<int32_t> i32;   // filled when dtype == i32
    size_t numel() const {
        size_t n = 1;
        for (int64_t d : dims) n *= size_t(d);
        return n;
    }
};

struct FixtureConfig {
    int L = 0, C = 0, NH = 0, V = 0, Vp = 0, maxT = 0, B = 0, T = 0;
};

struct Fixture {
    std::string path;
    FixtureConfig config;
    nlohmann::json meta;                          // the whole metadata JSON
    std::vector<std::string> names;               // tensor names in file order
    std::map<std::string, FixtureTensor> tensors;

    const FixtureTensor& at(const std::string& name) const {
        auto it = tensors.find(name);
        if (it == tensors.end()) throw std::runtime_error("fixture " + path + ": no tensor '" + name + "'");
        return it->second;
    }
};

// The GPT-2 parameter tensors in llm.c's checkpoint order, Linear weights as (out, in).
inline std::vector<std::pair<std::string, std::vector<int64_t>>> gpt2_parameter_shapes(const FixtureConfig& c) {
    const int64_t L = c.L, C = c.C;
    return {{"wte", {c.Vp, C}},        {"wpe", {c.maxT, C}},     {"ln1w", {L, C}},  {"ln1b", {L, C}},
            {"qkvw", {L, 3 * C, C}},   {"qkvb", {L, 3 * C}},     {"attprojw", {L, C, C}},
            {"attprojb", {L, C}},      {"ln2w", {L, C}},         {"ln2b", {L, C}},  {"fcw", {L, 4 * C, C}},
            {"fcb", {L, 4 * C}},       {"fcprojw", {L, C, 4 * C}}, {"fcprojb", {L, C}},
            {"lnfw", {C}},             {"lnfb", {C}}};
}

namespace fixture_detail {

// Reads the file's bytes front to back; running out names the field that was being read.
struct Cursor {
    const std::string& path;
    const std::vector<char>& bytes;
    size_t pos = 0;

    [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
        throw std::runtime_error("fixture " + path + ": " + field + ": " + problem);
    }
    const char* take(size_t n, const std::string& field) {
        if (n > bytes.size() - pos)
            fail(field, "file ends at byte " + std::to_string(bytes.size()) + ", needs " + std::to_string(n) +
                            " bytes from byte " + std::to_string(pos) + " (truncated?)");
        const char* p = bytes.data() + pos;
        pos += n;
        return p;
    }
    template <typename T> T read(const std::string& field) {
        T value;
        std::memcpy(&value, take(sizeof(T), field), sizeof(T));
        return value;
    }
};

inline int config_int(const Cursor& in, const nlohmann::json& config, const char* key) {
    auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > INT32_MAX)
        in.fail(std::string("metadata config.") + key, "missing or not a positive 32-bit integer");
    return it->get<int>();
}

}  // namespace fixture_detail

// Parses a whole fixture file's bytes; `path` only names it in messages.
inline Fixture parse_fixture(const std::vector<char>& bytes, const std::string& path) {
    fixture_detail::Cursor in{path, bytes};

    int32_t header[kFixtureHeaderInts];
    std::memcpy(header, in.take(sizeof(header), "header"), sizeof(header));
    if (header[0] != kFixtureMagic)
        in.fail("header magic", "expected " + std::to_string(kFixtureMagic) + ", got " + std::to_string(header[0]));
    if (header[1] != kFixtureVersion)
        in.fail("header version", "expected " + std::to_string(kFixtureVersion) + ", got " + std::to_string(header[1]));
    const int32_t tensor_count = header[2], meta_length = header[3];
    if (tensor_count < 0) in.fail("header tensor count", "negative: " + std::to_string(tensor_count));
    if (meta_length < 0) in.fail("header metadata length", "negative: " + std::to_string(meta_length));
    for (int i = 4; i < kFixtureHeaderInts; ++i)
        if (header[i] != 0) in.fail("header[" + std::to_string(i) + "]", "reserved, must be 0");

    Fixture fx;
    fx.path = path;
    const char* meta_text = in.take(size_t(meta_length), "metadata JSON");
    fx.meta = nlohmann::json::parse(meta_text, meta_text + meta_length, nullptr, /*allow_exceptions=*/false);
    if (fx.meta.is_discarded() || !fx.meta.is_object()) in.fail("metadata JSON", "not a JSON object");
    if (!fx.meta.contains("config") || !fx.meta["config"].is_object()) in.fail("metadata config", "missing");
    const nlohmann::json& config = fx.meta["config"];
    fx.config = {fixture_detail::config_int(in, config, "L"),    fixture_detail::config_int(in, config, "C"),
                 fixture_detail::config_int(in, config, "NH"),   fixture_detail::config_int(in, config, "V"),
                 fixture_detail::config_int(in, config, "Vp"),   fixture_detail::config_int(in, config, "maxT"),
                 fixture_detail::config_int(in, config, "B"),    fixture_detail::config_int(in, config, "T")};

    for (int32_t t = 0; t < tensor_count; ++t) {
        const std::string record = "tensor record " + std::to_string(t);
        const int32_t name_length = in.read<int32_t>(record + " name length");
        if (name_length <= 0 || name_length > 1024)
            in.fail(record + " name length", "must be in [1, 1024], got " + std::to_string(name_length));
        const char* name_bytes = in.take(size_t(name_length), record + " name");
        std::string name(name_bytes, size_t(name_length));
        for (char ch : name)
            if (ch < 0x21 || ch > 0x7e) in.fail(record + " name", "not printable ASCII");
        const std::string field = "tensor '" + name + "'";
        if (fx.tensors.count(name)) in.fail(field, "appears twice");

        FixtureTensor tensor;
        const int32_t dtype = in.read<int32_t>(field + " dtype");
        if (dtype != int32_t(FixtureDType::f32) && dtype != int32_t(FixtureDType::i32))
            in.fail(field + " dtype", "expected 0 (float32) or 1 (int32), got " + std::to_string(dtype));
        tensor.dtype = FixtureDType(dtype);
        const int32_t ndim = in.read<int32_t>(field + " ndim");
        if (ndim < 0 || ndim > 8) in.fail(field + " ndim", "must be in [0, 8], got " + std::to_string(ndim));
        // Element count checked against the bytes left as it grows, so it cannot overflow.
        const size_t max_elements = (bytes.size() - in.pos) / 4;
        size_t numel = 1;
        for (int32_t d = 0; d < ndim; ++d) {
            const int64_t dim = in.read<int64_t>(field + " dims");
            if (dim < 0) in.fail(field + " dims", "negative dimension " + std::to_string(dim));
            tensor.dims.push_back(dim);
            if (dim != 0 && numel > max_elements / size_t(dim)) numel = max_elements + 1;  // saturate
            else numel *= size_t(dim);
        }
        const char* data = in.take(numel * 4, field + " data");
        if (tensor.dtype == FixtureDType::f32) {
            tensor.f32.resize(numel);
            std::memcpy(tensor.f32.data(), data, numel * 4);
        } else {
            tensor.i32.resize(numel);
            std::memcpy(tensor.i32.data(), data, numel * 4);
        }
        fx.names.push_back(name);
        fx.tensors.emplace(name, std::move(tensor));
    }
    if (in.pos != bytes.size())
        in.fail("file length", std::to_string(bytes.size() - in.pos) + " bytes after the last tensor record");
    return fx;
}

inline Fixture load_fixture(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw std::runtime_error("fixture " + path + ": cannot open the file");
    return parse_fixture(std::vector<char>(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()), path);
}
