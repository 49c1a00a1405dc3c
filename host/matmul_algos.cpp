// The autotuned matmul algorithms' file (host/matmul_algos.h): reading, checking and writing its JSON.
#include "host/matmul_algos.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "host/checkpoint.h"  // write_file_atomically

namespace {

// An algorithm as 8 words of 16 hex digits each, the first word first.
std::string algo_hex(const std::array<uint64_t, 8>& algo) {
    std::string text;
    for (uint64_t word : algo) {
        char digits[17];
        std::snprintf(digits, sizeof digits, "%016llx", (unsigned long long)word);
        text += digits;
    }
    return text;
}

bool parse_algo_hex(const std::string& text, std::array<uint64_t, 8>* algo) {
    if (text.size() != 8 * 16) return false;
    for (size_t w = 0; w < 8; ++w) {
        uint64_t word = 0;
        for (size_t i = 0; i < 16; ++i) {
            const char c = text[w * 16 + i];
            const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (digit < 0) return false;
            word = word << 4 | uint64_t(digit);
        }
        (*algo)[w] = word;
    }
    return true;
}

}  // namespace

MatmulAlgos read_matmul_algos(const std::string& path) {
    const auto fail = [&](const std::string& why) { return std::runtime_error("matmul algorithms '" + path + "': " + why); };
    std::ifstream in(path);
    if (!in) throw fail("cannot open the file");
    nlohmann::json root;
    try {
        root = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw fail(std::string("not valid JSON: ") + e.what());
    }
    if (!root.is_object()) throw fail("expects a JSON object");
    const auto text_field = [&](const nlohmann::json& object, const char* name, const std::string& where) {
        if (!object.contains(name) || !object[name].is_string()) throw fail(where + name + ": missing or not a string");
        return object[name].get<std::string>();
    };
    if (const std::string format = text_field(root, "format", ""); format != kMatmulAlgosFormat)
        throw fail("format: '" + format + "', expected '" + kMatmulAlgosFormat + "'");
    MatmulAlgos algos;
    algos.origin = {text_field(root, "library", ""), text_field(root, "device", ""), text_field(root, "precision", "")};
    if (!root.contains("picks") || !root["picks"].is_array()) throw fail("picks: missing or not an array");
    for (size_t i = 0; i < root["picks"].size(); ++i) {
        const nlohmann::json& entry = root["picks"][i];
        const std::string where = "picks[" + std::to_string(i) + "].";
        if (!entry.is_object()) throw fail("picks[" + std::to_string(i) + "]: not an object");
        MatmulAlgoPick pick;
        for (size_t f = 0; f < kMatmulPlanKeyFieldCount; ++f) {
            const char* name = kMatmulPlanKeyFields[f];
            // Every key field is an int or a uint32 in matmul.cuh's PlanKey. (nlohmann reads a non-negative
            // integer as unsigned: 2^64 - 1 taken as int64 would be -1.)
            const bool fits = entry.contains(name) && entry[name].is_number_integer() &&
                              (entry[name].is_number_unsigned()
                                   ? entry[name].get<uint64_t>() <= std::numeric_limits<uint32_t>::max()
                                   : entry[name].get<int64_t>() >= std::numeric_limits<int32_t>::min());
            if (!fits) throw fail(where + name + ": missing or not a 32-bit integer");
            pick.key[f] = entry[name].get<int64_t>();
        }
        if (!parse_algo_hex(text_field(entry, "algo", where), &pick.algo))
            throw fail(where + "algo: expects 128 lower-case hex digits (cublasLtMatmulAlgo_t's 64 bytes)");
        algos.picks.push_back(pick);
    }
    return algos;
}

void write_matmul_algos(const std::string& path, const MatmulAlgos& algos) {
    nlohmann::json picks = nlohmann::json::array();
    for (const MatmulAlgoPick& pick : algos.picks) {
        nlohmann::json entry = nlohmann::json::object();
        for (size_t f = 0; f < kMatmulPlanKeyFieldCount; ++f) entry[kMatmulPlanKeyFields[f]] = pick.key[f];
        entry["algo"] = algo_hex(pick.algo);
        picks.push_back(entry);
    }
    const nlohmann::json root = {{"format", kMatmulAlgosFormat},
                                 {"library", algos.origin.library},
                                 {"device", algos.origin.device},
                                 {"precision", algos.origin.precision},
                                 {"picks", picks}};
    const std::string text = root.dump(1) + "\n";
    write_file_atomically("matmul algorithms '" + path + "'", path, text.data(), text.size());
}
