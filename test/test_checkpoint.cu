// Checkpoint files: llm.c model format (round trips, exact byte layout), the training-state file
// (multi-writer ranges, completion marker), the directory policy, and every bad input's message.
#include "test_util.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>

#include "host/checkpoint.h"
#include "host/rng.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {


std::vector<char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(out);
}
template <typename T> void patch(const std::string& path, size_t offset, T value) {
    std::vector<char> bytes = read_bytes(path);
    REQUIRE(offset + sizeof(T) <= bytes.size());
    std::memcpy(bytes.data() + offset, &value, sizeof(T));
    write_bytes(path, bytes);
}
template <typename T> T peek(const std::vector<char>& bytes, size_t offset) {
    T value;
    std::memcpy(&value, bytes.data() + offset, sizeof(T));
    return value;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = float(rng.normal(0.0, 1.0));
    return v;
}

// Odd sizes everywhere: V not a multiple of anything, Vp padded, C a multiple of NH.
const ModelHeader kTinyFp32{{7, 37, 40, 3, 3, 9}, 3};
const ModelHeader kTinyBf16{{7, 37, 40, 3, 3, 9}, 5};

// The sum of the 16 tensor shapes, written out independently of the library's closed form.
size_t shape_sum(const ModelHeader& h) {
    const size_t Vp = h.padded_vocab_size, T = h.max_seq_len, L = h.num_layers, C = h.channels;
    const size_t shapes[16] = {Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                               L * C,  L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    size_t total = 0;
    for (size_t s : shapes) total += s;
    return total;
}

// Every error is one line naming the function (and the file where there is one).
void require_one_line(const std::function<void()>& call, const std::string& function, const std::string& text) {
    try {
        call();
        FAIL("expected an error containing '" << text << "'");
    } catch (const std::runtime_error& e) {
        const std::string message = e.what();
        INFO(message);
        CHECK(message.find('\n') == std::string::npos);
        CHECK_THAT(message, Contains(function + ":"));
        CHECK_THAT(message, Contains(text));
    }
}

TrainingState make_state(uint64_t num_parameters, int64_t step) {
    TrainingState s{};
    s.step = step;
    s.num_parameters = num_parameters;
    s.rng[0] = 42, s.rng[1] = 0xDEADBEEFCAFEF00Dull, s.rng[2] = ~0ull, s.rng[3] = 7;
    s.loader_epoch = 2, s.loader_shard = 5, s.loader_sample = 123456789012ull;
    s.meta_json = "{\"model\": \"d12\", \"lr\": 0.0006, \"note\": \"line\\nbreak, \xc3\xa9\", \"step\": " +
                  std::to_string(step) + "}";  // odd length, so the arrays need padding
    return s;
}

struct OptimizerArrays {
    std::vector<float> master, m, v;
    OptimizerArrays(size_t n, uint64_t seed)
        : master(random_floats(n, seed)), m(random_floats(n, seed + 1)), v(random_floats(n, seed + 2)) {}
};

// One complete checkpoint (model + state + marker) as the training program writes it.
void write_checkpoint(const std::string& out, int64_t step, const ModelHeader& h) {
    const size_t n = gpt2_parameter_count(h);
    const std::vector<float> params = random_floats(n, uint64_t(step));
    write_model_checkpoint(model_checkpoint_path(out, step), h, params.data(), n);
    const std::string state = state_checkpoint_path(out, step);
    begin_state_file(state, make_state(n, step));
    write_state_range(state, n, 0, 0, params.data(), params.data(), params.data(), n);
    finish_state_file(state);
}

}  // namespace

TEST_CASE("gpt2_parameter_count matches llm.c's 124M model and the shape table") {
    // llm.c prints num_parameters: 124475904 for GPT-2 124M with the vocab padded to 50304.
    CHECK(gpt2_parameter_count({{1024, 50257, 50304, 12, 12, 768}, 3}) == 124475904);
    CHECK(gpt2_parameter_count(kTinyFp32) == shape_sum(kTinyFp32));
    CHECK(gpt2_parameter_count({{1, 1, 1, 1, 1, 1}, 5}) == shape_sum({{1, 1, 1, 1, 1, 1}, 5}));
}

