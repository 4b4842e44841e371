#!/usr/bin/env bash
# device_check.sh - the whole GPU check in one command, for a fresh GPU machine (the H200 of the
# project: torch at python3, nvcc, cmake; no apt, no network). Run from anywhere:
#
#   OUT=/some/dir tests/gpu/device_check.sh
#
# From this VM: tests/gpu/prepare_devdeps.sh, then the device tool's run with this script,
# carry [".devdeps"], timeout ~420 s and kind "nvidia-h200" (the tool's default is an H100 now:
# an H100 run checks every parity row just as well, but its timings are not the H200 goals').
#
# $OUT gets three files, rewritten after every row so that a run cut off by its time limit still
# leaves them: summary.txt (the table so far), logs.tgz (every step's log and JSON, from a fresh
# folder under /tmp that the first line names) and compare.json (the peer comparison). The device
# tool brings back at most 8 files from $OUT, so the ~40 logs travel as one archive:
#   tar -xzf logs.tgz -C somewhere    (then e.g. somewhere/ops.log)
#
# Steps, each with its own time limit inside one budget (ACT_CHECK_BUDGET_S, default 330 s),
# each failing soft (a failed step is reported and the next one runs):
#   deps       (tests/gpu/prepare_devdeps.sh fills .devdeps here) unpack the carried .devdeps/*.deb (OpenBLAS, zstd headers) into /tmp and point
#              ACT_BLAS_ROOT / ACT_ZSTD_ROOT / LD_LIBRARY_PATH at them; find cuDNN in the torch
#              wheel (nvidia.cudnn: lib/libcudnn.so.9 has no unversioned link, so make one in
#              /tmp), headers from the wheel or .devdeps/cudnn/include. HDF5 (for the eval rows)
#              from .devdeps/hdf5, an h5py wheel's libraries: linked only if a probe program
#              (tests/gpu/hdf5_probe.c) writes and reads a file through it (hdf5_setup)
#   episodes   (in the background during the build, if HDF5 is there) tools/make_episodes.py:
#              two short gzip episodes, then one raw and one gzip episode of 512 timesteps,
#              hard-linked 8 and 4 times, then six raw ones of 40-55 timesteps (pad-ab)
#   build      cmake (sm_90, Release) + build -j16 into build-dev/
#   testdata   tests/make_testdata.py (small models) + a full act_resnet checkpoint -> full.actw
#   ops        tests/test_backend_ops: every CUDA op vs the CPU backend, 4 precisions x 3 batches
#              (feature maps NCHW in fp32/tf32, NHWC in bf16/fp16; if a conv fails: again on the
#              direct conv kernel, ACT_CUDA_CONV=direct)
#   ops-nhwc32, ops-nchw16  the vision ops once more in the other layout of each precision
#              (ACT_CUDA_LAYOUT)
#   e2e        tests/test_cuda_e2e: whole steps vs the CPU session, every precision, graphs on/off
#   ops-stem8  conv and preprocess with the stem's input padded to 8 channels (stem-ab's variant)
#   e2e-lanes  the same, small models, batches 2-3 through the per-camera upload lane (and the
#              stem's input padded to 8 channels)
#   e2e-fuse16 the same, full size, with bf16/fp16 convs through cuDNN's fused bias+ReLU
#              (if ops or e2e fail: the op table again with the fused epilogues off)
#   eval       act-infer eval over two short gzip HDF5 episodes, fp32: CUDA vs CPU summaries within
#              1e-4 (the eval path's parity: frames pulled by the GPU from the reader's buffers)
#   memcheck   compute-sanitizer memcheck on full-size steps (eager, captured and replayed)
#   racecheck  compute-sanitizer racecheck on the attention and norm kernels
#   bench      bench/compare_torch.py --device cuda (if present): ours vs PyTorch eager/compile
#   goals      (a note after bench) each goal line compare_torch judged, met or NOT, with its figure
#   serve      bench/serve_load.py: act-serve on the GPU, 1/8/32 loopback clients, batching on/off,
#              frames over TCP and in shared memory over the Unix socket
#   profile    act-infer bench's section profile (bf16 batch 1 and 256, fp32 batch 1): the four
#              sections that take the most of the step (full tables in profile_*.log)
#   ncu        Nsight Compute on an eager bf16 batch-1 step: kernel time per step, the kernels that
#              take most of it and their compute/memory speed of light (a note where the runtime
#              gives no hardware counters)
#   eval-speed act-infer eval over HDF5 episodes, bf16 batch 256: the steady timesteps/s (past each
#              batch size's first step), the wall rate and the reader-wait share, on raw and gzip
#   algo-ab    act-infer bench, full model, bf16 at batch 1 and 256 (algo-ab32: fp32, batch 1):
#              conv algorithms measured by cuDNN's Find at each shape's first step (the default)
#              vs the heuristics' first choice (ACT_CUDA_CONV_ALGO=heuristic)
#   gemm-ab    the same for the linears (gemm-ab32: fp32, batch 1): cuBLASLt algorithms timed
#              among the heuristic's candidates (the default) vs its first (ACT_CUDA_GEMM_ALGO)
#   xform-ab   act-infer bench, full model, bf16 at batch 1 and 256: 16-bit convs kept to cuDNN's
#              GEMM-family algorithms (the default: the parity rows measured those) vs FFT and
#              non-fused Winograd allowed too (ACT_CUDA_CONV_TRANSFORMS16=1; its choices in ab.log);
#              a gain there needs the e2e row rerun with the switch before it can be a default
#   algo-log   (a note after the A/B rows) how many measured conv and GEMM shapes of those rows
#              took another algorithm than the heuristics' first (ACT_CUDA_ALGO_LOG lines, with
#              both times, in ab.log)
#   stem-ab    act-infer bench, full model, bf16 at batch 1 and 256: the stem conv's input padded
#              from 3 channels to 4 or 8 (zeros; ACT_CUDA_STEM_CHANNELS, its filter padded at
#              load) vs 3 (the default); ops-stem8 and e2e-lanes check its parity
#   layout-ab  act-infer bench, full model, bf16 at batch 1 and 64, feature maps NCHW vs NHWC
#   pipeline-ab act-infer bench, full model, bf16 at batch 64 and 256: frames uploaded per camera
#              on a second stream while the trunk runs on the camera before, vs all at once
#   attn-ab    act-infer bench, full model, bf16 at batch 1 and 4 (attn-ab32: fp32, batch 1):
#              attention + out-projection + residual LayerNorm as one kernel vs three ops
#   group-ab   act-infer bench, full model, bf16 at batch 1: the decoder's cross-attention K/V
#              as one GEMM over stacked weights (the default) vs one GEMM per layer
#   fusion-ab  act-infer bench, full model, batch 1, fp32 and bf16, with the fused epilogues
#              (cuDNN conv+bias+ReLU, cuBLASLt GEMM+bias, bf16 GEMM+bias+GELU) on and off
#   inputs-ab  act-infer bench, full model, bf16 at batch 1 and 256: frames copied by act_run
#              from the caller's memory vs written into the session's pinned input buffers
#              (--staged-inputs, what every other bench row uses)
#   gather-ab  act-infer bench, full model, bf16 at batch 1, 32 and 256: frames uploaded by DMA from
#              the pinned input buffers vs read in place by the gather kernel (--in-place-inputs)
#   serve-warm act-serve's start-to-ready time in bf16 at max-batch 32 (run with copy-ab/io-ab):
#              measuring every batch size's conv/GEMM algorithms, then with them from the shared
#              algorithm cache (ACT_CUDA_ALGO_CACHE; every act-serve here uses it); both for the
#              default sizes (--batch-sizes auto: 1,2,4,8,16,24,32, a batch padded up to the next)
#              and for every size 1-32 (all)
#   sizes-ab   act-serve, bf16, 12 and 20 TCP clients: batches padded up to the next of the
#              default sizes (12 -> 16, 20 -> 24) vs every size warmed and run as it comes (all)
#   copy-ab    act-serve, bf16, 1 and 32 clients over shared memory and TCP: a batch's frames
#              copied into the pinned input buffers by one thread, by --copy-threads' default
#              (half the cores, at most 8), or not at all: read in place from the registered
#              memfds and receive buffers (the default)
#   io-ab      act-serve, bf16, 1 and 32 TCP clients: every frame received by one I/O thread vs
#              --io-threads' default (one per 4 cores, at most 4)
#   pad-ab     act-infer eval, bf16 batch 32, 6 episodes of 40-55 timesteps: the last batches at
#              --pad-batches auto (few: own sizes until 4 ran, then padded), on (all at 32) and
#              off (7 sizes), wall time with a fresh algorithm cache each, metrics compared
#   eval-ab    act-infer eval, bf16 batch 256: raw frames read by HDF5 on one thread vs pread on
#              the pool vs pread and copied into the session's inputs (--copy-frames); gzip
#              chunks fetched by HDF5 (ACT_EPISODE_PREAD=0) vs pread on the inflating threads
#              (the A/B rows come last and take what time is left: parity and the peer comparison
#              matter more)
#   chunk100   bench/compare_torch.py on the ACT paper's transformer with chunks of 100
#              (tools/configs/act_chunk100.yaml), bf16 and fp32 batch 1, torch eager beside: the
#              long-sequence attention kernels' speed and, in compare_torch's output check, parity
# The last thing printed is the summary table (check, result, figure); it is also $LOG/summary.txt.
# ACT_CHECK_ONLY=ops,e2e (a comma list of the rows above) runs deps, build and testdata and then
# only those rows: a quick second run after a fix, inside the session's device time. The bench
# row may use all but 90 s of what is left (torch.compile's autotuning), so ncu and the A/B rows
# may find no time in a first full run: then a second run with
# ACT_CHECK_ONLY=ncu,algo-ab,gemm-ab,gather-ab,fusion-ab,stem-ab,e2e-fuse16,io-ab,group-ab,eval-speed,eval-ab,sizes-ab,pad-ab
# (the rows that decide a default first) and, time permitting, the other A/B rows and chunk100.
# A rehearsal without a GPU (every row's logic, on the CUDA emulator; no figure means anything):
#   ACT_CUDA_EMULATOR=$PWD/build-dev/libact_cuda_emu.so ACT_PYTHON=/usr/bin/python3 ACT_E2E_MAX_BATCH=3 \
#   ACT_CHECK_SLOW=6 ACT_CHECK_ITERS_DIV=50 ACT_CHECK_BUDGET_S=5400 tests/gpu/device_check.sh
# ACT_CHECK_SLOW multiplies every step's time limit; ACT_CHECK_ITERS_DIV divides the timed
# iterations and requests of the bench and serve rows (at least 1 each).
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
RET=${OUT:-$ROOT/device_out}       # what the caller gets back (see the header)
mkdir -p "$RET" || exit 2
LOG=$(mktemp -d "${TMPDIR:-/tmp}/act_device_check.XXXXXX") || exit 2
BUDGET=${ACT_CHECK_BUDGET_S:-330}
T0=$SECONDS
BUILD=$ROOT/build-dev
TD=$BUILD/testdata
FULLW=/tmp/act_full
export PYTHONUNBUFFERED=1
# the interpreter with torch (the device's python3; ACT_PYTHON=/usr/bin/python3 for a dry run on Debian)
PY=${ACT_PYTHON:-python3}
SUMMARY=()

