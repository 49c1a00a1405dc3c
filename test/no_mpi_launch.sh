#!/usr/bin/env bash
# The test suite's "mpirun" for builds without MPI (make MPI=0; test/tests.cmake): runs the command
# directly when one rank is asked for; for more, says why it cannot and exits 77, which CTest reports as
# skipped (the shell tests run under set -e, so their multi-rank part ends them with 77 too).
#   no_mpi_launch.sh -np N COMMAND...
set -euo pipefail
[ "${1:-}" = "-np" ] || { echo "no_mpi_launch.sh: expected -np N COMMAND..., got '$*'" >&2; exit 2; }
ranks=$2
shift 2
if [ "$ranks" -ne 1 ]; then
  echo "skipped: $ranks ranks need MPI, and this build has none (make MPI=0): ${1##*/}"
  exit 77
fi
exec "$@"
