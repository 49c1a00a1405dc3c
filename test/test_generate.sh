#!/usr/bin/env bash
# --generate through the program: with and without the key/value cache the same tokens come out; a
# text prompt is encoded as data/prepare.py encodes documents (EOT first); -e takes a run directory
# (its newest complete checkpoint); a tokenizer.bin beside -i's shards turns ids into text; the
# context limit clips --max-tokens with a note; mistakes are one-line errors.
# Usage: test_generate.sh TRAIN_BINARY
set -euo pipefail
bin=$1
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "generate: $*"; exit 1; }
gen() { "$bin" -e tiny -t 64 --generate -i "$dir/none/train_*.bin" "$@" 2>"$dir/stderr"; }

# The cache changes how, not what: 40 sampled tokens (ids: no tokenizer.bin) equal with and without it.
# With the SIMT attention kernels, whose arithmetic the cached decode step repeats: on a GPU, `auto`
# takes the tensor-core kernels for the uncached passes, whose BF16 rounding of the probabilities
# differs, and an untrained model's near-uniform distribution then samples other tokens (an H100,
# 2026-11-27: the second token already differed).
gen --prompt-ids 50256,464,2068 --max-tokens 40 --seed 7 --top-k 100 --attention simt > "$dir/cached"
gen --prompt-ids 50256,464,2068 --max-tokens 40 --seed 7 --top-k 100 --attention simt --kv-cache off > "$dir/uncached"
cat "$dir/cached"
[ "$(wc -w < "$dir/cached")" -eq 40 ] || fail "expected 40 token ids, got: $(cat "$dir/cached")"
cmp -s "$dir/cached" "$dir/uncached" || fail "the cache changed the tokens: $(cat "$dir/uncached")"
grep -q "generate: 3 prompt tokens, 40 generated" "$dir/stderr" || fail "no summary line: $(cat "$dir/stderr")"
# Another seed draws other tokens (the comparison above is not between two constants).
gen --prompt-ids 50256,464,2068 --max-tokens 40 --seed 8 --top-k 100 --attention simt > "$dir/seed8"
! cmp -s "$dir/cached" "$dir/seed8" || fail "seeds 7 and 8 drew the same 40 tokens"

# The model's context (64 positions) ends first: 61 tokens and a note.
gen --prompt-ids 1,2,3 --max-tokens 100 > "$dir/long"
[ "$(wc -w < "$dir/long")" -eq 61 ] || fail "expected 61 tokens in a context of 64 after 3, got $(wc -w < "$dir/long")"
grep -q "note: at most 61 tokens, not --max-tokens 100" "$dir/stderr" || fail "no note for the clipped length"

# A text prompt: EOT, then data/prepare.py's encoding ("Hello, world" is 15496 11 995 in GPT-2's BPE).
# Where data/encode.py can run: tiktoken and the packaged BPE files (a GPU node may have tiktoken alone).
if python3 "$here/../data/encode.py" "Hello, world" > /dev/null 2>&1; then
    TRAIN_GPT_ROOT="$here/.." gen --prompt "Hello, world" --max-tokens 12 --seed 3 > "$dir/text"
    gen --prompt-ids 50256,15496,11,995 --max-tokens 12 --seed 3 > "$dir/ids"
    cmp -s "$dir/text" "$dir/ids" || fail "--prompt 'Hello, world' did not act as --prompt-ids 50256,15496,11,995"
    grep -q "generate: 4 prompt tokens" "$dir/stderr" || fail "the text prompt is not 4 tokens"
else
    echo "generate: data/encode.py cannot run here: the --prompt text case was not run"
fi

# -e RUN_DIR: its newest complete checkpoint, which is what -e of that model file gives. With a
# tokenizer.bin beside the shards, text comes out, the prompt first.
mkdir -p "$dir/data" "$dir/none"
python3 "$here/make_shards.py" "$dir/data" 1 4000
"$bin" -e tiny -b 2 -t 32 -x 2 -n 2 -v 0 -s 0 -i "$dir/data/train_*.bin" -o "$dir/run" > /dev/null
"$bin" -e "$dir/run" --generate --prompt-ids 464,2068 --max-tokens 10 -i "$dir/none/train_*.bin" > "$dir/from_dir" 2>/dev/null
"$bin" -e "$dir/run/model_00000002.bin" --generate --prompt-ids 464,2068 --max-tokens 10 -i "$dir/none/train_*.bin" \
    > "$dir/from_file" 2>/dev/null
cmp -s "$dir/from_dir" "$dir/from_file" || fail "-e RUN_DIR did not generate as its newest checkpoint does"
[ "$(wc -w < "$dir/from_dir")" -eq 10 ] || fail "expected 10 ids from the trained model, got: $(cat "$dir/from_dir")"
if python3 "$here/../data/prepare.py" --out "$dir/tok" > /dev/null 2>&1; then
    cp "$dir/tok/tokenizer.bin" "$dir/data/"
    "$bin" -e "$dir/run" --generate --prompt-ids 464,2068 --max-tokens 10 -i "$dir/data/train_*.bin" > "$dir/text_out" 2>/dev/null
    grep -q "^The quick" "$dir/text_out" || fail "with a tokenizer the text starts with the prompt: $(cat "$dir/text_out")"
else
    echo "generate: data/prepare.py cannot run here: the tokenizer.bin case was not run"
fi

# Mistakes: one line naming the flag, non-zero exit.
x="$here/expect_failure.sh"
"$x" "--prompt needs --generate" "$bin" -e tiny --prompt "Hi"
"$x" "--prompt-ids: '70000' is not a token id in \[0, 50257\)" "$bin" -e tiny -t 64 --generate --prompt-ids 1,70000
"$x" "--top-p must be in \(0, 1\], got 0" "$bin" -e tiny --generate --top-p 0
"$x" "--prompt and --prompt-ids cannot go together" "$bin" -e tiny --generate --prompt a --prompt-ids 1
"$x" "a directory that holds no complete checkpoint" "$bin" -e "$dir/none" --generate --prompt-ids 1
"$x" "leave no room in the model's context of 64" "$bin" -e tiny -t 64 --generate --prompt-ids "$(seq -s, 1 64)"
echo "generate: all checks passed"
