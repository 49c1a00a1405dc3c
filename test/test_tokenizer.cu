// host/tokenizer.h: llm.c's tokenizer file (layout from llm.c train_gpt2.py write_tokenizer and
// llmc/tokenizer.h), both versions, byte-exact decoding, and rejection of damaged files.
#include "test_util.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "host/tokenizer.h"

namespace {

namespace fs = std::filesystem;


// A tokenizer file as llm.c writes it: 256 uint32 (magic, version, vocab size, EOT from version 2,
// zeros), then per token a uint8 length and the bytes.
std::string tokenizer_bytes(const std::vector<std::string>& pieces, uint32_t version, uint32_t eot,
                            uint32_t magic = 20240328) {
    uint32_t header[256] = {};
    header[0] = magic;
    header[1] = version;
    header[2] = uint32_t(pieces.size());
    if (version >= 2) header[3] = eot;
    std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
    for (const std::string& piece : pieces) {
        bytes += char(uint8_t(piece.size()));
        bytes += piece;
    }
    return bytes;
}

std::string write(const TempDir& dir, const std::string& bytes) {
    const std::string path = dir.file("tokenizer.bin");
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return path;
}


// A small vocabulary: the euro sign U+20AC (E2 82 AC in UTF-8) split over two tokens, a NUL byte
// (GPT-2 has a token per byte), a 255-byte token (the longest a uint8 length allows), EOT last.
const std::vector<std::string> kPieces = {"Hello", " world", "\xE2\x82", "\xAC", std::string(1, '\0'),
                                          std::string(255, 'x'), "<|endoftext|>"};

}  // namespace

TEST_CASE("a version 2 file decodes every token to its exact bytes") {
    TempDir dir;
    const Tokenizer tokenizer(write(dir, tokenizer_bytes(kPieces, 2, 6)));
    CHECK(tokenizer.vocab_size() == 7);
    CHECK(tokenizer.eot_token() == 6);
    for (int token = 0; token < 7; ++token) CHECK(tokenizer.decode(token) == kPieces[size_t(token)]);
    CHECK(tokenizer.decode(4).size() == 1);  // the NUL byte is kept, not a terminator
    CHECK(tokenizer.decode(std::vector<int>{0, 1, 2, 3}) == "Hello world\xE2\x82\xAC");  // bytes rejoin into UTF-8
    CHECK(tokenizer.decode(std::vector<int>{}).empty());
}

TEST_CASE("a version 1 file implies GPT-2's vocabulary and EOT 50256") {
    TempDir dir;
    std::vector<std::string> pieces(50257);
    for (size_t token = 0; token < pieces.size(); ++token) pieces[token] = "t" + std::to_string(token);
    const Tokenizer tokenizer(write(dir, tokenizer_bytes(pieces, 1, 0)));
    CHECK(tokenizer.vocab_size() == 50257);
    CHECK(tokenizer.eot_token() == 50256);
    CHECK(tokenizer.decode(50256) == "t50256");
    CHECK(tokenizer.decode(std::vector<int>{7, 300}) == "t7t300");

    pieces.pop_back();  // version 1 with another vocabulary size cannot say where EOT is
    const std::string path = write(dir, tokenizer_bytes(pieces, 1, 0));
    CHECK_THAT(error_of([&] { Tokenizer{path}; }), Catch::Contains(path) && Catch::Contains("vocab size 50256"));
}

TEST_CASE("decoding an id outside the vocabulary throws, naming the id and the vocab size") {
    TempDir dir;
    const Tokenizer tokenizer(write(dir, tokenizer_bytes(kPieces, 2, 6)));
    CHECK_THAT(error_of([&] { tokenizer.decode(7); }), Catch::Contains("token id 7") && Catch::Contains("vocab size 7"));
    CHECK_THAT(error_of([&] { tokenizer.decode(-1); }), Catch::Contains("token id -1"));
    CHECK_THAT(error_of([&] { tokenizer.decode(std::vector<int>{0, 99}); }), Catch::Contains("token id 99"));
}

TEST_CASE("a bad tokenizer file is rejected with one line naming the file and the field") {
    TempDir dir;
    const std::string good = tokenizer_bytes(kPieces, 2, 6);
    const size_t last_piece = good.size() - kPieces.back().size();  // where the last token's bytes start
    struct Case {
        const char* what;
        std::string bytes;
        const char* field;
    };
    const std::vector<Case> cases = {
        {"wrong magic", tokenizer_bytes(kPieces, 2, 6, 20240520), "magic"},
        {"version 0", tokenizer_bytes(kPieces, 0, 6), "version 0"},
        {"version 3", tokenizer_bytes(kPieces, 3, 6), "version 3"},
        {"EOT outside the vocabulary", tokenizer_bytes(kPieces, 2, 7), "EOT token 7"},
        {"empty vocabulary", tokenizer_bytes({}, 2, 0), "vocab size 0"},
        {"zero-length file", "", "length 0"},
        {"truncated header", good.substr(0, 1000), "length 1000"},
        {"truncated in the middle of a token", good.substr(0, last_piece + 3), "inside token 6"},
        {"truncated before a token's length byte", good.substr(0, last_piece - 1), "before token 6"},
        {"bytes after the last token", good + "zz", "2 bytes after the last token"},
        {"a token of length 0", tokenizer_bytes({"a", "", "c"}, 2, 0), "token 1 has length 0"},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        const std::string path = write(dir, c.bytes);
        CHECK_THAT(error_of([&] { Tokenizer{path}; }), Catch::Contains(path) && Catch::Contains(c.field));
    }
    const std::string missing = dir.file("absent.bin");
    CHECK_THAT(error_of([&] { Tokenizer{missing}; }), Catch::Contains(missing) && Catch::Contains("no such file"));
    CHECK_THAT(error_of([&] { Tokenizer{dir.path.string()}; }), Catch::Contains("not a regular file"));
}
