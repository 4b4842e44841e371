#!/usr/bin/env bash
# setup.sh - install what act-engine needs (Debian/Ubuntu packages, by name) and build it.
# Usage: scripts/setup.sh [BUILD_DIR] [extra cmake args...]
# ACT_EXTRA_PKGS="clang ..." installs more packages by name (test.sh's clang leg).
# Installs only missing packages; uses sudo when not root. CUDA parts build when nvcc and cuDNN
# are found (nvcc on PATH or in /usr/local/cuda/bin; cuDNN there or in $ACT_CUDNN_ROOT); without
# them the CPU engine builds alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}; shift || true

pkgs=(build-essential cmake pkg-config libopenblas-dev libhdf5-dev libzstd-dev zlib1g-dev libdeflate-dev
      python3 python3-numpy python3-h5py python3-pytest python3-yaml python3-matplotlib
      python3-zstandard python3-torch python3-torchvision python3-pip python3-setuptools
      python3-wheel haproxy ${ACT_EXTRA_PKGS:-})
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$build_dir.cmake.log" 2>&1 \
  || { cat "$build_dir.cmake.log"; exit 1; }
grep "act-engine:" "$build_dir.cmake.log" >&2 || true
cmake --build "$build_dir" -j"$(nproc)" 2>&1 | grep -E "error|warning: unused|Error" >&2 || true
cmake --build "$build_dir" -j"$(nproc)" >/dev/null
echo "setup: built into $build_dir" >&2
