#!/usr/bin/env bash
# cpu_ab.sh - the same act-infer bench run with one switch flipped, interleaved in rounds so that
# a noisy shared machine spreads over every variant alike. Prints each variant's min and p50 per
# round and the median of its p50s.
#
#   bench/cpu_ab.sh [--rounds N] [--iters N] [--batch B] [--model M.actw] LABEL:VAR=value[,VAR=value] ...
#
# Example (Winograd convs and the helper threads, full model, batch 1):
#   bench/cpu_ab.sh --rounds 6 --model build/testdata-full/full.actw \
#       im2col:ACT_CPU_WINOGRAD=0 winograd:ACT_CPU_WINOGRAD=1 wino-1thread:ACT_CPU_THREADS=1
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 iters=20 batch=1 model="" bin=${ACT_INFER:-build/act-infer}
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2;;
        --iters) iters=$2; shift 2;;
        --batch) batch=$2; shift 2;;
        --model) model=$2; shift 2;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
        *) break;;
    esac
done
[ $# -ge 1 ] || { echo "cpu_ab: give at least one LABEL:VAR=value variant (--help)" >&2; exit 2; }
[ -x "$bin" ] || { echo "cpu_ab: $bin is not built (cmake --build build)" >&2; exit 2; }
margs=(); [ -n "$model" ] && margs=(--model "$model")
echo "cpu_ab: $(date -u +%FT%TZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), batch $batch, $rounds rounds x $iters steps"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for r in $(seq "$rounds"); do
    for spec in "$@"; do
        label=${spec%%:*} envs=${spec#*:}
        [ "$envs" = "$spec" ] && envs=""
        json=$(mktemp)
        env ${envs//,/ } "$bin" bench "${margs[@]}" --device cpu --batch "$batch" --iters "$iters" \
            --warmup 2 --profile-iters 0 --json "$json" >/dev/null 2>&1 ||
            { echo "cpu_ab: variant $label failed (run it by hand: env ${envs//,/ } $bin bench ...)" >&2; exit 1; }
        python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]['latency_ms']; print(sys.argv[2], r['min'], r['p50'])" \
            "$json" "$label" >>"$tmp"
        rm -f "$json"
    done
done
python3 - "$tmp" "$@" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
order = [s.split(":", 1)[0] for s in sys.argv[2:]]
print(f"{'variant':<16} {'median p50':>10} {'best min':>9}   p50 per round (ms)")
for lab in order:
    mins = [float(r[1]) for r in rows if r[0] == lab]
    p50s = [float(r[2]) for r in rows if r[0] == lab]
    print(f"{lab:<16} {statistics.median(p50s):10.1f} {min(mins):9.1f}   " + " ".join(f"{x:.1f}" for x in p50s))
EOF