left() { echo $((BUDGET - (SECONDS - T0))); }
# want ROW: ACT_CHECK_ONLY is unset or lists ROW (the rows that are not wanted print nothing)
want() { [ -z "${ACT_CHECK_ONLY:-}" ] || [[ ",$ACT_CHECK_ONLY," == *",$1,"* ]]; }
row() { SUMMARY+=("$(printf '%-10s %-5s %s' "$1" "$2" "$3")"); echo "== $1: $2 $3"; pack; }
# figs_ok FIGURE: "ok", or "FAIL" when a run of the row left no figure ("?")
figs_ok() { if [[ $1 == *"?"* ]]; then echo FAIL; else echo ok; fi; }
# pack: the summary so far, every log as one archive and compare.json into $RET (a partial archive
# never replaces a whole one)
pack() {
    { printf '%-10s %-5s %s\n' check result figure; printf '%s\n' "${SUMMARY[@]}"; } >"$RET/summary.txt"
    tar -czf "$RET/logs.tgz.part" -C "$LOG" . 2>/dev/null && mv -f "$RET/logs.tgz.part" "$RET/logs.tgz"
    [ -f "$LOG/compare.json" ] && cp -f "$LOG/compare.json" "$RET/"
    return 0
}
# limit WANT: the seconds a step may take, capped by what is left of the budget
SLOW=${ACT_CHECK_SLOW:-1}
DIV=${ACT_CHECK_ITERS_DIV:-1}
limit() { local l w=$(($1 * SLOW)); l=$(left); ((l < 1)) && l=1; if ((l < w)); then echo "$l"; else echo "$w"; fi; }
# it N: N timed iterations (or requests), divided for a rehearsal
it() { local n=$(($1 / DIV)); echo $((n < 1 ? 1 : n)); }
enough() { (($(left) >= $1)); }
# a rehearsal on the CUDA emulator: compare_torch's torch peers run on the CPU (no CUDA torch here)
PEER_DEV=()
[ -n "${ACT_CUDA_EMULATOR:-}" ] && PEER_DEV=(--peer-device cpu)

echo "device_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname); logs in $LOG, packed into $RET/logs.tgz"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$LOG/gpu.txt"
else
    echo "no nvidia-smi on this machine (no GPU driver: every CUDA row below fails or runs on the emulator)" | tee "$LOG/gpu.txt"
fi
nvcc --version 2>&1 | tail -1
# the summary's first row names the card: the device tool lends H100s and H200s, and the goals
# (ARCHITECTURE section 9) are H200 figures, so no timing may be read without it
row device note "$(head -1 "$LOG/gpu.txt" | cut -c1-100)"

# ---------------- deps ----------------
# hdf5_setup: HDF5 for the eval rows, from .devdeps/hdf5 (prepare_devdeps.sh: an h5py wheel's
# libraries, HDF5 1.14, and Debian's 1.10 headers). A probe program writes and reads back a file
# through it first; only if that works is ACT_HDF5_ROOT exported (the build then reads episodes),
# so a library that will not load costs the eval rows, never the build.
hdf5_setup() {
    local h=/tmp/act_hdf5 src=$ROOT/.devdeps/hdf5 lib v
    if ! [ -d "$src/lib" ] || ! [ -e "$src/include/hdf5.h" ]; then echo "hdf5: none carried"; return 0; fi
    rm -rf "$h" && mkdir -p "$h/lib" && ln -sfn "$src/include" "$h/include" || return 0
    for lib in "$src"/lib/*.so*; do ln -sf "$lib" "$h/lib/"; done
    lib=$(ls "$h"/lib/libhdf5-*.so.* 2>/dev/null | head -1)
    [ -n "$lib" ] && ln -sf "$lib" "$h/lib/libhdf5.so"
    cp "$ROOT/tests/gpu/hdf5_probe.c" "$h/probe.c"
    if cc -O1 -I"$h/include" "$h/probe.c" -L"$h/lib" -lhdf5 -Wl,-rpath,"$h/lib" -o "$h/probe" &&
        v=$(LD_LIBRARY_PATH=$h/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} HDF5_DISABLE_VERSION_CHECK=2 \
            "$h/probe" "$h/probe.h5"); then
        export ACT_HDF5_ROOT=$h HDF5_DISABLE_VERSION_CHECK=2
        export LD_LIBRARY_PATH=$h/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        echo "hdf5: $v ($(basename "${lib:-?}"))"
    else
        echo "hdf5: the probe failed: the build reads no episodes"
    fi
}
deps() {
    local dd=/tmp/act_devdeps f
    if [ -d "$ROOT/.devdeps" ]; then
        mkdir -p "$dd"
        for f in "$ROOT"/.devdeps/*.deb; do
            [ -e "$f" ] || continue
            if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$dd"
            else local t; t=$(mktemp -d) && (cd "$t" && ar x "$f" && tar -xf data.tar.* -C "$dd"); rm -rf "$t"; fi
        done
        export ACT_BLAS_ROOT=$dd/usr ACT_ZSTD_ROOT=$dd/usr ACT_LIBDEFLATE_ROOT=$dd/usr
        export LD_LIBRARY_PATH=$dd/usr/lib/x86_64-linux-gnu/openblas-pthread:$dd/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    hdf5_setup
    local cp r=/tmp/act_cudnn
    cp=$("$PY" -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null)
    mkdir -p "$r/lib"
    if [ -n "$cp" ] && [ -e "$cp/lib/libcudnn.so.9" ]; then
        for f in "$cp"/lib/libcudnn*.so.9; do ln -sf "$f" "$r/lib/"; done
        ln -sf "$cp/lib/libcudnn.so.9" "$r/lib/libcudnn.so"
        export LD_LIBRARY_PATH=$cp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
    if [ -n "$cp" ] && [ -e "$cp/include/cudnn.h" ]; then ln -sfn "$cp/include" "$r/include"
    elif [ -e "$ROOT/.devdeps/cudnn/include/cudnn.h" ]; then ln -sfn "$ROOT/.devdeps/cudnn/include" "$r/include"; fi
    export ACT_CUDNN_ROOT=$r
    echo "cudnn wheel: ${cp:-none}; header: $(grep -h 'define CUDNN_M[AI][JN]OR' "$r/include/cudnn_version.h" 2>/dev/null | awk '{print $3}' | paste -sd.)"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    # where the build will find cuBLAS/cuBLASLt (the toolkit's, or the cu13 wheels' nvidia/cu13/lib)
    local cu; cu=$(dirname "$(command -v nvcc)")/..
    echo "cublas: $(ls "$cu"/lib64/libcublas*.so* "$cu"/targets/*/lib/libcublas*.so* 2>/dev/null | head -4 | paste -sd' ')"
    [ -e "$r/lib/libcudnn.so" ] || [ -n "$(ldconfig -p 2>/dev/null | grep libcudnn.so)" ]
}
if deps >"$LOG/deps.log" 2>&1; then row deps ok "$(grep -E '^(cudnn|hdf5)' "$LOG/deps.log" | paste -sd';' | cut -c1-200)"
else row deps FAIL "no cuDNN found (see deps.log)"; fi
# (deps ran in this shell, not a subshell: its exports hold for every step below)