TEST_CASE("model checkpoint round trip, fp32 (version 3) and bf16 (version 5), odd sizes") {
    TempDir dir;
    const size_t n = gpt2_parameter_count(kTinyFp32);
    SECTION("fp32") {
        const std::vector<float> params = random_floats(n, 1);
        const std::string path = dir.file("model_fp32.bin");
        write_model_checkpoint(path, kTinyFp32, params.data(), n);
        CHECK(fs::file_size(path) == 1024 + n * 4);
        const ModelHeader h = read_model_header(path);
        CHECK(h == kTinyFp32);
        std::vector<float> back(n, -1.0f);
        read_model_parameters(path, h, back.data(), n);
        CHECK(std::memcmp(back.data(), params.data(), n * 4) == 0);  // bitwise, no conversion
    }
    SECTION("bf16") {
        std::vector<uint16_t> params(n);
        Rng rng(2);
        for (uint16_t& x : params) x = uint16_t(rng.next_u64());  // any bit pattern, NaNs included
        const std::string path = dir.file("model_bf16.bin");
        write_model_checkpoint(path, kTinyBf16, params.data(), n);
        CHECK(fs::file_size(path) == 1024 + n * 2);
        const ModelHeader h = read_model_header(path);
        CHECK(h == kTinyBf16);
        std::vector<uint16_t> back(n);
        read_model_parameters(path, h, back.data(), n);
        CHECK(back == params);
    }
    CHECK_FALSE(fs::exists(dir.file("model_fp32.bin.tmp")));
    CHECK_FALSE(fs::exists(dir.file("model_bf16.bin.tmp")));
}

TEST_CASE("model checkpoint byte layout is llm.c's") {
    TempDir dir;
    const ModelHeader h = kTinyBf16;
    const size_t n = gpt2_parameter_count(h);
    std::vector<uint16_t> params(n);
    for (size_t i = 0; i < n; i++) params[i] = uint16_t(i * 2654435761u >> 7);
    const std::string path = dir.file("m.bin");
    write_model_checkpoint(path, h, params.data(), n);
    const std::vector<char> bytes = read_bytes(path);
    REQUIRE(bytes.size() == 1024 + 2 * n);
    // llm.c train_gpt2.cu gpt2_write_to_checkpoint: int32 header[256] = magic, version, maxT, V, L,
    // NH, C, Vp; the rest zero. Ours in two of llm.c's zeros: [8] = 1 (CRC-32C), [9] = the CRC-32C of
    // the parameter bytes (llm.c reads [0..7] only).
    const int expected[8] = {20240326, 5, 7, 37, 3, 3, 9, 40};
    for (int i = 0; i < 8; i++) CHECK(peek<int32_t>(bytes, 4 * i) == expected[i]);
    CHECK(peek<int32_t>(bytes, 32) == 1);
    CHECK(peek<uint32_t>(bytes, 36) == crc32c_portable(params.data(), 2 * n));
    for (int i = 10; i < 256; i++) CHECK(peek<int32_t>(bytes, 4 * i) == 0);
    // Parameters follow the header in order: wte first, lnfb (C values) last.
    CHECK(peek<uint16_t>(bytes, 1024) == params[0]);
    CHECK(peek<uint16_t>(bytes, 1024 + 2 * (40 * 9)) == params[40 * 9]);  // wpe starts after (Vp, C) wte
    CHECK(peek<uint16_t>(bytes, bytes.size() - 2) == params[n - 1]);

    SECTION("a file laid out by hand the llm.c way reads back") {
        std::vector<char> hand(1024 + 4 * gpt2_parameter_count(kTinyFp32), 0);
        const int header[8] = {20240326, 3, 7, 37, 3, 3, 9, 40};
        std::memcpy(hand.data(), header, sizeof header);
        const float lnfb_last = 0.625f;
        std::memcpy(hand.data() + hand.size() - 4, &lnfb_last, 4);
        write_bytes(dir.file("hand.bin"), hand);
        const ModelHeader read = read_model_header(dir.file("hand.bin"));
        CHECK(read == kTinyFp32);
        std::vector<float> values(gpt2_parameter_count(read));
        read_model_parameters(dir.file("hand.bin"), read, values.data(), values.size());
        CHECK(values.back() == lnfb_last);
        CHECK(values.front() == 0.0f);
    }
}

