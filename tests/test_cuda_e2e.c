/* test_cuda_e2e.c - whole steps on CUDA against the CPU session: prior actions and the
 * posterior path (mu, logvar, kl, post_actions, deterministic and sampled z).
 *
 * Models: $ACT_TEST_DATA/small.actw (BatchNorm trunk, min_max, gelu) and small_sep_gn.actw
 * (separate GroupNorm trunks, mean_std, relu, crop + ImageNet), plus full.actw (act_resnet size)
 * when that file exists. For each model and batch (1, 3, 64), two sets of fresh random frames,
 * qpos, actions and padding masks go through the CPU session once (the reference) and through
 * CUDA sessions in every precision, with graphs on and off. With graphs on, the sets run in the
 * order 0, 1, 0, 1: the backend runs a key's first step eagerly, captures the second and replays
 * from then on, so the last two runs are replays of one graph with new inputs each, and each
 * must match the CPU's outputs for its own set (a stale replay would reproduce the other).
 * Error: ||cuda - cpu|| / ||cpu|| per output.
 * Limits: ARCHITECTURE section 6's - fp32 1e-4, tf32 2e-3, bf16/fp16 2e-2 - on the full-size
 * model. The small test models amplify rounding (2x2 feature maps under a 4-way spatial
 * softmax, a 32-wide head): a PyTorch emulation of the same storage precisions on them
 * (weights and every layer output rounded) measured tf32 1.4e-3..1.6e-3 and bf16 1.2e-2..3.7e-2
 * on actions, against 1.2e-3 and 1.0e-2 at full size. The tails are long: a sweep of 28 seeds
 * on the emulator (both small models, batch 1, ACT_E2E_MODELS=small,small_sep_gn
 * ACT_E2E_MAX_BATCH=1) gave worst errors tf32 median 2.0e-3 / max 4.4e-3, bf16 1.6e-2 / 4.7e-2,
 * fp16 2.3e-3 / 5.8e-3, and single seeds reached tf32 4.95e-3 and bf16 6.04e-2 - past the
 * former limits (5e-3, 6e-2), so CI failed at random. They get tf32 1.2e-2, bf16 0.15 and fp16
 * 3e-2 (6-13x the medians); a real defect shows 0.5-1 (a filter in the wrong layout measured
 * 0.55-0.99), and the precision itself is held to the spec's limits at full size. fp32 keeps 1e-4.
 * Exit 77 (skipped) without a CUDA device.
 * Frames: uniform noise for the small models; camera-like frames (frames.h) for the full size,
 * whose limits are the spec's. Noise frames are all high frequency, which no camera gives, and
 * put bf16 right at the limit: on the emulator one seed gave 2.2e-2 at full size, and a PyTorch
 * emulation of bf16 storage over 60 noise inputs gave median 1.0e-2, max 1.8e-2 (vision trunk
 * alone 8.6e-3 / 1.7e-2: the trunk's bf16 feature maps are most of it). Camera-like frames:
 * 1.0e-2..1.2e-2 on the emulator.
 * ACT_E2E_MAX_BATCH=N leaves out the batches above N (the CUDA-emulator run in CI uses 3);
 * ACT_E2E_FULL_MODEL names the full-size file (default $ACT_TEST_DATA/full.actw, if present);
 * ACT_E2E_MODELS=small,small_sep_gn,full runs only the models named (for seed sweeps).
 * ACT_E2E_CHECKS=parity,switching,gather,faults runs only the checks named; unset, all but
 * faults, which need the CUDA emulator (they make it refuse allocations and captures) and run
 * in test_cuda_e2e_emu_faults. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "act.h"
#include "frames.h"
#include "test_common.h"

static const char *PREC_NAME[4] = {"fp32", "tf32", "bf16", "fp16"};
static const double TOL_FULL[4] = {1e-4, 2e-3, 2e-2, 2e-2};
static const double TOL_SMALL[4] = {1e-4, 1.2e-2, 1.5e-1, 3e-2};
static const double *TOL = TOL_SMALL;          /* the limits of the model under test */
static double g_worst[4], g_worst_full[4];
static int g_full_ran;


typedef struct {                 /* one input set and the outputs of one run on it */
    float *qpos, *actions;
    uint8_t *images[ACT_MAX_CAMS], *pad;
    float *act, *post, *mu, *logvar, *kl, *post_s;
} run_io;

static void *xmalloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

/* frames: uniform noise (every pixel independent), or camera-like (frames.h) */
static void make_inputs(run_io *io, const act_config *c, int B, int camera_like) {
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    int H = c->pred_horizon, A = c->action_dim;
    io->qpos = xmalloc(sizeof(float) * B * c->obs_dim);
    io->actions = xmalloc(sizeof(float) * B * H * A);
    io->pad = xmalloc((size_t)B * H);
    for (int i = 0; i < B * c->obs_dim; i++) io->qpos[i] = urand(-1, 1);
    for (int i = 0; i < B * H * A; i++) io->actions[i] = urand(-1, 1);
    for (int b = 0; b < B; b++) {                   /* a random tail of padded steps */
        int keep = 1 + (int)(rnd() % H);
        for (int h = 0; h < H; h++) io->pad[b * H + h] = h >= keep;
    }
    for (int cam = 0; cam < c->num_cams; cam++) {
        io->images[cam] = xmalloc(B * fsz);
        for (int b = 0; b < B && camera_like; b++)
            act_synthetic_frame(io->images[cam] + (size_t)b * fsz, c->image_h, c->image_w, rnd());
        for (size_t i = 0; i < B * fsz && !camera_like; i++) io->images[cam][i] = (uint8_t)(rnd() >> 56);
    }
}

