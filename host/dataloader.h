// Token shards in llm.c's format, served as (inputs, targets) batches for data-parallel training.
//
// A shard (llm.c dev/data/data_common.py, write_datafile, "gpt-2"): a header of 256 int32 ([0] magic
// 20240520, [1] version 1, [2] token count), then that many uint16 tokens. Documents are packed back
// to back, separated by EOT (50256), so a sample is simply a window of T+1 consecutive tokens:
// inputs are its first T, targets its last T. Sample i of a shard starts at token i*T.
//
// An epoch is one sequence of samples: the shards in an order, each shard's samples in an order
// (seeded permutations of (seed, epoch) when shuffling, file order otherwise). Every rank computes
// the same sequence, cut into groups of B samples dealt round-robin: step s gives rank r the group
// s*world_size + r. So a step reads B*world_size consecutive samples of the sequence, each once (a
// group may straddle two shards), and the last < B*world_size samples of an epoch are skipped (a
// different tail every epoch when shuffling). The position is the step's, identical on all ranks.
// Shards are read lazily: one open file, each sample read where it lies. check_tokens() scans every
// token once before training, so a token outside the vocabulary is found at start, by shard and index.
#pragma once

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "host/rng.h"

struct DataLoaderPosition {
    uint64_t epoch = 0;
    uint64_t shard = 0;   // index into the epoch's shard order (not the file index)
    uint64_t sample = 0;  // index into that shard's sample order
    bool operator==(const DataLoaderPosition&) const = default;
};

// Whether any file matches the glob `pattern` (what the DataLoader would open).
inline bool any_file_matches(const std::string& pattern) {
    glob_t matches{};
    const int status = glob(pattern.c_str(), 0, nullptr, &matches);
    const bool any = status == 0 && matches.gl_pathc > 0;
    globfree(&matches);
    return any;
}

class DataLoader {
public:
    static constexpr int32_t kMagic = 20240520;
    static constexpr int32_t kVersion = 1;
    static constexpr int64_t kHeaderBytes = 256 * sizeof(int32_t);

    DataLoader(const std::string& pattern, int B, int T, int rank, int world_size, uint64_t seed, bool shuffle)
        : B_(B), T_(T), rank_(rank), world_size_(world_size), seed_(seed), shuffle_(shuffle) {
        if (B <= 0) fail("DataLoader: B must be positive, got " + std::to_string(B));
        if (T <= 0) fail("DataLoader: T must be positive, got " + std::to_string(T));
        if (world_size <= 0) fail("DataLoader: world_size must be positive, got " + std::to_string(world_size));
        if (rank < 0 || rank >= world_size)
            fail("DataLoader: rank " + std::to_string(rank) + " is outside [0, world_size " +
                 std::to_string(world_size) + ")");
        files_ = expand_glob(pattern);
        uint64_t total_samples = 0;
        for (const std::string& file : files_) {
            const uint64_t tokens = validate_shard(file);
            total_tokens_ += tokens;
            shard_samples_.push_back((tokens - 1) / T_);  // the last window needs its T+1-th token
            total_samples += shard_samples_.back();
        }
        if (total_samples < step_samples())
            fail("DataLoader: '" + pattern + "' holds " + std::to_string(total_samples) + " samples of T+1 = " +
                 std::to_string(T_ + 1) + " tokens, fewer than one step of B*world_size = " +
                 std::to_string(step_samples()));
        samples_per_epoch_per_rank_ = total_samples / step_samples() * B_;
        window_.resize(size_t(T_) + 1);
        reset();
    }

    // inputs and targets: B*T host ints each (row b holds sample b).
    void next_batch(int* inputs, int* targets) {
        DataLoaderPosition cursor = advance(position_, uint64_t(rank_) * B_);
        for (int b = 0; b < B_; ++b) {
            read_sample(cursor, inputs + size_t(b) * T_, targets + size_t(b) * T_);
            cursor = advance(cursor, 1);
        }
        position_ = start_of_step(advance(position_, step_samples()));
    }

    void reset() { position_ = start_of_step(DataLoaderPosition{}); }

    DataLoaderPosition position() const { return position_; }

