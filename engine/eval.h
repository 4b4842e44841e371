/* eval.h - batch-evaluation metrics: accumulation per episode, the JSON summary, shard merge.
 * defines: act_eval_summary, act_eval_episode, act_eval_init, act_eval_add_batch,
 *          act_eval_overall, act_eval_write_json, act_eval_read_json, act_eval_merge, act_eval_free,
 *          act_eval_steady_rate, act_eval_set_list
 * Metrics (issue "act-infer eval"), for every timestep t and chunk step k with 0 <= t + k - o + 1
 * < T (o = obs_horizon, 1 by default; episode_stream.c fill_targets says why):
 *   action_l1 / action_mse   prior chunk (z = 0) vs action[t+k-o+1], denormalized units, mean over
 *                            valid (t, k, joint);  per_joint_l1 the same per joint;
 *   val_l1                   posterior chunk (z = mu) vs the normalized targets, same mask;
 *   val_kl                   mean over timesteps of the KL summed over latent dims;
 *   val_loss                 val_l1 + kl_weight * val_kl.
 * The summary stores raw sums and counts beside the means. Sums are accumulated per episode in
 * timestep order (so the batch size does not change a bit of them), and `overall` is always
 * recomputed from the episodes' sums in episode-list order: a merge of shard summaries is
 * bit-identical to a single run over the same episodes. */
#ifndef ACT_EVAL_H
#define ACT_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "act.h"

typedef struct act_eval_sums {
    double l1, sq;             /* prior, denormalized: sum |pred - target|, sum (pred - target)^2 */
    int64_t count;             /* valid (t, k, joint) elements */
    double *joint_l1;          /* [action_dim] */
    double val_l1;             /* posterior, normalized space */
    double kl;                 /* sum over timesteps of the per-timestep KL */
    int64_t kl_count;          /* timesteps */
} act_eval_sums;

typedef struct act_eval_episode {
    char name[256];            /* file name */
    int index;                 /* position in the full (unsharded) episode list */
    long long number;          /* N of episode_<N>.hdf5; -1 for another name or an older summary */
    int steps;                 /* T */
    int failed;
    char error[ACT_ERR_LEN];
    char reader[256];          /* how its frames were read ("" if unknown: an older summary) */
    act_eval_sums s;
} act_eval_episode;

typedef struct act_eval_summary {
    char model_hash[17];
    char device[16], precision[16];
    char device_name[128];     /* e.g. the GPU's name, from act_session_device_name */
    int batch;                 /* --batch (0: unknown, a summary written before it was kept, or
                                  summaries of different batch sizes merged) */
    char pad_batches[8];       /* --pad-batches as it ran: off, on or few ("" unknown, "mixed") */
    float kl_weight;
    int action_dim, pred_horizon, num_cams;
    int obs_horizon;           /* the chunk's alignment (see above; 1 in a summary that lacks it) */
    int shard_count;           /* n of --shard i/n (1 without sharding) */
    int n_shards;              /* how many shard indices this summary covers */
    int *shards;               /* [n_shards]: the shard indices (one for a run, all after a merge) */
    int list_count;            /* the full (unsharded) episode list: its length and a hash of its */
    char list_hash[17];        /* file names and sizes in order ("" in a summary written before it was kept) */
    int n_episodes;
    act_eval_episode *episodes;
    int64_t timesteps;         /* of the episodes that succeeded */
    double elapsed_s;          /* sum over runs of the evaluation wall time */
    double elapsed_max_s;      /* the slowest run (the wall time of a parallel sharded eval) */
    double reader_wait_s;      /* sum over runs of the time spent waiting for the episode reader's
                                  next batch (NaN: a summary written before it was kept) */
    double steady_s;           /* sum over runs of the time of the steady iterations: from the third
                                  step at each batch size on (the first sets up plans and, on CUDA,
                                  measures algorithms, the second captures the graph), each from
                                  the end of the one before; NaN: a summary written before it */
    double steady_timesteps;   /* the timesteps of those iterations (NaN as above) */
    double padded_rows;        /* sum over runs of the rows computed past the episodes' ends, their
                                  last batches padded up to the batch size (--pad-batches); NaN: a
                                  summary written before it was kept */
} act_eval_summary;

int act_eval_init(act_eval_summary *s, const act_config *cfg, const char *device, const char *precision,
                  int shard_index, int shard_count, int n_episodes, char *err, size_t errlen);
/* Adds n timesteps of one episode. pred: prior chunk [n][H][A] denormalized; targets [n][H][A]
 * raw; is_pad [n][H]; post_norm: posterior chunk normalized; targets_norm: targets normalized;
 * kl [n]. */
void act_eval_add_batch(act_eval_episode *e, const act_config *cfg, int n, const float *pred,
                        const float *targets, const uint8_t *is_pad, const float *post_norm,
                        const float *targets_norm, const float *kl);
/* Records the full episode list (every shard's, before --shard picks): its length and an FNV-1a
 * hash of its file names and sizes in order, so that eval-merge can refuse shards run over different lists
 * (a directory that changed between array tasks): their positions would not line up. */
void act_eval_set_list(act_eval_summary *s, char *const *paths, int n);
int act_eval_write_json(const act_eval_summary *s, const char *path, char *err, size_t errlen);
int act_eval_read_json(const char *path, act_eval_summary *s, char *err, size_t errlen);
/* Merges shard summaries; checks they come from one model and one episode list and cover each
 * shard once. */
int act_eval_merge(const act_eval_summary *in, int n, act_eval_summary *out, char *err, size_t errlen);
void act_eval_free(act_eval_summary *s);

/* Means of a set of sums (NAN where the count is zero). */
typedef struct act_eval_means {
    double action_l1, action_mse, val_l1, val_kl, val_loss;
} act_eval_means;
act_eval_means act_eval_means_of(const act_eval_sums *s, float kl_weight);
/* The overall sums (the successful episodes' sums added in list order; o->joint_l1 is allocated,
 * free it) and the number of failed episodes. -1: out of memory, or counts past 2^63 (only a
 * forged summary gets there; act_eval_read_json refuses those). */
int act_eval_overall(const act_eval_summary *s, act_eval_sums *o, int *failed);
/* steady_timesteps / steady_s: NaN when unknown (an older summary) or when no iteration was
 * steady (fewer than three steps at every batch size). */
double act_eval_steady_rate(const act_eval_summary *s);

#endif
