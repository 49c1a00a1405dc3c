// Checkpoint files.
// 1. The model file in llm.c's format, so models interchange with llm.c (train_gpt2.cu,
//    gpt2_write_to_checkpoint / gpt2_build_from_checkpoint): 256 int32 header, then every parameter
//    tensor in a fixed order, float32 (version 3) or bf16 (version 5).
// 2. Our own versioned training-state file (step, FP32 master weights, Adam m and v unsharded, RNG
//    and data-loader position, the run config as JSON), written by several ranks into disjoint
//    ranges and completed by a ".done" marker.
// 3. The checkpoint directory policy: find the newest complete checkpoint, keep the last K.
// Every failure throws std::runtime_error with one line naming the function, the file and the field.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/checksum.h"
#include "host/model_config.h"

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian");

// An llm.c model file's header: the model's shape (host/model_config.h) and the file's precision.
// Constructed from both parts, never from a list of ints (whose order differs from the file's).
struct ModelHeader : GPT2Config {
    int version = 0;  // 3: fp32 parameters, 5: bf16
    ModelHeader() : GPT2Config{} {}
    ModelHeader(const GPT2Config& shape, int version) : GPT2Config(shape), version(version) {}
    bool operator==(const ModelHeader&) const = default;
};

struct TrainingState {
    int64_t step;
    uint64_t num_parameters;
    uint64_t rng[4];
    uint64_t loader_epoch, loader_shard, loader_sample;
    std::string meta_json;
    uint64_t writers = 1;  // ranks that write a range (one checksum record each); 0 read: a version-1 file
};