static void alloc_outputs(run_io *o, const act_config *c, int B) {
    size_t chunk = (size_t)B * c->pred_horizon * c->action_dim;
    o->act = xmalloc(4 * chunk);
    o->post = xmalloc(4 * chunk);
    o->post_s = xmalloc(4 * chunk);
    o->mu = xmalloc(4 * (size_t)B * c->latent_dim);
    o->logvar = xmalloc(4 * (size_t)B * c->latent_dim);
    o->kl = xmalloc(4 * (size_t)B);
}

static void free_io(run_io *io, int ncam) {
    free(io->qpos); free(io->actions); free(io->pad);
    for (int cam = 0; cam < ncam; cam++) free(io->images[cam]);
    free(io->act); free(io->post); free(io->post_s); free(io->mu); free(io->logvar); free(io->kl);
}

/* two act_run calls: prior + deterministic posterior, then the sampled posterior; the frames
 * from in->images, or per sample from items when it is given */
static int run_items(act_session *s, const act_config *c, int B, const run_io *in, run_io *out,
                     uint64_t seed, const uint8_t **items[ACT_MAX_CAMS], char *err, size_t errlen) {
    act_inputs ai;
    memset(&ai, 0, sizeof ai);
    ai.batch = B;
    ai.qpos = in->qpos;
    for (int cam = 0; cam < c->num_cams; cam++) {
        if (items) ai.image_items[cam] = items[cam];
        else ai.images[cam] = in->images[cam];
    }
    ai.actions = in->actions;
    ai.action_is_pad = in->pad;
    act_outputs ao;
    memset(&ao, 0, sizeof ao);
    ao.actions = out->act;
    ao.post_actions = out->post;
    ao.mu = out->mu;
    ao.logvar = out->logvar;
    ao.kl = out->kl;
    if (act_run(s, &ai, &ao, err, errlen)) return -1;
    ai.sample_latent = 1;
    ai.seed = seed;
    memset(&ao, 0, sizeof ao);
    ao.post_actions = out->post_s;
    return act_run(s, &ai, &ao, err, errlen);
}

static int run(act_session *s, const act_config *c, int B, const run_io *in, run_io *out,
               uint64_t seed, char *err, size_t errlen) {
    return run_items(s, c, B, in, out, seed, NULL, err, errlen);
}