    void seek(const DataLoaderPosition& position) {
        if (position.shard >= files_.size())
            fail("DataLoader::seek: shard " + std::to_string(position.shard) + " is outside [0, " +
                 std::to_string(files_.size()) + " shards)");
        const uint64_t samples = samples_in(position.epoch, position.shard);
        if (position.sample >= samples)
            fail("DataLoader::seek: sample " + std::to_string(position.sample) + " is outside [0, " +
                 std::to_string(samples) + " samples of shard " + std::to_string(position.shard) + ")");
        position_ = start_of_step(position);
    }

    // Every token of shards rank, rank + world_size, ... (the ranks share the work; together they see
    // every shard) must be below vocab_size. The shards are memory-mapped and scanned by up to
    // `threads` threads (0: the hardware's), one shard at a time each. Throws naming the shard, the
    // first bad token's index and value; returns the number of tokens scanned.
    uint64_t check_tokens(int vocab_size, unsigned threads = 0) const {
        if (vocab_size < 1 || vocab_size > 65536)
            fail("DataLoader::check_tokens: vocab_size " + std::to_string(vocab_size) + " is outside [1, 65536]");
        std::vector<size_t> mine;
        for (size_t i = size_t(rank_); i < files_.size(); i += size_t(world_size_)) mine.push_back(i);
        if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
        threads = unsigned(std::min<size_t>(threads, mine.size()));
        std::atomic<size_t> next{0};
        std::atomic<uint64_t> scanned{0};
        std::vector<std::string> errors(mine.size());
        auto worker = [&] {
            for (size_t k; (k = next.fetch_add(1)) < mine.size();) {
                try {
                    scanned += scan_shard(files_[mine[k]], uint16_t(vocab_size - 1));
                } catch (const std::exception& e) {
                    errors[k] = e.what();
                }
            }
        };
        std::vector<std::thread> pool;
        for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
        worker();
        for (std::thread& t : pool) t.join();
        for (const std::string& error : errors)  // the first shard in file order that failed
            if (!error.empty()) fail(error);
        return scanned;
    }

    size_t num_shards() const { return files_.size(); }
    size_t total_tokens() const { return total_tokens_; }
    size_t samples_per_epoch_per_rank() const { return samples_per_epoch_per_rank_; }
    const std::vector<std::string>& files() const { return files_; }

private:
    struct FileCloser {
        void operator()(FILE* file) const { std::fclose(file); }
    };
    [[noreturn]] static void fail(const std::string& message) { throw std::runtime_error(message); }

    uint64_t step_samples() const { return uint64_t(B_) * world_size_; }

    static std::vector<std::string> expand_glob(const std::string& pattern) {
        glob_t matches{};
        const int status = glob(pattern.c_str(), 0, nullptr, &matches);
        std::vector<std::string> files;
        if (status == 0) files.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
        globfree(&matches);
        if (status == GLOB_NOMATCH) fail("DataLoader: no file matches the pattern '" + pattern + "'");
        if (status != 0) fail("DataLoader: glob failed on the pattern '" + pattern + "' (code " + std::to_string(status) + ")");
        std::sort(files.begin(), files.end());  // byte order, independent of the locale: same on every rank
        return files;
    }

    // Checks the header and the length; returns the token count.
    uint64_t validate_shard(const std::string& file) const {
        const std::string where = "DataLoader: '" + file + "': ";
        std::error_code error;
        if (!std::filesystem::is_regular_file(file, error)) fail(where + "not a regular file");
        const uint64_t length = std::filesystem::file_size(file, error);
        if (error) fail(where + "cannot read the length: " + error.message());
        if (length < uint64_t(kHeaderBytes))
            fail(where + "length " + std::to_string(length) + " bytes is shorter than the " +
                 std::to_string(kHeaderBytes) + "-byte header");
        std::unique_ptr<FILE, FileCloser> stream(std::fopen(file.c_str(), "rb"));
        int32_t header[256];
        if (!stream || std::fread(header, sizeof(header), 1, stream.get()) != 1) fail(where + "cannot read the header");
        if (header[0] != kMagic)
            fail(where + "magic " + std::to_string(header[0]) + ", expected " + std::to_string(kMagic) +
                 " (an llm.c GPT-2 token shard)");
        if (header[1] != kVersion)
            fail(where + "version " + std::to_string(header[1]) + ", expected " + std::to_string(kVersion));
        if (header[2] <= 0) fail(where + "token count " + std::to_string(header[2]) + " is not positive");
        const uint64_t tokens = uint64_t(header[2]);
        const uint64_t expected = kHeaderBytes + tokens * sizeof(uint16_t);
        if (length != expected)
            fail(where + "length " + std::to_string(length) + " bytes, but the token count " + std::to_string(tokens) +
                 " needs " + std::to_string(expected));
        if (tokens < uint64_t(T_) + 1)
            fail(where + "token count " + std::to_string(tokens) + " is smaller than one sample of T+1 = " +
                 std::to_string(T_ + 1) + " tokens");
        return tokens;
    }