TEST_CASE("model checkpoint writes are atomic") {
    TempDir dir;
    const size_t n = gpt2_parameter_count(kTinyFp32);
    const std::string path = dir.file("model.bin");
    const std::vector<float> first = random_floats(n, 3), second = random_floats(n, 4);
    write_model_checkpoint(path, kTinyFp32, first.data(), n);
    // A crashed earlier write left a temp file: the next write replaces it and the file.
    write_bytes(path + ".tmp", {'j', 'u', 'n', 'k'});
    write_model_checkpoint(path, kTinyFp32, second.data(), n);
    CHECK_FALSE(fs::exists(path + ".tmp"));
    std::vector<float> back(n);
    read_model_parameters(path, kTinyFp32, back.data(), n);
    CHECK(back == second);
    // A rejected write leaves the previous file untouched.
    require_one_line([&] { write_model_checkpoint(path, kTinyFp32, first.data(), n - 1); }, "write_model_checkpoint",
                     "count");
    read_model_parameters(path, kTinyFp32, back.data(), n);
    CHECK(back == second);
    CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("model checkpoint bad inputs give a one-line message") {
    TempDir dir;
    const size_t n = gpt2_parameter_count(kTinyFp32);
    const std::vector<float> params = random_floats(n, 5);
    const std::string good = dir.file("good.bin"), bad = dir.file("bad.bin");
    write_model_checkpoint(good, kTinyFp32, params.data(), n);
    const std::vector<char> bytes = read_bytes(good);
    auto read_bad = [&] { read_model_header(bad); };

    SECTION("missing file") {
        require_one_line([&] { read_model_header(dir.file("absent.bin")); }, "read_model_header", "absent.bin");
    }
    SECTION("zero-length file") {
        write_bytes(bad, {});
        require_one_line(read_bad, "read_model_header", "empty");
    }
    SECTION("shorter than the header") {
        write_bytes(bad, std::vector<char>(bytes.begin(), bytes.begin() + 100));
        require_one_line(read_bad, "read_model_header", "shorter than the 1024-byte header");
    }
    SECTION("wrong magic") {
        write_bytes(bad, bytes);
        patch<int32_t>(bad, 0, 20240327);
        require_one_line(read_bad, "read_model_header", "bad magic 20240327");
    }
    SECTION("wrong version") {
        write_bytes(bad, bytes);
        patch<int32_t>(bad, 4, 4);
        require_one_line(read_bad, "read_model_header", "version 4");
    }
    SECTION("non-positive size field") {
        write_bytes(bad, bytes);
        patch<int32_t>(bad, 4 * 4, 0);
        require_one_line(read_bad, "read_model_header", "num_layers 0");
    }
    SECTION("padded vocab below vocab") {
        write_bytes(bad, bytes);
        patch<int32_t>(bad, 7 * 4, 36);
        require_one_line(read_bad, "read_model_header", "padded_vocab_size 36");
    }
    SECTION("huge sizes give a message, not an overflow or a huge allocation") {
        write_bytes(bad, bytes);
        for (int i : {2, 3, 4, 6, 7}) patch<int32_t>(bad, 4 * i, 2147483646);
        require_one_line(read_bad, "read_model_header", "bad.bin");
    }
    SECTION("truncated by one byte") {
        write_bytes(bad, std::vector<char>(bytes.begin(), bytes.end() - 1));
        require_one_line(read_bad, "read_model_header", "(truncated)");
    }
    SECTION("trailing bytes") {
        std::vector<char> longer = bytes;
        longer.push_back(0);
        write_bytes(bad, longer);
        require_one_line(read_bad, "read_model_header", "(trailing bytes)");
    }
    SECTION("parameter count mismatch") {
        std::vector<float> back(n + 1);
        require_one_line([&] { read_model_parameters(good, kTinyFp32, back.data(), n + 1); }, "read_model_parameters",
                         "count");
        require_one_line([&] { read_model_parameters(good, kTinyBf16, back.data(), n); }, "read_model_parameters",
                         "header differs");
        require_one_line([&] { read_model_parameters(good, kTinyFp32, nullptr, n); }, "read_model_parameters", "null");
    }
    SECTION("bad header given to the writer") {
        ModelHeader h = kTinyFp32;
        h.channels = 10;  // not a multiple of num_heads 3
        require_one_line([&] { write_model_checkpoint(bad, h, params.data(), n); }, "write_model_checkpoint", "channels");
        h = kTinyFp32;
        h.version = 4;
        require_one_line([&] { write_model_checkpoint(bad, h, params.data(), n); }, "write_model_checkpoint", "version");
        require_one_line([&] { write_model_checkpoint(bad, kTinyFp32, nullptr, n); }, "write_model_checkpoint", "null");
        require_one_line([&] { write_model_checkpoint(dir.file("no/such/dir/m.bin"), kTinyFp32, params.data(), n); },
                         "write_model_checkpoint", "cannot open");
        CHECK_FALSE(fs::exists(bad));
    }
}

TEST_CASE("training state: three ranks write disjoint ranges, any range reads back") {
    TempDir dir;
    const uint64_t n = 1001;  // odd, split unevenly below
    const OptimizerArrays a(n, 10);
    TrainingState s = make_state(n, int64_t(1) << 40);
    s.writers = 4;
    const std::string path = dir.file("state.bin");

    begin_state_file(path, s);
    // Ranges in a shuffled order, one of them empty (a rank that owns no parameters).
    const uint64_t ranges[][2] = {{334, 667}, {0, 334}, {1001, 1001}, {667, 1001}};
    uint64_t writer = 0;
    for (const auto& r : ranges)
        write_state_range(path, n, writer++, r[0], a.master.data() + r[0], a.m.data() + r[0], a.v.data() + r[0], r[1] - r[0]);
    CHECK_FALSE(fs::exists(path));  // not visible before finish
    finish_state_file(path);
    CHECK_FALSE(fs::exists(path + ".tmp"));
    REQUIRE(fs::exists(path + ".done"));

    const TrainingState r = read_state_header(path);
    CHECK(r.step == s.step);
    CHECK(r.num_parameters == n);
    for (int i = 0; i < 4; i++) CHECK(r.rng[i] == s.rng[i]);
    CHECK(r.loader_epoch == s.loader_epoch);
    CHECK(r.loader_shard == s.loader_shard);
    CHECK(r.loader_sample == s.loader_sample);
    CHECK(r.meta_json == s.meta_json);

    // Read back with a different split than written (a resume on another number of ranks).
    const uint64_t reads[][2] = {{0, 1001}, {0, 500}, {500, 1001}, {333, 335}, {1000, 1001}, {17, 17}};
    for (const auto& rd : reads) {
        const uint64_t count = rd[1] - rd[0];
        std::vector<float> master(count), m(count), v(count);
        read_state_range(path, r, rd[0], count, master.data(), m.data(), v.data());
        INFO("range [" << rd[0] << ", " << rd[1] << ")");
        CHECK(std::equal(master.begin(), master.end(), a.master.begin() + rd[0]));
        CHECK(std::equal(m.begin(), m.end(), a.m.begin() + rd[0]));
        CHECK(std::equal(v.begin(), v.end(), a.v.begin() + rd[0]));
    }
    // Null skips an array: all master weights, only a shard of m.
    std::vector<float> master(n), m(100, -7.0f);
    read_state_range(path, r, 0, n, master.data(), nullptr, nullptr);
    read_state_range(path, r, 900, 100, nullptr, m.data(), nullptr);
    CHECK(master == a.master);
    CHECK(std::equal(m.begin(), m.end(), a.m.begin() + 900));
    // The documented layout: 256 uint64 header (magic, version, header bytes, step, num_parameters,
    // ...), the JSON at 2048, the 4 writers' checksum records (5 uint64 each) from the next 8-byte
    // boundary, then master, m, v from the next 64-byte boundary; nothing after v.
    const std::vector<char> bytes = read_bytes(path);
    const size_t checksum_offset = (2048 + s.meta_json.size() + 7) / 8 * 8;
    const size_t master_offset = (checksum_offset + 4 * 40 + 63) / 64 * 64;
    REQUIRE(bytes.size() == master_offset + 3 * 4 * n);
    CHECK(peek<uint64_t>(bytes, 0) == 20261122);
    CHECK(peek<uint64_t>(bytes, 8) == 2);
    // Writer 0's record (the range [334, 667)): begin, count, then the CRC-32C of its master bytes.
    CHECK(peek<uint64_t>(bytes, checksum_offset) == 334);
    CHECK(peek<uint64_t>(bytes, checksum_offset + 8) == 333);
    CHECK(peek<uint64_t>(bytes, checksum_offset + 16) == crc32c_portable(a.master.data() + 334, 333 * 4));
    CHECK(peek<uint64_t>(bytes, 16) == 2048);
    CHECK(peek<int64_t>(bytes, 24) == s.step);
    CHECK(peek<uint64_t>(bytes, 32) == n);
    CHECK(std::string(bytes.data() + 2048, s.meta_json.size()) == s.meta_json);
    CHECK(peek<float>(bytes, master_offset) == a.master[0]);
    CHECK(peek<float>(bytes, master_offset + 4 * n) == a.m[0]);
    CHECK(peek<float>(bytes, bytes.size() - 4) == a.v[n - 1]);
}

TEST_CASE("training state: an unfinished or unmarked state is not complete") {
    TempDir dir;
    const uint64_t n = 64;
    const OptimizerArrays a(n, 20);
    const std::string path = dir.file("state.bin");

    SECTION("crash before finish: only the temp file exists") {
        begin_state_file(path, make_state(n, 3));
        write_state_range(path, n, 0, 0, a.master.data(), a.m.data(), a.v.data(), n);
        require_one_line([&] { read_state_header(path); }, "read_state_header", "cannot open");
    }
    SECTION("marker removed") {
        begin_state_file(path, make_state(n, 3));
        write_state_range(path, n, 0, 0, a.master.data(), a.m.data(), a.v.data(), n);
        finish_state_file(path);
        fs::remove(path + ".done");
        require_one_line([&] { read_state_header(path); }, "read_state_header", "incomplete");
    }
    SECTION("stale marker from another state") {
        begin_state_file(path, make_state(n, 3));
        write_state_range(path, n, 0, 0, a.master.data(), a.m.data(), a.v.data(), n);
        finish_state_file(path);
        const std::vector<char> marker = read_bytes(path + ".done");
        begin_state_file(path, make_state(n, 4));
        write_state_range(path, n, 0, 0, a.master.data(), a.m.data(), a.v.data(), n);
        finish_state_file(path);
        write_bytes(path + ".done", marker);
        require_one_line([&] { read_state_header(path); }, "read_state_header", "stale marker");
    }
}

TEST_CASE("training state bad inputs give a one-line message") {
    TempDir dir;
    const uint64_t n = 50;
    const OptimizerArrays a(n, 30);
    const TrainingState s = make_state(n, 9);
    const std::string path = dir.file("state.bin");
    begin_state_file(path, s);
    write_state_range(path, n, 0, 0, a.master.data(), a.m.data(), a.v.data(), n);
    finish_state_file(path);
    const std::vector<char> bytes = read_bytes(path);
    auto read = [&] { read_state_header(path); };

    SECTION("missing file") {
        require_one_line([&] { read_state_header(dir.file("absent.bin")); }, "read_state_header", "absent.bin");
    }
    SECTION("zero-length file") {
        write_bytes(path, {});
        require_one_line(read, "read_state_header", "empty");
    }
    SECTION("truncated header") {
        write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + 1000));
        require_one_line(read, "read_state_header", "shorter than the 2048-byte header");
    }
    SECTION("truncated arrays") {
        write_bytes(path, std::vector<char>(bytes.begin(), bytes.end() - 4));
        require_one_line(read, "read_state_header", "(truncated)");
    }
    SECTION("wrong magic") {
        patch<uint64_t>(path, 0, 20240326);
        require_one_line(read, "read_state_header", "bad magic 20240326");
    }
    SECTION("wrong version") {
        patch<uint64_t>(path, 8, 3);
        require_one_line(read, "read_state_header", "unsupported version 3");
    }
    SECTION("version 1 (no checksums) with checksum slots set") {
        patch<uint64_t>(path, 8, 1);
        require_one_line(read, "read_state_header", "version 1 with checksum slots set");
    }
    SECTION("offset disagreeing with the sizes") {
        patch<uint64_t>(path, 8 * 15, 12345);  // m_offset slot
        require_one_line(read, "read_state_header", "m_offset 12345");
    }
    SECTION("absurd num_parameters") {
        patch<uint64_t>(path, 8 * 4, ~0ull);
        require_one_line(read, "read_state_header", "num_parameters");
    }
    SECTION("ranges outside the parameters") {
        std::vector<float> buf(n + 1);
        require_one_line([&] { read_state_range(path, s, 1, n, buf.data(), buf.data(), buf.data()); }, "read_state_range",
                         "exceeds num_parameters");
        require_one_line([&] { read_state_range(path, s, ~0ull, 2, buf.data(), nullptr, nullptr); }, "read_state_range",
                         "exceeds num_parameters");
        TrainingState other = s;
        other.num_parameters = n + 1;
        require_one_line([&] { read_state_range(path, other, 0, 1, buf.data(), nullptr, nullptr); }, "read_state_range",
                         "header differs");
    }
    SECTION("writer misuse") {
        const std::string other = dir.file("other.bin");
        require_one_line([&] { write_state_range(other, n, 0, 0, a.master.data(), a.m.data(), a.v.data(), n); },
                         "write_state_range", "begin_state_file");
        require_one_line([&] { finish_state_file(other); }, "finish_state_file", "other.bin.tmp");
        begin_state_file(other, s);
        require_one_line([&] { write_state_range(other, n + 1, 0, 0, a.master.data(), a.m.data(), a.v.data(), 1); },
                         "write_state_range", "num_parameters");
        require_one_line([&] { write_state_range(other, n, 0, 40, a.master.data(), a.m.data(), a.v.data(), 11); },
                         "write_state_range", "exceeds num_parameters");
        require_one_line([&] { write_state_range(other, n, 0, 0, a.master.data(), nullptr, a.v.data(), 1); },
                         "write_state_range", "non-null");
        TrainingState empty = s;
        empty.num_parameters = 0;
        require_one_line([&] { begin_state_file(other, empty); }, "begin_state_file", "num_parameters is 0");
        TrainingState negative = s;
        negative.step = -1;
        require_one_line([&] { begin_state_file(other, negative); }, "begin_state_file", "step -1");
    }
}

