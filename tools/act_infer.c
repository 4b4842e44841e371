/* act_infer.c - the act-infer command: a thin dispatcher; each subcommand lives in its own file
 * (tools/infer_*.c, declared in act_infer_cmds.h). `act-infer --help` teaches the whole tool. */
#include <stdio.h>
#include <string.h>

#include "act.h"
#include "act_infer_cmds.h"
#include "infer_common.h"

static const char *USAGE =
    "act-infer " ACT_VERSION " - run the ACT policy (act_resnet) from a .actw weight file\n"
    "\n"
    "usage: act-infer <command> [options]     (act-infer <command> --help for details)\n"
    "\n"
    "commands:\n"
    "  info        the model's contract (dims, cameras, image size, preprocessing), size, provenance\n"
    "                act-infer info --model M.actw [--json]\n"
    "  predict     the prior action chunk for every timestep of one HDF5 episode, as .npy\n"
    "                act-infer predict --model M.actw --episode EP.hdf5 --out PRED.npy\n"
    "  eval        score the model on held-out episodes: action L1/MSE, per-joint error,\n"
    "              validation loss (masked L1 + kl_weight * KL), throughput; JSON summary\n"
    "                act-infer eval --model M.actw --episodes DIR --json SUMMARY.json\n"
    "  eval-merge  combine the summaries of sharded evals (--shard i/n) into one\n"
    "                act-infer eval-merge S0.json S1.json --json ALL.json\n"
    "  bench       latency and throughput of one policy step, per-stage breakdown\n"
    "                act-infer bench --model M.actw --batch 1,8,64\n"
    "\n"
    "common options: --device cpu|cuda (default: cuda when a GPU is usable), --precision\n"
    "fp32|tf32|bf16|fp16 (default fp32), --batch N (timesteps per forward).\n"
    "Exit codes: 0 success, 1 failure (message on stderr), 2 bad command line; SIGTERM/SIGINT/\n"
    "SIGHUP: eval stops after the step in flight and exits 128 + the signal (a second signal\n"
    "stops at once), the other commands stop at once; no half-written output file is left.\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(USAGE, stdout);
        return infer_finish(0);
    }
    if (!strcmp(cmd, "--version")) {
        /* the optional parts this binary was built with, for scripts and tests to check */
        printf("act-infer %s (features:%s%s%s%s%s)\n", ACT_VERSION,
#ifdef ACT_WITH_CUDA
               " cuda",
#else
               "",
#endif
#ifdef ACT_WITH_HDF5
               " hdf5",
#else
               "",
#endif
#ifdef ACT_WITH_ZSTD
               " zstd",
#else
               "",
#endif
#if defined(ACT_WITH_HDF5) && defined(ACT_WITH_LIBDEFLATE)
               " libdeflate",  /* gzip episode frames inflated by libdeflate (episode_inflate.c) */
#else
               "",
#endif
#if defined(ACT_WITH_HDF5) && defined(ACT_WITH_ZLIB)
               " zlib"         /* ... or by zlib */
#else
               ""
#endif
        );
        return infer_finish(0);
    }
    /* eval stops by itself between steps at a first signal; the others die of it (their
     * unfinished outputs' temporary files removed) */
    infer_signals(!strcmp(cmd, "eval"));
    if (!strcmp(cmd, "info")) return infer_finish(act_cmd_info(argc - 2, argv + 2));
    if (!strcmp(cmd, "predict")) return infer_finish(act_cmd_predict(argc - 2, argv + 2));
    if (!strcmp(cmd, "eval")) return infer_finish(act_cmd_eval(argc - 2, argv + 2));
    if (!strcmp(cmd, "eval-merge")) return infer_finish(act_cmd_eval_merge(argc - 2, argv + 2));
    if (!strcmp(cmd, "bench")) return infer_finish(act_cmd_bench(argc - 2, argv + 2));
    fprintf(stderr, "act-infer: unknown command '%s'\n\n%s", cmd, USAGE);
    return 2;
}
