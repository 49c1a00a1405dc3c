// Documents inside packed rows (--doc-mask, --doc-positions). The data (data/prepare.py, llm.c's
// shards) is documents back to back, each PRECEDED by the end-of-text token EOT (50256 for GPT-2), so
// a row of T tokens cut from it holds the tail of one document, then whole documents, then the head
// of another.
//
// The convention: token t of a row belongs to the document that starts at the last position p <= t
// whose token is EOT, or at 0 when there is none. The EOT that opens a document belongs to it (it is
// its first token, at document position 0), and the row's start acts as a document start, so each
// row of a batch is independent of the others and of the row before it in the data.
//
// With --doc-mask, query t attends to key k exactly when doc_start[t] <= k <= t; with
// --doc-positions, token t takes the position embedding of t - doc_start[t].
#pragma once

#include <cstddef>
#include <vector>

// The end-of-text token of GPT-2's tokenizer (what data/prepare.py writes before every document).
constexpr int kGpt2EotToken = 50256;

// The document start of every token of B rows of T tokens (row-major, as the tokens): the position
// within its row where token t's document starts (see above). One pass per row; non-decreasing
// along a row, and at most t.
// Written to `starts` (B * T ints: the forward pass's upload buffer), or returned.
inline void document_starts(int* starts, const int* tokens, int B, int T, int eot) {
    for (int b = 0; b < B; ++b) {
        int start = 0;
        for (int t = 0; t < T; ++t) {
            const size_t i = size_t(b) * T + t;
            if (tokens[i] == eot) start = t;
            starts[i] = start;
        }
    }
}
inline std::vector<int> document_starts(const int* tokens, int B, int T, int eot) {
    std::vector<int> starts(size_t(B) * size_t(T));
    document_starts(starts.data(), tokens, B, T, eot);
    return starts;
}
