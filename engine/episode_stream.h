/* episode_stream.h - batches of timesteps from a list of episodes, read ahead on a thread.
 * defines: act_stream_open, act_stream_next, act_stream_frame_blocks, act_stream_close,
 *          act_ep_batch
 * A reader thread walks the episodes in order and fills two batch buffers in turn (a double
 * buffer) while the caller runs inference on the other, so HDF5 reads and gzip inflation
 * overlap with compute, across episode boundaries too. Memory is two batches, whatever the
 * episodes' lengths. The reader thread is the only one touching HDF5 while a stream is open. */
#ifndef ACT_EPISODE_STREAM_H
#define ACT_EPISODE_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "act.h"

typedef struct act_ep_batch {
    int episode;        /* index into the stream's path list */
    int T;              /* the episode's timesteps (0 if it failed to open) */
    int t0, n;          /* this batch holds timesteps [t0, t0 + n); the buffers hold the
                         * stream's batch rows, and a partial batch's rows past n are stand-ins
                         * (row 0's qpos, targets, is_pad; frames an earlier batch left), so the
                         * step may run at the full batch size and drop them */
    int first, last;    /* first / last batch of the episode */
    int failed;         /* the episode failed: err says why, no data; no more batches follow for it */
    char err[ACT_ERR_LEN];
    float *qpos;        /* [n][obs_dim] raw */
    const uint8_t *images[ACT_MAX_CAMS];  /* per camera [n][H][W][3] */
    float *targets;     /* [n][pred_horizon][action_dim]: action[t-(obs_horizon-1) : +H], padded
                           with the nearest recorded action (episode_stream.c, fill_targets) */
    uint8_t *is_pad;    /* [n][pred_horizon]: 1 where that step is before 0 or at/after T */
    char reader[256];   /* first batch of an episode: how its frames are read (act_episode_readers) */
} act_ep_batch;

typedef struct act_stream act_stream;

int act_stream_open(char *const *paths, int npaths, const act_config *cfg, int batch,
                    act_stream **out, char *err, size_t errlen);
/* The next batch, valid until the next call; NULL when every episode has been delivered.
 * A batch is returned even for a failed episode (failed = 1), so the caller can report it. */
const act_ep_batch *act_stream_next(act_stream *s);
/* The frame memory of the read-ahead buffers (two): each holds every camera's frames of its
 * batch and is whole pages of its own, so a caller can register it with a session
 * (act_session_register_host) and the step reads the frames where the reader put them. Fills
 * blocks[i] and bytes[i] for up to max buffers; returns how many. A registered block must be
 * unregistered before act_stream_close frees it. */
int act_stream_frame_blocks(const act_stream *s, const uint8_t **blocks, size_t *bytes, int max);
/* Stops the reader (even mid-episode) and frees everything. */
void act_stream_close(act_stream *s);

#endif
