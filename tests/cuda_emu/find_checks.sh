#!/bin/sh
# find_checks.sh ACT_INFER MODEL - what measuring conv algorithms (cuDNN's Find) must not cost,
# on the CUDA emulator (ACT_CUDA_EMULATOR set by ctest) with Find ranking its list backwards
# (ACT_EMU_CUDNN=find-reverse), so that plans take other algorithms than the heuristics' first:
#  1. cuDNN's fused bias stays: every fp32 conv of the model is one fused call in the captured
#     graph (ACT_EMU_TRACE=1 prints the node counts), none a bare cudnnConvolutionForward plus a
#     bias kernel (the identity-epilogue convs need IMPLICIT_PRECOMP_GEMM);
#  2. device memory: the session holds no more than with the heuristics' choices
#     (ACT_CUDA_CONV_ALGO=heuristic), at batch 3;
#  3. tensor cores stay: in bf16, with Find ranking as the heuristics do (the emulator's list
#     offers IMPLICIT_PRECOMP_GEMM and IMPLICIT_GEMM with CUDNN_TENSOR_OP_MATH first, then
#     IMPLICIT_GEMM with DEFAULT_MATH), every conv node of the captured graph runs with
#     TENSOR_OP_MATH ("math 1" in ACT_EMU_TRACE=2's node list). A filter that held bf16 to
#     fp32's rules (no tensor ops) computes the same numbers, and no parity test sees it.
#  4. no transform algorithm in bf16: the emulator ranks WINOGRAD_NONFUSED (algo 7) first for
#     16-bit 3x3 convs, as a real cuDNN may; no conv node may run it (nor FFT, 4 and 5, nor
#     the fused WINOGRAD, 6: only the GEMM family, 0-3) unless
#     ACT_CUDA_CONV_TRANSFORMS16=1 allows them, in which case some node must (or the check
#     below could not fail).
set -u
infer=$1
model=$2
run() {   # batch, then VAR=value... -> act-infer bench's output (fp32 unless PREC is set)
    b=$1
    shift
    env ACT_EMU_TRACE=1 "$@" "$infer" bench --model "$model" --device cuda \
        --precision "${PREC:-fp32}" --batch "$b" --iters 2 --warmup 1 --profile-iters 0 2>&1
}
fail=0
out=$(run 1 ACT_EMU_CUDNN=find-reverse) || { echo "$out"; exit 1; }
graph=$(echo "$out" | grep 'graph instantiated' | tail -1)   # the step's (the GEMM tuner's come first)
echo "measured, batch 1: $graph"
convs=$(echo "$graph" | sed -n 's/.*cudnnConvolutionBiasActivationForward=\([0-9]*\).*/\1/p')
if [ -z "$convs" ] || echo "$graph" | grep -q 'cudnnConvolutionForward='; then
    echo "FAIL: a conv lost cuDNN's fused bias under a measured choice"
    fail=1
fi
held() { echo "$1" | sed -n 's/^memory  device \([0-9.]*\) MiB held.*/\1/p'; }
h=$(run 3 ACT_CUDA_CONV_ALGO=heuristic) || { echo "$h"; exit 1; }
m=$(run 3 ACT_CUDA_CONV_ALGO=find ACT_EMU_CUDNN=find-reverse) || { echo "$m"; exit 1; }
h=$(held "$h")
m=$(held "$m")
echo "device memory held at batch 3: heuristic ${h:-?} MiB, measured ${m:-?} MiB"
if [ -z "$h" ] || [ -z "$m" ] || [ "$(echo "$m $h" | awk '{print ($1 > $2)}')" != 0 ]; then
    echo "FAIL: measuring made the session hold more device memory than the heuristics"
    fail=1
fi
o=$(PREC=bf16 run 1 ACT_EMU_TRACE=2) || { echo "$o"; exit 1; }
nodes=$(echo "$o" | grep 'cuda-emu:   \[lane' | grep -o 'Forward algo [0-9]* math [0-9]*')
total=$(echo "$nodes" | grep -c 'math')
plain=$(echo "$nodes" | grep -vc 'math 1$')
echo "bf16 conv nodes, batch 1: $total, $plain without TENSOR_OP_MATH"
if [ "$total" = 0 ] || [ "$plain" != 0 ]; then
    echo "$nodes" | sort | uniq -c
    echo "FAIL: a bf16 conv left tensor cores (or no conv node was listed)"
    fail=1
fi
transforms() { echo "$1" | grep 'cuda-emu:   \[lane' | grep -c 'Forward algo [4-7] '; }
t=$(transforms "$o")
a=$(PREC=bf16 run 1 ACT_EMU_TRACE=2 ACT_CUDA_CONV_TRANSFORMS16=1) || { echo "$a"; exit 1; }
ta=$(transforms "$a")
echo "bf16 conv nodes on FFT/Winograd transforms, batch 1: $t by default, $ta with ACT_CUDA_CONV_TRANSFORMS16=1"
if [ "$t" != 0 ] || [ "$ta" = 0 ]; then
    echo "FAIL: a bf16 conv ran a transform algorithm by default (or the emulator offered none to refuse)"
    fail=1
fi
exit $fail
