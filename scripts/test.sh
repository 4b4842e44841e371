#!/usr/bin/env bash
# test.sh - install, build and run every test: the C tests through ctest (once in the normal
# build, where CUDA tests report themselves skipped without a GPU, and once under
# AddressSanitizer + UndefinedBehaviorSanitizer), then the Python tests through pytest, the
# README's demo (scripts/demo.sh), then the
# episode reader's tests against HDF5 1.14 (a third build, compiled by clang: the others are GCC's,
# and the two compilers differ in what they accept, e.g. multiversioned functions across files).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's interpreter: the one the apt packages (torch, h5py, numpy) install into.
PY=${ACT_PYTHON:-/usr/bin/python3}
scripts/setup.sh build
scripts/setup.sh build-asan -DACT_SANITIZE=ON -DACT_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
status=0
# pytest's temporary files go to one folder removed at the end (pytest's default keeps its last
# three runs' under /tmp, several GB each; on a shared CI disk they piled up until a run failed
# for want of space). ACT_KEEP_TEST_TMP=1 keeps it and says where.
ttmp=$(mktemp -d "${TMPDIR:-/tmp}/act-tests.XXXXXX")
if [ "${ACT_KEEP_TEST_TMP:-0}" = 1 ]; then
    trap 'echo "test.sh: pytest temporary files kept in $ttmp" >&2' EXIT
else
    trap 'rm -rf "$ttmp"' EXIT
fi
(cd build && ctest --output-on-failure) || status=1
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure) || status=1
ACT_BUILD_DIR="$PWD/build" "$PY" -m pytest -q --basetemp "$ttmp/all" tests/python || status=1
# act-serve's own tests once more with three I/O threads (a 2-core machine's default is one)
ACT_SERVE_IO_THREADS=3 ACT_BUILD_DIR="$PWD/build" "$PY" -m pytest -q --basetemp "$ttmp/io3" tests/python/test_serve.py \
    tests/python/test_serve_faults.py tests/python/test_serve_shm.py || status=1
# the README's first command, the demo (its model, an episode, predict, bench: ~1 min), so that
# the quick start is checked on every change too
scripts/demo.sh || { echo "test.sh: scripts/demo.sh (the README's quick start) failed" >&2; status=1; }
# the episode reader once more, built against a second HDF5: 1.14 (Debian 13's source, built once
# into .deps by scripts/hdf5_114.sh; the builds above use this machine's 1.10). Its chunk table
# comes from H5Dchunk_iter there, and 1.14's API must compile. Built by clang (installed by
# setup.sh), CUDA off: every CPU target compiles and links, and the CPU ops' vector clones and a
# whole model run. A folder an older test.sh configured for GCC starts afresh (CMake would wipe its cache and
# drop the -D options with it).
h5rc=0
h5=$(scripts/hdf5_114.sh) || h5rc=$?
if [ -f build-h5114/CMakeCache.txt ] && ! grep -q '^CMAKE_C_COMPILER:.*clang' build-h5114/CMakeCache.txt; then
    rm -rf build-h5114
fi
if [ $h5rc -eq 0 ] && ! ACT_EXTRA_PKGS=clang ACT_HDF5_ROOT="$h5" scripts/setup.sh build-h5114 \
        -DACT_ENABLE_CUDA=OFF -DCMAKE_C_COMPILER=clang; then
    echo "test.sh: the build against HDF5 1.14 (by clang) failed" >&2
    status=1
elif [ $h5rc -eq 0 ]; then
    (cd build-h5114 && ctest --output-on-failure -R 'make_testdata|episode|eval_summary|fuzz_corpus|cpu_ops|test_model$') || status=1
    ACT_BUILD_DIR="$PWD/build-h5114" "$PY" -m pytest -q --basetemp "$ttmp/h5114" tests/python/test_episode_chunks.py \
        tests/python/test_episode_direct.py tests/python/test_episode_inflate.py tests/python/test_episode_libver.py tests/python/test_episode_lzf.py \
        tests/python/test_episode_fletcher.py \
        tests/python/test_eval.py || status=1
elif [ $h5rc -eq 2 ]; then
    echo "test.sh: SKIPPED the HDF5 1.14 leg: its source could not be fetched (see above)" >&2
else
    status=1
fi
exit $status
