#!/usr/bin/env bash
# test_torch2.sh - the Python side (fixtures, reference, converter, client, benches) under the
# torch and numpy of the GPU machine's image (torch 2.11, torchvision 0.26, numpy 2.x) rather
# than Debian's torch 1.13 / numpy 1.24, which CI uses. torch >= 2.6 changed torch.load's default
# (weights_only) and numpy 2 moved numpy.core: this is where such breakage shows before a device
# run or a user's environment finds it.
#
#   scripts/test_torch2.sh [pytest paths and options]   (default: every test in tests/python,
#       then the comparison; e.g. tests/python/test_serve.py -k pip for one test)
#
# Needs PyPI (the venv, ~5 GB with torch's CUDA libraries, goes to .venv-torch2/, git-ignored;
# made once) and a build (scripts/setup.sh build). Not part of CI: the download is too big for it.
# Then it runs bench/compare_torch.py on the small model with every torch.compile peer on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ACT_TORCH2_VENV:-$PWD/.venv-torch2}
BASE=${ACT_TORCH2_PYTHON:-python3}     # any CPython 3.10-3.13 with venv
if [ ! -e "$VENV/.act-ready" ]; then   # (made once; an install cut short is redone)
    echo "test_torch2: making $VENV (torch 2.11.0, torchvision 0.26.0, numpy 2.x from PyPI)" >&2
    if ! "$BASE" -m venv --help >/dev/null 2>&1; then
        echo "test_torch2: $BASE has no venv module (Debian: apt-get install python3-venv)" >&2
        exit 2
    fi
    [ -x "$VENV/bin/python" ] || "$BASE" -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.11.0 torchvision==0.26.0 "numpy>=2" h5py pyyaml pytest zstandard wheel matplotlib
    touch "$VENV/.act-ready"
fi
PY=$VENV/bin/python
"$PY" -c "import torch, numpy; print('test_torch2: torch', torch.__version__, 'numpy', numpy.__version__)"
[ -x build/act-infer ] || scripts/setup.sh build
status=0
ACT_BUILD_DIR="$PWD/build" "$PY" -m pytest -q -p no:cacheprovider "${@:-tests/python}" || status=1
if [ $# -eq 0 ]; then
    "$PY" bench/compare_torch.py --device cpu --config small --batch 1 --iters 3 --warmup 1 \
        --budget-s 900 --json /tmp/act_compare_torch2.json || status=1
fi
exit $status
