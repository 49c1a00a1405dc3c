// The algorithms --matmul-autotune picked, one per GEMM shape, in a JSON file: a later run that reads
// it takes the same algorithms without timing anything, so its results have the same bits. Timing
// picks differ between runs (kernels/matmul.cuh, fastest_candidate), and with them the last bits of
// every product; a resume (-y) that timed the candidates again would leave the interrupted run's
// path. The run's output dir keeps the file (matmul_algos.json; per rank, matmul_algos.rank<r>.json),
// so a resume reads it; --matmul-algos FILE names another.
//
// cuBLASLt's cublasLtMatmulAlgo_t "can be trivially serialized and later restored for use with the
// same version of cuBLAS library" (cublasLt.h): each pick is its 64 bytes, with the shape it was
// timed for. The file names the library's version, the device and the precision it was written with;
// a run on another of any of these times again and rewrites it.
//
// {"format": "train_gpt matmul algorithms 1", "library": "cuBLASLt 130100", "device": "NVIDIA H100 ...",
//  "precision": "bf16", "picks": [{"transa": 1, "transb": 0, "m": 768, ..., "algo": "<128 hex digits>"}]}
// The JSON work is in host/matmul_algos.cpp (the host library); the key fields are matmul.cuh's PlanKey.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

inline constexpr const char* kMatmulAlgosFormat = "train_gpt matmul algorithms 1";

// PlanKey's fields (kernels/matmul.cuh), in its order: what decides a GEMM's algorithm.
inline constexpr const char* kMatmulPlanKeyFields[] = {"transa", "transb",  "m",         "n",        "k",       "lda",
                                                       "ldb",    "ldd",     "accumulate", "epilogue", "bias_type",
                                                       "align_a", "align_b", "align_d",   "align_bias", "align_aux"};
inline constexpr size_t kMatmulPlanKeyFieldCount = std::size(kMatmulPlanKeyFields);

struct MatmulAlgoPick {
    std::array<int64_t, kMatmulPlanKeyFieldCount> key{};
    std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t::data
};

// What a file's picks hold for: they are valid only with the same library, device and precision.
struct MatmulAlgoOrigin {
    std::string library, device, precision;
    bool operator==(const MatmulAlgoOrigin&) const = default;
};

struct MatmulAlgos {
    MatmulAlgoOrigin origin;
    std::vector<MatmulAlgoPick> picks;
};

// Throws std::runtime_error, one line naming the file and the field, for a file that does not read
// or is not such a file.
MatmulAlgos read_matmul_algos(const std::string& path);
// Atomically (host/checkpoint.h's write_file_atomically: a temp file, fsync, rename), so a reader never
// sees half a file; throws on failure, naming the file.
void write_matmul_algos(const std::string& path, const MatmulAlgos& algos);

// The file of this rank: `path` in a world of one, else "<stem>.rank<r><ext>" (matmul_algos.rank3.json),
// since ranks time their GEMMs apart and a pipeline stage's shapes are its own.
inline std::string matmul_algos_path_of_rank(const std::string& path, int rank, int world_size) {
    if (world_size <= 1) return path;
    const size_t slash = path.find_last_of('/'), dot = path.find_last_of('.');
    const size_t name = slash == std::string::npos ? 0 : slash + 1;  // a leading dot starts a name, not an extension
    const bool has_ext = dot != std::string::npos && dot > name;
    const std::string stem = has_ext ? path.substr(0, dot) : path, ext = has_ext ? path.substr(dot) : "";
    return stem + ".rank" + std::to_string(rank) + ext;
}
