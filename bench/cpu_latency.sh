#!/usr/bin/env bash
# cpu_latency.sh - the CPU goal figure: full act_resnet, batch 1, act-infer vs PyTorch CPU eager in
# the same run, both on the same thread budget (default 2: these machines' cores).
# Usage: bench/cpu_latency.sh [OUT.json] [extra compare_torch.py args...]
# Timings mean something only on a quiet machine: the script prints the load average first and
# refuses to call the figure clean when other work is running (it still measures).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/cpu_latency.json}; shift || true
py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3   # Debian's torch lives there
load=$(cut -d' ' -f1 /proc/loadavg)
echo "cpu_latency: $(date -u +%FT%TZ) on $(nproc) cores, load average $load" >&2
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  echo "cpu_latency: WARNING: the machine is busy (load $load); the figures below are not clean" >&2
fi
exec "$py" bench/compare_torch.py --device cpu --config full --batch 1 --iters 10 --warmup 2 \
     --threads 2 --rounds 3 --peers eager,channels_last,compile-default --json "$out" "$@"