static double rel(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check(const char *what, const char *tag, int prec, const float *got, const float *want,
                  size_t n) {
    double e = rel(got, want, n);
    g_checks++;
    if (!(e <= TOL[prec])) {
        g_fail++;
        printf("FAIL %-40s %-12s rel err %.3g > %.2g\n", tag, what, e, TOL[prec]);
    }
    double *worst = TOL == TOL_FULL ? g_worst_full : g_worst;
    if (!(e <= worst[prec])) worst[prec] = isnan(e) ? INFINITY : e;
}

static void compare(const char *tag, int prec, const act_config *c, int B, const run_io *got,
                    const run_io *want) {
    size_t chunk = (size_t)B * c->pred_horizon * c->action_dim, nl = (size_t)B * c->latent_dim;
    check("actions", tag, prec, got->act, want->act, chunk);
    check("post_actions", tag, prec, got->post, want->post, chunk);
    check("post(sample)", tag, prec, got->post_s, want->post_s, chunk);
    check("mu", tag, prec, got->mu, want->mu, nl);
    check("logvar", tag, prec, got->logvar, want->logvar, nl);
    check("kl", tag, prec, got->kl, want->kl, (size_t)B);
}

static act_model *load_model(const char *path) {
    char err[1024];
    act_model *m = NULL;
    if (act_model_load(path, &m, err, sizeof err))
        printf("FAIL cannot load %s: %s (make it with tests/make_testdata.py)\n", path, err);
    return m;
}

/* n input sets (set k of batch Bs[k]: fresh inputs, camera-like frames or noise) and their
 * outputs on a CPU session - the reference the CUDA runs are compared with */
static int cpu_reference(const act_model *m, int n, const int *Bs, int camera_like,
                         const uint64_t *seeds, run_io *in, run_io *ref) {
    const act_config *c = act_model_config(m);
    char err[1024];
    act_session_opts o = act_session_default_opts();
    for (int k = 0; k < n; k++) if (Bs[k] > o.max_batch) o.max_batch = Bs[k];
    act_session *cpu = NULL;
    if (act_session_create(m, &o, &cpu, err, sizeof err)) {
        printf("FAIL cpu session: %s\n", err);
        return -1;
    }
    int rc = 0;
    for (int k = 0; k < n; k++) {
        memset(&in[k], 0, sizeof in[k]);
        memset(&ref[k], 0, sizeof ref[k]);
        make_inputs(&in[k], c, Bs[k], camera_like);
        alloc_outputs(&ref[k], c, Bs[k]);
        if (!rc && run(cpu, c, Bs[k], &in[k], &ref[k], seeds[k], err, sizeof err)) {
            printf("FAIL cpu run: %s\n", err);
            rc = -1;
        }
    }
    act_session_free(cpu);
    return rc;
}

/* one CUDA run of input set in, checked against the CPU's outputs for it */
static void check_run(act_session *s, const act_config *c, int B, const run_io *in,
                      const run_io *ref, uint64_t seed, int prec, const char *tag) {
    char err[1024];
    run_io got;
    memset(&got, 0, sizeof got);
    alloc_outputs(&got, c, B);
    if (run(s, c, B, in, &got, seed, err, sizeof err)) {
        printf("FAIL %s: %s\n", tag, err);
        g_fail++;
    } else {
        compare(tag, prec, c, B, &got, ref);
    }
    free_io(&got, 0);
}

static void free_sets(run_io *in, run_io *ref, int n, int ncam) {
    for (int k = 0; k < n; k++) {
        free_io(&in[k], ncam);
        free_io(&ref[k], 0);
    }
}

/* The driver's count (cudaMemGetInfo since the backend's setup) against what the session
 * allocated itself. The emulator's libraries allocate nothing of their own, so there the two are
 * equal to the byte: a count taken after the setup's own buffers (cuBLAS's workspace) would read
 * low. On a GPU the two are printed for the log (the libraries', the graphs' and lazily loaded
 * kernels' memory make the difference). */
static void check_driver_memory(const act_session *s, const char *prec, int B, int graphs) {
    act_memory mm;
    act_session_memory(s, &mm);
    int emulated = strstr(act_session_device_name(s), "emulator") != NULL;
    if (!emulated && mm.driver_total == 0) {   /* a figure the driver may not give (a sandbox) */
        if (B == 1 && graphs) printf("note: %s: cudaMemGetInfo gave no driver count here\n", prec);
        return;
    }
    if (!emulated) {   /* a GPU's count is a figure for the log: pages another session of this
                          process left, lazily loaded kernels, other processes all move it */
        if (B == 1 && graphs)
            printf("note: %s B=1: driver held %.1f MiB vs the session's %.1f MiB (context etc. %.1f MiB)\n",
                   prec, mm.driver_held / 1048576.0, mm.total / 1048576.0, mm.driver_before / 1048576.0);
        return;
    }
    g_checks++;
    if (mm.driver_total == 0 || mm.driver_held != mm.total ||
        mm.driver_before + mm.driver_held > mm.driver_total) {
        printf("FAIL driver memory %s B=%d graphs=%d: driver held %zu, before %zu, total %zu; the "
               "session's own %zu bytes\n", prec, B, graphs, mm.driver_held, mm.driver_before,
               mm.driver_total, mm.total);
        g_fail++;
    }
}

static int test_model(const char *path, int full) {
    char err[1024];
    act_model *m = load_model(path);
    if (!m) return -1;
    const act_config *c = act_model_config(m);
    TOL = full ? TOL_FULL : TOL_SMALL;
    g_full_ran |= full;
    const int batches[3] = {1, 3, 64};
    int nb = full ? 2 : 3;                           /* full size: batch 1 and 3 keep the CPU short */
    const char *maxb = getenv("ACT_E2E_MAX_BATCH");  /* the emulator run stops at 3 (the op
                                                        harness covers every op at 64) */
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        if (maxb && *maxb && B > atoi(maxb)) break;
        run_io in[2], ref[2];
        uint64_t seeds[2] = {rnd(), rnd()};
        const int Bs[2] = {B, B};
        if (cpu_reference(m, 2, Bs, full, seeds, in, ref)) return -1;
        act_session_opts o = act_session_default_opts();
        for (int prec = 0; prec < 4; prec++)
            for (int graphs = 0; graphs < 2; graphs++) {
                o.device = ACT_DEVICE_CUDA;
                o.precision = (act_precision)prec;
                o.use_graphs = graphs;
                o.max_batch = 64;
                act_session *s = NULL;
                if (act_session_create(m, &o, &s, err, sizeof err)) {
                    printf("FAIL cuda session %s: %s\n", PREC_NAME[prec], err);
                    g_fail++;
                    continue;
                }
                for (int r = 0; r < (graphs ? 4 : 2); r++) {
                    int k = r % 2;
                    char tag[1200];
                    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
                    snprintf(tag, sizeof tag, "%s %s B=%d graphs=%d run=%d (set %d)", base,
                             PREC_NAME[prec], B, graphs, r, k);
                    check_run(s, c, B, &in[k], &ref[k], seeds[k], prec, tag);
                }
                check_driver_memory(s, PREC_NAME[prec], B, graphs);
                act_session_free(s);
            }
        free_sets(in, ref, 2, c->num_cams);
    }
    act_model_free(m);
    return 0;
}

/* One CUDA session through batch sizes in turn, graphs on: a new size's eager first step may make
 * conv plans that need a larger workspace, which drops the graphs captured so far (they hold the
 * old one). The sizes that come back must be captured again and still match the CPU; a graph
 * replayed against the freed workspace would not (the emulator faults on it). tf32 is the
 * precision whose conv workspace grows with the batch (Winograd, on the emulator too). */
static int test_batch_switching(const char *path) {
    char err[1024];
    act_model *m = load_model(path);
    if (!m) return -1;
    const act_config *c = act_model_config(m);
    TOL = TOL_SMALL;
    const int order[] = {1, 1, 1, 3, 3, 1, 1, 3, 1};   /* eager, capture, replay per size */
    run_io in[2], ref[2];                               /* [0] batch 1, [1] batch 3 */
    uint64_t seeds[2] = {rnd(), rnd()};
    const int Bs[2] = {1, 3};
    act_session_opts o = act_session_default_opts();
    o.max_batch = 3;
    act_session *s = NULL;
    int rc = cpu_reference(m, 2, Bs, 0, seeds, in, ref);
    o.device = ACT_DEVICE_CUDA;
    o.precision = ACT_TF32;
    if (!rc && act_session_create(m, &o, &s, err, sizeof err)) {
        printf("FAIL batch switching, cuda session: %s\n", err);
        rc = -1;
    }
    for (size_t r = 0; r < sizeof order / sizeof order[0] && !rc; r++) {
        int k = order[r] == 3, B = order[r];
        char tag[128];
        snprintf(tag, sizeof tag, "batch switching tf32 step %zu (B=%d)", r, B);
        check_run(s, c, B, &in[k], &ref[k], seeds[k], ACT_TF32, tag);
    }
    act_session_free(s);
    free_sets(in, ref, 2, c->num_cams);
    act_model_free(m);
    return rc;
}