    // Maps a validated shard and finds its first token above max_token; returns its token count.
    static uint64_t scan_shard(const std::string& file, uint16_t max_token) {
        const std::string where = "DataLoader: '" + file + "': ";
        const int fd = ::open(file.c_str(), O_RDONLY);
        if (fd < 0) fail(where + "cannot open it to check its tokens");
        const off_t length = ::lseek(fd, 0, SEEK_END);
        void* map = length > 0 ? ::mmap(nullptr, size_t(length), PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0) : MAP_FAILED;
        ::close(fd);
        if (map == MAP_FAILED) fail(where + "cannot map it to check its tokens");
        const auto* tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kHeaderBytes);
        const uint64_t count = (uint64_t(length) - kHeaderBytes) / sizeof(uint16_t);
        ::madvise(map, size_t(length), MADV_SEQUENTIAL);
        // The maximum of each 64K-token chunk, 16 tokens at a time (GCC's vector extension: one AVX
        // register); the exact place only when a chunk holds a bad token.
        typedef uint16_t Tokens16 __attribute__((vector_size(32)));
        constexpr uint64_t kChunk = uint64_t(1) << 16;
        for (uint64_t begin = 0; begin < count; begin += kChunk) {
            const uint64_t end = std::min(count, begin + kChunk);
            Tokens16 lanes_max = {};
            uint64_t i = begin;
            for (; i + 16 <= end; i += 16) {
                Tokens16 v;
                std::memcpy(&v, tokens + i, sizeof v);
                lanes_max = lanes_max > v ? lanes_max : v;
            }
            uint16_t chunk_max = 0;
            for (int k = 0; k < 16; ++k) chunk_max = std::max(chunk_max, uint16_t(lanes_max[k]));
            for (; i < end; ++i) chunk_max = std::max(chunk_max, tokens[i]);
            if (chunk_max <= max_token) continue;
            i = begin;
            while (tokens[i] <= max_token) ++i;
            const uint16_t bad = tokens[i];
            ::munmap(map, size_t(length));
            fail(where + "token " + std::to_string(bad) + " at index " + std::to_string(i) + " (byte " +
                 std::to_string(kHeaderBytes + i * sizeof(uint16_t)) + ") is not below the vocabulary size " +
                 std::to_string(int(max_token) + 1));
        }
        ::munmap(map, size_t(length));
        return count;
    }

    // A seeded permutation of [0, n), a function of (seed, epoch, stream) only.
    std::vector<uint32_t> permutation(uint64_t n, uint64_t epoch, uint64_t stream) const {
        std::vector<uint32_t> order(n);
        std::iota(order.begin(), order.end(), 0u);
        if (!shuffle_) return order;
        const auto mix = [](uint64_t x) { return Rng(x).next_u64(); };
        Rng rng(mix(mix(mix(seed_) ^ epoch) ^ stream));
        for (uint64_t i = n; i-- > 1;)  // Fisher-Yates; the modulo bias (< n / 2^64) is immaterial
            std::swap(order[i], order[rng.next_u64() % (i + 1)]);
        return order;
    }

    const std::vector<uint32_t>& shard_order(uint64_t epoch) {
        if (shard_order_.empty() || shard_order_epoch_ != epoch) {
            shard_order_ = permutation(files_.size(), epoch, ~uint64_t(0));  // file indices never reach ~0
            shard_order_epoch_ = epoch;
        }
        return shard_order_;
    }

    uint64_t samples_in(uint64_t epoch, uint64_t shard) { return shard_samples_[shard_order(epoch)[shard]]; }

    // Moves a position `count` samples along its epoch's sequence (to shard == num_shards at the end).
    DataLoaderPosition advance(DataLoaderPosition position, uint64_t count) {
        while (count > 0 && position.shard < files_.size()) {
            const uint64_t left = samples_in(position.epoch, position.shard) - position.sample;
            if (count < left) {
                position.sample += count;
                break;
            }
            count -= left;
            position.shard += 1;
            position.sample = 0;
        }
        return position;
    }

    // The position itself if a whole step fits in the rest of its epoch, else the next epoch's start.
    DataLoaderPosition start_of_step(DataLoaderPosition position) {
        uint64_t left = 0;
        for (uint64_t shard = position.shard; shard < files_.size() && left < step_samples(); ++shard)
            left += samples_in(position.epoch, shard) - (shard == position.shard ? position.sample : 0);
        if (left >= step_samples()) return position;
        return DataLoaderPosition{position.epoch + 1, 0, 0};
    }

    void read_sample(const DataLoaderPosition& position, int* inputs, int* targets) {
        const uint32_t file = shard_order(position.epoch)[position.shard];
        if (sample_order_.empty() || sample_order_epoch_ != position.epoch || sample_order_file_ != file) {
            sample_order_ = permutation(shard_samples_[file], position.epoch, file);
            sample_order_epoch_ = position.epoch;
            sample_order_file_ = file;
        }
        if (!open_file_ || open_file_index_ != file) {
            open_file_.reset(std::fopen(files_[file].c_str(), "rb"));
            open_file_index_ = file;
            if (!open_file_) fail("DataLoader: '" + files_[file] + "': cannot open it again");
        }
        const uint64_t sample = sample_order_[position.sample];
        const long offset = long(kHeaderBytes + sample * T_ * sizeof(uint16_t));
        if (std::fseek(open_file_.get(), offset, SEEK_SET) != 0 ||
            std::fread(window_.data(), sizeof(uint16_t), window_.size(), open_file_.get()) != window_.size()) {
            open_file_.reset();
            fail("DataLoader: '" + files_[file] + "': tokens of sample " + std::to_string(sample) +
                 " cannot be read (the file changed after validation?)");
        }
        for (int t = 0; t < T_; ++t) {
            inputs[t] = window_[t];
            targets[t] = window_[t + 1];
        }
    }

    int B_, T_, rank_, world_size_;
    uint64_t seed_;
    bool shuffle_;
    std::vector<std::string> files_;
    std::vector<uint64_t> shard_samples_;  // per file
    size_t total_tokens_ = 0;
    size_t samples_per_epoch_per_rank_ = 0;
    DataLoaderPosition position_;

    // Caches: the current epoch's shard order, the current shard's sample order, its open file.
    std::vector<uint32_t> shard_order_;
    uint64_t shard_order_epoch_ = 0;
    std::vector<uint32_t> sample_order_;
    uint64_t sample_order_epoch_ = 0;
    uint32_t sample_order_file_ = 0;
    std::unique_ptr<FILE, FileCloser> open_file_;
    uint32_t open_file_index_ = 0;
    std::vector<uint16_t> window_;  // T+1 tokens
};

// One optimizer step's micro-batches from a loader (B x T tokens each), and the pointers the training
// step takes; the buffers are reused from step to step.
struct StepBatches {
    std::vector<std::vector<int>> inputs, targets;
    std::vector<const int*> input_ptrs, target_ptrs;

    void load(DataLoader& loader, int micro_steps, int B, int T) {
        inputs.resize(micro_steps, std::vector<int>(size_t(B) * T));
        targets.resize(micro_steps, std::vector<int>(size_t(B) * T));
        input_ptrs.clear();
        target_ptrs.clear();
        for (int i = 0; i < micro_steps; ++i) {
            loader.next_batch(inputs[i].data(), targets[i].data());
            input_ptrs.push_back(inputs[i].data());
            target_ptrs.push_back(targets[i].data());
        }
    }
};
