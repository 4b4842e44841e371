#!/usr/bin/env bash
# prepare_devdeps.sh - fill .devdeps/ (git-ignored) with what the GPU machine lacks, for
# device_check.sh to unpack there: Debian .debs of OpenBLAS (the CPU oracle), HDF5 and zstd
# headers/libraries, and cuDNN headers (the machine's cuDNN may come as a torch wheel without
# them). Run it here, then call the device tool with carry [".devdeps"].
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devdeps/cudnn/include
(cd .devdeps && apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev \
    libgfortran5 libhdf5-103-1 libhdf5-dev libaec0 libsz2 libzstd-dev libcurl3-gnutls)
cudnn_h=$(ls /usr/local/cuda/include/cudnn*.h /usr/include/cudnn*.h 2>/dev/null || true)
[ -n "$cudnn_h" ] && cp $cudnn_h .devdeps/cudnn/include/
du -sh .devdeps