/* zeroed whole pages: registrations of two blocks must not share one */
static void *page_alloc(size_t n) {
    void *p = NULL;
    size_t sz = (n + 4095) / 4096 * 4096;
    if (posix_memalign(&p, 4096, sz)) { fprintf(stderr, "out of memory\n"); exit(1); }
    memset(p, 0, sz);
    return p;
}

/* Frames read where they lie (act_inputs.image_items in registered memory, act-serve's
 * shared-memory clients): each sample's frames in a block of its own, as a client's memfd, and
 * new blocks at every step, so a replayed graph must take the new addresses from the step's
 * table and never the captured ones. Then the same with one frame outside registered memory
 * (that step copies every frame instead) and after unregistering. All against the CPU. */
static int test_gather(const char *path) {
    char err[1024];
    act_model *m = load_model(path);
    if (!m) return -1;
    const act_config *c = act_model_config(m);
    TOL = TOL_SMALL;
    enum { B = 3, RUNS = 5 };
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    run_io in[2], ref[2];
    uint64_t seeds[2] = {rnd(), rnd()};
    const int Bs[2] = {B, B};
    int rc = cpu_reference(m, 2, Bs, 0, seeds, in, ref);
    const act_precision precs[2] = {ACT_FP32, ACT_BF16};
    for (int pi = 0; pi < 2 && !rc; pi++) {
        act_session_opts o = act_session_default_opts();
        o.device = ACT_DEVICE_CUDA;
        o.precision = precs[pi];
        o.max_batch = 4;
        act_session *s = NULL;
        if (act_session_create(m, &o, &s, err, sizeof err)) {
            printf("FAIL gather, cuda session %s: %s\n", PREC_NAME[precs[pi]], err);
            g_fail++;
            rc = -1;
            break;
        }
        /* a runtime that pins no host memory (a GPU proxy such as gVisor's may not) makes
         * act-serve copy frames instead: a limit of the machine, said as a skip, not a failure */
        uint8_t *probe = page_alloc(fsz);
        int refused = act_session_register_host(s, probe, fsz, err, sizeof err) != 0;
        if (!refused) act_session_unregister_host(s, probe);
        free(probe);
        if (refused) {
            printf("SKIP gather %s: this runtime registers no host memory (%s); frames are "
                   "copied there\n", PREC_NAME[precs[pi]], err);
            act_session_free(s);
            continue;
        }
        uint8_t *blocks[RUNS][B];
        const uint8_t *items[ACT_MAX_CAMS][B], **itp[ACT_MAX_CAMS];
        for (int cam = 0; cam < c->num_cams; cam++) itp[cam] = items[cam];
        for (int r = 0; r < RUNS; r++) {
            int k = r % 2, outside = r == RUNS - 1;   /* the last run: sample 1's camera 0 outside */
            for (int b = 0; b < B; b++) {
                blocks[r][b] = page_alloc(c->num_cams * fsz + 64);   /* the driver pins whole pages */
                for (int cam = 0; cam < c->num_cams; cam++) {
                    uint8_t *dst = blocks[r][b] + cam * fsz + (b == 2 ? 16 : b == 1 ? 5 : 0);   /* off 16-byte alignment too */
                    memcpy(dst, in[k].images[cam] + (size_t)b * fsz, fsz);
                    items[cam][b] = dst;
                }
                size_t reg = outside && b == 1 ? fsz - 1 : c->num_cams * fsz + 64;   /* too short: frame 0 sticks out */
                if (act_session_register_host(s, blocks[r][b], reg, err, sizeof err)) {
                    printf("FAIL gather register %s run %d: %s\n", PREC_NAME[precs[pi]], r, err);
                    g_fail++;
                }
            }
            if (r == 2) {   /* a registration the driver refuses (pages registered already) must
                             * not leave its error for the next step's first launch check */
                g_checks++;
                if (act_session_register_host(s, blocks[r][0] - 64, 128, err, sizeof err) == 0) {
                    printf("FAIL gather: registering a page registered already did not fail\n");
                    g_fail++;
                }
            }
            char tag[128];
            snprintf(tag, sizeof tag, "gathered frames %s B=%d run=%d%s", PREC_NAME[precs[pi]], B, r,
                     outside ? " (one frame outside: copied)" : "");
            run_io got;
            memset(&got, 0, sizeof got);
            alloc_outputs(&got, c, B);
            if (run_items(s, c, B, &in[k], &got, seeds[k], itp, err, sizeof err)) {
                printf("FAIL %s: %s\n", tag, err);
                g_fail++;
            } else {
                compare(tag, precs[pi], c, B, &got, &ref[k]);
            }
            free_io(&got, 0);
        }
        for (int r = 0; r < RUNS; r++)
            for (int b = 0; b < B; b++) {
                g_checks++;
                if (act_session_unregister_host(s, blocks[r][b]) != 0) {
                    printf("FAIL gather: unregistering block %d of run %d\n", b, r);
                    g_fail++;
                }
            }
        g_checks++;
        if (act_session_unregister_host(s, blocks[0][0]) != -1) {
            printf("FAIL gather: a second unregister of the same block did not fail\n");
            g_fail++;
        }
        act_session_free(s);
        for (int r = 0; r < RUNS; r++)
            for (int b = 0; b < B; b++) free(blocks[r][b]);
    }
    free_sets(in, ref, 2, c->num_cams);
    act_model_free(m);
    return rc;
}