# ---------------- episodes for the eval rows (made in the background while the build runs) ----------------
# Two short gzip episodes for the eval path's parity (row eval; ready first), then one 512-timestep
# episode each, raw contiguous and gzip chunked, hard-linked 8 and 4 times (eval-speed, eval-ab:
# the reader and the step see 4096 and 2048 timesteps; making them takes most of the time here).
# Each set gets a marker file when whole; a second run on the same machine keeps what is there.
EPS=/tmp/act_eps
EVAL_B=$(it 256)   # eval-speed's and eval-ab's batch (a rehearsal divides it, and the episodes' length)
EPS_BIG=ready_T$(it 512)
eps_pid=""
if [ -n "${ACT_HDF5_ROOT:-}" ] && { want eval || want eval-speed || want eval-ab || want pad-ab; }; then
    (
        set -e
        "$PY" -c "import h5py" 2>/dev/null || { echo "no h5py for $PY: no episodes made"; exit 3; }
        mkdir -p "$EPS"
        if ! [ -e "$EPS/ready_short" ]; then
            rm -rf "$EPS/short"
            "$PY" tools/make_episodes.py --out "$EPS/short" --episodes 2 --T 24 --gzip --chunked --seed 3
            touch "$EPS/ready_short"
        fi
        if ! [ -e "$EPS/$EPS_BIG" ]; then
            rm -rf "$EPS/raw" "$EPS/gzip" "$EPS"/ready_T*
            "$PY" tools/make_episodes.py --out "$EPS/gzip" --episodes 1 --T "$(it 512)" --gzip --chunked --seed 2 &
            "$PY" tools/make_episodes.py --out "$EPS/raw" --episodes 1 --T "$(it 512)" --contiguous --seed 1
            wait $!
            for i in 1 2 3 4 5 6 7; do ln -f "$EPS/raw/episode_0.hdf5" "$EPS/raw/episode_$i.hdf5"; done
            for i in 1 2 3; do ln -f "$EPS/gzip/episode_0.hdf5" "$EPS/gzip/episode_$i.hdf5"; done
            touch "$EPS/$EPS_BIG"
        fi
        if ! [ -e "$EPS/ready_varied" ]; then   # pad-ab: 6 lengths, 6 different last batches at b32
            rm -rf "$EPS/varied"
            for i in 0 1 2 3 4 5; do
                "$PY" tools/make_episodes.py --out "$EPS/varied" --episodes 1 --T $((40 + 3 * i)) --contiguous \
                    --seed $((10 + i)) --start-index $i
            done
            touch "$EPS/ready_varied"
        fi
        echo "episodes ready after $SECONDS s"
    ) >"$LOG/episodes.log" 2>&1 &
    eps_pid=$!
fi

# ---------------- build ----------------
built=0
build() {   # cmake + build, with HDF5 if hdf5_setup found one
    timeout "$(limit 180)" bash -c "cmake -S '$ROOT' -B '$BUILD' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DACT_REQUIRE_CUDA=ON -DACT_ENABLE_HDF5=$([ -n "${ACT_HDF5_ROOT:-}" ] && echo ON || echo OFF) \
        && cmake --build '$BUILD' -j16" >>"$LOG/build.log" 2>&1
}
build_ok=0
if build; then build_ok=1
elif [ -n "${ACT_HDF5_ROOT:-}" ] && enough 120; then
    # the carried HDF5 passed its probe but not the build: build without it (the eval rows skip)
    echo "device_check: the build with HDF5 failed; again without it" | tee -a "$LOG/build.log"
    unset ACT_HDF5_ROOT
    build && build_ok=1
fi
if ((build_ok)); then
    if grep -q "CUDA=ON" "$LOG/build.log"; then built=1; row build ok "$(grep -o 'act-engine: .*' "$LOG/build.log" | tail -1)"
    else row build FAIL "configured without CUDA: $(grep -o 'act-engine: .*' "$LOG/build.log" | tail -1)"; fi
else
    row build FAIL "$(grep -m1 -E 'error|Error' "$LOG/build.log" | cut -c1-150)"
fi

# ---------------- test data ----------------
have_full=0
if ((built)); then
    mkdir -p "$TD" "$FULLW"
    if timeout "$(limit 120)" "$PY" tests/make_testdata.py "$TD" >"$LOG/testdata.log" 2>&1; then
        row testdata ok "$(ls "$TD"/*.actw | grep -vc /full.actw) small models"
    # without the zstandard module the compressed variant fails: make the others without it
    elif timeout "$(limit 120)" "$PY" - "$TD" >>"$LOG/testdata.log" 2>&1 <<'EOF'
import sys
sys.path.insert(0, "tests")
import make_testdata as m
every = m.variants
m.variants = lambda: [(c, s, [f for f in files if "--compress" not in f[1]]) for c, s, files in every()]
sys.exit(m.main([None, sys.argv[1]]))
EOF
    then row testdata ok "$(ls "$TD"/*.actw | grep -vc /full.actw) small models, no zstd variant (see testdata.log)"
    else row testdata FAIL "$(tail -1 "$LOG/testdata.log" | cut -c1-150)"; fi
    if ACT_PYTHON=$PY timeout "$(limit 120)" scripts/make_full_model.sh "$FULLW" "$TD/full.actw" \
            >>"$LOG/testdata.log" 2>&1; then
        have_full=1; row fullmodel ok "act_resnet full size -> $TD/full.actw"
    else row fullmodel FAIL "$(tail -1 "$LOG/testdata.log" | cut -c1-150)"; fi
fi
export ACT_TEST_DATA=$TD

# ---------------- parity ----------------
run_test() {   # name binary seconds
    local name=$1 bin=$2 secs=$3 rc
    want "$name" || return 0
    if ! ((built)) || ! enough 20; then row "$name" SKIP "no build or no time left"; return; fi
    timeout "$(limit "$secs")" "$bin" >"$LOG/$name.log" 2>&1
    rc=$?
    case $rc in
        0) row "$name" PASS "$(grep -E 'worst relative|failing checks|checks failed|^SKIP' "$LOG/$name.log" | tail -4 | paste -sd' ' | cut -c1-300)";;
        77) row "$name" SKIP "$(head -1 "$LOG/$name.log")";;
        124) row "$name" FAIL "timed out after $(limit "$secs") s";;
        *) row "$name" FAIL "rc $rc: $(grep -m3 FAIL "$LOG/$name.log" | paste -sd' ' | cut -c1-200)";;
    esac
}
run_test ops "$BUILD/tests/test_backend_ops" 120
# a failing op table: does the conv part pass on the direct kernel (is cuDNN the cause)?
if grep -q "FAIL.*conv" "$LOG/ops.log" 2>/dev/null; then
    ACT_CUDA_CONV=direct ACT_OPS_ONLY=conv run_test ops-direct "$BUILD/tests/test_backend_ops" 60
