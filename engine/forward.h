/* forward.h - the ACT forward pass over the backend op table (forward.c), used by session.c.
 * defines: act_fwd, act_fwd_create, act_fwd_free, act_fwd_step, act_trunk_geometry,
 *          act_conv_out, ACT_FWD_* modes
 *
 * act_fwd_create allocates every activation buffer for max_batch, builds the sinusoid tables and
 * the host staging buffers. A step is: the caller fills the staging buffers (act_fwd.stage),
 * act_fwd_step runs (or replays) the ops for (batch, mode) and leaves the results in the output
 * staging buffers. Nothing is allocated and nothing synchronizes inside the step but the final
 * backend sync. */
#ifndef ACT_FORWARD_H
#define ACT_FORWARD_H

#include <stdint.h>
#include "backend.h"

/* Step modes (bits): PRIOR decodes z = 0, POSTERIOR encodes the recorded actions and decodes
 * z from the posterior, SAMPLE draws z = mu + eps * std instead of z = mu. GATHER takes the
 * frames from the device addresses in stage.frame_ptrs (be->gather) instead of stage.frames. */
enum { ACT_FWD_PRIOR = 1, ACT_FWD_POSTERIOR = 2, ACT_FWD_SAMPLE = 4, ACT_FWD_GATHER = 8 };

/* A step's graph key, and the batch a key stands for (the CPU timing model reads it). */
#define ACT_FWD_KEY(B, mode) ((B) * 16 + (mode))
#define ACT_FWD_KEY_BATCH(key) ((key) / 16)

/* Spatial size after a conv along one axis. */
static inline int act_conv_out(int H, const act_conv *c) { return (H + 2 * c->pad - c->k) / c->stride + 1; }

typedef struct act_trunk_geom {
    int in_h, in_w;        /* trunk input (after resize and crop) */
    int c1_h, c1_w;        /* conv1 output */
    int pool_h, pool_w;    /* after the max pool */
    int feat_h, feat_w;    /* after layer4 */
    size_t c1_elems;       /* per image: 64 x c1 map */
    size_t layer_elems;    /* per image: the largest map of layer1..layer4 */
} act_trunk_geom;

/* Walks trunk 0 from the config's input size; checks that it ends at (feat_h, feat_w). */
int act_trunk_geometry(const act_model *m, act_trunk_geom *g, char *err, size_t errlen);

/* Host staging (made by be->host_alloc; pinned on CUDA). */
typedef struct act_fwd_stage {
    uint8_t *frames[ACT_MAX_CAMS];   /* [max_batch][image_h][image_w][3] per camera */
    float *qpos;                     /* [max_batch][obs_dim] */
    float *actions;                  /* [max_batch][H][A] */
    uint8_t *pad;                    /* [max_batch][H + 2]: 0, 0, then action_is_pad */
    uint8_t *seed8;                  /* 8 bytes, the sampling seed, little endian */
    uint64_t *frame_ptrs;            /* GATHER: [num_cams][B] device addresses of single frames */
    /* outputs, each group in one block so that one download brings it (its layout follows the
     * step's B): outs holds act_norm [Bd][H][A] then act [Bd][H][A], Bd = B per path run;
     * lat_out holds mu [B][L], logvar [B][L], kl [B]. act_fwd_step points the views below at
     * them. Rows [0, B) are the prior, [B, 2B) the posterior when both run, else [0, B). */
    float *outs;                     /* [2][2 max_batch][H][A] */
    float *lat_out;                  /* [2 max_batch][L] + [max_batch] */
    float *act_norm, *act;           /* views into outs after a step */
    float *mu, *logvar, *kl;         /* views into lat_out after a step */
} act_fwd_stage;

/* A step key whose capture failed runs eagerly for a while, then tries a capture again: a
 * failure may pass (device memory short at instantiation while another process held it). The
 * retries come base, 10 x base and 100 x base eager steps apart; after ACT_FWD_RETRIES of them
 * the key stays eager. A capture that holds starts the count afresh. */
#define ACT_FWD_RETRIES 3
#define ACT_FWD_RETRY_BASE 100
typedef struct {
    unsigned char fails;               /* failed captures so far */
    unsigned char retried;             /* 1: the next capture is a retry (said if it holds) */
    long wait;                         /* eager steps left before that capture; -1: never */
} act_fwd_retry;

/* the eager steps between a key's fails-th failed capture and its next try; -1: never again */
long act_fwd_retry_wait(int fails, long base);

typedef struct act_fwd act_fwd;
struct act_fwd {
    act_backend *be;
    const act_model *m;
    int max_batch;
    int profile;                       /* 1: mark the sections (be->section_mark) and use no upload
                                        * lane, which would blur them; 0: no marks */
    act_trunk_geom g;
    act_fwd_stage stage;
    act_conv kp_conv[ACT_MAX_CAMS];    /* the keypoint 1x1 conv of each trunk */
    act_linear kp_out[ACT_MAX_CAMS];   /* SpatialSoftmax -> token linear of each trunk */
    act_linear kv_group[ACT_MAX_LAYERS]; /* every decoder layer's cross-attention K/V linear */
    int kv_grouped;                    /* 1: they run as one be->linear_group before the decoder,
                                        * into kv [rows][dec_layers * 2E]; 0: each in its layer */
    /* backend buffers (U8: frames, pad, seed8; F32: normalization and outputs; the rest ACT) */
    act_buf frames, img, c1, lay[4], gn_tmp, kp_map, kp_xy, tok;
    act_buf qpos, qn, acts, an, pad, seed8, frame_ptrs;
    act_buf pos_post, pos_mem;
    act_buf x, qkv, att, o, ff, q, kv, mem;
    act_buf e_qp, e_act, cls_rows, ml, lat_out, z, lat, d_qp, vis, outs;
    act_buf lat_prior;                 /* constant: the prior's latent token, max_batch rows (lat:
                                        * the posterior's) */
    act_buf dec0_x, dec0_q;            /* constants: decoder layer 0 after self-attention, its cross-attention query */
    act_fwd_retry *retry;              /* by step key (ACT_FWD_KEY): its failed captures */
    long retry_base;                   /* eager steps before a failed capture's first retry
                                        * (ACT_CUDA_GRAPH_RETRY, default ACT_FWD_RETRY_BASE; 0:
                                        * never retry, the first failure is the last) */
};

int act_fwd_create(act_backend *be, const act_model *m, int max_batch, act_fwd **out, char *err,
                   size_t errlen);
void act_fwd_free(act_fwd *f);
/* Runs one step for batch B in mode (ACT_FWD_* bits) from/to f->stage; use_graphs lets the
 * backend capture and replay the step per (B, mode). A step whose capture fails runs eagerly
 * instead, and so do the later steps of its (B, mode) until a retry's capture holds (see
 * act_fwd_retry; each failure, and a retry that holds, is said on stderr). */
int act_fwd_step(act_fwd *f, int B, int mode, int use_graphs, char *err, size_t errlen);

#endif