/* ---- faults the emulator injects (ACT_EMU_*, tests/cuda_emu/emu_runtime.cc) ---- */

/* stderr from here to stderr_end goes to a file too, so a check can read what the steps said */
typedef struct { FILE *f; int saved; } err_capture;
static void stderr_begin(err_capture *e) {
    fflush(stderr);
    e->f = tmpfile();
    e->saved = e->f ? dup(2) : -1;
    if (e->saved >= 0) dup2(fileno(e->f), 2);
}
/* what was written (malloc'd, "" when it could not be captured); echoed to the real stderr */
static char *stderr_end(err_capture *e) {
    fflush(stderr);
    char *text = NULL;
    if (e->saved >= 0) {
        dup2(e->saved, 2);
        close(e->saved);
        long n = ftell(e->f);
        text = xmalloc(n > 0 ? (size_t)n + 1 : 1);
        rewind(e->f);
        size_t got = n > 0 ? fread(text, 1, (size_t)n, e->f) : 0;
        text[got] = 0;
        fputs(text, stderr);
    }
    if (e->f) fclose(e->f);
    return text ? text : xmalloc(1);
}
static int count_of(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}
#define NO_GRAPH_LINE "runs without a graph from now on"
#define CAPTURE_FAILED "graph capture failed"

/* a CUDA session made with the environment variable env set to val (read at creation) */
static act_session *cuda_session(const act_model *m, act_precision prec, int max_batch,
                                 const char *env, const char *val) {
    char err[1024];
    act_session_opts o = act_session_default_opts();
    o.device = ACT_DEVICE_CUDA;
    o.precision = prec;
    o.max_batch = max_batch;
    act_session *s = NULL;
    if (env) setenv(env, val, 1);
    if (act_session_create(m, &o, &s, err, sizeof err)) {
        printf("FAIL fault checks, cuda session %s: %s\n", PREC_NAME[prec], err);
        g_fail++;
        s = NULL;
    }
    if (env) unsetenv(env);
    return s;
}

/* A new batch size's plans need a larger conv workspace while the device has no memory left:
 * that step fails, and the backend runs on as it was - batch 1's graph, captured on the old
 * workspace, replays correctly - and once memory is there, batch 3 is planned again and runs
 * eagerly, then from a graph of its own (never marked as one that cannot be captured). The
 * emulated convs take 1 MiB of workspace more per image (ACT_EMU_CONV_WS_PER_IMAGE), so batch 3
 * needs more than batch 1; the heuristics' algorithms, not Find, whose temporary workspace
 * would fail first. */
static void check_workspace_oom(const act_model *m, const act_config *c, const run_io *in,
                                const run_io *ref, const uint64_t *seeds) {
    setenv("ACT_EMU_CONV_WS_PER_IMAGE", "1048576", 1);
    act_session *s = cuda_session(m, ACT_TF32, 3, "ACT_CUDA_CONV_ALGO", "heuristic");
    if (!s) {
        unsetenv("ACT_EMU_CONV_WS_PER_IMAGE");
        return;
    }
    char err[1024];
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_TF32, "oom: batch 1 eager");
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_TF32, "oom: batch 1 captured");
    act_memory before, after;
    act_session_memory(s, &before);
    run_io got;
    memset(&got, 0, sizeof got);
    alloc_outputs(&got, c, 3);
    setenv("ACT_EMU_MALLOC", "fail", 1);
    int rc = run(s, c, 3, &in[1], &got, seeds[1], err, sizeof err);
    unsetenv("ACT_EMU_MALLOC");
    free_io(&got, 0);
    CHECK(rc != 0, "oom: batch 3's first step ran although no device memory was left for its "
          "conv workspace (this check needs the workspace to grow at batch 3)");
    err_capture cap;
    stderr_begin(&cap);
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_TF32, "oom: batch 1 replayed after the failed growth");
    for (int r = 0; r < 3; r++)
        check_run(s, c, 3, &in[1], &ref[1], seeds[1], ACT_TF32, "oom: batch 3 with memory again");
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_TF32, "oom: batch 1 captured again");
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_TF32, "oom: batch 1 replayed");
    char *said = stderr_end(&cap);
    CHECK(!strstr(said, CAPTURE_FAILED), "oom: a step that failed eagerly left its batch size to "
          "be captured before it had run eagerly once (its later plans made in a capture)");
    free(said);
    act_session_memory(s, &after);
    CHECK(after.workspace > before.workspace, "oom: the workspace did not grow at batch 3 "
          "(%zu -> %zu bytes): the failed growth was not tested", before.workspace,
          after.workspace);
    act_session_free(s);
    unsetenv("ACT_EMU_CONV_WS_PER_IMAGE");
}

/* A graph that cannot be instantiated (ACT_EMU_CAPTURE=refuse-instantiate) leaves no error
 * behind: the next step, of another batch size, runs (its first launch check used to find the
 * refusal's error in the runtime's last-error slot and fail). */
static void check_no_stale_error(const act_model *m, const act_config *c, const run_io *in,
                                 const run_io *ref, const uint64_t *seeds) {
    act_session *s = cuda_session(m, ACT_FP32, 3, NULL, NULL);
    if (!s) return;
    char err[1024];
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, "stale: batch 1 eager");
    run_io got;
    memset(&got, 0, sizeof got);
    alloc_outputs(&got, c, 1);
    setenv("ACT_EMU_CAPTURE", "refuse-instantiate", 1);
    run(s, c, 1, &in[0], &got, seeds[0], err, sizeof err);   /* the refused step: not checked here */
    unsetenv("ACT_EMU_CAPTURE");
    free_io(&got, 0);
    check_run(s, c, 3, &in[1], &ref[1], seeds[1], ACT_FP32, "stale: batch 3 after a refused instantiate");
    act_session_free(s);
}

