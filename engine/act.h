/* act.h - the public API of act-engine.
 *
 * A newcomer reads this file and knows the whole library:
 *   1. act_model_load()     reads and validates a .actw weight file (weights/FORMAT.md);
 *   2. act_session_create() binds the model to a backend (CPU or CUDA) and a precision and
 *                           allocates every buffer for batches up to max_batch;
 *   3. act_run()            runs one step for a batch: uint8 frames + qpos in, the
 *                           denormalized action chunk out (and, given recorded actions, the
 *                           CVAE posterior: mu, logvar, KL and the chunk decoded from z).
 * Every function that can fail returns 0 on success or -1, and writes a message naming what
 * was wrong into the caller's err buffer. The library never calls exit().
 */
#ifndef ACT_H
#define ACT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ACT_VERSION "0.1.0"
#define ACT_MAX_CAMS 8
#define ACT_MAX_LAYERS 16
#define ACT_NAME_LEN 32
#define ACT_ERR_LEN 512

typedef enum { ACT_NORM_MIN_MAX = 0, ACT_NORM_MEAN_STD = 1 } act_norm_type;
typedef enum { ACT_ACT_RELU = 0, ACT_ACT_GELU = 1 } act_activation;
typedef enum { ACT_VISION_BATCHNORM = 0, ACT_VISION_GROUPNORM = 1 } act_vision_norm;

/* Everything the weight file's metadata says about the model (weights/FORMAT.md lists keys). */
typedef struct act_config {
    int obs_dim, action_dim, pred_horizon, obs_horizon, num_action_steps;
    int num_cams;
    char camera_names[ACT_MAX_CAMS][ACT_NAME_LEN];
    int image_h, image_w;          /* expected uint8 HWC frame size per camera */
    /* preprocessing: /255 -> bilinear resize to input -> optional center crop -> optional ImageNet */
    int input_h, input_w;
    int crop_h, crop_w;            /* 0 = no crop */
    int imagenet_norm;             /* 1 = (x - mean) / std with ImageNet statistics */
    /* vision: ResNet18 trunk + SpatialSoftmax + Linear + ReLU, one token per camera */
    act_vision_norm vision_norm;   /* BATCHNORM: folded into conv weights; GROUPNORM: C/16 groups */
    int separate_trunks;           /* 1 = one trunk per camera, else one shared trunk */
    int num_keypoints, vision_dim; /* K, output_dim */
    int feat_h, feat_w;            /* trunk output map size (7x7 at 224x224) */
    /* ACT head */
    int hidden_dim, nheads, enc_layers, dec_layers, ff_dim, latent_dim;
    act_activation activation;
    float kl_weight;
    float ln_eps;                  /* LayerNorm eps (1e-5) */
    /* normalization of qpos and actions */
    act_norm_type norm_type;
    float norm_eps;                /* clamp of (max - min) or std */
    /* provenance */
    char model_hash[17];           /* 16 hex digits: the file's checksum */
    char source_sha256[65];
    char converter_version[128];
    int64_t n_params;
} act_config;

typedef struct act_model act_model;
typedef struct act_session act_session;

typedef enum { ACT_DEVICE_CPU = 0, ACT_DEVICE_CUDA = 1 } act_device;
typedef enum { ACT_FP32 = 0, ACT_TF32 = 1, ACT_BF16 = 2, ACT_FP16 = 3 } act_precision;

/* ---- model ---- */
int act_model_load(const char *path, act_model **out, char *err, size_t errlen);
void act_model_free(act_model *m);
const act_config *act_model_config(const act_model *m);

/* ---- session ---- */
typedef struct act_session_opts {
    act_device device;
    act_precision precision;
    int max_batch;                 /* largest batch act_run will be given */
    int use_graphs;                /* CUDA: capture each (batch, mode) step as a graph (default 1) */
    int cuda_device;               /* CUDA device ordinal */
    int copy_threads;              /* threads act_run copies input frames with (up to 64); 0 =
                                    * ACT_COPY_THREADS, else half the cores, at most 8 */
} act_session_opts;