fi
VISION=conv,pool,softmax,groupnorm,preprocess
ACT_CUDA_LAYOUT=nhwc ACT_OPS_PREC=fp32,tf32 ACT_OPS_ONLY=$VISION run_test ops-nhwc32 "$BUILD/tests/test_backend_ops" 60
ACT_CUDA_LAYOUT=nchw ACT_OPS_PREC=bf16,fp16 ACT_OPS_ONLY=$VISION run_test ops-nchw16 "$BUILD/tests/test_backend_ops" 60
# the stem's input padded to 8 channels (stem-ab's variant): preprocess writes zeros there, the
# stem's filter ignores whatever is there
ACT_CUDA_STEM_CHANNELS=8 ACT_OPS_PREC=bf16,fp16 ACT_OPS_ONLY=conv,preprocess,gather run_test ops-stem8 "$BUILD/tests/test_backend_ops" 60
run_test e2e "$BUILD/tests/test_cuda_e2e" 150
# batches 2 and 3 of the small models through the per-camera upload lane (default: from 32 on,
# which the e2e row's batch 64 covers at full size)
# (and the stem's input padded to 8 channels, whose per-camera images then lie 8 channels apart)
ACT_CUDA_PIPELINE_MIN_BATCH=2 ACT_E2E_MODELS=small,small_sep_gn ACT_E2E_MAX_BATCH=3 ACT_CUDA_STEM_CHANNELS=8 \
    run_test e2e-lanes "$BUILD/tests/test_cuda_e2e" 60
# bf16/fp16 convs through cuDNN's fused conv+bias+ReLU (which rounds the bias to the data type;
# off by default): does full-size parity hold on the real cuDNN? With fusion-ab's figure this
# decides ACT_CUDA_CONV_FUSE_LOWP's default (21 nodes at batch 1)
ACT_CUDA_CONV_FUSE_LOWP=1 ACT_E2E_MODELS=full ACT_E2E_MAX_BATCH=3 \
    run_test e2e-fuse16 "$BUILD/tests/test_cuda_e2e" 60
# fused epilogues (cuDNN conv+bias+ReLU, cuBLASLt GEMM+bias): if parity failed, does it pass
# with both off (is the fusion the cause)?
if grep -q "FAIL" "$LOG/ops.log" "$LOG/e2e.log" 2>/dev/null; then
    ACT_CUDA_CONV_UNFUSED=1 ACT_CUDA_GEMM=gemmex run_test ops-unfused "$BUILD/tests/test_backend_ops" 90
fi

# ---------------- the eval path's parity: act-infer eval over HDF5 episodes, CUDA vs CPU ----------------
# (needs the carried HDF5: hdf5_setup in deps). On CUDA the eval step pulls each batch's frames
# over PCIe from the episode reader's registered buffers, which no other row runs: fp32 on CUDA
# vs the CPU over two short gzip episodes, every metric of the summary within 1e-4 relative.
eval_can() {   # row marker seconds: the HDF5 build, the full model, time, and the episodes of
    # that marker (waiting for the background job up to the row's limit); else a row says why
    local name=$1 mark=$2 secs=$3 n=0
    if [ -z "${ACT_HDF5_ROOT:-}" ]; then row "$name" SKIP "no HDF5 carried, or its probe failed (deps.log)"; return 1; fi
    if ! ((built && have_full)) || ! enough "$secs"; then row "$name" SKIP "no build, full model or time"; return 1; fi
    while ! [ -e "$EPS/$mark" ] && [ -n "$eps_pid" ] && kill -0 "$eps_pid" 2>/dev/null && ((n < $(limit 60))); do
        sleep 1
        n=$((n + 1))
    done
    [ -e "$EPS/$mark" ] && return 0
    if grep -q "^no h5py" "$LOG/episodes.log" 2>/dev/null; then row "$name" SKIP "$(grep -m1 '^no h5py' "$LOG/episodes.log")"
    else row "$name" FAIL "no episodes: $(tail -1 "$LOG/episodes.log" 2>/dev/null | cut -c1-150)"; fi
    return 1
}
eval_run() {   # tag episodes device precision batch [VAR=value... | --copy-frames]: -> eval_TAG.json
    local tag=$1 dir=$2 dev=$3 prec=$4 batch=$5 a envs=() flags=()
    shift 5
    for a in "$@"; do case $a in --*) flags+=("$a");; *) envs+=("$a");; esac; done
    echo "== eval $tag: ${envs[*]-} ${flags[*]-}" >>"$LOG/eval.log"
    rm -f "$LOG/eval_$tag.json"
    env ACT_CUDA_ALGO_CACHE="$LOG/eval_algos.cache" ${envs[@]+"${envs[@]}"} timeout "$(limit 60)" \
        "$BUILD/act-infer" eval --model "$TD/full.actw" --device "$dev" --precision "$prec" --batch "$batch" \
        --episodes "$EPS/$dir" ${flags[@]+"${flags[@]}"} --json "$LOG/eval_$tag.json" >>"$LOG/eval.log" 2>&1 ||
        { echo "== eval $tag: rc $?" >>"$LOG/eval.log"; EVAL_BAD=$((EVAL_BAD + 1)); }
}
EVAL_BAD=0   # eval runs that failed (a row whose runs failed says FAIL, not ok)
eval_fig() {   # tag: "N ts/s (wall M, wait P%)" of eval_TAG.json: N the steady rate (past the first two steps at each batch size)
    "$PY" -c "
import json, sys
t = json.load(open(sys.argv[1]))['overall']['throughput']
print('%.0f ts/s (wall %.0f, wait %.0f%%)' % (t.get('steady_timesteps_per_s') or float('nan'), t['timesteps_per_s'],
      100 * t['reader_wait_s'] / t['elapsed_s']))" \
        "$LOG/eval_$1.json" 2>/dev/null || echo "? (eval.log)"
}
if ! want eval; then :
elif eval_can eval ready_short 20; then
    eval_run short_cpu short cpu fp32 16
    eval_run short_cuda short cuda fp32 16
    par=$("$PY" - "$LOG/eval_short_cpu.json" "$LOG/eval_short_cuda.json" <<'EOF' 2>/dev/null || echo "FAIL ? (a run failed or its summary is incomplete: eval.log)"
import json, sys
a, b = (json.load(open(p))["overall"] for p in sys.argv[1:3])
keys = ["action_l1", "action_mse", "val_l1", "val_kl", "val_loss"]
if a["failed"] or b["failed"] or a["timesteps"] != b["timesteps"] or not a["timesteps"]:
    print("FAIL episodes failed or timesteps differ: cpu %d/%d, cuda %d/%d (failed/timesteps)" % (
        a["failed"], a["timesteps"], b["failed"], b["timesteps"]))
    sys.exit(0)
if any(a[k] is None or b[k] is None for k in keys):
    print("FAIL a metric is null: %s" % [k for k in keys if a[k] is None or b[k] is None])
    sys.exit(0)
rel = {k: abs(a[k] - b[k]) / max(abs(a[k]), 1e-6) for k in keys}
rel["per_joint_l1"] = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a["per_joint_l1"], b["per_joint_l1"]))
worst = max(rel, key=rel.get)
print("%s worst relative %.1e (%s)" % ("PASS" if rel[worst] <= 1e-4 else "FAIL", rel[worst], worst))
EOF
)
    row eval "$([[ $par == PASS* ]] && echo PASS || echo FAIL)" "fp32 cuda vs cpu, summaries of 2 gzip episodes: ${par#* }"
fi

