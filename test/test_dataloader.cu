// host/dataloader.h: llm.c token shards (layout from llm.c dev/data/data_common.py write_datafile),
// header validation, the deal of samples to ranks, seeded shuffling, resume by position.
#include "test_util.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "host/dataloader.h"

namespace {

namespace fs = std::filesystem;


void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// A shard as llm.c writes it: 256 int32 (magic, version, token count, zeros), then uint16 tokens.
std::string shard_bytes(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                        int64_t count = -1) {
    int32_t header[256] = {};
    header[0] = magic;
    header[1] = version;
    header[2] = int32_t(count < 0 ? int64_t(tokens.size()) : count);
    std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
    return bytes;
}


constexpr int T = 4;

// Three shards of 10, 23 and 15 samples (48 in all: divisible by B*world_size for B = 2 and every
// world size 1..4), with 0..3 spare tokens after the last whole window. Token value 1000*shard + i
// names its place, so a sample is known by its first input token.
struct Shards {
    TempDir dir;
    const std::vector<int> samples = {10, 23, 15};
    std::string pattern = dir.file("train_*.bin");
    Shards() {
        const int spare[3] = {0, 2, 3};  // fewer than T: never a sample of their own
        for (int shard = 0; shard < 3; ++shard) {
            std::vector<uint16_t> tokens(size_t(samples[shard] * T + 1 + spare[shard]));
            for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(1000 * shard + i);
            write_bytes(dir.file("train_00" + std::to_string(shard) + ".bin"), shard_bytes(tokens));
        }
        write_bytes(dir.file("val_000.bin"), shard_bytes(std::vector<uint16_t>(9, 7)));  // not in the pattern
    }
    std::set<int> all() const {
        std::set<int> ids;
        for (int shard = 0; shard < 3; ++shard)
            for (int i = 0; i < samples[shard]; ++i) ids.insert(1000 * shard + i * T);
        return ids;
    }
};

struct Batch {
    std::vector<int> inputs, targets;
    bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader, int B) {
    Batch batch{std::vector<int>(size_t(B) * T, -1), std::vector<int>(size_t(B) * T, -1)};
    loader.next_batch(batch.inputs.data(), batch.targets.data());
    return batch;
}

// The sample ids of a batch, after checking each row is a window of consecutive tokens of one
// shard and its targets are its inputs shifted by one.
std::vector<int> sample_ids(const Batch& batch, int B) {
    std::vector<int> ids;
    for (int b = 0; b < B; ++b) {
        const int first = batch.inputs[size_t(b) * T];
        for (int t = 0; t < T; ++t) {
            REQUIRE(batch.inputs[size_t(b) * T + t] == first + t);
            REQUIRE(batch.targets[size_t(b) * T + t] == first + t + 1);
        }
        ids.push_back(first);
    }
    return ids;
}

// One epoch of a rank, in reading order.
std::vector<int> epoch_ids(DataLoader& loader, int B) {
    std::vector<int> ids;
    const size_t steps = loader.samples_per_epoch_per_rank() / size_t(B);
    for (size_t step = 0; step < steps; ++step)
        for (int id : sample_ids(next(loader, B), B)) ids.push_back(id);
    return ids;
}

}  // namespace