act_session_opts act_session_default_opts(void);
int act_session_create(const act_model *m, const act_session_opts *opts, act_session **out,
                       char *err, size_t errlen);
void act_session_free(act_session *s);
int act_cuda_available(char *why, size_t whylen); /* 1 if a CUDA device can be used */

/* One step for a batch. Inputs are host memory in raw (unnormalized) units.
 * The prior path (z = 0) runs when actions or actions_norm is requested; the posterior path
 * (CVAE encoder -> z -> decoder) runs when in->actions is given. */
typedef struct act_inputs {
    int batch;
    const float *qpos;                        /* [B][obs_dim] */
    const uint8_t *images[ACT_MAX_CAMS];      /* per camera, in config order: [B][image_h][image_w][3] */
    /* instead of images[cam]: B pointers, one [image_h][image_w][3] frame each (a batch whose
     * samples come from different clients), none inside act_session_input_buffers. When every
     * camera's frames (given either way) lie in memory registered with
     * act_session_register_host, the step reads them where they lie; otherwise they are copied
     * first. */
    const uint8_t *const *image_items[ACT_MAX_CAMS];
    const float *actions;                     /* optional [B][pred_horizon][action_dim] */
    const uint8_t *action_is_pad;             /* optional [B][pred_horizon], 1 = padded step */
    int sample_latent;                        /* posterior: 0 -> z = mu, 1 -> z = mu + eps*std */
    uint64_t seed;                            /* eps generator seed when sample_latent */
} act_inputs;

typedef struct act_outputs {                  /* every pointer optional (NULL = not wanted) */
    float *actions;                           /* prior chunk, denormalized [B][H][A] */
    float *actions_norm;                      /* prior chunk, normalized space */
    float *post_actions;                      /* posterior chunk, denormalized */
    float *post_actions_norm;                 /* posterior chunk, normalized space */
    float *mu, *logvar;                       /* [B][latent_dim] */
    float *kl;                                /* [B]: sum over latent dims of the KL to N(0, I) */
} act_outputs;

int act_run(act_session *s, const act_inputs *in, act_outputs *out, char *err, size_t errlen);

/* act_run hands its outputs back as computed: inputs far outside the dataset statistics (a qpos
 * of 1e30 is finite) or an overflow at fp16 can make them NaN or infinite, and a robot must not
 * act on such a chunk. 0 when every output out holds for rows [first, first + n) is finite; else
 * -1 with err naming the first bad value (which output, row, step, joint) and the likely causes. */
int act_outputs_check(const act_session *s, const act_outputs *out, int first, int n, char *err,
                      size_t errlen);

/* The session's own input buffers, sized for max_batch: page-locked host memory on CUDA, from
 * which the step uploads by DMA. act_run first copies every input into them - 590 KB per batch
 * element with three 256x256 cameras, 151 MB at batch 256 (frames on copy_threads threads). A caller that writes its frames and
 * qpos (and recorded actions) straight into these buffers and passes the same pointers in
 * act_inputs saves that copy: act_run sees the pointer is its own and copies nothing, and leaves
 * the buffers as they were. A window inside them (a smaller batch starting at a later row) works
 * too; it is moved to the buffers' start first. They stay valid until act_session_free; do not
 * write them while act_run runs. */
typedef struct act_input_buffers {
    uint8_t *images[ACT_MAX_CAMS];            /* per camera: [max_batch][image_h][image_w][3] */
    float *qpos;                              /* [max_batch][obs_dim] */
    float *actions;                           /* [max_batch][pred_horizon][action_dim] */
    int max_batch;
} act_input_buffers;
void act_session_input_buffers(act_session *s, act_input_buffers *b);

/* Host memory the device may read in place. When every frame of a step (act_inputs.images or
 * image_items, every camera) lies inside registered memory, the step reads them there: no host
 * copy (on CUDA the GPU pulls them over PCIe from the page-locked pages; act-serve registers its
 * clients' shared memory and receive buffers, act-infer eval its episode reader's buffers).
 * Write every page of private memory before registering it: CUDA pins it read-only, and a
 * page never written may be pinned as the kernel's shared zero page (Linux before 6.2). -1 with err when the backend or the driver refuses (such
 * frames are then copied, as any others). Do not free or unmap the memory while it is
 * registered; unregister (0, or -1 if p was not registered) before. Not inside act_run. */