# ---------------- sanitizers ----------------
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
sanitize() {   # name seconds summary-regex cmd...
    local name=$1 secs=$2 re=$3 rc
    shift 3
    want "$name" || return 0
    if [ -z "$SAN" ] || ! ((built)) || ! enough 20; then row "$name" SKIP "no compute-sanitizer, build or time"; return; fi
    timeout "$(limit "$secs")" "$SAN" "$@" >"$LOG/$name.log" 2>&1
    rc=$?
    local fig; fig=$(grep -E "$re" "$LOG/$name.log" | tail -1)
    # a runtime where the sanitizer cannot attach (gVisor: "Device not supported", then error
    # 999) or a run past its limit says nothing about our code: a note, not a failure
    local cant; cant=$(grep -m1 -iE "device not supported|not supported on this|unable to (initialize|attach)" "$LOG/$name.log")
    if ((rc == 0)); then row "$name" PASS "$fig"
    elif [ -n "$cant" ]; then row "$name" note "compute-sanitizer cannot run here: $(echo "$cant" | cut -c1-150)"
    elif ((rc == 124)); then row "$name" note "inconclusive: timed out after $(limit "$secs") s (${fig:-no summary})"
    else row "$name" FAIL "rc $rc: ${fig:-$(tail -1 "$LOG/$name.log" | cut -c1-150)}"; fi
}
model=$TD/full.actw
((have_full)) || model=$TD/small.actw
# warmup 1 runs the step eagerly, iter 1 captures it, iter 2 replays the graph; the conv and
# GEMM algorithms are the heuristics' (measuring them all would run, and make the sanitizer
# patch, dozens of cuDNN and cuBLASLt kernels more, each many times: the same workspace code,
# far past the row's time)
ACT_CUDA_CONV_ALGO=heuristic ACT_CUDA_GEMM_ALGO=heuristic ACT_CUDA_PIPELINE_MIN_BATCH=3 \
    sanitize memcheck 90 "ERROR SUMMARY" --tool memcheck --error-exitcode 9 --leak-check no \
    "$BUILD/act-infer" bench --model "$model" --device cuda --precision fp32 --batch 1,3 --iters 2 \
    --warmup 1 --profile-iters 1
ACT_OPS_ONLY=attention,norm,softmax ACT_OPS_PREC=fp32,bf16 ACT_OPS_BATCH=3 \
    ACT_CUDA_CONV_ALGO=heuristic ACT_CUDA_GEMM_ALGO=heuristic \
    sanitize racecheck 90 "RACECHECK SUMMARY|ERROR SUMMARY" --tool racecheck --error-exitcode 9 \
    "$BUILD/tests/test_backend_ops"

# ---------------- benchmark ----------------
if ! want bench; then :
elif [ -f bench/compare_torch.py ] && ((built)) && ((have_full)) && enough 150; then
    b=$(($(left) - 90))   # the rest: serving under load (40 s), then the A/B rows
    ACT_BUILD_DIR=$BUILD timeout "$b" "$PY" bench/compare_torch.py --device cuda --batch "1,$(it 256)" \
        --iters "$(it 100)" --warmup "$(it 10)" ${PEER_DEV[@]+"${PEER_DEV[@]}"} \
        --precision fp32,bf16 --budget-s $((b - 15)) --json "$LOG/compare.json" --ckpt "$FULLW/full.pt" \
        --model "$TD/full.actw" --config "$FULLW/agent.yaml" --stats "$FULLW/dataset_stats.pkl" \
        --workdir /tmp/act_bench >"$LOG/bench.log" 2>&1
    rc=$?
    fig=$("$PY" - "$LOG/compare.json" <<'EOF' 2>/dev/null
import json, sys
rep = json.load(open(sys.argv[1]))
out = []
for r in rep["rows"]:
    if r.get("batch") in (1, 256) and r.get("p50") is not None and (r["who"].startswith("act-infer") or
            r["who"] in ("torch eager", "torch channels_last", "torch compile-max-autotune")):
        who = "ours" if r["who"].startswith("act-infer") else r["who"].replace("torch ", "")
        out.append(f'b{r["batch"]} {who} {r["precision"]} {r["p50"]:.3f}ms')
print("; ".join(out) if out else "no rows")
EOF
)
    row bench "$([ $rc = 0 ] && echo ok || echo rc$rc)" "p50: ${fig:-no compare.json}"
    # the goal lines compare_torch judged (ARCHITECTURE section 9), one word each: what to read first
    goals=$("$PY" - "$LOG/compare.json" <<'EOF' 2>/dev/null
import json, sys
out = []
for g in json.load(open(sys.argv[1])).get("goals", []):
    fig = g.get("speedup") or g.get("ratio") or g.get("ours_ms")
    out.append(("met " if g.get("met") else "NOT ") + g["goal"].split(" (")[0] + (f" ({fig:.3g})" if fig is not None else ""))
print("; ".join(out) if out else "none judged")
EOF
)
    [ -n "$goals" ] && row goals note "$goals"
else
    row bench SKIP "no bench/compare_torch.py, build, full model or time"
fi

# ---------------- serving under load (act-serve on the GPU, loopback clients) ----------------
# Every act-serve here shares one algorithm cache: the warm-up of the first (this row's, batching
# on) measures the conv/GEMM algorithms of batch sizes 1-32 and writes them down, the later ones
# (copy-ab, io-ab) load them, so their startup fits their rows' limits and each A/B pair runs the
# same algorithms. The row's figure gives both startups (start to ready).
SERVE_ALGOS=$LOG/serve_algos.cache
if ! want serve; then :
elif [ -f bench/serve_load.py ] && ((built)) && ((have_full)) && [ -x "$BUILD/act-serve" ] && enough 40; then
    ACT_CUDA_ALGO_CACHE=$SERVE_ALGOS timeout "$(limit 60)" "$PY" bench/serve_load.py --model "$TD/full.actw" \
        --act-serve "$BUILD/act-serve" --device cuda --clients 1,8,32 --requests "$(it 50)" --max-seconds 20 \
        --transports tcp,shm --json "$LOG/serve_load.json" >"$LOG/serve.log" 2>&1
    rc=$?
    fig=$(grep -E '^(overhead|speedup_32_clients_vs|startup_s)' "$LOG/serve.log" | tr '\n' ' ' | cut -c1-220)
    # cut short: where it stood (serve_load's last words and act-serve's last warm-up line)
    ((rc == 0)) || fig="$fig$(grep -E 'serve_load: (stopped|act-serve did not start)|warm-up: [0-9]+ of' \
        "$LOG/serve.log" | tail -2 | sed 's/^ *//' | paste -sd' ' | cut -c1-220)"
    row serve "$([ $rc = 0 ] && echo ok || echo rc$rc)" "$fig"
else
    row serve SKIP "no bench/serve_load.py, act-serve, full model or time"
fi

# ---------------- where a step's time goes: the engine's own section profile ----------------
# (CUDA events around the ResNet stem and layers, keypoints, latent, memory, decoder, head; the
# profiled pass runs eagerly, so at batch 1 launch gaps are in it - the graph replay's p50 beside)
if ! want profile; then :
elif ((built)) && ((have_full)) && enough 30; then
    fig="" pbad=0
    for pb in "bf16 1" "bf16 256" "fp32 1"; do
        read -r pp pbs <<<"$pb"
        timeout "$(limit 30)" "$BUILD/act-infer" bench --model "$TD/full.actw" --device cuda --precision "$pp" \
            --batch "$pbs" --iters "$(it 50)" --warmup "$(it 10)" --profile-iters "$(it 10)" --staged-inputs --json "$LOG/profile_${pp}_b$pbs.json" \
            >"$LOG/profile_${pp}_b$pbs.log" 2>&1 || pbad=1
        r=$("$PY" - "$LOG/profile_${pp}_b$pbs.json" <<'EOF' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
sec = r["sections_ms"] or {}
tot = sum(sec.values()) or 1.0
top = sorted(sec.items(), key=lambda kv: -kv[1])[:4]
print("p50 %.3f, profiled %.3f ms: %s" % (r["latency_ms"]["p50"], tot,
      " ".join("%s %.0f%%" % (k, 100 * v / tot) for k, v in top)))
EOF
)
        fig="$fig $pp b$pbs ${r:-?};"
    done
    row profile "$( ((pbad)) && echo FAIL || echo ok)" "$fig"
else
    row profile SKIP "no build, full model or time"
fi

