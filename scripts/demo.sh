#!/usr/bin/env bash
# demo.sh - the main job on the built-in demo model, from a fresh machine:
# install + build, make the demo model (full act_resnet size, deterministic seed, converted by the
# real converter) and a synthetic socket-peg episode, then predict its action chunks and report
# latency. Runs on the GPU when one is usable, else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's interpreter: the one the apt packages (torch, h5py, numpy) install into.
PY=${ACT_PYTHON:-/usr/bin/python3}
scripts/setup.sh build
mkdir -p weights demo
if [ ! -f weights/demo.actw ]; then
  echo "demo: making the demo model (act_resnet, seed 0) ..." >&2
  ACT_PYTHON=$PY scripts/make_full_model.sh demo weights/demo.actw
fi
[ -f demo/episodes/episode_0.hdf5 ] || \
  "$PY" tools/make_episodes.py --out demo/episodes --episodes 1 --T 24 --image-size 256 --seed 0
./build/act-infer info --model weights/demo.actw
./build/act-infer predict --model weights/demo.actw --episode demo/episodes/episode_0.hdf5 \
    --out demo/pred.npy --batch 8
"$PY" -c "import numpy as np; p = np.load('demo/pred.npy'); print('demo: predicted chunks', p.shape, 'first action of step 0:', np.round(p[0, 0, :6], 4))"
./build/act-infer bench --model weights/demo.actw --batch 1 --iters 10 --warmup 2