/* A step that cannot be captured - the capture refused at its start, invalidated by a call in
 * it, the graph refused at instantiation or at its first launch, a cuDNN call refused in it -
 * runs eagerly instead, says so once per step key (run() makes two: prior + posterior, sampled
 * posterior), and with ACT_CUDA_GRAPH_RETRY=0 (no retry) its later steps run eagerly too, all
 * matching the CPU. ACT_CUDA_GRAPHS=0 never captures. */
static void check_capture_refused(const act_model *m, const act_config *c, const run_io *in,
                                  const run_io *ref, const uint64_t *seeds) {
    const char *how[][3] = {{"ACT_EMU_CAPTURE", "refuse-begin", NULL},
                            {"ACT_EMU_CAPTURE", "invalidate", NULL},
                            {"ACT_EMU_CAPTURE", "refuse-instantiate", NULL},
                            {"ACT_EMU_CAPTURE", "refuse-launch", NULL},
                            {"ACT_EMU_CUDNN", "refuse-capture", NULL},
                            {"ACT_EMU_CAPTURE", "refuse-begin", "ACT_CUDA_GRAPHS"}};
    setenv("ACT_CUDA_GRAPH_RETRY", "0", 1);   /* the first failure is the last (retries: below) */
    for (size_t k = 0; k < sizeof how / sizeof how[0]; k++) {
        act_session *s = cuda_session(m, ACT_FP32, 3, how[k][2], "0");
        if (!s) continue;
        char tag[128];
        snprintf(tag, sizeof tag, "%s=%s%s", how[k][0], how[k][1],
                 how[k][2] ? ", ACT_CUDA_GRAPHS=0" : "");
        setenv(how[k][0], how[k][1], 1);
        err_capture cap;
        stderr_begin(&cap);
        for (int r = 0; r < 3; r++)
            check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, tag);
        char *said = stderr_end(&cap);
        unsetenv(how[k][0]);
        int want = how[k][2] ? 0 : 2, got = count_of(said, NO_GRAPH_LINE);
        CHECK(got == want && count_of(said, "act-engine: batch 1 (") == want,
              "%s: %d lines say a step runs without a graph, %d expected (each naming batch 1)",
              tag, got, want);
        free(said);
        act_session_free(s);
    }
    unsetenv("ACT_CUDA_GRAPH_RETRY");
}

/* A capture refused once (ACT_EMU_CAPTURE=refuse-instantiate for one step, as device memory that
 * another process held at instantiation would) is tried again after ACT_CUDA_GRAPH_RETRY eager
 * steps and holds: said once per step key, and the key's later steps replay the graph (no new
 * capture begins: under refuse-begin one would be said). A capture refused every time is tried
 * ACT_FWD_RETRIES more times, base, 10 x base and 100 x base eager steps apart, then the key
 * stays eager ("from now on"). Every step is compared with the CPU. */
