#!/usr/bin/env bash
# make_full_model.sh WORKDIR OUT.actw - the full-size act_resnet model every full-size run uses
# (the demo, the emulator's parity fixture, the GPU check): the PyTorch reference agent at seed 0
# saved as a training checkpoint (WORKDIR/full.pt, agent.yaml, dataset_stats.pkl) and converted by
# the real converter to OUT.actw. Deterministic: the same bytes on every machine with the same
# torch. ACT_PYTHON names the interpreter with torch (default: Debian's /usr/bin/python3).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 WORKDIR OUT.actw" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
PY=${ACT_PYTHON:-/usr/bin/python3}
mkdir -p "$1"
"$PY" tools/act_reference.py make-checkpoint --out "$1/full.pt" --config full --seed 0 \
    --stats-out "$1/dataset_stats.pkl" --config-out "$1/agent.yaml"
"$PY" tools/convert_checkpoint.py "$1/full.pt" -o "$2" --config "$1/agent.yaml" \
    --stats "$1/dataset_stats.pkl"
