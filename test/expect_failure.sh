#!/usr/bin/env bash
# expect_failure.sh PATTERN COMMAND...: passes when COMMAND exits non-zero and its stderr has a line
# matching PATTERN (grep -E), so error paths are tested for both the exit status and the message.
set -u
pattern=$1
shift
stderr=$("$@" 2>&1 >/dev/null)
status=$?
if [ "$status" -eq 0 ]; then
    echo "expected a failure, got exit status 0: $*" >&2
    exit 1
fi
if ! grep -qE -- "$pattern" <<<"$stderr"; then
    echo "exit status $status, but no stderr line matches '$pattern':" >&2
    echo "$stderr" >&2
    exit 1
fi
echo "failed as expected (status $status): $(grep -E -- "$pattern" <<<"$stderr" | head -1)"
