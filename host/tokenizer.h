// GPT-2 token decoding from llm.c's tokenizer file (llm.c train_gpt2.py write_tokenizer, read by
// llmc/tokenizer.h): a header of 256 uint32 ([0] magic 20240328, [1] version, [2] vocab size,
// [3] EOT token id from version 2 on; version 1 implies GPT-2's 50257 tokens with EOT 50256), then
// per token a uint8 length (at least 1) and that many bytes. Tokens are bytes, not characters: a
// UTF-8 character may be split across tokens, so decoded text is passed on as is.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

class Tokenizer {
public:
    static constexpr uint32_t kMagic = 20240328;
    static constexpr size_t kHeaderBytes = 256 * sizeof(uint32_t);
    static constexpr uint32_t kGpt2VocabSize = 50257, kGpt2Eot = 50256;  // implied by version 1

    explicit Tokenizer(const std::string& path) {
        const std::string where = "Tokenizer: '" + path + "': ";
        std::error_code error;
        if (!std::filesystem::exists(path, error)) fail(where + "no such file");
        if (!std::filesystem::is_regular_file(path, error)) fail(where + "not a regular file");
        const size_t length = std::filesystem::file_size(path, error);
        if (error) fail(where + "cannot read the length: " + error.message());
        std::ifstream stream(path, std::ios::binary);
        if (!stream) fail(where + "cannot open it");
        if (length < kHeaderBytes)
            fail(where + "length " + std::to_string(length) + " bytes is shorter than the " +
                 std::to_string(kHeaderBytes) + "-byte header");
        uint32_t header[256];
        if (!stream.read(reinterpret_cast<char*>(header), kHeaderBytes)) fail(where + "cannot read the header");
        if (header[0] != kMagic)
            fail(where + "magic " + std::to_string(header[0]) + ", expected " + std::to_string(kMagic) +
                 " (an llm.c tokenizer file)");
        const uint32_t vocab = header[2];
        if (header[1] == 1) {
            if (vocab != kGpt2VocabSize)
                fail(where + "vocab size " + std::to_string(vocab) + ", but version 1 implies GPT-2's " +
                     std::to_string(kGpt2VocabSize));
            eot_ = int(kGpt2Eot);
        } else if (header[1] == 2) {
            if (vocab == 0 || vocab > uint32_t(INT32_MAX)) fail(where + "vocab size " + std::to_string(vocab) + " is invalid");
            if (header[3] >= vocab)
                fail(where + "EOT token " + std::to_string(header[3]) + " is outside the vocab size " + std::to_string(vocab));
            eot_ = int(header[3]);
        } else {
            fail(where + "version " + std::to_string(header[1]) + ", expected 1 or 2");
        }

        // Read the tokens only now that the header says this is a tokenizer file (no mistaken 10 GB reads).
        std::string bytes(length - kHeaderBytes, '\0');
        if (!stream.read(bytes.data(), std::streamsize(bytes.size()))) fail(where + "cannot read the tokens");
        size_t offset = 0;
        pieces_.reserve(std::min<size_t>(vocab, bytes.size()));  // a bogus vocab size cannot over-allocate
        for (uint32_t token = 0; token < vocab; ++token) {
            if (offset >= bytes.size())
                fail(where + "length " + std::to_string(length) + " bytes ends before token " +
                     std::to_string(token) + " of " + std::to_string(vocab));
            const size_t piece_length = static_cast<unsigned char>(bytes[offset++]);
            if (piece_length == 0) fail(where + "token " + std::to_string(token) + " has length 0");
            if (piece_length > bytes.size() - offset)
                fail(where + "length " + std::to_string(length) + " bytes ends inside token " +
                     std::to_string(token) + " (" + std::to_string(piece_length) + " bytes)");
            pieces_.emplace_back(bytes, offset, piece_length);
            offset += piece_length;
        }
        if (offset != bytes.size())
            fail(where + "length " + std::to_string(length) + " bytes, " + std::to_string(bytes.size() - offset) +
                 " bytes after the last token");
    }

    const std::string& decode(int token) const {
        if (token < 0 || token >= vocab_size())
            fail("Tokenizer::decode: token id " + std::to_string(token) + " is outside the vocab size " +
                 std::to_string(vocab_size()));
        return pieces_[size_t(token)];
    }

    std::string decode(const std::vector<int>& tokens) const {
        std::string text;
        for (int token : tokens) text += decode(token);
        return text;
    }

    int vocab_size() const { return int(pieces_.size()); }
    int eot_token() const { return eot_; }

private:
    [[noreturn]] static void fail(const std::string& message) { throw std::runtime_error(message); }

    std::vector<std::string> pieces_;
    int eot_ = 0;
};
