# step_graph.sh - sourced by the emulator's check scripts (sh): what they share.
# step_nodes TEXT: the node list ACT_EMU_TRACE=2 printed for the last instantiated graph in TEXT
# (an act-infer run's output), one "cuda-emu:   [lane ...] ..." line per node. The step's graph
# is the last one instantiated: the GEMM tuner's timed batches are graphs of their own, before it.
step_nodes() {
    echo "$1" | awk '/graph instantiated/ {buf = ""; next} /cuda-emu:   \[lane/ {buf = buf $0 "\n"} END {printf "%s", buf}'
}