# ---------------- ncu: per-kernel time and speed of light of an eager bf16 step ----------------
# Nsight Compute's hardware counters: on a Firecracker machine they were seen working, on gVisor
# not ("LibraryNotLoaded"), so a failure here is a note, not a failed check. --clock-control none
# leaves the clocks as every other row had them. One eager step runs (no warmup: the first step
# launches nothing extra, because cuDNN and cuBLASLt plans come from the heuristics here: the
# default measurement would run every candidate algorithm inside that step and ncu would count
# them as the step's), each kernel replayed by ncu; tests/gpu/ncu_summary.py groups them by
# function (top 15 in ncu_top.txt, every launch in ncu_bf16_b1.csv; the load's weight
# conversions are in it too, once).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)
if ! want ncu; then :
elif [ -n "$NCU" ] && ((built)) && ((have_full)) && enough 50; then
    rm -f "$LOG/ncu_bf16_b1.csv"
    ACT_CUDA_CONV_ALGO=heuristic ACT_CUDA_GEMM_ALGO=heuristic \
        timeout "$(limit 60)" "$NCU" --clock-control none --print-units base --print-kernel-base function \
        --csv --page raw --log-file "$LOG/ncu_bf16_b1.csv" --metrics \
        gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed \
        "$BUILD/act-infer" bench --model "$TD/full.actw" --device cuda --precision bf16 --batch 1 \
        --iters 1 --warmup 0 --profile-iters 0 --no-graph >"$LOG/ncu.log" 2>&1
    rc=$?
    if "$PY" tests/gpu/ncu_summary.py "$LOG/ncu_bf16_b1.csv" 1 >"$LOG/ncu_top.txt" 2>>"$LOG/ncu.log"; then
        row ncu "$([ $rc = 0 ] && echo ok || echo rc$rc)" "bf16 b1 eager: $(head -1 "$LOG/ncu_top.txt" | cut -c1-240)"
    else
        row ncu note "no counters (rc $rc): $(grep -m1 -iE 'error|fail' "$LOG/ncu.log" "$LOG/ncu_bf16_b1.csv" 2>/dev/null | cut -c1-150)"
    fi
else
    row ncu SKIP "no ncu, build, full model or time"
fi

# ---------------- batch eval on the GPU: throughput over HDF5 episodes ----------------
# bf16 batch 256: raw episodes (frames read by pread on the reader's threads) and gzip ones
# (inflated by libdeflate), the steady rate (past each batch size's first step) with the wall rate
# and the share of the time the step waited for the reader. The conv/GEMM algorithms come from one
# cache: the first run measures them (its wall rate says what that costs), the others load them.
if ! want eval-speed; then :
elif eval_can eval-speed "$EPS_BIG" 30; then
    bad0=$EVAL_BAD
    eval_run raw_first raw cuda bf16 "$EVAL_B"
    eval_run raw raw cuda bf16 "$EVAL_B"
    eval_run gzip gzip cuda bf16 "$EVAL_B"
    row eval-speed "$( ((EVAL_BAD == bad0)) && echo ok || echo FAIL)" "bf16 b$EVAL_B: raw $(eval_fig raw), gzip $(eval_fig gzip); first run, measuring: raw $(eval_fig raw_first)"
fi

# ---------------- A/B rows: the same step with one switch flipped (what time is left) ----------------
ab_p50() {   # precision batch [VAR=value...] [copied|inplace] -> "p50 ms" of act-infer bench (graphs on)
    # (with AB_FIRST=1 also the first warmup step's time: "p50 (1st N)", what measuring costs)
    local prec=$1 batch=$2 inputs=--staged-inputs a envs=()
    shift 2
    # frames already in pinned memory (as the torch peers have them) unless "copied" (act_run
    # copies them in) or "inplace" (registered memory, read by the GPU where they lie)
    for a in "$@"; do
        case $a in copied) inputs="";; inplace) inputs=--in-place-inputs;; *) envs+=("$a");; esac
    done
    env ${envs[@]+"${envs[@]}"} timeout "$(limit 40)" "$BUILD/act-infer" bench --model "$TD/full.actw" \
        --device cuda --precision "$prec" --batch "$batch" --iters "$(it 200)" --warmup "$(it 20)" $inputs \
        --json "$LOG/ab.json" >>"$LOG/ab.log" 2>&1 &&
        "$PY" -c "
import json, os, sys
r = json.load(open(sys.argv[1]))['results'][0]
first = r.get('first_steps_ms') if os.environ.get('AB_FIRST') else None
print('%.3f' % r['latency_ms']['p50'] + (' (1st %.0f)' % first[0] if first else ''))" "$LOG/ab.json"
}
ab_pair() {   # row precision "batches" label-a "args-a" label-b "args-b": p50 of a and b per batch
    local name=$1 prec=$2 batches=$3 fig="" b x y
    want "$name" || return 0
    if ! ((built && have_full)) || ! enough 30; then row "$name" SKIP "no build, full model or time"; return; fi
    for b in $batches; do
        x=$(ab_p50 "$prec" "$b" $5) y=$(ab_p50 "$prec" "$b" $7)
        fig="$fig b=$b $4 ${x:-?} / $6 ${y:-?} ms;"
    done
    row "$name" ok "$prec p50:$fig"
}
# conv algorithms measured at each shape's first step (cuDNN's Find, as torch's cudnn.benchmark,
# which compare_torch's peers use) vs the heuristics' first: the default is the measurement;
# if the heuristics win, ACT_CUDA_CONV_ALGO's default flips in cu create
# (the measured runs log each choice beside the heuristics' into ab.log: the algo-log row; each
# side's first step, in ms after its p50, says what the measurements cost)
AB_FIRST=1 ab_pair algo-ab bf16 "1 256" heuristic ACT_CUDA_CONV_ALGO=heuristic measured "ACT_CUDA_CONV_ALGO=find ACT_CUDA_ALGO_LOG=1"
AB_FIRST=1 ab_pair algo-ab32 fp32 "1" heuristic ACT_CUDA_CONV_ALGO=heuristic measured "ACT_CUDA_CONV_ALGO=find ACT_CUDA_ALGO_LOG=1"
# cuBLASLt algorithms timed among the heuristic's candidates at each linear shape's first step
# (as torch.compile's max-autotune times its GEMM choices) vs the heuristic's first: the default
# is the measurement; if the heuristic wins, ACT_CUDA_GEMM_ALGO's default flips in cu create
AB_FIRST=1 ab_pair gemm-ab bf16 "1 256" heuristic ACT_CUDA_GEMM_ALGO=heuristic measured "ACT_CUDA_GEMM_ALGO=measure ACT_CUDA_ALGO_LOG=1"
AB_FIRST=1 ab_pair gemm-ab32 fp32 "1" heuristic ACT_CUDA_GEMM_ALGO=heuristic measured "ACT_CUDA_GEMM_ALGO=measure ACT_CUDA_ALGO_LOG=1"
# 16-bit convs on transform algorithms (FFT, non-fused Winograd) too, which cuDNN may rank first
# for 3x3 shapes, vs the GEMM family only (the default, what the e2e parity rows measure)
ab_pair xform-ab bf16 "1 256" gemm-family ACT_CUDA_CONV_TRANSFORMS16=0 transforms "ACT_CUDA_CONV_TRANSFORMS16=1 ACT_CUDA_ALGO_LOG=1"
# the stem conv's input (the preprocessed image, NHWC) padded from 3 channels to 4 or 8 with
# zeros and its filters padded at load: cuDNN's tensor-core kernels want C a multiple of 4 or 8,
# and with 3 it may pad or transform the image inside every call (or take a slower kernel); the
# default stays 3 until this row and an e2e run with the switch say otherwise
if ! want stem-ab; then :
elif ((built)) && ((have_full)) && enough 45; then
    fig=""
    for b in 1 256; do
        x=$(ab_p50 bf16 "$b" ACT_CUDA_STEM_CHANNELS=3) y=$(ab_p50 bf16 "$b" ACT_CUDA_STEM_CHANNELS=4)
        z=$(ab_p50 bf16 "$b" ACT_CUDA_STEM_CHANNELS=8 ACT_CUDA_ALGO_LOG=1)
        fig="$fig b=$b 3ch ${x:-?} / 4ch ${y:-?} / 8ch ${z:-?} ms;"
    done
    row stem-ab "$(figs_ok "$fig")" "bf16 p50:$fig"
else
    row stem-ab SKIP "no build, full model or time"
