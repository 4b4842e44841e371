#!/usr/bin/env bash
# episode_read_ab.sh - the episode reader with and without its chunk table (ACT_EPISODE_INDEX=0:
# HDF5's lookups per chunk), in one or more builds (e.g. one against HDF5 1.10, one against 1.14:
# scripts/hdf5_114.sh), alternated, on episodes made by bench/episode_layouts.py. Prints the
# second round's timesteps/s (each round opens the episode: the open is included) and the reader
# each run used.
#   bench/episode_read_ab.sh [-n ALTERNATIONS] [-m MODEL] BUILD_DIR[,BUILD_DIR...] EP.hdf5...
# e.g. bench/episode_read_ab.sh build,build-h5114 /tmp/ep700.hdf5
set -euo pipefail
cd "$(dirname "$0")/.."
alts=3
model=weights/demo.actw
while getopts "n:m:" o; do
    case $o in n) alts=$OPTARG ;; m) model=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ]; then sed -n 2,8p "$0"; exit 2; fi
IFS=, read -r -a builds <<< "$1"
shift
for ep in "$@"; do
    for alt in $(seq "$alts"); do
        for b in "${builds[@]}"; do
            for ix in 0 1; do
                r=$(ACT_EPISODE_INDEX=$ix timeout 600 "$b/bench_episode_read" --model "$model" --episodes "$ep" \
                    --rounds 2 2>&1) || { echo "$ep $b INDEX=$ix: failed: $(echo "$r" | tail -1)"; continue; }
                echo "$(basename "$ep") alt$alt $b INDEX=$ix | $(echo "$r" | grep '^round 2' |
                      grep -o '[0-9]* timesteps/s') | $(echo "$r" | grep '^reader  front' | cut -c9-)"
            done
        done
    done
done
