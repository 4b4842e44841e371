#!/bin/sh
# gemm_algo_checks.sh ACT_INFER MODEL - the cuBLASLt linears' algorithm is the measured fastest
# of the heuristic's candidates, on the CUDA emulator (ACT_CUDA_EMULATOR set by ctest), whose
# heuristic offers two (#0 and #1; ACT_EMU_TRACE=2 names each captured node "cublasLtMatmul #i"):
#  1. ACT_EMU_CUBLASLT=slow-first (#0 takes 2 ms more per run): every linear of the captured
#     graph runs #1; with ACT_CUDA_GEMM_ALGO=heuristic every one runs #0 (no measurement);
#  2. refuse-first (#0 refused at every run): every linear still runs on cuBLASLt, as #1, none
#     falls back to cublasGemmEx + a bias kernel (fp32 keeps its bias-less / erf-GELU linears
#     there anyway); with the heuristic alone they all fall back;
#  3. refuse-others: every linear runs #0 (a candidate that refuses is never chosen).
#  5. slightly-slow-first (#0 twice its own time + 10 us a run: short enough that a small shape's
#     timed batch holds several runs): the batches are captured graphs of their own (a few-us GEMM launched one by one
#     would time the host's launch rate), #1 is still chosen everywhere; with ACT_CUDA_GRAPHS=0
#     no graph at all is made, the batches are plain launches and #1 is chosen all the same.
#  6. slow-launch (400 us more for each plain call, a host's launch cost): the batches are sized
#     again from the first candidate's graph, so every shape is timed as graphs at the GPU's
#     pace, not as single plain launches (or graphs of one run) sized by the host's;
#  4. ACT_CUDA_ALGO_LOG=1 logs each measured choice ("act-engine: algo: ..." on stderr) beside
#     the heuristic's, for linears and convs alike; without it nothing is logged.
# In fp32 and bf16, batch 1 (graphs on).
set -u
. "$(dirname "$0")/step_graph.sh"
infer=$1
model=$2
fail=0
# prec VAR=value... -> "N0 N1 NGEMMEX": the captured graph's cuBLASLt nodes by algorithm, and
# its cublasGemmEx nodes
nodes() {
    p=$1
    shift
    out=$(env "$@" ACT_EMU_TRACE=2 "$infer" bench --model "$model" --device cuda --precision "$p" \
        --batch 1 --iters 2 --warmup 1 --profile-iters 0 2>&1) || { echo "$out" >&2; echo "x x x"; return; }
    listed=$(step_nodes "$out")
    echo "$(echo "$listed" | grep -c 'cublasLtMatmul #0') $(echo "$listed" | grep -c 'cublasLtMatmul #1')" \
         "$(echo "$listed" | grep -c 'cublasGemmEx')"
}
expect() {   # what got want
    if [ "$2" = "$3" ]; then echo "ok   $1: $2"; else echo "FAIL $1: #0 #1 GemmEx nodes $2, expected $3"; fail=1; fi
}
for p in fp32 bf16; do
    set -- $(nodes $p)
    total=$(($1 + $2)) g=$3
    if [ "$total" -lt 1 ]; then
        echo "FAIL $p: no cuBLASLt linears in the default graph ($*)"
        fail=1
        continue
    fi
    expect "$p slow-first, measured" "$(nodes $p ACT_EMU_CUBLASLT=slow-first)" "0 $total $g"
    expect "$p slow-first, heuristic" \
        "$(nodes $p ACT_EMU_CUBLASLT=slow-first ACT_CUDA_GEMM_ALGO=heuristic)" "$total 0 $g"
    expect "$p refuse-first, measured" "$(nodes $p ACT_EMU_CUBLASLT=refuse-first)" "0 $total $g"
    expect "$p refuse-first, heuristic (all fall back)" \
        "$(nodes $p ACT_EMU_CUBLASLT=refuse-first ACT_CUDA_GEMM_ALGO=heuristic)" "0 0 $((g + total))"
    expect "$p refuse-others, measured" "$(nodes $p ACT_EMU_CUBLASLT=refuse-others)" "$total 0 $g"
done
log() {   # VAR=value... -> the "act-engine: algo:" lines of a bf16 run
    env "$@" "$infer" bench --model "$model" --device cuda --precision bf16 --batch 1 --iters 1 \
        --warmup 0 --profile-iters 0 2>&1 | grep '^act-engine: algo: '
}
logged=$(log ACT_EMU_CUBLASLT=slow-first ACT_CUDA_ALGO_LOG=1)
n1=$(echo "$logged" | grep -c 'cuBLASLt .*: candidate 1 of 2 (.* us a run), the heuristic.s first 0 (')
n0=$(echo "$logged" | grep -c 'cuBLASLt .*: candidate 0 of')
nc=$(echo "$logged" | grep -c 'cuDNN conv .*: measured [A-Z_]* (.* ms), the heuristics. [A-Z_]* (')
if [ "$n1" -ge 1 ] && [ "$n0" = 0 ] && [ "$nc" -ge 1 ]; then
    echo "ok   ACT_CUDA_ALGO_LOG=1: $n1 linear shapes on candidate 1, $nc conv shapes logged"
