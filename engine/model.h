/* model.h - the model description: the loaded weights bound to the structure of act_resnet.
 * defines: act_model (internal), act_conv, act_linear, act_trunk, act_enc_layer, act_dec_layer
 * act_model_load() (model.c) parses the metadata into act_config, binds every tensor by its
 * canonical name (weights/FORMAT.md), checks every shape against the config, and refuses
 * missing and unknown tensors. The forward pass (forward.c) reads only this description. */
#ifndef ACT_MODEL_H
#define ACT_MODEL_H

#include "act.h"
#include "weights.h"

typedef struct act_conv {                    /* conv2d, BN folded: y = conv(x, w) + b */
    const act_tensor *w, *b;                 /* w [cout][cin][k][k], b [cout] */
    const act_tensor *gn_w, *gn_b;           /* GroupNorm trunks only, else NULL */
    int cin, cout, k, stride, pad;
} act_conv;

typedef struct act_block {                   /* ResNet BasicBlock */
    act_conv conv1, conv2, down;
    int has_down;
} act_block;

typedef struct act_trunk {                   /* ResNet18 conv1..layer4 + SpatialSoftmax + Linear */
    act_conv conv1;
    act_block blocks[4][2];
    const act_tensor *kp_w, *kp_b;           /* 1x1 conv 512 -> K: kp_w [K][512][1][1] */
    const act_tensor *pos_grid;              /* [feat_h*feat_w][2] */
    const act_tensor *out_w, *out_b;         /* [vision_dim][2K] */
} act_trunk;

typedef struct act_linear {                  /* y = x W[row0:row0+out]^T + b[row0:row0+out] */
    const act_tensor *w, *b;                 /* w [rows][in] */
    int row0, out, in;
} act_linear;

typedef struct act_ln { const act_tensor *w, *b; } act_ln;

typedef struct act_mha {                     /* nn.MultiheadAttention, packed in_proj */
    act_linear q, k, v, kv, qkv;             /* views of in_proj: rows [0,E), [E,2E), [2E,3E), [E,3E), [0,3E) */
    act_linear out;
} act_mha;

typedef struct act_enc_layer {               /* post-norm nn.TransformerEncoderLayer */
    act_mha attn;
    act_ln ln1, ln2;
    act_linear ff1, ff2;
} act_enc_layer;

typedef struct act_dec_layer {               /* post-norm nn.TransformerDecoderLayer */
    act_mha self_attn, cross_attn;
    act_ln ln1, ln2, ln3;
    act_linear ff1, ff2;
} act_dec_layer;

struct act_model {
    act_config cfg;
    act_weights *w;
    int n_trunks;                            /* 1 (shared) or num_cams */
    act_trunk trunks[ACT_MAX_CAMS];
    /* CVAE posterior encoder */
    const act_tensor *cls_embed;             /* [E] */
    act_linear enc_qpos, enc_action;
    act_enc_layer enc[ACT_MAX_LAYERS];
    act_linear latent_proj;                  /* E -> 2L (mu | logvar) */
    /* decoder */
    act_linear latent_out, dec_qpos, visual_proj;
    const act_tensor *mem_type;              /* [3][E] */
    const act_tensor *query;                 /* [H][E] */
    act_dec_layer dec[ACT_MAX_LAYERS];
    act_linear action_head;
    /* normalization statistics: (min, max) for min_max, (mean, std) for mean_std */
    const act_tensor *qpos_lo, *qpos_hi, *action_lo, *action_hi;
};

#endif