static void check_capture_retry(const act_model *m, const act_config *c, const run_io *in,
                                const run_io *ref, const uint64_t *seeds) {
    /* convs that want 1 MiB of workspace more per image, as in check_workspace_oom: batch 3 grows it */
    setenv("ACT_EMU_CONV_WS_PER_IMAGE", "1048576", 1);
    setenv("ACT_CUDA_CONV_ALGO", "heuristic", 1);
    act_session *s = cuda_session(m, ACT_FP32, 3, "ACT_CUDA_GRAPH_RETRY", "2");
    unsetenv("ACT_CUDA_CONV_ALGO");
    if (!s) {
        unsetenv("ACT_EMU_CONV_WS_PER_IMAGE");
        return;
    }
    char tag[96];
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, "retry: eager first step");
    err_capture cap;
    stderr_begin(&cap);
    setenv("ACT_EMU_CAPTURE", "refuse-instantiate", 1);
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, "retry: instantiation refused");
    unsetenv("ACT_EMU_CAPTURE");
    char *said = stderr_end(&cap);
    CHECK(count_of(said, CAPTURE_FAILED) == 2 &&
          count_of(said, "for its next 2 steps, then tries a capture again (retry 1 of 3)") == 2,
          "retry: a refused instantiation did not say twice (two step keys) that it retries after 2 "
          "steps");
    free(said);
    stderr_begin(&cap);
    for (int r = 0; r < 3; r++) {   /* two eager steps, then the retry's capture */
        snprintf(tag, sizeof tag, "retry: step %d after the refusal", r + 1);
        check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, tag);
        if (r == 1) {
            fflush(stderr);
            CHECK(ftell(cap.f) == 0, "retry: something was said before the retry was due");
        }
    }
    said = stderr_end(&cap);
    CHECK(count_of(said, "graph captured on retry 1") == 2 && count_of(said, CAPTURE_FAILED) == 0,
          "retry: the capture after two eager steps was not said to hold for both step keys");
    free(said);
    stderr_begin(&cap);
    setenv("ACT_EMU_CAPTURE", "refuse-begin", 1);   /* a replay never begins a capture */
    for (int r = 0; r < 2; r++)
        check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, "retry: replayed");
    unsetenv("ACT_EMU_CAPTURE");
    said = stderr_end(&cap);
    CHECK(count_of(said, CAPTURE_FAILED) == 0, "retry: a step after the retry held began another "
          "capture instead of replaying its graph");
    free(said);
    /* batch 3's first step grows the conv workspace, which drops every graph; batch 1's
     * recapture then fails anew: a retry that held renewed the count (retry 1, after 2 steps) */
    act_memory before, after;
    act_session_memory(s, &before);
    check_run(s, c, 3, &in[1], &ref[1], seeds[1], ACT_FP32, "retry: batch 3 grows the workspace");
    act_session_memory(s, &after);
    CHECK(after.workspace > before.workspace, "retry: the workspace did not grow at batch 3 (%zu -> "
          "%zu bytes): the graphs were not dropped, the recapture not tested", before.workspace,
          after.workspace);
    stderr_begin(&cap);
    setenv("ACT_EMU_CAPTURE", "refuse-instantiate", 1);
    check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, "retry: recapture refused");
    unsetenv("ACT_EMU_CAPTURE");
    said = stderr_end(&cap);
    CHECK(count_of(said, "for its next 2 steps, then tries a capture again (retry 1 of 3)") == 2,
          "retry: a recapture that failed after a retry held did not start the retries afresh");
    free(said);
    act_session_free(s);
    unsetenv("ACT_EMU_CONV_WS_PER_IMAGE");

    /* refused every time, retries 1, 10 and 100 steps apart: failures at steps 2, 4, 15, 116 */
    s = cuda_session(m, ACT_FP32, 1, "ACT_CUDA_GRAPH_RETRY", "1");
    if (!s) return;
    act_inputs ai;
    memset(&ai, 0, sizeof ai);
    ai.batch = 1;
    ai.qpos = in[0].qpos;
    for (int cam = 0; cam < c->num_cams; cam++) ai.images[cam] = in[0].images[cam];
    float *out = xmalloc((size_t)c->pred_horizon * c->action_dim * sizeof *out);
    act_outputs ao;
    memset(&ao, 0, sizeof ao);
    ao.actions = out;
    setenv("ACT_EMU_CAPTURE", "refuse-instantiate", 1);
    stderr_begin(&cap);
    char err[1024];
    int failed_at[8], nfail = 0, bad = 0;
    for (int step = 1; step <= 120 && !bad; step++) {
        fflush(stderr);
        long before = ftell(cap.f);
        if (act_run(s, &ai, &ao, err, sizeof err)) {
            printf("FAIL retry: prior step %d: %s\n", step, err);
            g_fail++;
            bad = 1;
        }
        for (size_t i = 0; i < (size_t)c->pred_horizon * c->action_dim && !bad; i++)
            if (!(fabsf(out[i] - ref[0].act[i]) <= 1e-4f * (1.0f + fabsf(ref[0].act[i])))) {
                printf("FAIL retry: prior step %d, action %zu: %g vs %g on the CPU\n", step, i,
                       out[i], ref[0].act[i]);
                g_fail++;
                bad = 1;
            }
        fflush(stderr);
        if (ftell(cap.f) != before && nfail < 8) failed_at[nfail++] = step;
    }
    unsetenv("ACT_EMU_CAPTURE");
    said = stderr_end(&cap);
    CHECK(nfail == 4 && failed_at[0] == 2 && failed_at[1] == 4 && failed_at[2] == 15 &&
          failed_at[3] == 116, "retry: %d failed captures said, at steps %d, %d, %d, %d; want 4, at "
          "steps 2, 4, 15 and 116", nfail, nfail > 0 ? failed_at[0] : -1, nfail > 1 ? failed_at[1] : -1,
          nfail > 2 ? failed_at[2] : -1, nfail > 3 ? failed_at[3] : -1);
    CHECK(count_of(said, "(retry 3 of 3)") == 1 && count_of(said, NO_GRAPH_LINE) == 1,
          "retry: the last retry's failure did not say the step stays eager from now on");
    free(said);
    free(out);
    act_session_free(s);
}

/* An op refused under capture while the upload lane is forked into it (batch 3 with the lane
 * from batch 2, ACT_EMU_CUDNN=refuse-capture: camera 0's first conv, camera 1's upload not yet
 * waited for): the capture is ended with the lane joined back (CUDA fails an unjoined end with
 * cudaErrorStreamCaptureUnjoined and may leave the lane capturing), then the step runs eagerly. */
static void check_lane_joined(const act_model *m, const act_config *c, const run_io *in,
                              const run_io *ref, const uint64_t *seeds) {
    if (c->num_cams < 2) {
        printf("note: one camera, the lane is joined before the first conv: lane check not run\n");
        return;
    }
    setenv("ACT_CUDA_GRAPH_RETRY", "0", 1);
    act_session *s = cuda_session(m, ACT_FP32, 3, "ACT_CUDA_PIPELINE_MIN_BATCH", "2");
    unsetenv("ACT_CUDA_GRAPH_RETRY");
    if (!s) return;
    check_run(s, c, 3, &in[1], &ref[1], seeds[1], ACT_FP32, "lane: batch 3 eager");
    setenv("ACT_EMU_CUDNN", "refuse-capture", 1);
    err_capture cap;
    stderr_begin(&cap);
    for (int r = 0; r < 2; r++)
        check_run(s, c, 3, &in[1], &ref[1], seeds[1], ACT_FP32, "lane: batch 3, conv refused in the capture");
    char *said = stderr_end(&cap);
    unsetenv("ACT_EMU_CUDNN");
    CHECK(!strstr(said, "cudaErrorStreamCaptureUnjoined"), "lane: a failed capture was ended "
          "with the upload lane still forked into it");
    CHECK(count_of(said, NO_GRAPH_LINE) == 2, "lane: %d lines say a step runs without a graph, 2 "
          "expected", count_of(said, NO_GRAPH_LINE));
    free(said);
    act_session_free(s);
}