int act_session_register_host(act_session *s, const void *p, size_t bytes, char *err, size_t errlen);
int act_session_unregister_host(act_session *s, const void *p);

/* Per-stage timing of the last act_run (filled when the session profiles, see act_session_profile).
 * upload counts act_run's host copy of the inputs into the session's buffers (none when the
 * caller wrote them there or they lie in registered memory) and the transfer to the device. */
typedef enum {
    ACT_STAGE_UPLOAD = 0, ACT_STAGE_PREPROCESS, ACT_STAGE_VISION, ACT_STAGE_TRANSFORMER,
    ACT_STAGE_DOWNLOAD, ACT_STAGE_COUNT
} act_stage;
const char *act_stage_name(act_stage st);
void act_session_profile(act_session *s, int enable);  /* CUDA: disables graphs while on */
int act_session_stage_ms(act_session *s, double ms[ACT_STAGE_COUNT]);
/* The stages in finer sections, from the same profiled run: the vision stage by ResNet layer
 * (summed over cameras and trunks), the transformer stage by part. Each section belongs to one
 * stage (act_section_stage), and a stage's time is the sum of its sections'. */
typedef enum {
    ACT_SECTION_UPLOAD = 0, ACT_SECTION_PREPROCESS,
    ACT_SECTION_STEM,        /* conv1 + max pool */
    ACT_SECTION_LAYER1, ACT_SECTION_LAYER2, ACT_SECTION_LAYER3, ACT_SECTION_LAYER4,
    ACT_SECTION_KEYPOINTS,   /* keypoint conv, spatial softmax, linear: one token per image */
    ACT_SECTION_LATENT,      /* the latent token: CVAE encoder and projection (posterior), bias (prior) */
    ACT_SECTION_MEMORY,      /* qpos and visual projections, memory assembly */
    ACT_SECTION_DECODER,     /* every decoder layer */
    ACT_SECTION_HEAD,        /* action head + denormalization */
    ACT_SECTION_DOWNLOAD, ACT_SECTION_COUNT
} act_section;
const char *act_section_name(act_section sec);
act_stage act_section_stage(act_section sec);
int act_session_section_ms(act_session *s, double ms[ACT_SECTION_COUNT]);
const char *act_session_device_name(const act_session *s);
/* 1 when the session's steps run as CUDA graphs (the options asked for them and the backend
 * makes them: not on the CPU, not under ACT_CUDA_GRAPHS=0); profiling still runs eagerly */
int act_session_uses_graphs(const act_session *s);
size_t act_session_device_bytes(const act_session *s);  /* device memory held by the session */
/* What that memory holds: the weights in the backend's form (CUDA fp32/tf32: the fp32 blob;
 * bf16/fp16: the blob in that type plus the few tensors read in fp32), the activations of the
 * largest batch (buffers sized at creation), and the rest - library workspaces, which grow
 * while the first steps plan (cuDNN). */
typedef struct act_memory {
    size_t total, weights, activations, workspace;   /* what the session allocated itself */
    /* the driver's count (CUDA: cudaMemGetInfo), all 0 where the backend has none (CPU):
     * driver_held is the device's use now less at the backend's setup (so it includes cuBLAS's,
     * cuDNN's and the graphs' own memory, which `total` cannot see; on a shared device, other
     * processes' allocations since then too); driver_before the use at setup (the CUDA context,
     * and other processes); driver_total the device's memory */
    size_t driver_held, driver_before, driver_total;
} act_memory;
void act_session_memory(const act_session *s, act_memory *m);

/* Normalization helpers (host, fp32), the same formulas the engine applies. */
void act_normalize_qpos(const act_model *m, const float *x, float *y, int rows);
void act_normalize_action(const act_model *m, const float *x, float *y, int rows);
void act_denormalize_action(const act_model *m, const float *x, float *y, int rows);

#ifdef __cplusplus
}
#endif
#endif
