#!/usr/bin/env bash
# ptxas_report.sh - registers, spills, stack and shared memory of every kernel in kernels/*.cu,
# as ptxas reports them for one GPU architecture (default sm_90, the H200). Needs nvcc only,
# no GPU: a kernel that spills or needs a stack frame shows here before any profiler run.
#   bench/ptxas_report.sh [sm_XX]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-sm_90}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in kernels/*.cu; do
    "$NVCC" -arch="$ARCH" -O3 -std=c++17 -Ikernels -Iengine -c "$f" -o "$tmp/k.o" -Xptxas -v 2>&1 |
        sed -n "s/.*Compiling entry function '\([^']*\)'.*/entry \1 $(basename "$f")/p;
                s/.*\([0-9][0-9]*\) bytes stack frame, \([0-9][0-9]*\) bytes spill stores, \([0-9][0-9]*\) bytes spill loads.*/frame \1 \2 \3/p;
                s/.*Used \([0-9][0-9]*\) registers.*/regs \1 &/p"
done | awk -v arch="$ARCH" '
    BEGIN { printf "%-24s %-15s %5s %6s %12s %6s\n", "kernel (" arch ")", "file", "regs", "stack", "spill st/ld", "smem"; bad = 0 }
    # a mangled name is _Z<length><name><parameter types>: keep the name
    $1 == "entry" { cur = $2; if (match($2, /^_Z[0-9]+/)) cur = substr($2, RLENGTH + 1, substr($2, 3, RLENGTH - 2) + 0);
                    f[cur] = $3 }
    $1 == "frame" { st[cur] = $2; sp[cur] = $3 "/" $4; if ($3 + $4 > 0 || $2 > 0) bad = 1 }
    $1 == "regs"  { r[cur] = $2; sm[cur] = 0; if (match($0, /[0-9]+ bytes smem/)) sm[cur] = substr($0, RSTART, RLENGTH - 11) + 0;
                    printf "%-24s %-15s %5d %6d %12s %6d\n", cur, f[cur], r[cur], st[cur], sp[cur], sm[cur] }
    END { print (bad ? "some kernel spills or needs a stack frame" : "no kernel spills or needs a stack frame") }'
