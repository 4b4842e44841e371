/* infer_common.h - what the act-infer subcommands share: argument helpers, device/precision
 * names, opening a model + session with the default device rule, and one batch of episode
 * timesteps through act_run (prior and, on request, posterior in the same run).
 * defines: infer_usage, infer_opt, infer_parse_int, infer_parse_device, infer_parse_precision,
 *          infer_device_name, infer_precision_name, infer_check_run_opts, infer_open,
 *          infer_buffers, infer_run_batch, infer_signals, infer_stop_requested,
 *          infer_signal_name, infer_wait_child, infer_finish */
#ifndef INFER_COMMON_H
#define INFER_COMMON_H

#include <stdio.h>

#include "act.h"
#include "episode_stream.h"

#define INFER_EXIT_OK 0
#define INFER_EXIT_FAIL 1
#define INFER_EXIT_USAGE 2

/* Signals (infer_signal.c): SIGTERM/SIGINT/SIGHUP handled, SIGXFSZ ignored. polled: the command
 * checks infer_stop_requested() between steps and stops by itself at the first signal (eval);
 * otherwise, and at a second signal, the process removes its unfinished outputs' temporary
 * files and dies of the signal. */
void infer_signals(int polled);
/* the signal that asked a polled command to stop, or 0 */
int infer_stop_requested(void);
const char *infer_signal_name(int sig);
/* waitpid for a child this command runs (eval's --plots), handing a stop request on to it: 0
 * with *status, -1 with errno */
int infer_wait_child(int pid, int *status);
/* The exit of every command: a failed write to the standard output (a full disk, ulimit -f,
 * /dev/full) turns success into INFER_EXIT_FAIL with a message, never exit 0 with the output cut
 * short. A failing run leaves at once (_exit), without the libraries' exit handlers: OpenBLAS's
 * joins a worker thread that an out-of-memory failure can leave retrying its allocation forever.
 * Returns rc when it is 0. */
int infer_finish(int rc);

/* Prints "act-infer <cmd>: <message>" and the command's usage to stderr; returns INFER_EXIT_USAGE. */
int infer_usage(const char *cmd, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* If argv[*i] is `name VALUE` or `name=VALUE`, stores VALUE, advances *i and returns 1;
 * returns -1 if the value is missing, 0 if argv[*i] is another option. */
int infer_opt(int argc, char **argv, int *i, const char *name, const char **val);
int infer_parse_int(const char *s, int lo, int hi, int *out);
/* A long run must not end in "cannot create OUT": 0 when the file `path` (given as `flag`) can
 * be written (its folder is writable, where the file is written through a temporary sibling, or it
 * is a writable device or FIFO, written directly; not a folder); else -1 with a message. */
int infer_output_writable(const char *cmd, const char *flag, const char *path);
int infer_parse_device(const char *s, act_device *out);
int infer_parse_precision(const char *s, act_precision *out);
const char *infer_device_name(act_device d);
const char *infer_precision_name(act_precision p);

typedef struct infer_run_opts {
    const char *device;      /* NULL: cuda if available, else cpu */
    const char *precision;   /* NULL: fp32 */
    int batch;               /* 0: per-device default */
    const char *pad;         /* --pad-batches auto|on|off|few (NULL: auto) */
} infer_run_opts;

typedef struct infer_ctx {
    act_model *model;
    act_session *session;
    const act_config *cfg;
    act_device device;
    act_precision precision;
    int batch;
    int pad;                 /* an episode's last, partial batch: INFER_PAD_OFF / _ON / _FEW */
    unsigned char *ran;      /* [batch + 1]: steps run at each size so far (up to 255; a size that
                              * ran is set up, on CUDA), by infer_run_batch */
    int n_ran;               /* how many sizes ran */
} infer_ctx;

/* --pad-batches: off runs a partial batch at its own size, on at --batch; few at its own size
 * while that size ran before or fewer than INFER_PAD_SIZES sizes have, else padded up to the
 * smallest size that ran (or --batch): equal-length episodes pad nothing, and varied lengths set
 * up at most INFER_PAD_SIZES sizes. auto is few on CUDA, off on the CPU. */
enum { INFER_PAD_OFF, INFER_PAD_ON, INFER_PAD_FEW };
#define INFER_PAD_SIZES 4

/* Checks --device / --precision before anything is loaded; returns 0 or a usage error. */
int infer_check_run_opts(const char *cmd, const char *usage, const infer_run_opts *o);

/* Loads the model and creates the session; reports errors on stderr as "act-infer <cmd>: ...".
 * Returns an exit code (0 on success). */
int infer_open(const char *cmd, const char *model_path, const infer_run_opts *o, infer_ctx *ctx);
void infer_close(infer_ctx *ctx);

/* Output buffers for one batch (sized for ctx->batch). */
typedef struct infer_buffers {
    float *actions, *post_actions, *post_actions_norm, *mu, *logvar, *kl;
} infer_buffers;
int infer_buffers_alloc(const infer_ctx *ctx, infer_buffers *b);
void infer_buffers_free(infer_buffers *b);

/* --pad-batches' help lines, for the subcommands' usage texts */
#define INFER_PAD_USAGE \
    "  --pad-batches MODE        an episode's last, partial batch: off runs it at its own size, on\n" \
    "                            pads it up to --batch (extra rows computed and dropped), few runs\n" \
    "                            its own size while that size ran before or fewer than 4 have, else\n" \
    "                            pads it up to the smallest that ran. auto (default): few on cuda,\n" \
    "                            where a new size's first steps plan it, measure its algorithms and\n" \
    "                            capture its graph; off on cpu\n"
/* Runs the prior for batch b and, if posterior, the z = mu posterior with b's targets, at the
 * rows ctx->pad gives (b->n, a size >= b->n that ran before, or ctx->batch; stored in *rows when
 * rows is not NULL; out holds them all). */
int infer_run_batch(infer_ctx *ctx, const act_ep_batch *b, int posterior, infer_buffers *out, int *rows,
                    char *err, size_t errlen);

#endif