else
    echo "FAIL ACT_CUDA_ALGO_LOG=1: $n1 linears on candidate 1, $n0 on 0, $nc convs logged:"
    echo "$logged" | head -5
    fail=1
fi
# A choice between runs 2x + 10 us apart is timed on this host's clock: a loaded CI host can stall
# both rounds of one shape (the emulator's work is the host's), so a failed try is run once more
# and the check fails only when both do (a wrong choice is made every time).
slightly() {   # graphs -> "ok ..." or "FAIL ..."
    out=$(ACT_CUDA_GRAPHS=$1 ACT_EMU_CUBLASLT=slightly-slow-first ACT_CUDA_ALGO_LOG=1 ACT_EMU_TRACE=1 \
          "$infer" bench --model "$model" --device cuda --precision bf16 --batch 1 --iters 2 --warmup 1 \
          --profile-iters 0 2>&1)
    n1=$(echo "$out" | grep -c 'cuBLASLt .*: candidate 1 of 2')
    n0=$(echo "$out" | grep -c 'cuBLASLt .*: candidate 0 of')
    tg=$(echo "$out" | grep -c 'graph instantiated: [0-9]* nodes in 1 lane: cublasLtMatmul=[0-9]*$')
    # each timed batch's graph is launched once per round (two rounds), beside the step's own
    gl=$(echo "$out" | sed -n 's/^cuda-emu: operations run:.* graphLaunch=\([0-9]*\).*/\1/p')
    if [ "$1" = 1 ]; then want_tg=$([ "$tg" -ge 1 ] && [ "${gl:-0}" -ge $((2 * tg)) ] && echo y)
    else want_tg=$([ "$tg" = 0 ] && [ -z "$gl" ] && echo y); fi
    if [ "$n1" -ge 1 ] && [ "$n0" = 0 ] && [ "$want_tg" = y ]; then
        echo "ok   slightly-slow-first, ACT_CUDA_GRAPHS=$1: $n1 linear shapes on candidate 1, $tg timed batches as graphs, ${gl:-no} graph launches"
    else
        echo "FAIL slightly-slow-first, ACT_CUDA_GRAPHS=$1: $n1 linears on candidate 1, $n0 on 0, $tg timed batches as graphs, ${gl:-no} graph launches"
        echo "$out" | grep 'cuBLASLt .*: candidate 0 of' | head -2
    fi
}
for graphs in 1 0; do
    r=$(slightly $graphs)
    case $r in
    ok*) echo "$r" ;;
    *) r2=$(slightly $graphs)
       case $r2 in
       ok*) echo "$r2 (on a second try; the first: ${r#FAIL })" ;;
       *) echo "$r"; echo "$r2 (second try)"; fail=1 ;;
       esac ;;
    esac
done
# a host whose every plain cublasLtMatmul costs 400 us more (slow-launch): one plain run's time
# is mostly that, so batches sized from it alone are 1 run, launched one by one (timing the
# host) or as a graph of 1; sized again from the first candidate's graph, every shape is timed
# as graphs at the (emulated) GPU's pace, well under the 400 us, and of 2+ runs wherever a run
# takes under 25 us (the target is 50 us a batch: the batch is sized from one measurement and the
# logged figure is another, so a shape near the target may land either side; under ASan on a
# loaded CI host a 31.8 us shape was sized from a 50+ us one). Absolute speeds vary (ASan,
# load): the figures only need to stay clear of the 400 us.
out=$(ACT_EMU_CUBLASLT=slow-launch ACT_CUDA_ALGO_LOG=1 "$infer" bench --model "$model" --device cuda \
      --precision bf16 --batch 1 --iters 2 --warmup 1 --profile-iters 0 2>&1)
lines=$(echo "$out" | grep '^act-engine: algo: cuBLASLt .*: candidate [0-9]* of ')
n=$(echo "$lines" | grep -c 'candidate')
bad=$(echo "$lines" | awk '{
    us = $0; sub(/.*candidate [0-9]* of [0-9]* \(/, "", us); sub(/ us a run.*/, "", us)
    reps = $0; sub(/.*timed in batches of /, "", reps); sub(/ run.*/, "", reps)
    if ($0 !~ /as graphs$/ || us + 0 >= 200 || (us + 0 < 25 && reps + 0 < 2)) print
}')
if [ "$n" -ge 1 ] && [ -z "$bad" ]; then
    echo "ok   slow-launch: $n linear shapes timed as graphs at the GPU's pace ($(echo "$lines" |
         sed -n 's/.*(\([0-9.]*\) us a run).*batches of \([0-9]*\) runs.*/\1 us x \2/p' | head -3 | paste -sd, ) ...)"
else
    echo "FAIL slow-launch: of $n shapes, these were timed at the host's pace, plainly or in batches too short:"
    echo "${bad:-(no shape logged)}" | head -3
    fail=1
fi
quiet=$(log ACT_EMU_CUBLASLT=slow-first)
if [ -n "$quiet" ]; then
    echo "FAIL choices logged without ACT_CUDA_ALGO_LOG: $(echo "$quiet" | head -1)"
    fail=1
fi
exit $fail