TEST_CASE("checkpoint directory: latest complete checkpoint and keep-last-K") {
    TempDir dir;
    const std::string out = dir.path.string();
    const ModelHeader h{{4, 11, 12, 1, 2, 4}, 3};
    CHECK(model_checkpoint_path(out, 300) == out + "/model_00000300.bin");
    CHECK(state_checkpoint_path(out, 300) == out + "/state_00000300.bin");
    CHECK_FALSE(latest_complete_checkpoint(out));
    CHECK_FALSE(latest_complete_checkpoint(dir.file("not_created_yet")));

    for (int64_t step : {100, 200, 300, 350, 400, 500}) write_checkpoint(out, step, h);
    // 350: model file truncated; 400: state without its marker; 500: a crash mid-write (temp only).
    const std::string model350 = model_checkpoint_path(out, 350);
    fs::resize_file(model350, fs::file_size(model350) - 1);
    fs::remove(state_checkpoint_path(out, 400) + ".done");
    fs::rename(state_checkpoint_path(out, 500), state_checkpoint_path(out, 500) + ".tmp");
    fs::remove(state_checkpoint_path(out, 500) + ".done");
    write_bytes(dir.file("notes.txt"), {'x'});  // unrelated files are left alone
    write_bytes(dir.file("state_abc.bin"), {'x'});

    REQUIRE(latest_complete_checkpoint(out) == 300);

    SECTION("K <= 0 keeps everything") {
        remove_old_checkpoints(out, 0);
        remove_old_checkpoints(out, -1);
        CHECK(fs::exists(state_checkpoint_path(out, 100)));
        CHECK(fs::exists(model_checkpoint_path(out, 100)));
    }
    SECTION("keep 2: steps older than the second newest complete one go, newer ones stay") {
        remove_old_checkpoints(out, 2);
        CHECK_FALSE(fs::exists(state_checkpoint_path(out, 100)));
        CHECK_FALSE(fs::exists(state_checkpoint_path(out, 100) + ".done"));
        CHECK_FALSE(fs::exists(model_checkpoint_path(out, 100)));
        for (int64_t step : {200, 300, 350, 400}) CHECK(fs::exists(model_checkpoint_path(out, step)));
        CHECK(fs::exists(state_checkpoint_path(out, 500) + ".tmp"));  // possibly still being written
        CHECK(latest_complete_checkpoint(out) == 300);
    }
    SECTION("keep 1 keeps the newest complete one") {
        remove_old_checkpoints(out, 1);
        for (int64_t step : {100, 200}) CHECK_FALSE(fs::exists(model_checkpoint_path(out, step)));
        CHECK(latest_complete_checkpoint(out) == 300);
    }
    SECTION("keep more than exist deletes nothing") {
        remove_old_checkpoints(out, 10);
        CHECK(fs::exists(state_checkpoint_path(out, 100) + ".done"));
    }
    CHECK(fs::exists(dir.file("notes.txt")));
    CHECK(fs::exists(dir.file("state_abc.bin")));

    SECTION("a model whose size disagrees with the state is not complete") {
        const ModelHeader bigger{{4, 11, 16, 1, 2, 4}, 3};
        const std::vector<float> params(gpt2_parameter_count(bigger));
        write_model_checkpoint(model_checkpoint_path(out, 300), bigger, params.data(), params.size());
        CHECK(latest_complete_checkpoint(out) == 200);
    }
    SECTION("the newest complete checkpoint survives when nothing older is complete") {
        TempDir lone;
        write_checkpoint(lone.path.string(), 7, h);
        fs::remove(state_checkpoint_path(lone.path.string(), 7) + ".done");
        write_checkpoint(lone.path.string(), 8, h);
        remove_old_checkpoints(lone.path.string(), 1);
        CHECK(latest_complete_checkpoint(lone.path.string()) == 8);
        CHECK_FALSE(fs::exists(model_checkpoint_path(lone.path.string(), 7)));
    }
}

