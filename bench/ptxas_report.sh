#!/usr/bin/env bash
# ptxas_report.sh - registers, spills, stack and shared memory of every kernel in kernels/*.cu,
# as ptxas reports them for one GPU architecture (default sm_90, the H200). Needs nvcc only,
# no GPU: a kernel that spills or needs a stack frame shows here before any profiler run.
#   bench/ptxas_report.sh [sm_XX]
# Exit status 1 when a kernel spills or needs a stack frame (a local array indexed at run time,
# a kernel parameter whose address is taken: every thread then copies it to local memory),
# 2 when a file does not compile; ctest runs it (test_kernels_no_local_memory).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-sm_90}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in kernels/*.cu; do
    b=$(basename "$f")
    if ! "$NVCC" -arch="$ARCH" -O3 -std=c++17 -Ikernels -Iengine -c "$f" -o "$tmp/k.o" -Xptxas -v \
            >"$tmp/$b.log" 2>&1; then
        cat "$tmp/$b.log" >&2
        echo "ptxas_report: $f does not compile for $ARCH" >&2
        exit 2
    fi
    # the numbers follow the line's leading blanks (a greedy ".*" before a number would keep
    # only its last digit)
    sed -n "s/.*Compiling entry function '\([^']*\)'.*/entry \1 $b/p;
            s/^[^0-9]*\([0-9][0-9]*\) bytes stack frame, \([0-9][0-9]*\) bytes spill stores, \([0-9][0-9]*\) bytes spill loads.*/frame \1 \2 \3/p;
            s/.*Used \([0-9][0-9]*\) registers.*/regs \1 &/p" "$tmp/$b.log"
done >"$tmp/all"
awk -v arch="$ARCH" '
    BEGIN { printf "%-24s %-15s %5s %6s %12s %6s\n", "kernel (" arch ")", "file", "regs", "stack", "spill st/ld", "smem"; bad = 0; n = 0 }
    # a mangled name is _Z<length><name><parameter types>: keep the name
    $1 == "entry" { cur = $2; if (match($2, /^_Z[0-9]+/)) cur = substr($2, RLENGTH + 1, substr($2, 3, RLENGTH - 2) + 0);
                    f[cur] = $3; n++ }
    $1 == "frame" { st[cur] = $2; sp[cur] = $3 "/" $4; if ($3 + $4 > 0 || $2 > 0) { bad = 1; worst = worst " " cur } }
    $1 == "regs"  { r[cur] = $2; sm[cur] = 0; if (match($0, /[0-9]+ bytes smem/)) sm[cur] = substr($0, RSTART, RLENGTH - 11) + 0;
                    printf "%-24s %-15s %5d %6d %12s %6d\n", cur, f[cur], r[cur], st[cur], sp[cur], sm[cur] }
    END { if (n == 0) { print "no kernel found in the ptxas output"; exit 2 }
          print (bad ? "some kernel spills or needs a stack frame:" worst : "no kernel spills or needs a stack frame")
          exit bad }' "$tmp/all"
