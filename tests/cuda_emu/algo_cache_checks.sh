#!/bin/sh
# algo_cache_checks.sh ACT_INFER MODEL - measured algorithm choices outlive the process through
# ACT_CUDA_ALGO_CACHE=FILE (kernels/algo_cache.cuh), on the CUDA emulator (ACT_CUDA_EMULATOR set
# by ctest). ACT_EMU_TRACE=2 names each captured linear "cublasLtMatmul #i" and each conv
# "<call> algo <n>", so a graph shows which algorithms its step runs. bf16, batch 1:
#  1. measured under ACT_EMU_CUBLASLT=slow-first and ACT_EMU_CUDNN=find-reverse (choices that
#     differ from the defaults), the choices land in FILE, one line each;
#  2. a second process with FILE and neither switch measures nothing (no "act-engine: algo:"
#     choice lines, both tables say they loaded) and runs the first one's algorithms, where
#     without FILE it runs others (the defaults: the convs differ for certain; the linears' two
#     candidates time alike here, so a measurement without the switches may take either);
#  3. lines of another library version are skipped: that process measures every shape again
#     and appends its own lines;
#  4. lines that are not choices (garbage, random bytes, an overlong line, a cut hex string, a
#     conv algorithm cuDNN does not have) are skipped with one warning a table; the good lines
#     still count;
#  5. a FILE that cannot be written or read is said, and the step still runs; a line of another
#     entry size (an older build's) is skipped as another version's, without a warning;
#  6. choices made with 16-bit transforms kept out (the default) are no answer for a process that
#     allows them (ACT_CUDA_CONV_TRANSFORMS16=1), nor the reverse: with one FILE, each measures
#     its own conv choices (the emulator ranks WINOGRAD_NONFUSED first for bf16 3x3 convs, so the
#     switch's graph runs it), and a third process of either kind then measures nothing.
set -u
. "$(dirname "$0")/step_graph.sh"
infer=$1
model=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/act_algo_cache.XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
fail=0
# VAR=value... -> act-infer bench's output (stderr included); the exit status is kept in $dir/rc
run() {
    env "$@" ACT_EMU_TRACE=2 "$infer" bench --model "$model" --device cuda --precision bf16 --batch 1 \
        --iters 2 --warmup 1 --profile-iters 0 >"$dir/out" 2>&1
    echo $? >"$dir/rc"
    cat "$dir/out"
}
# the step's captured graph's algorithms, as "conv algos | linears" counted by name
algos() {
    listed=$(step_nodes "$1")
    echo "$(echo "$listed" | grep -o 'Forward algo [0-9]*' | sort | uniq -c | tr -s ' ' | paste -sd,)" \
         "| $(echo "$listed" | grep -o 'cublasLtMatmul #[0-9]*' | sort | uniq -c | tr -s ' ' | paste -sd,)"
}
measured() { echo "$1" | grep -c '^act-engine: algo: \(cuBLASLt\|cuDNN conv\)'; }
check() {   # what ok
    if [ "$2" = 1 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}
ran() { [ "$(cat "$dir/rc")" = 0 ]; }

cache=$dir/algos
o1=$(run ACT_CUDA_ALGO_CACHE="$cache" ACT_CUDA_ALGO_LOG=1 ACT_EMU_CUBLASLT=slow-first \
     ACT_EMU_CUDNN=find-reverse)
ran || { echo "$o1"; exit 1; }
chosen=$(algos "$o1")
n1=$(measured "$o1")
lines=$(grep -c '^act-algo 1 \(conv\|gemm\) ' "$cache" 2>/dev/null || echo 0)
echo "measured: $chosen ($n1 shapes logged, $lines lines in the cache)"
check "every measured choice is one line of the cache" \
      "$([ "$n1" -ge 2 ] && [ "$lines" = "$n1" ] && echo 1)"

o3=$(run)
default=$(algos "$o3")
echo "defaults: $default"
check "the switches made choices other than the defaults" "$([ "$chosen" != "$default" ] && echo 1)"

o2=$(run ACT_CUDA_ALGO_CACHE="$cache" ACT_CUDA_ALGO_LOG=1)
ran || { echo "$o2"; exit 1; }
check "a second process measures nothing ($(measured "$o2") shapes logged)" \
      "$([ "$(measured "$o2")" = 0 ] && echo 1)"
check "it says both tables loaded" "$(echo "$o2" | grep -c 'algo: cache .*: [1-9][0-9]* \(conv\|gemm\) choices loaded' \
      | grep -qx 2 && echo 1)"
check "it runs the first process's algorithms ($(algos "$o2"))" "$([ "$(algos "$o2")" = "$chosen" ] && echo 1)"
check "it adds no line" "$([ "$(wc -l <"$cache")" = "$lines" ] && echo 1)"

other=$dir/other
sed 's#/conv\([0-9]*\)/#/conv1\1/#; s#/gemm\([0-9]*\)/#/gemm1\1/#' "$cache" >"$other"
o4=$(run ACT_CUDA_ALGO_CACHE="$other" ACT_CUDA_ALGO_LOG=1)
ran || { echo "$o4"; exit 1; }
skipped=$(echo "$o4" | grep -c ": 0 \(conv\|gemm\) choices loaded, [1-9][0-9]* of other devices or library")
check "another library version's lines are skipped ($skipped tables): that process measures ($(measured "$o4"))" \
      "$([ "$skipped" = 2 ] && [ "$(measured "$o4")" = "$n1" ] && echo 1)"
check "and appends its own lines" "$([ "$(wc -l <"$other")" = $((2 * lines)) ] && echo 1)"

bad=$dir/bad
{
    echo "not a choice"
    echo "act-algo 1 gemm x/sm90/gemm1/128 00ff"
    head -c 3000 /dev/zero | tr '\0' 'a'                       # a line longer than any choice
    echo
    head -c 2048 /dev/urandom                                # bytes, NULs and all
    echo
    # a conv entry naming algorithm 9 (bytes 60-63 of the entry; cuDNN has 0-7)
    grep -m1 ' conv ' "$cache" | awk '{ $5 = substr($5, 1, 120) "09000000" substr($5, 129); print }'
    cat "$cache"
} >"$bad"
o5=$(run ACT_CUDA_ALGO_CACHE="$bad")
ran || { echo "$o5"; exit 1; }
warned=$(echo "$o5" | grep -c 'algorithm cache .*: lines that are not an act-engine algorithm choice skipped')
check "bad lines are skipped with one warning a table ($warned), the good ones used" \
      "$([ "$warned" = 2 ] && [ "$(algos "$o5")" = "$chosen" ] && echo 1)"

# a line of a build whose conv entries were 4 bytes shorter (its tag ends in that size): another
# version's, skipped without a warning, as session 41's longer conv key made every older line
older=$dir/older
grep -m1 ' conv ' "$cache" | awk '{ n = split($4, t, "/"); t[n] = t[n] - 4; tag = t[1];
    for (i = 2; i <= n; i++) tag = tag "/" t[i]; $4 = tag; $5 = substr($5, 1, length($5) - 8); print }' >"$older"