/* A CUDA fault inside cuDNN (ACT_EMU_CUDNN=fail-run: EXECUTION_FAILED at the call, as a real
 * fault gives) fails the step in cuDNN's own words. It is not taken for a refusal, whose fallback
 * (the direct kernel) would hide the fault's cause and run on into a broken context. Once the
 * fault is gone the same shapes run on cuDNN again. */
static void check_conv_fault(const act_model *m, const act_config *c, const run_io *in,
                             const run_io *ref, const uint64_t *seeds) {
    act_session *s = cuda_session(m, ACT_FP32, 3, NULL, NULL);
    if (!s) return;
    char err[1024] = "";
    run_io got;
    memset(&got, 0, sizeof got);
    alloc_outputs(&got, c, 1);
    err_capture cap;
    stderr_begin(&cap);
    setenv("ACT_EMU_CUDNN", "fail-run", 1);
    int rc = run(s, c, 1, &in[0], &got, seeds[0], err, sizeof err);
    unsetenv("ACT_EMU_CUDNN");
    for (int r = 0; r < 3; r++)
        check_run(s, c, 1, &in[0], &ref[0], seeds[0], ACT_FP32, "conv fault: batch 1 once the fault is gone");
    char *said = stderr_end(&cap);
    free_io(&got, 0);
    CHECK(rc != 0 && strstr(err, "EXECUTION_FAILED"), "conv fault: a step whose conv met "
          "EXECUTION_FAILED returned %d (%s), not an error naming it", rc, err);
    CHECK(!strstr(said, "direct kernel"), "conv fault: EXECUTION_FAILED was taken for a refusal, "
          "the conv handed to the direct kernel");
    free(said);
    act_session_free(s);
}

static int test_faults(const char *path) {
    if (!getenv("ACT_CUDA_EMULATOR")) {
        printf("note: the fault checks need the CUDA emulator (ACT_CUDA_EMULATOR), not run\n");
        return 0;
    }
    act_model *m = load_model(path);
    if (!m) return -1;
    const act_config *c = act_model_config(m);
    TOL = TOL_SMALL;
    run_io in[2], ref[2];                               /* [0] batch 1, [1] batch 3 */
    uint64_t seeds[2] = {rnd(), rnd()};
    const int Bs[2] = {1, 3};
    int rc = cpu_reference(m, 2, Bs, 0, seeds, in, ref);
    if (!rc) {
        check_workspace_oom(m, c, in, ref, seeds);
        check_no_stale_error(m, c, in, ref, seeds);
        check_capture_refused(m, c, in, ref, seeds);
        check_capture_retry(m, c, in, ref, seeds);
        check_lane_joined(m, c, in, ref, seeds);
        check_conv_fault(m, c, in, ref, seeds);
    }
    free_sets(in, ref, 2, c->num_cams);
    act_model_free(m);
    return rc;
}

int main(void) {
    char why[256];
    if (!act_cuda_available(why, sizeof why)) {
        printf("SKIP test_cuda_e2e: %s\n", why);
        return 77;
    }
    const char *dir = data_dir();
    seed_rng("test_cuda_e2e");
    const char *names[3] = {"small.actw", "small_sep_gn.actw", "full.actw"};
    const char *full = getenv("ACT_E2E_FULL_MODEL");   /* named: it must exist */
    const char *only = getenv("ACT_E2E_MODELS");
    const char *checks = getenv("ACT_E2E_CHECKS");
    if (!checks || !*checks) checks = "parity,switching,gather";
    for (int i = 0; i < 3; i++) {
        char path[1024], model[32];
        snprintf(model, sizeof model, "%.*s", (int)(strlen(names[i]) - 5), names[i]);   /* less .actw */
        if (!listed(only, model, 0)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (i == 2 && full && *full) snprintf(path, sizeof path, "%s", full);
        if (i == 2) {
            FILE *f = fopen(path, "rb");
            if (!f && full && *full) {
                printf("FAIL ACT_E2E_FULL_MODEL=%s cannot be opened\n", path);
                return 1;
            }
            if (!f) {
                printf("note: %s absent, full-size parity not run here\n", path);
                break;
            }
            fclose(f);
        }
        if (listed(checks, "parity", 0) && test_model(path, i == 2)) return 1;
        if (i == 0 && ((listed(checks, "switching", 0) && test_batch_switching(path)) ||
                       (listed(checks, "gather", 0) && test_gather(path)) ||
                       (listed(checks, "faults", 0) && test_faults(path))))
            return 1;
    }
    /* a model left out by ACT_E2E_MODELS is "not run", never a worst error of 0 */
    int small_ran = listed(only, "small", 0) || listed(only, "small_sep_gn", 0);
    printf("\nworst relative error, small models:");
    for (int p = 0; p < 4; p++)
        if (small_ran) printf("  %s %.2e (limit %.2g)", PREC_NAME[p], g_worst[p], TOL_SMALL[p]);
    if (!small_ran) printf(" not run (ACT_E2E_MODELS=%s)", only);
    printf("\nworst relative error, full size:");
    for (int p = 0; p < 4; p++)
        if (g_full_ran) printf("  %s %.2e (limit %.2g)", PREC_NAME[p], g_worst_full[p], TOL_FULL[p]);
    if (!g_full_ran) printf(listed(only, "full", 0) ? " not run (no full.actw)" : " not run (ACT_E2E_MODELS=%s)", only);
    if (g_checks == 0) {
        printf("\nFAIL: no check ran (ACT_E2E_MODELS=%s names no model)", getenv("ACT_E2E_MODELS"));
        g_fail++;
    }
    printf("\n%s: %d of %d checks failed\n", g_fail ? "FAIL" : "PASS", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