fi
# feature-map layout: NHWC is the bf16/fp16 default on the strength of cuDNN's guidance (tensor-core
# kernels read NHWC; NCHW adds transposes) - this row is the measurement
ab_pair layout-ab bf16 "1 64" NCHW ACT_CUDA_LAYOUT=nchw NHWC ACT_CUDA_LAYOUT=nhwc
# the per-camera upload lane (frames of camera c+1 upload while camera c's trunk runs) vs one
# upload then one trunk pass over all cameras
ab_pair pipeline-ab bf16 "64 256" serial ACT_CUDA_PIPELINE_MIN_BATCH=0 lanes ACT_CUDA_PIPELINE_MIN_BATCH=1
# attention + output projection + residual + LayerNorm as one kernel (by default up to 32 rows,
# decoder batch 2; here up to 64 to learn whether batch 4 gains too) vs three ops; fp32 reads
# twice the weight bytes per block
ab_pair attn-ab bf16 "1 4" three-ops ACT_CUDA_FUSED_ATTN_MAX_ROWS=0 fused ACT_CUDA_FUSED_ATTN_MAX_ROWS=64
ab_pair attn-ab32 fp32 "1" three-ops ACT_CUDA_FUSED_ATTN_MAX_ROWS=0 fused ACT_CUDA_FUSED_ATTN_MAX_ROWS=64
# every decoder layer's cross-attention K/V in one GEMM (5 nodes fewer at batch 1) vs one per layer
ab_pair group-ab bf16 "1" per-layer ACT_CUDA_LINEAR_GROUP=0 grouped ACT_CUDA_LINEAR_GROUP=1
# the fused epilogues (cuDNN conv+bias+ReLU, cuBLASLt GEMM+bias(+GELU in bf16)) on and off
if ! want fusion-ab; then :
elif ((built)) && ((have_full)) && enough 45; then
    fig=""
    for prec in fp32 bf16; do
        on=$(ab_p50 $prec 1) off=$(ab_p50 $prec 1 ACT_CUDA_CONV_UNFUSED=1 ACT_CUDA_GEMM=gemmex)
        fig="$fig $prec fused ${on:-?} / unfused ${off:-?} ms;"
    done
    # bf16 convs fuse only on request (cuDNN rounds the bias to bf16): what would it gain?
    lp=$(ab_p50 bf16 1 ACT_CUDA_CONV_FUSE_LOWP=1)
    fig="$fig bf16 +conv fusion ${lp:-?} ms"
    row fusion-ab ok "b=1 p50:$fig"
else
    row fusion-ab SKIP "no build, full model or time"
fi
# what act_run's own copy of the frames into its pinned buffers costs (151 MB at batch 256)
ab_pair inputs-ab bf16 "1 256" copied copied staged ""
# frames read in place (act-serve's shared-memory clients: a gather kernel pulls each frame over
# PCIe from registered host memory) vs a DMA upload from the pinned staging buffers
ab_pair gather-ab bf16 "1 32 256" staged "" in-place inplace
# act-serve's startup in bf16 (what copy-ab and io-ab serve): one server measures the algorithms
# of every batch size into the shared cache, a second one loads them; both start-to-ready times
# are the figure, and the two A/B rows below then start as the second did
if ! want serve-warm && ! want copy-ab && ! want io-ab && ! want sizes-ab; then :
elif [ -f bench/serve_load.py ] && ((built)) && ((have_full)) && enough 60; then
    fig=""
    # the default sizes (7 at max-batch 32) measured, then cached; then every size 1-32, whose 25
    # others are measured at its first start (so that sizes-ab's server finds them cached), and
    # cached
    vs="measured:auto cached:auto"
    { want serve-warm || want sizes-ab; } && vs="$vs all-sizes(25-more-measured):all"
    want serve-warm && vs="$vs all-sizes-cached:all"
    for v in $vs; do
        rm -f "$LOG/serve_warm.json"
        ACT_CUDA_ALGO_CACHE=$SERVE_ALGOS timeout "$(limit 90)" "$PY" bench/serve_load.py --batch-sizes "${v#*:}" \
            --model "$TD/full.actw" --act-serve "$BUILD/act-serve" --device cuda --precision bf16 --clients 1 \
            --requests "$(it 20)" --max-seconds 5 --modes on --transports tcp --json "$LOG/serve_warm.json" \
            >>"$LOG/serve_warm.log" 2>&1
        r=$("$PY" -c "import json, sys; print('%.1f s' % json.load(open(sys.argv[1]))['summary']['startup_s_batching_on'])" \
            "$LOG/serve_warm.json" 2>/dev/null)
        fig="$fig ${v%%:*} ${r:-?};"
    done
    want serve-warm && row serve-warm "$(figs_ok "$fig")" "bf16 max-batch 32, start to ready:$fig cache $(wc -l <"$SERVE_ALGOS" 2>/dev/null || echo 0) lines"
elif want serve-warm; then
    row serve-warm SKIP "no serve_load, build, full model or time"