TEST_CASE("a shard in llm.c's layout is served as windows of T+1 tokens, packed across documents") {
    TempDir dir;
    // Two documents separated by EOT, then a third; 65535 checks the tokens are read unsigned.
    const std::vector<uint16_t> tokens = {11, 12, 13, 50256, 21, 22, 65535, 23, 50256, 31, 32, 33, 34};
    write_bytes(dir.file("shard.bin"), shard_bytes(tokens));
    const int B = 2, t = 3;  // 4 samples of 3+1 tokens: starts 0, 3, 6, 9
    DataLoader loader(dir.file("*.bin"), B, t, 0, 1, 0, false);
    CHECK(loader.num_shards() == 1);
    CHECK(loader.total_tokens() == tokens.size());
    CHECK(loader.samples_per_epoch_per_rank() == 4);
    CHECK(loader.position() == DataLoaderPosition{0, 0, 0});

    std::vector<int> inputs(B * t), targets(B * t);
    loader.next_batch(inputs.data(), targets.data());
    CHECK(inputs == std::vector<int>{11, 12, 13, 50256, 21, 22});
    CHECK(targets == std::vector<int>{12, 13, 50256, 21, 22, 65535});
    CHECK(loader.position() == DataLoaderPosition{0, 0, 2});
    loader.next_batch(inputs.data(), targets.data());
    CHECK(inputs == std::vector<int>{65535, 23, 50256, 31, 32, 33});
    CHECK(targets == std::vector<int>{23, 50256, 31, 32, 33, 34});
    CHECK(loader.position() == DataLoaderPosition{1, 0, 0});
    loader.next_batch(inputs.data(), targets.data());  // the next epoch, in the same (file) order
    CHECK(inputs == std::vector<int>{11, 12, 13, 50256, 21, 22});
}

TEST_CASE("the pattern's matches are the shards, in sorted order") {
    Shards shards;
    DataLoader loader(shards.pattern, 2, T, 0, 1, 0, false);
    CHECK(loader.files() == std::vector<std::string>{shards.dir.file("train_000.bin"), shards.dir.file("train_001.bin"),
                                                     shards.dir.file("train_002.bin")});
    CHECK(loader.total_tokens() == size_t(10 * T + 1) + size_t(23 * T + 3) + size_t(15 * T + 4));
    CHECK(loader.samples_per_epoch_per_rank() == 48);
}

TEST_CASE("a bad shard is rejected with one line naming the file and the field") {
    TempDir dir;
    const std::vector<uint16_t> tokens(3 * T + 1, 5);
    const std::string good = shard_bytes(tokens);
    struct Case {
        const char* what;
        std::string bytes;
        const char* field;
    };
    const std::vector<Case> cases = {
        {"wrong magic", shard_bytes(tokens, 20240522), "magic"},
        {"wrong version", shard_bytes(tokens, 20240520, 2), "version"},
        {"count above the tokens present", shard_bytes(tokens, 20240520, 1, tokens.size() + 1), "length"},
        {"count below the tokens present", shard_bytes(tokens, 20240520, 1, tokens.size() - 1), "length"},
        {"zero-length file", "", "length"},
        {"truncated header", good.substr(0, 100), "length"},
        {"truncated tokens", good.substr(0, good.size() - 1), "length"},
        {"negative count", shard_bytes({}, 20240520, 1, -3), "token count"},
        {"too short for one sample of T+1 tokens", shard_bytes(std::vector<uint16_t>(T, 5)), "token count"},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        const std::string file = dir.file("bad.bin");
        write_bytes(file, c.bytes);
        const std::string message = error_of([&] { DataLoader(file, 1, T, 0, 1, 0, false); });
        CHECK_THAT(message, Catch::Contains(file) && Catch::Contains(c.field));
    }
}

TEST_CASE("every shard is validated at construction, not when first read") {
    Shards shards;
    write_bytes(shards.dir.file("train_003.bin"), shard_bytes(std::vector<uint16_t>(2 * T + 1, 1), 1234));
    const std::string message = error_of([&] { DataLoader(shards.pattern, 2, T, 0, 1, 0, false); });
    CHECK_THAT(message, Catch::Contains("train_003.bin") && Catch::Contains("magic"));
}

TEST_CASE("a pattern matching nothing, or matching a folder, is rejected by name") {
    TempDir dir;
    const std::string missing = dir.file("nothing_*.bin");
    CHECK_THAT(error_of([&] { DataLoader(missing, 1, T, 0, 1, 0, false); }), Catch::Contains(missing));
    const std::string plain = dir.file("absent.bin");  // no wildcard: a missing file
    CHECK_THAT(error_of([&] { DataLoader(plain, 1, T, 0, 1, 0, false); }), Catch::Contains(plain));
    fs::create_directory(dir.file("folder.bin"));
    CHECK_THAT(error_of([&] { DataLoader(dir.file("*.bin"), 1, T, 0, 1, 0, false); }),
               Catch::Contains("folder.bin") && Catch::Contains("regular file"));
}

