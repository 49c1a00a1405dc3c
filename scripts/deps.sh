#!/usr/bin/env bash
# Installs the Debian packages train_gpt needs to build and test, when they are missing.
#   scripts/deps.sh           install what is missing (apt-get; run as root)
#   scripts/deps.sh --check   exit 1 and list what is missing, install nothing
#   scripts/deps.sh --fuzz    also clang (libFuzzer), for make fuzz
#   scripts/deps.sh --header-only-packages   print the header-only C++ packages (scripts/gpu_deps.sh
#                             unpacks them for machines that cannot install packages)
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) is not a Debian package here: when nvcc is absent,
# only the CPU build (train_gpt_cpu) is built and tested.
set -euo pipefail
header_only=(
  libcxxopts-dev nlohmann-json3-dev # CLI and JSON config
  catch2                            # tests (Catch2 2.x: one header)
)
if [ "${1:-}" = "--header-only-packages" ]; then
  echo "${header_only[@]}"
  exit 0
fi
packages=(
  g++ make cmake pkg-config         # compilers, CTest
  libopenmpi-dev openmpi-bin        # MPI: process launch, and the emulated NCCL's transport
  libopenblas-dev libdnnl-dev       # the emulated cuBLASLt's GEMMs: FP32 (OpenBLAS), BF16 (oneDNN)
  "${header_only[@]}"
  procps                            # pgrep/pkill: the tests that signal the program (not in minimal images)
)
[ "${1:-}" = "--fuzz" ] && packages+=(clang)  # libFuzzer and its sanitizer runtimes (make fuzz)
# Python for the data preparation (data/prepare.py): any python3 with pip will do.
command -v python3 >/dev/null 2>&1 || packages+=(python3)
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
here=$(cd "$(dirname "$0")" && pwd)
if [ ${#missing[@]} -eq 0 ]; then
  if [ "${1:-}" = "--check" ]; then
    exec "$here/install_python_deps.sh" --check
  fi
  echo "deps: all present"
  exec "$here/install_python_deps.sh"
fi
if [ "${1:-}" = "--check" ]; then
  echo "deps: missing: ${missing[*]}"
  exit 1
fi
echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
"$here/install_python_deps.sh"
