#!/usr/bin/env bash
# Fails if a ptxas -v log (nvcc -Xptxas -v) reports a register spill in any compiled kernel.
# Usage: scripts/check_spills.sh LOG
set -euo pipefail
log=$1
spills=$(awk '
  /Compiling entry function/ { fn = $0; sub(/.*Compiling entry function ./, "", fn); sub(/. for .*/, "", fn);
                               arch = $NF }
  /bytes spill stores/ { split($0, a, ","); st = a[2]; ld = a[3]; gsub(/[^0-9]/, "", st); gsub(/[^0-9]/, "", ld);
                         if (st + 0 > 0 || ld + 0 > 0) print fn " (" arch "): " st " bytes spill stores, " ld " bytes spill loads" }
' "$log")
kernels=$(grep -c "Compiling entry function" "$log" || true)
if [ -n "$spills" ]; then
  echo "register spills in $log:"
  echo "$spills"
  exit 1
fi
echo "ptxas: $kernels kernel compilations, 0 spills ($log)"