TEST_CASE("bad arguments are rejected naming the argument") {
    Shards shards;
    const auto message = [&](int B, int t, int rank, int world_size) {
        return error_of([&] { DataLoader(shards.pattern, B, t, rank, world_size, 0, true); });
    };
    CHECK_THAT(message(0, T, 0, 1), Catch::Contains("B must be positive"));
    CHECK_THAT(message(1, -1, 0, 1), Catch::Contains("T must be positive"));
    CHECK_THAT(message(1, T, 0, 0), Catch::Contains("world_size"));
    CHECK_THAT(message(1, T, -1, 2), Catch::Contains("rank -1"));
    CHECK_THAT(message(1, T, 2, 2), Catch::Contains("rank 2"));
    // 48 samples cannot fill one step of 25 * 2.
    CHECK_THAT(message(25, T, 0, 2), Catch::Contains("48 samples") && Catch::Contains("B*world_size = 50"));
    // T = 50: each shard is too short for one sample.
    CHECK_THAT(message(1, 50, 0, 1), Catch::Contains("train_000.bin") && Catch::Contains("token count"));
}

TEST_CASE("ranks read disjoint samples whose union is the single-rank epoch") {
    Shards shards;
    const int B = 2;
    for (bool shuffle : {false, true}) {
        DataLoader single(shards.pattern, B, T, 0, 1, 42, shuffle);
        const std::vector<int> sequence = epoch_ids(single, B);
        REQUIRE(std::set<int>(sequence.begin(), sequence.end()) == shards.all());
        REQUIRE(sequence.size() == 48);
        for (int world_size = 1; world_size <= 4; ++world_size) {
            INFO("shuffle " << shuffle << ", world_size " << world_size);
            std::multiset<int> union_of_ranks;
            for (int rank = 0; rank < world_size; ++rank) {
                DataLoader loader(shards.pattern, B, T, rank, world_size, 42, shuffle);
                REQUIRE(loader.samples_per_epoch_per_rank() == size_t(48 / world_size));
                const std::vector<int> ids = epoch_ids(loader, B);
                // The deal: step s gives rank r the group s*world_size + r of B samples of the sequence.
                for (size_t i = 0; i < ids.size(); ++i) {
                    const size_t step = i / B, within = i % B;
                    REQUIRE(ids[i] == sequence[(step * world_size + rank) * B + within]);
                }
                union_of_ranks.insert(ids.begin(), ids.end());
                CHECK(loader.position() == DataLoaderPosition{1, 0, 0});  // the same on every rank
            }
            CHECK(union_of_ranks.size() == 48);  // a multiset: a sample read twice would count twice
            CHECK(std::set<int>(union_of_ranks.begin(), union_of_ranks.end()) == shards.all());
        }
    }
}

TEST_CASE("when a step does not divide the epoch, the tail is skipped and ranks stay in step") {
    Shards shards;
    const int B = 5, world_size = 2;  // steps of 10 samples: 4 per epoch of 48, 8 skipped
    for (bool shuffle : {false, true}) {
        INFO("shuffle " << shuffle);
        DataLoader rank0(shards.pattern, B, T, 0, world_size, 3, shuffle);
        DataLoader rank1(shards.pattern, B, T, 1, world_size, 3, shuffle);
        REQUIRE(rank0.samples_per_epoch_per_rank() == 20);
        std::vector<std::set<int>> tails;
        for (int epoch = 0; epoch < 2; ++epoch) {
            const std::vector<int> a = epoch_ids(rank0, B), b = epoch_ids(rank1, B);
            REQUIRE(rank0.position() == DataLoaderPosition{uint64_t(epoch) + 1, 0, 0});
            REQUIRE(rank1.position() == rank0.position());
            std::set<int> read(a.begin(), a.end());
            read.insert(b.begin(), b.end());
            CHECK(read.size() == 40);  // disjoint, no repeats
            std::set<int> tail = shards.all();
            for (int id : read) tail.erase(id);
            tails.push_back(tail);
        }
        // Without shuffling every epoch skips the same tail (the end of the last shard); with it, another.
        CHECK((tails[0] == tails[1]) == !shuffle);
    }
}

