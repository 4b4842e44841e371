#!/usr/bin/env bash
# test.sh - install, build and run every test: the C tests through ctest (once in the normal
# build, where CUDA tests report themselves skipped without a GPU, and once under
# AddressSanitizer + UndefinedBehaviorSanitizer), then the Python tests through pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's interpreter: the one the apt packages (torch, h5py, numpy) install into.
PY=${ACT_PYTHON:-/usr/bin/python3}
scripts/setup.sh build
scripts/setup.sh build-asan -DACT_SANITIZE=ON -DACT_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
status=0
(cd build && ctest --output-on-failure) || status=1
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure) || status=1
ACT_BUILD_DIR="$PWD/build" "$PY" -m pytest -q tests/python || status=1
# act-serve's own tests once more with three I/O threads (a 2-core machine's default is one)
ACT_SERVE_IO_THREADS=3 ACT_BUILD_DIR="$PWD/build" "$PY" -m pytest -q tests/python/test_serve.py \
    tests/python/test_serve_faults.py tests/python/test_serve_shm.py || status=1
exit $status