TEST_CASE("CRC-32C: the catalogue's check value, both code paths, continuation") {
    // The CRC catalogue's check value for CRC-32C (iSCSI, RFC 3720): the 9 bytes "123456789".
    const char* check = "123456789";
    CHECK(crc32c(check, 9) == 0xE3069283u);
    CHECK(crc32c_portable(check, 9) == 0xE3069283u);
    CHECK(crc32c(check, 0) == 0u);
    // RFC 3720 B.4: 32 bytes of zeros, and of 0xFF.
    const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF);
    CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
    CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
    // The hardware path (where the CPU has one) agrees with the table for every length and alignment,
    // and a CRC continues across a split.
    std::vector<unsigned char> data(300);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
    for (size_t offset = 0; offset < 9; ++offset)
        for (size_t length : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(63), size_t(250)}) {
            INFO("offset " << offset << " length " << length);
            REQUIRE(crc32c(data.data() + offset, length) == crc32c_portable(data.data() + offset, length));
            const size_t half = length / 3;
            CHECK(crc32c(data.data() + offset + half, length - half, crc32c(data.data() + offset, half)) ==
                  crc32c(data.data() + offset, length));
        }
}

TEST_CASE("model checkpoint: a flipped byte in the parameters is found, an llm.c file is not checked") {
    TempDir dir;
    const size_t n = gpt2_parameter_count(kTinyFp32);
    const std::vector<float> params = random_floats(n, 5);
    const std::string path = dir.file("m.bin");
    write_model_checkpoint(path, kTinyFp32, params.data(), n);
    std::vector<float> back(n);
    read_model_parameters(path, kTinyFp32, back.data(), n);
    CHECK(back == params);

    std::vector<char> bytes = read_bytes(path);
    bytes[1024 + 4 * (n / 2) + 1] ^= 0x10;  // one bit of one parameter in the middle
    write_bytes(path, bytes);
    require_one_line([&] { read_model_parameters(path, kTinyFp32, back.data(), n); }, "read_model_parameters",
                     "CRC-32C");
    require_one_line([&] { read_model_parameters_as_float(path, kTinyFp32); }, "read_model_parameters", "corrupt");

    // The same corrupt bytes with llm.c's header (int 8 = 0: no checksum) read without a word.
    patch<int32_t>(path, 32, 0);
    read_model_parameters(path, kTinyFp32, back.data(), n);
    CHECK(back[n / 2] != params[n / 2]);
    patch<int32_t>(path, 32, 7);
    require_one_line([&] { read_model_parameters(path, kTinyFp32, back.data(), n); }, "read_model_parameters",
                     "checksum kind");
}