TEST_CASE("shuffling is seeded, a permutation per epoch, and reads shards one at a time") {
    Shards shards;
    const int B = 2;
    const auto epochs = [&](uint64_t seed, bool shuffle) {
        DataLoader loader(shards.pattern, B, T, 0, 1, seed, shuffle);
        std::vector<std::vector<int>> result;
        for (int epoch = 0; epoch < 3; ++epoch) result.push_back(epoch_ids(loader, B));
        return result;
    };
    const auto seven = epochs(7, true);
    CHECK(epochs(7, true) == seven);
    CHECK(epochs(8, true)[0] != seven[0]);
    CHECK(seven[0] != seven[1]);
    CHECK(seven[1] != seven[2]);
    for (const std::vector<int>& epoch : seven) {
        CHECK(epoch.size() == 48);
        CHECK(std::set<int>(epoch.begin(), epoch.end()) == shards.all());  // 48 distinct: each exactly once
        int shard_changes = 0;
        for (size_t i = 1; i < epoch.size(); ++i) shard_changes += epoch[i] / 1000 != epoch[i - 1] / 1000;
        CHECK(shard_changes == 2);  // each shard's samples are read together
    }
    CHECK(!std::is_sorted(seven[0].begin(), seven[0].end()));
    std::set<int> first_shards;  // the shard order is shuffled too
    for (uint64_t seed = 0; seed < 16; ++seed) first_shards.insert(epochs(seed, true)[0][0] / 1000);
    CHECK(first_shards.size() == 3);

    const auto in_order = epochs(7, false);  // validation: file order, every epoch
    const std::set<int> all = shards.all();
    CHECK(in_order[0] == std::vector<int>(all.begin(), all.end()));
    CHECK(in_order[1] == in_order[0]);
    CHECK(epochs(8, false) == in_order);
}

TEST_CASE("position() and seek() reproduce the following batches exactly") {
    Shards shards;
    const int B = 3, world_size = 2;  // 8 steps per epoch of 48 samples
    for (bool shuffle : {false, true}) {
        INFO("shuffle " << shuffle);
        DataLoader original(shards.pattern, B, T, 1, world_size, 99, shuffle);
        DataLoader other_rank(shards.pattern, B, T, 0, world_size, 99, shuffle);
        for (int step = 0; step < 5; ++step) {
            next(original, B);
            next(other_rank, B);
        }
        const DataLoaderPosition saved = original.position();
        CHECK(other_rank.position() == saved);
        std::vector<Batch> expected;
        for (int step = 0; step < 20; ++step) expected.push_back(next(original, B));  // crosses two epochs

        DataLoader resumed(shards.pattern, B, T, 1, world_size, 99, shuffle);
        next(resumed, B);  // anywhere: seek must not depend on the current state
        resumed.seek(saved);
        CHECK(resumed.position() == saved);
        for (int step = 0; step < 20; ++step) REQUIRE(next(resumed, B) == expected[size_t(step)]);
        CHECK(resumed.position() == original.position());
    }
}

TEST_CASE("seek() rejects positions outside the data and moves a short tail to the next epoch") {
    Shards shards;
    DataLoader loader(shards.pattern, 3, T, 0, 2, 0, false);
    CHECK_THAT(error_of([&] { loader.seek({0, 3, 0}); }), Catch::Contains("seek") && Catch::Contains("shard 3"));
    CHECK_THAT(error_of([&] { loader.seek({0, 1, 23}); }), Catch::Contains("seek") && Catch::Contains("sample 23"));
    loader.seek({2, 2, 12});  // a valid position whose epoch has less than a step (6 samples) left
    CHECK(loader.position() == DataLoaderPosition{3, 0, 0});
    loader.seek({0, 1, 20});  // 3 left in shard 1, 15 in shard 2: a step fits, straddling the shards
    CHECK(loader.position() == DataLoaderPosition{0, 1, 20});
    CHECK(sample_ids(next(loader, 3), 3) == std::vector<int>{1000 + 20 * T, 1000 + 21 * T, 1000 + 22 * T});
    CHECK(loader.position() == DataLoaderPosition{0, 2, 3});
}