o12=$(run ACT_CUDA_ALGO_CACHE="$older" ACT_CUDA_ALGO_LOG=1)
check "an older build's line (entry 4 bytes shorter) is skipped as another version's, without a warning" \
      "$(ran && ! echo "$o12" | grep -q 'lines that are not an act-engine algorithm choice' &&
         echo "$o12" | grep -q ': 0 conv choices loaded, 1 of other devices or library' && echo 1)"
o6=$(run ACT_CUDA_ALGO_CACHE="$dir/no/such/dir/algos")
check "an unwritable cache is said and the step runs" \
      "$(ran && echo "$o6" | grep -q 'algorithm cache .*: cannot be written' && echo 1)"
mkdir "$dir/adir"
o7=$(run ACT_CUDA_ALGO_CACHE="$dir/adir")
check "an unreadable cache (a folder) is said and the step runs" \
      "$(ran && echo "$o7" | grep -q 'algorithm cache .*: cannot be read' && echo 1)"

x16=$dir/x16
o8=$(run ACT_CUDA_ALGO_CACHE="$x16" ACT_CUDA_ALGO_LOG=1)
ran || { echo "$o8"; exit 1; }
o9=$(run ACT_CUDA_ALGO_CACHE="$x16" ACT_CUDA_ALGO_LOG=1 ACT_CUDA_CONV_TRANSFORMS16=1)
ran || { echo "$o9"; exit 1; }
convs() { echo "$1" | grep -c '^act-engine: algo: cuDNN conv'; }
wino() { algos "$1" | grep -c 'Forward algo [4-7]'; }
check "a process allowing 16-bit transforms measures its own conv choices ($(convs "$o9") of $(convs "$o8") shapes) and runs a transform ($(algos "$o9"))" \
      "$([ "$(convs "$o8")" -ge 1 ] && [ "$(convs "$o9")" = "$(convs "$o8")" ] && [ "$(wino "$o9")" -ge 1 ] && echo 1)"
o10=$(run ACT_CUDA_ALGO_CACHE="$x16" ACT_CUDA_ALGO_LOG=1)
o11=$(run ACT_CUDA_ALGO_CACHE="$x16" ACT_CUDA_ALGO_LOG=1 ACT_CUDA_CONV_TRANSFORMS16=1)
check "with both kinds in the file, neither measures again, and only the switch's runs a transform" \
      "$([ "$(measured "$o10")" = 0 ] && [ "$(measured "$o11")" = 0 ] && [ "$(wino "$o10")" = 0 ] && [ "$(wino "$o11")" -ge 1 ] && echo 1)"
exit $fail