TEST_CASE("training state: each writer's range is verified on read; version 1 reads unverified") {
    TempDir dir;
    const uint64_t n = 1000;
    const OptimizerArrays a(n, 20);
    TrainingState s = make_state(n, 9);
    s.writers = 3;
    const std::string path = dir.file("state.bin");
    const uint64_t ranges[3][2] = {{0, 334}, {334, 667}, {667, 1000}};
    auto write_all = [&](int skip_writer) {
        begin_state_file(path, s);
        for (uint64_t w = 0; w < 3; ++w)
            if (int(w) != skip_writer)
                write_state_range(path, n, w, ranges[w][0], a.master.data() + ranges[w][0], a.m.data() + ranges[w][0],
                                  a.v.data() + ranges[w][0], ranges[w][1] - ranges[w][0]);
        finish_state_file(path);
    };
    write_all(-1);
    const TrainingState r = read_state_header(path);
    CHECK(r.writers == 3);
    std::vector<float> buf(n), buf2(n), buf3(n);

    // One flipped bit in Adam m of writer 1's range [334, 667).
    std::vector<char> bytes = read_bytes(path);
    const size_t m_offset = peek<uint64_t>(bytes, 8 * 15);  // header slot kMOffset
    bytes[m_offset + 4 * 500 + 2] ^= 0x01;
    write_bytes(path, bytes);
    // Reads that touch the range fail naming the array and the range, also when they cover it only in
    // part (that writer's whole range is read for its checksum); the other arrays, and reads elsewhere, pass.
    require_one_line([&] { read_state_range(path, r, 0, n, nullptr, buf.data(), nullptr); }, "read_state_range",
                     "Adam m [334, 667)");
    require_one_line([&] { read_state_range(path, r, 600, 10, nullptr, buf.data(), nullptr); }, "read_state_range",
                     "corrupt");
    read_state_range(path, r, 0, n, buf.data(), nullptr, buf3.data());  // master and v are intact
    CHECK(buf == a.master);
    read_state_range(path, r, 0, 334, buf.data(), buf2.data(), buf3.data());
    read_state_range(path, r, 667, 333, buf.data(), buf2.data(), buf3.data());
    CHECK(std::equal(buf3.begin(), buf3.begin() + 333, a.v.begin() + 667));

    // A writer that never wrote its record: the records do not cover the parameters.
    write_all(1);
    const TrainingState missing = read_state_header(path);
    require_one_line([&] { read_state_range(path, missing, 0, 10, buf.data(), nullptr, nullptr); }, "read_state_range",
                     "checksum records");

    // Version 1 (this program before checksums): no records; it reads, unverified.
    write_all(-1);
    bytes = read_bytes(path);
    const uint64_t meta_bytes = peek<uint64_t>(bytes, 8 * 12);
    const size_t v2_master = peek<uint64_t>(bytes, 8 * 14), v1_master = (2048 + meta_bytes + 63) / 64 * 64;
    std::vector<char> v1(bytes.begin(), bytes.begin() + 2048 + meta_bytes);
    v1.resize(v1_master, 0);
    v1.insert(v1.end(), bytes.begin() + v2_master, bytes.end());
    const uint64_t shift = v2_master - v1_master, version = 1, zero = 0;
    std::memcpy(v1.data() + 8, &version, 8);
    for (size_t slot : {14, 15, 16, 17}) {  // master, m, v offsets and the file length
        const uint64_t moved = peek<uint64_t>(v1, 8 * slot) - shift;
        std::memcpy(v1.data() + 8 * slot, &moved, 8);
    }
    std::memcpy(v1.data() + 8 * 18, &zero, 8);  // writers
    std::memcpy(v1.data() + 8 * 19, &zero, 8);  // checksum offset
    v1[v1.size() - 1] ^= 0x40;                  // corrupt, but nothing records it
    write_bytes(path, v1);
    const std::string marker = "train_gpt state step=9 bytes=" + std::to_string(v1.size()) + "\n";
    write_bytes(path + ".done", std::vector<char>(marker.begin(), marker.end()));
    const TrainingState old = read_state_header(path);
    CHECK(old.writers == 0);
    read_state_range(path, old, 0, n, buf.data(), buf2.data(), buf3.data());
    CHECK(buf == a.master);
    CHECK(buf2 == a.m);
    CHECK(std::equal(buf3.begin(), buf3.end() - 1, a.v.begin()));
    CHECK(buf3.back() != a.v.back());
}