TEST_CASE("reset() returns to the first batch of epoch 0") {
    Shards shards;
    const int B = 2;
    DataLoader fresh(shards.pattern, B, T, 1, 3, 5, true);
    std::vector<Batch> first;
    for (int step = 0; step < 4; ++step) first.push_back(next(fresh, B));
    DataLoader loader(shards.pattern, B, T, 1, 3, 5, true);
    for (int step = 0; step < 11; ++step) next(loader, B);  // 8 steps per epoch: now in epoch 1
    CHECK(loader.position().epoch == 1);
    loader.reset();
    CHECK(loader.position() == DataLoaderPosition{0, 0, 0});
    for (const Batch& batch : first) CHECK(next(loader, B) == batch);
}

TEST_CASE("a shard damaged after validation fails at read time with a clear error") {
    Shards shards;
    DataLoader loader(shards.pattern, 2, T, 0, 1, 0, false);
    fs::resize_file(shards.dir.file("train_000.bin"), 1024 + 2 * (2 * T + 1));  // the first batch still reads
    next(loader, 2);
    std::vector<int> inputs(2 * T), targets(2 * T);
    CHECK_THAT(error_of([&] { loader.next_batch(inputs.data(), targets.data()); }),
               Catch::Contains("train_000.bin") && Catch::Contains("tokens of sample"));
}

TEST_CASE("check_tokens finds the first token outside the vocabulary, by shard and index, before any read") {
    Shards shards;  // tokens up to 2000 + 15 * T + 3 = 2063
    DataLoader loader(shards.pattern, 2, T, 0, 1, 0, false);
    CHECK(loader.check_tokens(2064) == loader.total_tokens());  // every token is checked
    CHECK(loader.check_tokens(2064, 1) == loader.total_tokens());
    // 2063 sits at the end of train_002.bin (index 63): a vocabulary of 2063 excludes it.
    std::string message = error_of([&] { loader.check_tokens(2063); });
    CHECK_THAT(message, Catch::Contains("train_002.bin") && Catch::Contains("token 2063 at index 63 (byte 1150)") &&
                            Catch::Contains("vocabulary size 2063"));
    // Two bad shards: the error names the first in file order, on any number of threads.
    for (unsigned threads : {1u, 2u, 3u}) {
        message = error_of([&] { loader.check_tokens(1000, threads); });
        CHECK_THAT(message, Catch::Contains("train_001.bin") && Catch::Contains("token 1000 at index 0 "));
    }
    // A bad token deep in a long shard (past the first 64K-token chunk).
    std::vector<uint16_t> tokens(200000, 17);
    tokens[150001] = 50257;
    write_bytes(shards.dir.file("train_003.bin"), shard_bytes(tokens));
    DataLoader with_long(shards.pattern, 2, T, 0, 1, 0, false);
    message = error_of([&] { with_long.check_tokens(50257); });
    CHECK_THAT(message, Catch::Contains("train_003.bin") && Catch::Contains("token 50257 at index 150001"));
    CHECK(with_long.check_tokens(50258) == with_long.total_tokens());
    // Ranks share the shards: rank 1 of 2 scans train_001 and train_003 only, rank 0 the others.
    DataLoader rank0(shards.pattern, 2, T, 0, 2, 0, false), rank1(shards.pattern, 2, T, 1, 2, 0, false);
    CHECK(rank0.check_tokens(2064) == size_t(10 * T + 1) + size_t(15 * T + 4));
    CHECK_THAT(error_of([&] { rank1.check_tokens(2064); }), Catch::Contains("train_003.bin"));
    CHECK_THAT(error_of([&] { loader.check_tokens(0); }), Catch::Contains("vocab_size 0"));
}
