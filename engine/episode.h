/* episode.h - socket-peg HDF5 episodes: validation, timestep-window reads, episode listing.
 * defines: act_episode_open, act_episode_read_frames, act_episode_reader, act_episode_readers,
 *          act_episode_close,
 *          act_episode_list, act_episode_free_list, act_episode_stem, act_episode_number
 * An episode file holds `action` (T, action_dim) float, `observations/qpos` (T, obs_dim) float and
 * `observations/images/<cam>` (T, H, W, 3) uint8 for every camera of the model (gzip or raw,
 * chunked or contiguous). act_episode_open checks all of it against the model's config and
 * reads the small float datasets whole; frames are read later as hyperslabs of a few timesteps,
 * so memory stays bounded by the caller's window, never the episode's length.
 * The HDF5 library is not thread-safe: one thread at a time may use these functions.
 * Built without HDF5 (ACT_WITH_HDF5 unset), every function returns a clear error. */
#ifndef ACT_EPISODE_H
#define ACT_EPISODE_H

#include <stddef.h>
#include <stdint.h>

#include "act.h"

typedef struct act_episode {
    char path[1024];
    int T;               /* timesteps */
    int obs_dim, action_dim, num_cams, image_h, image_w;
    float *qpos;         /* [T][obs_dim], raw units */
    float *action;       /* [T][action_dim], raw units */
    void *impl;          /* HDF5 handles */
} act_episode;

int act_episode_open(const char *path, const act_config *cfg, act_episode **out,
                     char *err, size_t errlen);
/* Frames of timesteps [t0, t0 + n) of camera `cam` (config order) into dst [n][H][W][3]. */
int act_episode_read_frames(act_episode *ep, int cam, int t0, int n, uint8_t *dst,
                            char *err, size_t errlen);
/* How camera `cam`'s frames are read, for logs and tests: "pread, contiguous", "pread, chunks of
 * K frames" (episode_direct.c), "LIB, gzip chunks of K frames[, pread]" (episode_inflate.c: LIB
 * is libdeflate or zlib; pread: the compressed bytes fetched by it, else through HDF5), "LIB,
 * gzip chunks of (t, y, x, c)" (tiles that are not whole frames, e.g. h5py's automatic chunks,
 * inflated on the same pool and copied into place), or "hdf5" (HDF5 itself). */
void act_episode_reader(const act_episode *ep, int cam, char *buf, size_t len);
/* Every camera's reader, cameras with the same one grouped in config order: "l_vis, r_vis,
 * front: pread, contiguous" or "l_vis: hdf5; r_vis, front: pread, contiguous". */
void act_episode_readers(const act_episode *ep, const act_config *cfg, char *buf, size_t len);
void act_episode_close(act_episode *ep);
/* The HDF5 this build reads with and how it lists a dataset's chunks (engine/episode_index.h):
 * "HDF5 1.10.8 (built against 1.10.8), chunk table: walked" / "...: H5Dchunk_iter" / "...: none",
 * or "no HDF5". */
void act_episode_library(char *buf, size_t len);

/* Expands arguments into episode paths: a directory becomes its episode_*.hdf5 files sorted by
 * episode number; a file is taken as is, in argument order. */
int act_episode_list(char *const *args, int nargs, char ***paths, int *npaths,
                     char *err, size_t errlen);
void act_episode_free_list(char **paths, int npaths);
/* "dir/episode_12.hdf5" -> "episode_12" (into buf). */
void act_episode_stem(const char *path, char *buf, size_t buflen);
/* "dir/episode_12.hdf5" -> "episode_12.hdf5" (a pointer into path). */
const char *act_episode_basename(const char *path);
/* "dir/episode_12.hdf5" -> 12, the number the recorder gave it (the N of seed 003's
 * `val_episode_indices`); -1 for a file not named episode_<N>.hdf5. */
long long act_episode_number(const char *path);

#endif