namespace checkpoint_internal {

constexpr int kModelMagic = 20240326;  // llm.c model file
constexpr int kModelVersionFp32 = 3;   // llm.c: 3 = fp32 parameters, padded vocab
constexpr int kModelVersionBf16 = 5;   // llm.c: 5 = bf16 parameters (layernorms too), padded vocab
constexpr size_t kModelHeaderInts = 256;
constexpr size_t kModelHeaderBytes = kModelHeaderInts * sizeof(int32_t);
// Header ints llm.c leaves zero: [8] the checksum kind (0: none, as llm.c writes; 1: CRC-32C),
// [9] the CRC-32C of the parameter bytes. llm.c reads ints 0-7 only, so files still interchange.
constexpr size_t kModelChecksumKindInt = 8, kModelChecksumInt = 9;
constexpr int32_t kModelChecksumCrc32c = 1;

constexpr uint64_t kStateMagic = 20261122;
constexpr uint64_t kStateVersion = 2;            // 2: a CRC-32C record per writer; 1 (read, unverified): none
constexpr uint64_t kStateVersionUnchecked = 1;
constexpr uint64_t kChecksumRecordWords = 5;     // begin, count, CRC-32C of its master, m and v bytes
constexpr size_t kStateHeaderWords = 256;
constexpr uint64_t kStateHeaderBytes = kStateHeaderWords * sizeof(uint64_t);
constexpr uint64_t kStateAlignment = 64;  // master/m/v start on a cache-line boundary
// Slots of the state header (uint64 each); unused slots are zero.
enum StateSlot : size_t {
    kMagic, kVersion, kHeaderBytes, kStep, kNumParameters, kRng0, kRng1, kRng2, kRng3,
    kLoaderEpoch, kLoaderShard, kLoaderSample, kMetaBytes, kMetaOffset, kMasterOffset, kMOffset,
    kVOffset, kFileBytes, kWriters, kChecksumOffset, kNumSlots
};
static_assert(kNumSlots <= kStateHeaderWords);

[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

inline std::string quote_path(const std::string& path) { return "'" + path + "'"; }

// Size arithmetic that reports overflow instead of wrapping (header fields come from files).
inline uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& context) {
    if (a != 0 && b > UINT64_MAX / a) fail(context + ": size overflows 64 bits");
    return a * b;
}
inline uint64_t checked_add(uint64_t a, uint64_t b, const std::string& context) {
    if (b > UINT64_MAX - a) fail(context + ": size overflows 64 bits");
    return a + b;
}
inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// A file descriptor that closes itself.
struct File {
    int fd = -1;
    File() = default;
    File(const std::string& fn, const std::string& path, int flags, mode_t mode = 0644) {
        do fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
        while (fd < 0 && errno == EINTR);
        if (fd < 0) fail(fn + ": cannot open " + quote_path(path) + ": " + std::strerror(errno));
    }
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    ~File() {
        if (fd >= 0) ::close(fd);
    }
};

inline uint64_t file_bytes(const std::string& fn, const File& f, const std::string& path) {
    struct stat st;
    if (::fstat(f.fd, &st) != 0) fail(fn + ": cannot stat " + quote_path(path) + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(fn + ": " + quote_path(path) + " is not a regular file");
    return uint64_t(st.st_size);
}

// pread/pwrite move at most ~2 GiB per call and may be interrupted: loop until done.
inline void read_exact(const std::string& fn, const File& f, const std::string& path, void* data, uint64_t bytes,
                       uint64_t offset, const std::string& what) {
    char* p = static_cast<char*>(data);
    for (uint64_t done = 0; done < bytes;) {
        ssize_t n = ::pread(f.fd, p + done, std::min<uint64_t>(bytes - done, 1ull << 30), off_t(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(fn + ": reading " + what + " from " + quote_path(path) + ": " + std::strerror(errno));
        if (n == 0) fail(fn + ": " + quote_path(path) + " ends inside " + what + " (truncated)");
        done += uint64_t(n);
    }
}
inline void write_exact(const std::string& fn, const File& f, const std::string& path, const void* data,
                        uint64_t bytes, uint64_t offset, const std::string& what) {
    const char* p = static_cast<const char*>(data);
    for (uint64_t done = 0; done < bytes;) {
        ssize_t n = ::pwrite(f.fd, p + done, std::min<uint64_t>(bytes - done, 1ull << 30), off_t(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail(fn + ": writing " + what + " to " + quote_path(path) + ": " + std::strerror(n < 0 ? errno : EIO));
        done += uint64_t(n);
    }
}

inline void sync_file(const std::string& fn, const File& f, const std::string& path) {
    if (::fsync(f.fd) != 0) fail(fn + ": fsync " + quote_path(path) + ": " + std::strerror(errno));
}
// A rename is durable only once the directory holding it is synced.
inline void sync_parent_directory(const std::string& fn, const std::string& path) {
    std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    File d(fn, dir, O_RDONLY | O_DIRECTORY);
    // Some file systems cannot sync a directory (EINVAL); their renames are as durable as they get.
    if (::fsync(d.fd) != 0 && errno != EINVAL) fail(fn + ": fsync directory " + quote_path(dir) + ": " + std::strerror(errno));
}
inline void rename_or_fail(const std::string& fn, const std::string& from, const std::string& to) {
    if (::rename(from.c_str(), to.c_str()) != 0)
        fail(fn + ": cannot rename " + quote_path(from) + " to " + quote_path(to) + ": " + std::strerror(errno));
}

// Writes a whole small file atomically: temp file, fsync, rename, directory fsync.
inline void write_file_atomically(const std::string& fn, const std::string& path, const void* data, uint64_t bytes) {
    const std::string tmp = path + ".tmp";
    try {
        File f(fn, tmp, O_WRONLY | O_CREAT | O_TRUNC);
        write_exact(fn, f, tmp, data, bytes, 0, "the file");
        sync_file(fn, f, tmp);
    } catch (...) {
        ::unlink(tmp.c_str());  // never leave a half-written temp behind; the old file is untouched
        throw;
    }
    rename_or_fail(fn, tmp, path);
    sync_parent_directory(fn, path);
}

inline size_t model_element_bytes(int version) { return version == kModelVersionBf16 ? 2 : 4; }

inline void validate_model_header(const std::string& fn, const std::string& where, const ModelHeader& h) {
    if (h.version != kModelVersionFp32 && h.version != kModelVersionBf16)
        fail(fn + ": " + where + "version " + std::to_string(h.version) + " is not 3 (fp32) or 5 (bf16)");
    if (const std::string problem = shape_problem(h); !problem.empty()) fail(fn + ": " + where + problem);
}

// The parameter count of a validated header (host/model_config.h), overflow reported under `context`.
inline uint64_t parameter_count(const std::string& context, const ModelHeader& h) {
    try {
        return gpt2_num_parameters(h);
    } catch (const std::overflow_error&) {
        fail(context + ": size overflows 64 bits");
    }
}

inline std::string state_marker_path(const std::string& path) { return path + ".done"; }
inline std::string state_tmp_path(const std::string& path) { return path + ".tmp"; }
// The marker names the file it completes, so a stale marker never validates a different file.
inline std::string state_marker_text(int64_t step, uint64_t bytes) {
    return "train_gpt state step=" + std::to_string(step) + " bytes=" + std::to_string(bytes) + "\n";
}

// The layout implied by the sizes: header | meta JSON | pad to 8 | checksum records (one per writer) |
// pad to 64 | master | m | v. With no writers (version 1) it is version 1's layout.
struct StateLayout {
    uint64_t meta_offset, checksum_offset, master_offset, m_offset, v_offset, file_bytes;
};
inline StateLayout state_layout(const std::string& context, uint64_t num_parameters, uint64_t meta_bytes,
                                uint64_t writers) {
    StateLayout l;
    l.meta_offset = kStateHeaderBytes;
    l.checksum_offset = align_up(checked_add(l.meta_offset, meta_bytes, context), sizeof(uint64_t));
    const uint64_t table_bytes = checked_mul(writers, kChecksumRecordWords * sizeof(uint64_t), context);
    l.master_offset = align_up(checked_add(l.checksum_offset, table_bytes, context), kStateAlignment);
    const uint64_t array_bytes = checked_mul(num_parameters, sizeof(float), context);
    l.m_offset = checked_add(l.master_offset, array_bytes, context);
    l.v_offset = checked_add(l.m_offset, array_bytes, context);
    l.file_bytes = checked_add(l.v_offset, array_bytes, context);
    return l;
}

struct StateHeader {
    uint64_t words[kStateHeaderWords];
    StateLayout layout;
};

// Reads and checks the header of an open state file (or its temp) against the file's real length.
inline StateHeader read_and_validate_state_header(const std::string& fn, const File& f, const std::string& path) {
    const uint64_t actual = file_bytes(fn, f, path);
    if (actual == 0) fail(fn + ": " + quote_path(path) + " is empty (0 bytes)");
    if (actual < kStateHeaderBytes)
        fail(fn + ": " + quote_path(path) + " is " + std::to_string(actual) + " bytes, shorter than the " +
             std::to_string(kStateHeaderBytes) + "-byte header (truncated)");
    StateHeader h;
    read_exact(fn, f, path, h.words, kStateHeaderBytes, 0, "the header");
    const uint64_t* w = h.words;
    const std::string at = fn + ": " + quote_path(path) + ": ";
    if (w[kMagic] != kStateMagic)
        fail(at + "bad magic " + std::to_string(w[kMagic]) + " (expected " + std::to_string(kStateMagic) +
             ": not a train_gpt state file)");
    if (w[kVersion] != kStateVersion && w[kVersion] != kStateVersionUnchecked)
        fail(at + "unsupported version " + std::to_string(w[kVersion]) + " (this build reads versions " +
             std::to_string(kStateVersionUnchecked) + " and " + std::to_string(kStateVersion) + ")");
    const bool checked = w[kVersion] == kStateVersion;
    if (checked && (w[kWriters] == 0 || w[kWriters] > (uint64_t(1) << 24)))
        fail(at + "writers " + std::to_string(w[kWriters]) + " is not in [1, 2^24]");
    if (!checked && (w[kWriters] != 0 || w[kChecksumOffset] != 0))
        fail(at + "version 1 with checksum slots set (corrupt header)");
    if (w[kHeaderBytes] != kStateHeaderBytes)
        fail(at + "header_bytes " + std::to_string(w[kHeaderBytes]) + " (expected " +
             std::to_string(kStateHeaderBytes) + ")");
    if (int64_t(w[kStep]) < 0) fail(at + "step " + std::to_string(int64_t(w[kStep])) + " is negative");
    if (w[kNumParameters] == 0) fail(at + "num_parameters is 0");
    if (w[kMetaBytes] > actual)
        fail(at + "meta_json size " + std::to_string(w[kMetaBytes]) + " exceeds the file size " + std::to_string(actual));
    h.layout = state_layout(at + "num_parameters " + std::to_string(w[kNumParameters]), w[kNumParameters],
                            w[kMetaBytes], w[kWriters]);
    const struct { const char* name; StateSlot slot; uint64_t value; } derived[] = {
        {"meta_offset", kMetaOffset, h.layout.meta_offset}, {"master_offset", kMasterOffset, h.layout.master_offset},
        {"m_offset", kMOffset, h.layout.m_offset},          {"v_offset", kVOffset, h.layout.v_offset},
        {"file_bytes", kFileBytes, h.layout.file_bytes},
        {"checksum_offset", kChecksumOffset, checked ? h.layout.checksum_offset : 0}};
    for (const auto& d : derived)
        if (w[d.slot] != d.value)
            fail(at + d.name + " " + std::to_string(w[d.slot]) + " disagrees with the sizes (expected " +
                 std::to_string(d.value) + ")");
    if (actual != h.layout.file_bytes)
        fail(at + "file is " + std::to_string(actual) + " bytes, the header says " + std::to_string(h.layout.file_bytes) +
             (actual < h.layout.file_bytes ? " (truncated)" : " (trailing bytes)"));
    return h;
}

inline void check_range(const std::string& fn, const std::string& path, uint64_t num_parameters, uint64_t begin,
                        uint64_t count) {
    if (begin > num_parameters || count > num_parameters - begin)
        fail(fn + ": " + quote_path(path) + ": range begin " + std::to_string(begin) + " count " + std::to_string(count) +
             " exceeds num_parameters " + std::to_string(num_parameters));
}

// Checks the arrays just read for [begin, begin + count) (null: not read) against the checksum records
// of every writer range that overlaps it. The non-empty records must tile [0, num_parameters) (else
// a writer's range is unaccounted for); a writer range that the read covers only in part is read
// whole for its checksum (a resume on another number of ranks).
inline void verify_state_range(const std::string& fn, const File& f, const std::string& path, const StateHeader& h,
                               uint64_t begin, uint64_t count, const std::array<const float*, 3>& arrays) {
    const uint64_t writers = h.words[kWriters], n = h.words[kNumParameters];
    std::vector<uint64_t> table(writers * kChecksumRecordWords);
    read_exact(fn, f, path, table.data(), table.size() * sizeof(uint64_t), h.layout.checksum_offset, "the checksum records");
    std::vector<const uint64_t*> records;
    for (uint64_t w = 0; w < writers; ++w)
        if (table[w * kChecksumRecordWords + 1] > 0) records.push_back(&table[w * kChecksumRecordWords]);
    std::sort(records.begin(), records.end(), [](const uint64_t* a, const uint64_t* b) { return a[0] < b[0]; });
    uint64_t covered = 0;
    for (const uint64_t* r : records) {
        if (r[0] != covered || r[1] > n - covered)
            fail(fn + ": " + quote_path(path) + ": the checksum records do not tile the parameters (a range at " +
                 std::to_string(r[0]) + " of " + std::to_string(r[1]) + " after " + std::to_string(covered) + ")");
        covered += r[1];
    }
    if (covered != n)
        fail(fn + ": " + quote_path(path) + ": the checksum records cover " + std::to_string(covered) + " of " +
             std::to_string(n) + " parameters (a writer's range is missing)");
    const char* names[3] = {"master weights", "Adam m", "Adam v"};
    const uint64_t offsets[3] = {h.layout.master_offset, h.layout.m_offset, h.layout.v_offset};
    std::vector<float> whole;
    for (const uint64_t* r : records) {
        if (r[0] >= begin + count || r[0] + r[1] <= begin) continue;  // no overlap with the read
        for (int a = 0; a < 3; ++a) {
            if (!arrays[a]) continue;
            const float* data = arrays[a] + (r[0] - std::min(r[0], begin));
            if (r[0] < begin || r[0] + r[1] > begin + count) {  // read only in part: read it whole
                whole.resize(r[1]);
                read_exact(fn, f, path, whole.data(), r[1] * sizeof(float), offsets[a] + r[0] * sizeof(float), names[a]);
                data = whole.data();
            }
            const uint32_t actual = crc32c(data, r[1] * sizeof(float)), recorded = uint32_t(r[2 + a]);
            if (actual != recorded) {
                char text[96];
                std::snprintf(text, sizeof text, "have CRC-32C %08x, the file records %08x", actual, recorded);
                fail(fn + ": " + quote_path(path) + ": " + names[a] + " [" + std::to_string(r[0]) + ", " +
                     std::to_string(r[0] + r[1]) + ") " + text + " (corrupt file)");
            }
        }
    }
}

}  // namespace checkpoint_internal

// The atomic whole-file write, for other small files too (autotune's picks, host/matmul_algos.cpp).
using checkpoint_internal::write_file_atomically;

// ------------------------------------------------------------------------------------------------
// llm.c model file

// The parameter count of a model file's header (host/model_config.h), after validating it.
inline size_t gpt2_parameter_count(const ModelHeader& h) {
    checkpoint_internal::validate_model_header("gpt2_parameter_count", "", h);
    return size_t(checkpoint_internal::parameter_count("gpt2_parameter_count", h));
}

// Writes the 256-int header (llm.c: [0] magic, [1] version, [2] maxT, [3] V, [4] L, [5] NH, [6] C,
// [7] Vp; ours: [8] 1 = CRC-32C, [9] the parameters' CRC-32C; the rest zero) and the parameters:
// float (version 3) or bf16 bits as uint16 (version 5).
// Atomic: a crash leaves either the old file or the new one, never a partial file under `path`.
inline void write_model_checkpoint(const std::string& path, const ModelHeader& h, const void* params, size_t count) {
    using namespace checkpoint_internal;
    const std::string fn = "write_model_checkpoint";
    validate_model_header(fn, quote_path(path) + ": ", h);
    const uint64_t expected = parameter_count(fn, h);
    if (count != expected)
        fail(fn + ": " + quote_path(path) + ": count " + std::to_string(count) + " != " + std::to_string(expected) +
             " parameters the header describes");
    if (params == nullptr) fail(fn + ": " + quote_path(path) + ": params is null");
    int32_t header[kModelHeaderInts] = {};
    header[0] = kModelMagic, header[1] = h.version, header[2] = h.max_seq_len, header[3] = h.vocab_size;
    header[4] = h.num_layers, header[5] = h.num_heads, header[6] = h.channels, header[7] = h.padded_vocab_size;
    const uint64_t param_bytes = checked_mul(count, model_element_bytes(h.version), fn);
    header[kModelChecksumKindInt] = kModelChecksumCrc32c;
    header[kModelChecksumInt] = std::bit_cast<int32_t>(crc32c(params, param_bytes));
    const std::string tmp = path + ".tmp";
    try {
        File f(fn, tmp, O_WRONLY | O_CREAT | O_TRUNC);
        write_exact(fn, f, tmp, header, kModelHeaderBytes, 0, "the header");
        write_exact(fn, f, tmp, params, param_bytes, kModelHeaderBytes, "the parameters");
        sync_file(fn, f, tmp);
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    rename_or_fail(fn, tmp, path);
    sync_parent_directory(fn, path);
}

// Validates magic, version (3 or 5), positive sizes, Vp >= V, and the exact file length.
inline ModelHeader read_model_header(const std::string& path) {
    using namespace checkpoint_internal;
    const std::string fn = "read_model_header";
    File f(fn, path, O_RDONLY);
    const uint64_t actual = file_bytes(fn, f, path);
    if (actual == 0) fail(fn + ": " + quote_path(path) + " is empty (0 bytes)");
    if (actual < kModelHeaderBytes)
        fail(fn + ": " + quote_path(path) + " is " + std::to_string(actual) + " bytes, shorter than the " +
             std::to_string(kModelHeaderBytes) + "-byte header (truncated)");
    int32_t header[kModelHeaderInts];
    read_exact(fn, f, path, header, kModelHeaderBytes, 0, "the header");
    if (header[0] != kModelMagic)
        fail(fn + ": " + quote_path(path) + ": bad magic " + std::to_string(header[0]) + " in header int 0 (expected " +
             std::to_string(kModelMagic) + ": not an llm.c model file)");
    ModelHeader h;  // llm.c: [1] version, [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp
    h.version = header[1], h.max_seq_len = header[2], h.vocab_size = header[3], h.num_layers = header[4];
    h.num_heads = header[5], h.channels = header[6], h.padded_vocab_size = header[7];
    validate_model_header(fn, quote_path(path) + ": header ", h);
    const std::string context = fn + ": " + quote_path(path);
    const uint64_t expected =
        checked_add(kModelHeaderBytes, checked_mul(parameter_count(context, h), model_element_bytes(h.version), context),
                    context);
    if (actual != expected)
        fail(context + ": file is " + std::to_string(actual) + " bytes, the header implies " + std::to_string(expected) +
             (actual < expected ? " (truncated)" : " (trailing bytes)"));
    return h;
}

// Reads all parameters into `params` (count elements of 4 or 2 bytes per h.version). The file is
// re-validated and must still match `h`; a file with a checksum (header int 8 = 1, ours) must match it.
inline void read_model_parameters(const std::string& path, const ModelHeader& h, void* params, size_t count) {
    using namespace checkpoint_internal;
    const std::string fn = "read_model_parameters";
    const ModelHeader on_disk = read_model_header(path);
    if (!(on_disk == h)) fail(fn + ": " + quote_path(path) + ": header differs from the one given (file changed?)");
    const uint64_t expected = parameter_count(fn, h);
    if (count != expected)
        fail(fn + ": " + quote_path(path) + ": count " + std::to_string(count) + " != " + std::to_string(expected) +
             " parameters in the file");
    if (params == nullptr) fail(fn + ": " + quote_path(path) + ": params is null");
    File f(fn, path, O_RDONLY);
    int32_t header[kModelHeaderInts];
    read_exact(fn, f, path, header, kModelHeaderBytes, 0, "the header");
    const uint64_t bytes = count * model_element_bytes(h.version);
    read_exact(fn, f, path, params, bytes, kModelHeaderBytes, "the parameters");
    const int32_t kind = header[kModelChecksumKindInt];
    if (kind == 0) return;  // an llm.c file: nothing to verify
    if (kind != kModelChecksumCrc32c)
        fail(fn + ": " + quote_path(path) + ": header int 8 (checksum kind) is " + std::to_string(kind) +
             ", not 0 (none) or 1 (CRC-32C)");
    const uint32_t recorded = std::bit_cast<uint32_t>(header[kModelChecksumInt]), actual = crc32c(params, bytes);
    if (actual != recorded) {
        char text[96];
        std::snprintf(text, sizeof text, "the parameters' CRC-32C is %08x, the header records %08x", actual, recorded);
        fail(fn + ": " + quote_path(path) + ": " + text + " (corrupt file)");
    }
}

// Reads the model file at `path` whole and checks it: header, length and (ours) the parameters' CRC-32C.
inline void verify_model_checkpoint(const std::string& path) {
    const ModelHeader h = read_model_header(path);
    const size_t n = gpt2_parameter_count(h);
    std::vector<unsigned char> params(n * checkpoint_internal::model_element_bytes(h.version));
    read_model_parameters(path, h, params.data(), n);
}

// All parameters of the model file at `path`, either precision, as floats (bf16 widens exactly). Its
// shape must be `shape`: a file of another model is refused naming both.
inline std::vector<float> read_model_parameters_as_float(const std::string& path, const GPT2Config& shape) {
    const ModelHeader h = read_model_header(path);
    if (!(GPT2Config(h) == shape)) {
        const auto text = [](const GPT2Config& c) {
            return "L=" + std::to_string(c.num_layers) + " C=" + std::to_string(c.channels) + " NH=" +
                   std::to_string(c.num_heads) + " V=" + std::to_string(c.vocab_size) + " maxT=" +
                   std::to_string(c.max_seq_len);
        };
        checkpoint_internal::fail("checkpoint '" + path + "': its model (" + text(h) + ") differs from the run's (" +
                                  text(shape) + ")");
    }
    const size_t n = gpt2_parameter_count(h);
    std::vector<float> params(n);
    if (h.version == checkpoint_internal::kModelVersionFp32) {
        read_model_parameters(path, h, params.data(), n);
        return params;
    }
    std::vector<uint16_t> bf16(n);
    read_model_parameters(path, h, bf16.data(), n);
    for (size_t i = 0; i < n; ++i) params[i] = std::bit_cast<float>(uint32_t(bf16[i]) << 16);
    return params;
}

// A preset's shape (host/model_config.h; tiny and mini sized for T), or else the shape in the llm.c
// checkpoint `model` names: then *checkpoint is set to its path ("" for a preset). A GPT-2 preset
// trained from scratch on sequences longer than GPT-2's 1024 (long contexts, --cp) gets a position
// table of T rows; a checkpoint's table is what it is.
inline GPT2Config model_config_of(const std::string& model, int T, std::string* checkpoint) {
    GPT2Config c;
    checkpoint->clear();
    if (gpt2_preset(model, &c)) {
        c.max_seq_len = std::max(c.max_seq_len, T);
        return c;
    }
    if (small_preset(model, T, &c)) return c;
    std::error_code ec;
    if (!std::filesystem::exists(model, ec))
        checkpoint_internal::fail("-e/--model '" + model + "' is neither a preset (" + kPresetNames +
                                  ") nor an existing model file");
    const ModelHeader h = read_model_header(model);  // throws naming the file and field
    *checkpoint = model;
    return h;
}

// ------------------------------------------------------------------------------------------------
// Training state (ours). Header: 256 uint64 slots (see StateSlot): magic 20261122, version 2, header
// bytes, step, num_parameters, rng[4], loader epoch/shard/sample, meta_json bytes, then the offsets of
// meta, master, m, v and the file length, the number of writers and the checksum records' offset, all
// recomputed and checked by the reader. Each writer's record {begin, count, CRC-32C of its master, m
// and v bytes} is verified by every read of that range. Version 1 (no records) is read unverified.
// Protocol: rank 0 begin_state_file; barrier; every rank write_state_range (disjoint ranges);
// barrier; rank 0 finish_state_file. The path exists only once complete; the ".done" marker is
// written last, so a state without its marker is incomplete.

inline void begin_state_file(const std::string& path, const TrainingState& s) {
    using namespace checkpoint_internal;
    const std::string fn = "begin_state_file";
    if (s.step < 0) fail(fn + ": " + quote_path(path) + ": step " + std::to_string(s.step) + " is negative");
    if (s.num_parameters == 0) fail(fn + ": " + quote_path(path) + ": num_parameters is 0");
    if (s.writers == 0 || s.writers > (uint64_t(1) << 24))
        fail(fn + ": " + quote_path(path) + ": writers " + std::to_string(s.writers) + " is not in [1, 2^24]");
    const StateLayout l = state_layout(fn + ": " + quote_path(path), s.num_parameters, s.meta_json.size(), s.writers);
    uint64_t w[kStateHeaderWords] = {};
    w[kMagic] = kStateMagic, w[kVersion] = kStateVersion, w[kHeaderBytes] = kStateHeaderBytes;
    w[kStep] = uint64_t(s.step), w[kNumParameters] = s.num_parameters;
    for (int i = 0; i < 4; i++) w[kRng0 + i] = s.rng[i];
    w[kLoaderEpoch] = s.loader_epoch, w[kLoaderShard] = s.loader_shard, w[kLoaderSample] = s.loader_sample;
    w[kMetaBytes] = s.meta_json.size(), w[kMetaOffset] = l.meta_offset, w[kMasterOffset] = l.master_offset;
    w[kMOffset] = l.m_offset, w[kVOffset] = l.v_offset, w[kFileBytes] = l.file_bytes;
    w[kWriters] = s.writers, w[kChecksumOffset] = l.checksum_offset;
    const std::string tmp = state_tmp_path(path);
    try {
        File f(fn, tmp, O_WRONLY | O_CREAT | O_TRUNC);
        write_exact(fn, f, tmp, w, kStateHeaderBytes, 0, "the header");
        write_exact(fn, f, tmp, s.meta_json.data(), s.meta_json.size(), l.meta_offset, "meta_json");
        if (::ftruncate(f.fd, off_t(l.file_bytes)) != 0)
            fail(fn + ": cannot size " + quote_path(tmp) + " to " + std::to_string(l.file_bytes) + " bytes: " +
                 std::strerror(errno));
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
}

// Writes elements [begin, begin+count) of master, m and v into the temp file begin_state_file made,
// and writer `writer`'s checksum record: the range and the CRC-32C of each array's bytes in it.
inline void write_state_range(const std::string& path, uint64_t num_parameters, uint64_t writer, uint64_t begin,
                              const float* master, const float* m, const float* v, uint64_t count) {
    using namespace checkpoint_internal;
    const std::string fn = "write_state_range";
    const std::string tmp = state_tmp_path(path);
    if (::access(tmp.c_str(), F_OK) != 0)
        fail(fn + ": " + quote_path(tmp) + " does not exist (call begin_state_file on rank 0 first, then a barrier)");
    File f(fn, tmp, O_RDWR);
    const StateHeader h = read_and_validate_state_header(fn, f, tmp);
    if (h.words[kNumParameters] != num_parameters)
        fail(fn + ": " + quote_path(tmp) + ": num_parameters " + std::to_string(num_parameters) + " != " +
             std::to_string(h.words[kNumParameters]) + " in the header");
    check_range(fn, tmp, num_parameters, begin, count);
    if (writer >= h.words[kWriters])
        fail(fn + ": " + quote_path(tmp) + ": writer " + std::to_string(writer) + " is not below the header's " +
             std::to_string(h.words[kWriters]) + " writers");
    if (count == 0) return;  // a rank may own no parameters: its record stays empty
    if (!master || !m || !v) fail(fn + ": " + quote_path(tmp) + ": master, m and v must all be non-null");
    const uint64_t skip = begin * sizeof(float), bytes = count * sizeof(float);
    write_exact(fn, f, tmp, master, bytes, h.layout.master_offset + skip, "master weights");
    write_exact(fn, f, tmp, m, bytes, h.layout.m_offset + skip, "Adam m");
    write_exact(fn, f, tmp, v, bytes, h.layout.v_offset + skip, "Adam v");
    const uint64_t record[kChecksumRecordWords] = {begin, count, crc32c(master, bytes), crc32c(m, bytes), crc32c(v, bytes)};
    write_exact(fn, f, tmp, record, sizeof record, h.layout.checksum_offset + writer * sizeof record, "the checksum record");
    sync_file(fn, f, tmp);  // durable before the barrier, also where ranks sit on other nodes
}

// Rank 0, after every rank's write_state_range: sync, rename into place, then write the marker.
inline void finish_state_file(const std::string& path) {
    using namespace checkpoint_internal;
    const std::string fn = "finish_state_file";
    const std::string tmp = state_tmp_path(path);
    StateHeader h;
    {
        File f(fn, tmp, O_RDWR);
        h = read_and_validate_state_header(fn, f, tmp);
        sync_file(fn, f, tmp);
    }
    rename_or_fail(fn, tmp, path);
    sync_parent_directory(fn, path);
    const std::string marker = state_marker_text(int64_t(h.words[kStep]), h.layout.file_bytes);
    write_file_atomically(fn, state_marker_path(path), marker.data(), marker.size());
}

// Validates the header, the exact file length and the ".done" marker (present and naming this file).
inline TrainingState read_state_header(const std::string& path) {
    using namespace checkpoint_internal;
    const std::string fn = "read_state_header";
    File f(fn, path, O_RDONLY);
    const StateHeader h = read_and_validate_state_header(fn, f, path);
    const uint64_t* w = h.words;
    const std::string marker_path = state_marker_path(path);
    if (::access(marker_path.c_str(), F_OK) != 0)
        fail(fn + ": " + quote_path(path) + " is incomplete: no marker " + quote_path(marker_path) +
             " (the writer did not finish)");
    const std::string expected_marker = state_marker_text(int64_t(w[kStep]), h.layout.file_bytes);
    {
        File mf(fn, marker_path, O_RDONLY);
        std::string marker(std::min<uint64_t>(file_bytes(fn, mf, marker_path), 256), '\0');
        read_exact(fn, mf, marker_path, marker.data(), marker.size(), 0, "the marker");
        if (marker != expected_marker)
            fail(fn + ": marker " + quote_path(marker_path) + " does not describe " + quote_path(path) + " (expected '" +
                 expected_marker.substr(0, expected_marker.size() - 1) + "'; stale marker?)");
    }
    TrainingState s;
    s.step = int64_t(w[kStep]);
    s.num_parameters = w[kNumParameters];
    for (int i = 0; i < 4; i++) s.rng[i] = w[kRng0 + i];
    s.loader_epoch = w[kLoaderEpoch], s.loader_shard = w[kLoaderShard], s.loader_sample = w[kLoaderSample];
    s.writers = w[kWriters];
    s.meta_json.resize(w[kMetaBytes]);
    read_exact(fn, f, path, s.meta_json.data(), s.meta_json.size(), h.layout.meta_offset, "meta_json");
    return s;
}

// Reads elements [begin, begin+count) of master, m and v; a null pointer skips that array (e.g. a
// ZeRO rank that needs all master weights but only its own shard of m and v).
inline void read_state_range(const std::string& path, const TrainingState& s, uint64_t begin, uint64_t count,
                             float* master, float* m, float* v) {
    using namespace checkpoint_internal;
    const std::string fn = "read_state_range";
    File f(fn, path, O_RDONLY);
    const StateHeader h = read_and_validate_state_header(fn, f, path);
    if (h.words[kNumParameters] != s.num_parameters || h.words[kMetaBytes] != s.meta_json.size() ||
        int64_t(h.words[kStep]) != s.step)
        fail(fn + ": " + quote_path(path) + ": header differs from the state given (file changed since read_state_header?)");
    check_range(fn, path, s.num_parameters, begin, count);
    const uint64_t skip = begin * sizeof(float), bytes = count * sizeof(float);
    if (master) read_exact(fn, f, path, master, bytes, h.layout.master_offset + skip, "master weights");
    if (m) read_exact(fn, f, path, m, bytes, h.layout.m_offset + skip, "Adam m");
    if (v) read_exact(fn, f, path, v, bytes, h.layout.v_offset + skip, "Adam v");
    if (h.words[kVersion] == kStateVersionUnchecked || count == 0) return;  // version 1: no checksums to verify
    verify_state_range(fn, f, path, h, begin, count, {master, m, v});
}

// ------------------------------------------------------------------------------------------------
// Checkpoint directory: <out>/model_<step>.bin, <out>/state_<step>.bin and state_<step>.bin.done,
// steps written with at least 8 digits.

inline std::string checkpoint_step_name(const char* prefix, int64_t step) {
    if (step < 0) checkpoint_internal::fail(std::string("checkpoint path: step ") + std::to_string(step) + " is negative");
    char name[64];
    std::snprintf(name, sizeof name, "%s_%08" PRId64 ".bin", prefix, step);
    return name;
}
inline std::string model_checkpoint_path(const std::string& out_dir, int64_t step) {
    return (std::filesystem::path(out_dir) / checkpoint_step_name("model", step)).string();
}
inline std::string state_checkpoint_path(const std::string& out_dir, int64_t step) {
    return (std::filesystem::path(out_dir) / checkpoint_step_name("state", step)).string();
}

namespace checkpoint_internal {

// The step in a name "<prefix>_<digits><suffix>", if it is exactly that.
inline std::optional<int64_t> parse_step(const std::string& name, const std::string& prefix, const std::string& suffix) {
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return std::nullopt;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    return std::stoll(digits);
}

// Every step that has any checkpoint file (model, state, marker or temp), newest first.
inline std::vector<int64_t> checkpoint_steps(const std::string& fn, const std::string& out_dir) {
    std::error_code ec;
    if (!std::filesystem::exists(out_dir, ec)) return {};  // no checkpoints written yet
    if (!std::filesystem::is_directory(out_dir, ec)) fail(fn + ": " + quote_path(out_dir) + " is not a directory");
    std::vector<int64_t> steps;
    std::filesystem::directory_iterator it(out_dir, ec);
    if (ec) fail(fn + ": cannot list " + quote_path(out_dir) + ": " + ec.message());
    for (const auto& entry : it) {
        const std::string name = entry.path().filename().string();
        for (const char* prefix : {"model_", "state_"})
            for (const char* suffix : {".bin", ".bin.done", ".bin.tmp", ".bin.done.tmp"})
                if (auto step = parse_step(name, prefix, suffix)) steps.push_back(*step);
    }
    std::sort(steps.rbegin(), steps.rend());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    return steps;
}

// Empty if the checkpoint at `step` is complete and valid; otherwise why not.
inline std::string checkpoint_problem(const std::string& out_dir, int64_t step) {
    try {
        const TrainingState s = read_state_header(state_checkpoint_path(out_dir, step));
        if (s.step != step) return "state file holds step " + std::to_string(s.step);
        const ModelHeader h = read_model_header(model_checkpoint_path(out_dir, step));
        if (parameter_count("", h) != s.num_parameters)
            return "model file has " + std::to_string(parameter_count("", h)) + " parameters, the state " +
                   std::to_string(s.num_parameters);
        return "";
    } catch (const std::exception& e) {
        return e.what();
    }
}

}  // namespace checkpoint_internal

// The steps, newest first, whose state has its marker and a valid header and length, and whose model
// file exists with a valid header and length; incomplete ones are skipped with a warning on stderr.
// (Contents are verified against their checksums when read: read_model_parameters, read_state_range.)
// At most `at_most` of them: the newest are found without reading the older ones.
inline std::vector<int64_t> complete_checkpoints(const std::string& out_dir, size_t at_most = SIZE_MAX) {
    using namespace checkpoint_internal;
    std::vector<int64_t> complete;
    for (int64_t step : checkpoint_steps("complete_checkpoints", out_dir)) {
        if (complete.size() == at_most) break;
        const std::string problem = checkpoint_problem(out_dir, step);
        if (problem.empty()) complete.push_back(step);
        else std::fprintf(stderr, "warning: complete_checkpoints: skipping step %" PRId64 ": %s\n", step, problem.c_str());
    }
    return complete;
}

// The highest complete step (complete_checkpoints), if any.
inline std::optional<int64_t> latest_complete_checkpoint(const std::string& out_dir) {
    const std::vector<int64_t> complete = complete_checkpoints(out_dir, 1);
    if (complete.empty()) return std::nullopt;
    return complete.front();
}

namespace checkpoint_internal {
// Every file of one step's checkpoint. The marker goes first: interrupted here, the step reads as
// incomplete, never as complete.
inline void remove_checkpoint_files(const std::string& fn, const std::string& out_dir, int64_t step) {
    const std::string state = state_checkpoint_path(out_dir, step), model = model_checkpoint_path(out_dir, step);
    for (const std::string& file : {state_marker_path(state), state_marker_path(state) + ".tmp", state,
                                    state_tmp_path(state), model, model + ".tmp"}) {
        std::error_code ec;
        std::filesystem::remove(file, ec);
        if (ec) fail(fn + ": cannot delete " + quote_path(file) + ": " + ec.message());
    }
}
}  // namespace checkpoint_internal

// The bytes one checkpoint takes on disk: the model file (parameter_bytes each) and the state file
// (FP32 master weights and both moments, its header and metadata), for the free-space check.
inline uint64_t checkpoint_bytes(uint64_t num_parameters, uint64_t parameter_bytes, uint64_t meta_bytes,
                                 uint64_t writers) {
    using namespace checkpoint_internal;
    return kModelHeaderBytes + num_parameters * parameter_bytes +
           state_layout("checkpoint_bytes", num_parameters, meta_bytes, writers).file_bytes;
}

// Deletes every file of one step's checkpoint (complete or not): a write that failed leaves none.
inline void remove_checkpoint(const std::string& out_dir, int64_t step) {
    checkpoint_internal::remove_checkpoint_files("remove_checkpoint", out_dir, step);
}

// Keeps the newest `keep_last` complete checkpoints and deletes every checkpoint file of older steps
// (complete or not); never touches steps newer than the oldest kept one, so the newest complete
// checkpoint and any write in progress survive. keep_last <= 0 keeps everything.
inline void remove_old_checkpoints(const std::string& out_dir, int keep_last) {
    using namespace checkpoint_internal;
    const std::string fn = "remove_old_checkpoints";
    if (keep_last <= 0) return;
    const std::vector<int64_t> steps = checkpoint_steps(fn, out_dir);
    int complete = 0;
    std::optional<int64_t> oldest_kept;
    for (int64_t step : steps) {
        if (complete == keep_last) break;
        if (checkpoint_problem(out_dir, step).empty()) complete++, oldest_kept = step;
    }
    if (!oldest_kept) return;  // no complete checkpoint: delete nothing
    for (int64_t step : steps)
        if (step < *oldest_kept) remove_checkpoint_files(fn, out_dir, step);
}

// Deletes every checkpoint file in out_dir (a fresh run started with --overwrite).
inline void remove_all_checkpoints(const std::string& out_dir) {
    using namespace checkpoint_internal;
    for (int64_t step : checkpoint_steps("remove_all_checkpoints", out_dir))
        remove_checkpoint_files("remove_all_checkpoints", out_dir, step);
}
