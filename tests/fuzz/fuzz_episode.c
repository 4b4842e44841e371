/* fuzz_episode.c - HDF5 episode files (engine/episode.c) against a small model contract.
 *
 * The input is a whole .hdf5 file, opened for a model of one 4x4 camera "front", obs_dim 3 and
 * action_dim 2 (the seeds: tools/make_episodes.py --T 3 --image-size 4 --cameras front
 * --obs-dim 3 --action-dim 2). An episode that opens must have finite tables of its declared
 * length, and every one of its frames must read into a buffer of exactly one window. Crashes
 * inside libhdf5 itself on a damaged file are HDF5's to fix, not ours: only our frames count. */
#include "fuzz.h"

#include <math.h>
#include <string.h>

#include "act.h"
#include "episode.h"

int act_fuzz_episode(const uint8_t *data, size_t size)
{
    act_config c;
    memset(&c, 0, sizeof c);
    c.obs_dim = 3;
    c.action_dim = 2;
    c.num_cams = 1;
    strcpy(c.camera_names[0], "front");
    c.image_h = 4;
    c.image_w = 4;
    const char *path = act_fuzz_tmp_file("episode.hdf5", data, size);
    if (!path) return 0;
    char err[ACT_ERR_LEN] = "";
    act_episode *ep = NULL;
    if (act_episode_open(path, &c, &ep, err, sizeof err) != 0) {
        FUZZ_ASSERT(err[0] && ep == NULL, "refused without a message");
        return 0;
    }
    FUZZ_ASSERT(ep->T >= 1, "T = %d", ep->T);
    for (int t = 0; t < ep->T; t++) {
        for (int j = 0; j < c.obs_dim; j++) FUZZ_ASSERT(isfinite(ep->qpos[t * c.obs_dim + j]), "qpos not finite");
        for (int j = 0; j < c.action_dim; j++)
            FUZZ_ASSERT(isfinite(ep->action[t * c.action_dim + j]), "action not finite");
    }
    uint8_t *frames = malloc((size_t)2 * 4 * 4 * 3);   /* exact: a window of two frames */
    for (int t = 0; t < ep->T && t < 64; t++) {
        int n = t + 2 <= ep->T ? 2 : 1;
        act_episode_read_frames(ep, 0, t, n, frames, err, sizeof err);
    }
    FUZZ_ASSERT(act_episode_read_frames(ep, 0, ep->T, 1, frames, err, sizeof err) != 0, "read past T accepted");
    free(frames);
    act_episode_close(ep);
    return 0;
}
