/* episode_read.c - how fast the episode reader alone delivers frames: every episode's frames
 * read in windows of --batch timesteps, camera by camera, as act-infer eval's reader thread does
 * (engine/episode.c: raw frames by pread on the pool's threads, gzip by libdeflate/zlib on them,
 * or HDF5 itself), nothing else running. Figures: timesteps/s and GB/s per round (the opens'
 * share of the round's time in brackets), and the HDF5 read with (act_episode_library); the variables
 * ACT_EPISODE_THREADS / ACT_EPISODE_INFLATE pick the path, so alternate them to compare.
 *
 *   build/bench_episode_read --model M.actw --episodes DIR [--batch 64] [--rounds 3] [--dump PREFIX]
 *
 * --dump writes the first episode's frames, as read, to PREFIX.CAMERA.u8 ((T, H, W, 3) raw bytes):
 * the tests compare them with h5py's, pixel for pixel.
 *
 * The model is read for its contract only (cameras, image size, dims). The page cache is not
 * dropped between rounds: the first round of a fresh file may read from disk. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "act.h"
#include "episode.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int usage(int rc) {
    fprintf(rc ? stderr : stdout,
            "usage: bench_episode_read --model M.actw --episodes DIR|FILE... [--batch 64] [--rounds 3]\n"
            "                          [--dump PREFIX]\n"
            "Reads every episode's frames in windows of --batch timesteps (the reader of act-infer eval,\n"
            "alone) and prints timesteps/s per round. ACT_EPISODE_THREADS=1 is HDF5's own path;\n"
            "ACT_EPISODE_INFLATE=zlib|libdeflate picks the gzip inflater. --dump writes the first\n"
            "episode's frames as read to PREFIX.CAMERA.u8 (raw (T, H, W, 3) bytes).\n");
    return rc;
}

int main(int argc, char **argv) {
    const char *model = NULL, *dump = NULL;
    char *eps[256];
    int neps = 0, batch = 64, rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(0);
        if (i + 1 >= argc) return usage(2);
        if (!strcmp(argv[i], "--model")) model = argv[++i];
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump")) dump = argv[++i];
        else if (!strcmp(argv[i], "--episodes")) {
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) && neps < 256) eps[neps++] = argv[++i];
        } else return usage(2);
    }
    if (!model || !neps || batch < 1 || rounds < 1) return usage(2);
    char err[1024];
    act_model *m = NULL;
    char **paths = NULL;
    int npaths = 0;
    if (act_model_load(model, &m, err, sizeof err) ||
        act_episode_list(eps, neps, &paths, &npaths, err, sizeof err)) {
        fprintf(stderr, "bench_episode_read: %s\n", err);
        act_model_free(m);
        return 1;
    }
    const act_config *c = act_model_config(m);
    size_t frame = (size_t)c->image_h * c->image_w * 3;
    uint8_t *buf = malloc(frame * (size_t)batch);
    if (!buf) {
        fprintf(stderr, "bench_episode_read: out of memory\n");
        act_episode_free_list(paths, npaths);
        act_model_free(m);
        return 1;
    }
    const char *th = getenv("ACT_EPISODE_THREADS"), *inf = getenv("ACT_EPISODE_INFLATE");
    printf("episodes %d, batch %d, ACT_EPISODE_THREADS=%s ACT_EPISODE_INFLATE=%s\n", npaths, batch,
           th ? th : "(default)", inf ? inf : "(default)");
    char lib[160];
    act_episode_library(lib, sizeof lib);
    printf("library %s\n", lib);
    int rc = 0;
    FILE *dumps[ACT_MAX_CAMS] = {0};
    for (int k = 0; dump && k < c->num_cams && !rc; k++) {
        char name[1024];
        snprintf(name, sizeof name, "%s.%s.u8", dump, c->camera_names[k]);
        if (!(dumps[k] = fopen(name, "wb"))) {
            snprintf(err, sizeof err, "cannot write %.1000s", name);
            rc = 1;
        }
    }
    for (int r = 0; r < rounds && !rc; r++) {
        long steps = 0;
        double t0 = now_s(), opens = 0;
        for (int e = 0; e < npaths && !rc; e++) {
            act_episode *ep = NULL;
            double o0 = now_s();
            if (act_episode_open(paths[e], c, &ep, err, sizeof err)) {
                rc = 1;
                break;
            }
            opens += now_s() - o0;
            if (r == 0 && e == 0)   /* how the first episode's cameras are read */
                for (int k = 0; k < c->num_cams; k++) {
                    char how[128];
                    act_episode_reader(ep, k, how, sizeof how);
                    printf("reader  %s: %s\n", c->camera_names[k], how);
                }
            for (int t = 0; t < ep->T && !rc; t += batch) {
                int n = ep->T - t < batch ? ep->T - t : batch;
                for (int k = 0; k < c->num_cams && !rc; k++) {
                    rc = act_episode_read_frames(ep, k, t, n, buf, err, sizeof err) ? 1 : 0;
                    if (!rc && r == 0 && e == 0 && dumps[k] && fwrite(buf, frame, (size_t)n, dumps[k]) != (size_t)n) {
                        snprintf(err, sizeof err, "cannot write the frames of %s", c->camera_names[k]);
                        rc = 1;
                    }
                }
                steps += n;
            }
            act_episode_close(ep);
        }
        double s = now_s() - t0;
        if (!rc)
            printf("round %d: %ld timesteps in %.3f s: %.0f timesteps/s, %.2f GB/s of frames (opens %.3f s)\n",
                   r + 1, steps, s, steps / s, steps * (double)frame * c->num_cams / s / 1e9, opens);
    }
    for (int k = 0; k < ACT_MAX_CAMS; k++)
        if (dumps[k] && fclose(dumps[k]) && !rc) {
            snprintf(err, sizeof err, "cannot write the frames of %s", c->camera_names[k]);
            rc = 1;
        }
    if (rc) fprintf(stderr, "bench_episode_read: %s\n", err);
    free(buf);
    act_episode_free_list(paths, npaths);
    act_model_free(m);
    return rc;
}