fi
# serve_tcp TAG LIMIT C1 C2 [VAR=value...] [--flag value...]: act-serve (bf16, batching on, the
# shared algorithm cache) under bench/serve_load.py with C1 and C2 TCP clients, log and JSON in
# $LOG/TAG.* -> "R1/R2 req/s, p50 P1/P2 ms", nothing if the run left no figures
serve_tcp() {
    local tag=$1 lim=$2 c1=$3 c2=$4 envs=()
    shift 4
    while (($#)) && [[ $1 != --* ]]; do envs+=("$1"); shift; done
    rm -f "$LOG/$tag.json"
    env ACT_CUDA_ALGO_CACHE="$SERVE_ALGOS" ${envs[@]+"${envs[@]}"} timeout "$(limit "$lim")" "$PY" bench/serve_load.py \
        --model "$TD/full.actw" --act-serve "$BUILD/act-serve" --device cuda --precision bf16 --clients "$c1,$c2" \
        --requests "$(it 200)" --max-seconds 5 --modes on --transports tcp --json "$LOG/$tag.json" "$@" \
        >>"$LOG/$tag.log" 2>&1
    "$PY" -c "
import json, sys
rows = {r['clients']: r for r in json.load(open(sys.argv[1]))['rows']}
a, b = rows[int(sys.argv[2])], rows[int(sys.argv[3])]
print('%.0f/%.0f req/s, p50 %.2f/%.2f ms' % (a['throughput_rps'], b['throughput_rps'], a['rtt_p50_ms'], b['rtt_p50_ms']))" \
        "$LOG/$tag.json" "$c1" "$c2" 2>/dev/null
}
# what padding a batch up to the next default size costs a busy server: 12 and 20 closed-loop
# TCP clients, whose batches mostly fall between the sizes 8, 16 and 24 (--batch-sizes auto), vs
# every size 1-32 warmed and each batch run as it comes. If 'all' serves clearly more, the
# default's sizes are too sparse for that load (a denser list costs start-up: serve-warm)
if ! want sizes-ab; then :
elif [ -f bench/serve_load.py ] && ((built)) && ((have_full)) && enough 40; then
    fig=""
    for v in auto all; do
        r=$(serve_tcp sizes_ab 60 12 20 --batch-sizes "$v")
        fig="$fig $v ${r:-?};"
    done
    row sizes-ab "$(figs_ok "$fig")" "bf16 TCP 12/20 clients:$fig"
else
    row sizes-ab SKIP "no serve_load, build, full model or time"
fi
# act-serve's batch assembly, 1 and 32 clients, shared memory and TCP: 590 KB of frames per
# request copied into the pinned input buffers by one thread or by the default (half the cores,
# at most 8), vs read in place by the GPU from registered memfds and receive buffers (the default
# since session 7)
if ! want copy-ab; then :
elif [ -f bench/serve_load.py ] && ((built)) && ((have_full)) && enough 40; then
    fig=""
    for v in "copy,1-thread:ACT_SERVE_COPY_FRAMES=1 ACT_SERVE_COPY_THREADS=1" \
             "copy,auto-threads:ACT_SERVE_COPY_FRAMES=1 ACT_SERVE_COPY_THREADS=0" "in-place:ACT_SERVE_COPY_FRAMES=0"; do
        rm -f "$LOG/copy_ab.json"
        env ${v#*:} ACT_CUDA_ALGO_CACHE="$SERVE_ALGOS" timeout "$(limit 30)" "$PY" bench/serve_load.py \
            --model "$TD/full.actw" --act-serve "$BUILD/act-serve" --device cuda --precision bf16 --clients 1,32 \
            --requests "$(it 200)" --max-seconds 5 --modes on --transports shm,tcp --json "$LOG/copy_ab.json" \
            >>"$LOG/copy_ab.log" 2>&1
        r=$("$PY" -c "
import json, sys
rows = {(r['transport'], r['clients']): r['throughput_rps'] for r in json.load(open(sys.argv[1]))['rows']}
print(' '.join('%s %.0f/%.0f' % (t, rows[(t, 1)], rows[(t, 32)]) for t in ('shm', 'tcp')))" "$LOG/copy_ab.json" 2>/dev/null)
        fig="$fig ${v%%:*} ${r:-?};"
    done
    row copy-ab "$(figs_ok "$fig")" "bf16 req/s 1/32 clients:$fig"
else
    row copy-ab SKIP "no serve_load, build, full model or time"
fi
# act-serve's I/O threads: the kernel copies each TCP request's 590 KB of frames on the thread that
# calls recv; one thread vs the default (one per 4 cores, at most 4)
if ! want io-ab; then :
elif [ -f bench/serve_load.py ] && ((built)) && ((have_full)) && enough 30; then
    fig=""
    for v in "1-thread:ACT_SERVE_IO_THREADS=1" "auto-threads:ACT_SERVE_IO_THREADS=0"; do
        r=$(serve_tcp io_ab 20 1 32 ${v#*:})
        fig="$fig ${v%%:*} ${r:-?};"
    done
    row io-ab "$(figs_ok "$fig")" "bf16 TCP 1/32 clients:$fig"
else
    row io-ab SKIP "no serve_load, build, full model or time"
fi
# the episode reader on the GPU host's cores: raw frames read by HDF5 on one thread
# (ACT_EPISODE_THREADS=1) vs pread on the pool (default), and frames copied into the session's
# input buffers (--copy-frames) vs pulled by the GPU from the reader's; gzip chunks fetched by
# HDF5's H5Dread_chunk on the reader thread (ACT_EPISODE_PREAD=0) vs pread on the inflating threads
if ! want eval-ab; then :
elif eval_can eval-ab "$EPS_BIG" 40; then
    bad0=$EVAL_BAD
    eval_run ab_raw_h5 raw cuda bf16 "$EVAL_B" ACT_EPISODE_THREADS=1
    eval_run ab_raw raw cuda bf16 "$EVAL_B"
    eval_run ab_raw_copy raw cuda bf16 "$EVAL_B" --copy-frames
    eval_run ab_gzip_h5 gzip cuda bf16 "$EVAL_B" ACT_EPISODE_PREAD=0
    eval_run ab_gzip gzip cuda bf16 "$EVAL_B"
    row eval-ab "$( ((EVAL_BAD == bad0)) && echo ok || echo FAIL)" "bf16 b$EVAL_B: raw HDF5 1 thread $(eval_fig ab_raw_h5) / pread $(eval_fig ab_raw) / pread+copy $(eval_fig ab_raw_copy); gzip H5Dread_chunk $(eval_fig ab_gzip_h5) / pread $(eval_fig ab_gzip)"
fi
# act-infer eval over episodes of 6 lengths (40-55 timesteps) at b32: the last batches under
# --pad-batches auto (CUDA: few; sizes 32, 8, 11, 14 set up, the other three padded up to 32), on
# (everything at 32) and off (7 sizes, each planned, its algorithms measured and its graph
# captured); each with an algorithm cache of its own, so each pays its measurements as a first
# eval on a machine would. The figure is the wall time; the metrics must agree
if ! want pad-ab; then :
elif eval_can pad-ab ready_varied 30; then
    bad0=$EVAL_BAD
    eval_run pad_auto varied cuda bf16 32 ACT_CUDA_ALGO_CACHE="$LOG/pad_auto.cache"
    eval_run pad_on varied cuda bf16 32 ACT_CUDA_ALGO_CACHE="$LOG/pad_on.cache" --pad-batches=on
    eval_run pad_off varied cuda bf16 32 ACT_CUDA_ALGO_CACHE="$LOG/pad_off.cache" --pad-batches=off
    pad_fig() {
        "$PY" -c "
import json, sys
t = json.load(open(sys.argv[1]))['overall']['throughput']
print('%.2f s (%.0f ts/s)' % (t['elapsed_s'], t['timesteps_per_s']))" "$LOG/eval_$1.json" 2>/dev/null || echo "? (eval.log)"
    }
    # the padded steps' stand-in rows must not change the metrics: both summaries within bf16's
    # end-to-end bound (2e-2; the two runs' batch sizes may take other algorithms)
    same=$("$PY" - "$LOG/eval_pad_off.json" "$LOG/eval_pad_auto.json" "$LOG/eval_pad_on.json" <<'EOF' 2>/dev/null || echo "FAIL ? (eval.log)"
import json, sys
b, *pads = (json.load(open(p))["overall"] for p in sys.argv[1:4])
keys = ["action_l1", "action_mse", "val_l1", "val_kl", "val_loss"]
if any(a["failed"] or b["failed"] or a["timesteps"] != b["timesteps"] or not a["timesteps"] for a in pads):
    print("FAIL episodes failed or timesteps differ")
    sys.exit(0)
worst = max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-6) for a in pads for k in keys)
print("%s metrics within %.1e" % ("ok" if worst <= 2e-2 else "FAIL", worst))
EOF
)
    st=$( ((EVAL_BAD == bad0)) && echo ok || echo FAIL)
    [[ $same == FAIL* ]] && st=FAIL
    row pad-ab "$st" "bf16 b32, 6 episodes of 40-55 ts, wall: auto (4 sizes) $(pad_fig pad_auto) / on (1) $(pad_fig pad_on) / off (7) $(pad_fig pad_off); ${same#* }"
fi
# the ACT paper's transformer with chunks of 100 (tools/configs/act_chunk100.yaml: hidden 512,
# head 64): the attention kernel that reads K/V in place, on a GPU, against torch eager in the
# same run; compare_torch's output check (each precision vs torch eager fp32) is the parity of
# the long-chunk path
if ! want chunk100; then :
elif [ -f bench/compare_torch.py ] && ((built)) && enough 100; then
    b=$(limit 150)   # compare_torch's --budget-s counts its model preparation (~20-30 s here)
    ACT_BUILD_DIR=$BUILD timeout "$b" "$PY" bench/compare_torch.py --device cuda --batch 1 \
        --precision bf16,fp32 --peers eager --iters "$(it 100)" --warmup "$(it 10)" --budget-s $((b - 10)) \
        ${PEER_DEV[@]+"${PEER_DEV[@]}"} \
        --config tools/configs/act_chunk100.yaml --workdir /tmp/act_bench100 \
        --json "$LOG/chunk100.json" >"$LOG/chunk100.log" 2>&1
    rc=$?
    fig=$("$PY" - "$LOG/chunk100.json" <<'EOF' 2>/dev/null
import json, sys
rep = json.load(open(sys.argv[1]))
out = [f'{"ours" if r["who"].startswith("act-infer") else "eager"} {r["precision"]} {r["p50"]:.3f}ms'
       for r in rep["rows"] if r.get("p50") is not None]
out += [f'ours {c["precision"]} err {c["rel_diff"]:.1e}{"" if c.get("ok") else " FAIL"}'
        for c in rep.get("checks", []) if c.get("ours") and c.get("rel_diff") is not None]
print("; ".join(out) if out else "no rows")
EOF
)
    row chunk100 "$([ $rc = 0 ] && echo ok || echo rc$rc)" "b1 p50: ${fig:-no chunk100.json}"
fi
# how often the measured runs of algo-ab and gemm-ab chose another algorithm than the heuristics'
# first (one "act-engine: algo:" line per measured shape in ab.log, with both times)
if [ -f "$LOG/ab.log" ] && grep -q "^act-engine: algo: " "$LOG/ab.log"; then
    differ() { sed -n "$1" "$LOG/ab.log" | awk '{n++; if ($1 != $2) c++} END {print c + 0 "/" n + 0}'; }
    row algo-log note "measured choices (all runs) other than the heuristics' first: cuBLASLt $(differ \
        's/^act-engine: algo: cuBLASLt.*candidate \([0-9]*\) of .*first \([0-9]*\) .*/\1 \2/p'), cuDNN $(differ \
        "s/^act-engine: algo: cuDNN conv.*: measured \([A-Z_]*\) .*heuristics' \([A-Z_]*\) .*/\1 \2/p") (times in ab.log)"
fi
# a conv cuDNN would not plan, or an epilogue it would not fuse, runs on a fallback: say which
# (each line's middle shortened: its start names the call, its end what took over)
fb=$(grep -h "^act-engine: " "$LOG"/*.log 2>/dev/null | grep -v "^act-engine: algo: " |
     sed -E 's/^(.{70}).*(; [^;]*)$/\1 ...\2/' |
     sort | uniq -c | sort -rn | head -3 | paste -sd'|')
[ -n "$fb" ] && row fallbacks note "$fb"


echo
pack
echo "==== device_check summary ($(($SECONDS - T0)) s, logs in $LOG and $RET/logs.tgz) ===="
cat "$RET/summary.txt"
