/* forward.c - the ACT policy forward pass, written once over the backend op table.
 * defines: act_fwd_create, act_fwd_free, act_fwd_step, act_trunk_geometry
 *
 * One step, for a batch of B:
 *   upload (frames of every camera, qpos; recorded actions, key padding, seed for the posterior)
 *   -> preprocess all num_cams*B frames in one call (which normalizes the qpos and recorded
 *   actions too: a launch fewer each) -> ResNet18 trunk(s): a shared trunk takes
 *   all images in one batched pass (image c*B + b is camera c of sample b), separate trunks take
 *   their camera's B images -> SpatialSoftmax -> Linear + ReLU: one token per image
 *   At batches of at least the backend's pipeline_min_batch the vision part runs per camera
 *   instead: each camera's frames upload on the backend's upload lane, and camera c's
 *   preprocess + trunk wait only for its own upload, so the later cameras' transfers hide
 *   behind the earlier cameras' trunks (the frames are 590 KB per sample; at batch 256, 151 MB).
 *   -> ACT head. The decoder's input is query_embed for every sample, so its first layer's
 *   self-attention block and cross-attention query projection do not depend on the inputs: they
 *   are computed once at setup (decoder_prefix) and each step starts from them (broadcast to
 *   its sequences; one sequence reads them in place).
 *   The cross-attention keys and values of every decoder layer read the same memory, so where
 *   the backend has linear_group they are one op before the first layer (kv_grouped).
 *   The prior (z = 0) and the posterior (z from the CVAE encoder) differ only in
 *   the latent memory token, so when both are asked for they share one vision pass and one
 *   decoder pass over 2B sequences: rows [0, B) prior, [B, 2B) posterior.
 *   -> action_head -> denormalize -> download into the host staging buffers.
 * Batch-dependent layouts use the actual B (not max_batch), so every op sees dense tensors.
 * The step is keyed (B, mode) for graph capture; no op allocates or synchronizes. With
 * ACT_FWD_GATHER the frames come from stage.frame_ptrs (be->gather) instead of stage.frames.
 * Profiling marks (only while the session profiles): each section (act_section, finer than
 * the stages) is opened by section_mark(section); section_mark(ACT_SECTION_COUNT) closes the last.
 * The normalized qpos and actions are written in the activation dtype, which the linears that
 * read them take as it is (F32 would cost a 16-bit backend a conversion node per linear); the
 * action head writes F32 for denormalization; so no op only copies between dtypes. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "forward.h"
#include "util.h"

int act_trunk_geometry(const act_model *m, act_trunk_geom *g, char *err, size_t errlen) {
    const act_config *c = &m->cfg;
    const act_trunk *t = &m->trunks[0];
    memset(g, 0, sizeof *g);
    g->in_h = c->crop_h > 0 ? c->crop_h : c->input_h;
    g->in_w = c->crop_w > 0 ? c->crop_w : c->input_w;
    g->c1_h = act_conv_out(g->in_h, &t->conv1);
    g->c1_w = act_conv_out(g->in_w, &t->conv1);
    g->pool_h = (g->c1_h + 2 - 3) / 2 + 1;
    g->pool_w = (g->c1_w + 2 - 3) / 2 + 1;
    if (g->in_h < 1 || g->in_w < 1 || g->c1_h < 1 || g->c1_w < 1 || g->pool_h < 1 || g->pool_w < 1)
        return act_errf(err, errlen, "model: input %dx%d is too small for the ResNet trunk",
                        g->in_h, g->in_w);
    g->c1_elems = (size_t)t->conv1.cout * g->c1_h * g->c1_w;
    int H = g->pool_h, W = g->pool_w;
    size_t mx = (size_t)t->conv1.cout * H * W;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 2; i++) {
            const act_conv *cv = &t->blocks[l][i].conv1;
            H = act_conv_out(H, cv);
            W = act_conv_out(W, cv);
            if (H < 1 || W < 1)
                return act_errf(err, errlen, "model: input %dx%d vanishes in layer%d of the "
                                "trunk", g->in_h, g->in_w, l + 1);
            size_t n = (size_t)cv->cout * H * W;
            if (n > mx) mx = n;
        }
    g->layer_elems = mx;
    g->feat_h = H;
    g->feat_w = W;
    if (H != c->feat_h || W != c->feat_w)
        return act_errf(err, errlen, "model: a %dx%d trunk input gives a %dx%d feature map, but "
                        "the model says %dx%d (vision.feature_height/width)", g->in_h, g->in_w,
                        H, W, c->feat_h, c->feat_w);
    return 0;
}

/* ---------------- setup ---------------- */

static int fwd_alloc(act_fwd *f, act_buf *b, size_t n, act_dtype dt, const char *what, char *err,
                     size_t errlen) {
    *b = f->be->alloc(f->be, n ? n : 1, dt);
    if (!b->p)
        return act_errf(err, errlen, "forward setup: cannot allocate %s (%zu elements): %s", what,
                        n, f->be->err);
    return 0;
}

static int host_alloc(act_fwd *f, void **p, size_t bytes, const char *what, char *err, size_t errlen) {
    *p = f->be->host_alloc(f->be, bytes ? bytes : 1);
    if (!*p)
        return act_errf(err, errlen, "forward setup: cannot allocate host staging for %s (%zu "
                        "bytes): %s", what, bytes, f->be->err);
    return 0;
}

void act_fwd_free(act_fwd *f) {
    if (!f) return;
    act_fwd_stage *s = &f->stage;
    void *ps[] = {s->qpos, s->actions, s->pad, s->seed8, s->frame_ptrs, s->outs, s->lat_out};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) f->be->host_free(f->be, ps[i]);
    if (s->frames[0]) f->be->host_free(f->be, s->frames[0]);   /* the other cameras' are views */
    free(f->retry);
    free(f);   /* backend buffers belong to the backend and go with it */
}

static int decoder_prefix(act_fwd *f, char *err, size_t errlen);

#define ALLOC(buf, n, dt) do { if (fwd_alloc(f, &(buf), (n), (dt), #buf, err, errlen)) goto fail; } while (0)
#define HALLOC(ptr, bytes) do { if (host_alloc(f, (void **)&(ptr), (bytes), #ptr, err, errlen)) goto fail; } while (0)

int act_fwd_create(act_backend *be, const act_model *m, int max_batch, act_fwd **out, char *err,
                   size_t errlen) {
    const act_config *c = &m->cfg;
    *out = NULL;
    act_fwd *f = calloc(1, sizeof *f);
    if (!f) return act_errf(err, errlen, "forward setup: out of memory");
    f->be = be;
    f->m = m;
    f->max_batch = max_batch;
    f->retry = calloc((size_t)ACT_FWD_KEY(max_batch + 1, 0), sizeof *f->retry);
    if (!f->retry) {
        act_errf(err, errlen, "forward setup: out of memory");
        goto fail;
    }
    f->retry_base = ACT_FWD_RETRY_BASE;
    const char *rv = getenv("ACT_CUDA_GRAPH_RETRY");
    if (rv && *rv) {
        char *end = NULL;
        errno = 0;
        long n = strtol(rv, &end, 10);
        if (*rv < '0' || *rv > '9' || *end || errno || n > 1000000000L) {
            act_errf(err, errlen, "forward setup: ACT_CUDA_GRAPH_RETRY=%s: expected a step count "
                     "(eager steps before a failed graph capture is tried again; 0 = never)", rv);
            goto fail;
        }
        f->retry_base = n;
    }
    if (act_trunk_geometry(m, &f->g, err, errlen)) goto fail;
    if (c->nheads < 1 || c->hidden_dim % c->nheads) {
        act_errf(err, errlen, "model: hidden_dim %d is not divisible by nheads %d", c->hidden_dim,
                 c->nheads);
        goto fail;
    }

    size_t MB = (size_t)max_batch, NI = (size_t)c->num_cams * MB;
    size_t E = c->hidden_dim, H = c->pred_horizon, A = c->action_dim, L = c->latent_dim;
    size_t Lp = H + 2, Lm = 2 + (size_t)c->num_cams, K = c->num_keypoints;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    size_t fhw = (size_t)f->g.feat_h * f->g.feat_w;
    int gn = c->vision_norm == ACT_VISION_GROUPNORM;

    for (int t = 0; t < m->n_trunks; t++) {
        const act_trunk *tr = &m->trunks[t];
        act_conv kc = {tr->kp_w, tr->kp_b, NULL, NULL, (int)tr->kp_w->dims[1], (int)K, 1, 1, 0};
        act_linear ol = {tr->out_w, tr->out_b, 0, c->vision_dim, (int)(2 * K)};
        f->kp_conv[t] = kc;
        f->kp_out[t] = ol;
    }
    for (int i = 0; i < c->dec_layers; i++) f->kv_group[i] = m->dec[i].cross_attn.kv;
    if (be->linear_group && be->linear_group_prepare && c->dec_layers > 1) {
        if (be->linear_group_prepare(be, f->kv_group, c->dec_layers)) {
            act_errf(err, errlen, "forward setup: decoder cross-attention K/V: %s", be->err);
            goto fail;
        }
        f->kv_grouped = 1;
    }

    /* vision */
    ALLOC(f->frames, NI * fsz, ACT_DT_U8);
    ALLOC(f->img, NI * be->image_channels * f->g.in_h * f->g.in_w, ACT_DT_ACT);
    ALLOC(f->c1, NI * f->g.c1_elems, ACT_DT_ACT);
    for (int i = 0; i < 4; i++) ALLOC(f->lay[i], NI * f->g.layer_elems, ACT_DT_ACT);
    if (gn)
        ALLOC(f->gn_tmp, NI * (f->g.c1_elems > f->g.layer_elems ? f->g.c1_elems : f->g.layer_elems),
              ACT_DT_ACT);
    ALLOC(f->kp_map, NI * K * fhw, ACT_DT_ACT);
    ALLOC(f->kp_xy, NI * 2 * K, ACT_DT_ACT);
    ALLOC(f->tok, NI * c->vision_dim, ACT_DT_ACT);
    /* inputs and normalization */
    ALLOC(f->qpos, MB * c->obs_dim, ACT_DT_F32);
    ALLOC(f->qn, MB * c->obs_dim, ACT_DT_ACT);
    ALLOC(f->acts, MB * H * A, ACT_DT_F32);
    ALLOC(f->an, MB * H * A, ACT_DT_ACT);
    ALLOC(f->pad, MB * Lp, ACT_DT_U8);
    ALLOC(f->seed8, 8, ACT_DT_U8);
    if (be->gather) ALLOC(f->frame_ptrs, NI * sizeof(uint64_t), ACT_DT_U8);
    /* position tables: the memory table has 1024 rows, or as many as the memory when longer */
    size_t pm_rows = Lm > 1024 ? Lm : 1024;
    ALLOC(f->pos_post, Lp * E, ACT_DT_F32);
    ALLOC(f->pos_mem, pm_rows * E, ACT_DT_F32);
    /* transformer scratch: rows of the largest of encoder, decoder and memory */
    size_t R = 2 * MB * H;
    if (MB * Lp > R) R = MB * Lp;
    if (2 * MB * Lm > R) R = 2 * MB * Lm;
    ALLOC(f->x, R * E, ACT_DT_ACT);
    ALLOC(f->qkv, R * 3 * E, ACT_DT_ACT);
    ALLOC(f->att, R * E, ACT_DT_ACT);
    ALLOC(f->o, R * E, ACT_DT_ACT);
    ALLOC(f->ff, R * c->ff_dim, ACT_DT_ACT);
    ALLOC(f->q, R * E, ACT_DT_ACT);
    ALLOC(f->kv, 2 * MB * Lm * 2 * E * (f->kv_grouped ? c->dec_layers : 1), ACT_DT_ACT);
    ALLOC(f->mem, 2 * MB * Lm * E, ACT_DT_ACT);
    /* head */
    ALLOC(f->e_qp, MB * E, ACT_DT_ACT);
    ALLOC(f->e_act, MB * H * E, ACT_DT_ACT);
    ALLOC(f->cls_rows, MB * E, ACT_DT_ACT);
    ALLOC(f->ml, MB * 2 * L, ACT_DT_ACT);
    ALLOC(f->lat_out, 2 * MB * L + MB, ACT_DT_F32);
    ALLOC(f->z, 2 * MB * L, ACT_DT_ACT);
    ALLOC(f->lat, MB * E, ACT_DT_ACT);
    ALLOC(f->lat_prior, MB * E, ACT_DT_ACT);
    ALLOC(f->d_qp, MB * E, ACT_DT_ACT);
    ALLOC(f->vis, NI * E, ACT_DT_ACT);
    ALLOC(f->outs, 2 * 2 * MB * H * A, ACT_DT_F32);
    ALLOC(f->dec0_x, H * E, ACT_DT_ACT);
    ALLOC(f->dec0_q, H * E, ACT_DT_ACT);

    act_fwd_stage *s = &f->stage;
    /* one block for every camera's frames, so that one 2D transfer takes them all */
    HALLOC(s->frames[0], (size_t)c->num_cams * MB * fsz);
    for (int cam = 1; cam < c->num_cams; cam++) s->frames[cam] = s->frames[0] + (size_t)cam * MB * fsz;
    HALLOC(s->qpos, MB * c->obs_dim * sizeof(float));
    HALLOC(s->actions, MB * H * A * sizeof(float));
    HALLOC(s->pad, MB * Lp);
    HALLOC(s->seed8, 8);
    if (be->gather) HALLOC(s->frame_ptrs, NI * sizeof(uint64_t));
    HALLOC(s->outs, 2 * 2 * MB * H * A * sizeof(float));
    HALLOC(s->lat_out, (2 * MB * L + MB) * sizeof(float));

    /* constants: the position tables, and the prior's latent token for every sample (it is
     * latent_out_proj(z = 0), the bias: no step computes or broadcasts it) */
    if (be->sinusoid_table(be, (int)Lp, (int)E, f->pos_post) ||
        be->sinusoid_table(be, (int)pm_rows, (int)E, f->pos_mem) ||
        be->broadcast_rows(be, m->latent_out.b, (int)MB, 1, (int)E, f->lat_prior) || be->sync(be)) {
        act_errf(err, errlen, "forward setup: sinusoid tables, prior latent token: %s", be->err);
        goto fail;
    }
    if (decoder_prefix(f, err, errlen)) goto fail;
    *out = f;
    return 0;
fail:
    act_fwd_free(f);
    return -1;
}

/* ---------------- the step ---------------- */

#define OP(call) do { if ((call) != 0) return act_errf(err, errlen, "forward (%s): %s", #call, be->err); } while (0)

/* conv, then GroupNorm when the trunk has it (the norm takes the residual and activation),
 * else bias + residual + activation fused into the conv. */
static int conv_norm(act_fwd *f, const act_conv *cv, act_buf x, int N, int H, int W, act_buf res,
                     act_epilogue epi, act_buf y, char *err, size_t errlen) {
    act_backend *be = f->be;
    if (!cv->gn_w) {
        OP(be->conv2d(be, cv, x, N, H, W, res, epi, y));
        return 0;
    }
    int Ho = act_conv_out(H, cv), Wo = act_conv_out(W, cv);
    OP(be->conv2d(be, cv, x, N, H, W, act_nobuf(), ACT_EPI_NONE, f->gn_tmp));
    OP(be->groupnorm(be, f->gn_tmp, N, cv->cout, Ho * Wo, cv->cout / 16, cv->gn_w, cv->gn_b, res,
                     epi, y));
    return 0;
}

/* ResNet18 conv1..layer4 + keypoints + SpatialSoftmax + Linear + ReLU over N images. */
/* a profiling mark (act_section), recorded only while the session profiles: an eager step
 * without profiling (the first of a key, or graphs off) records no events */
static void mark(act_fwd *f, int sec) {
    if (f->profile) f->be->section_mark(f->be, sec);
}

static int trunk(act_fwd *f, int t, act_buf img, int N, act_buf tok, char *err, size_t errlen) {
    act_backend *be = f->be;
    const act_trunk *tr = &f->m->trunks[t];
    const act_trunk_geom *g = &f->g;
    mark(f, ACT_SECTION_STEM);
    if (conv_norm(f, &tr->conv1, img, N, g->in_h, g->in_w, act_nobuf(), ACT_EPI_RELU, f->c1, err,
                  errlen))
        return -1;
    OP(be->maxpool(be, f->c1, N, tr->conv1.cout, g->c1_h, g->c1_w, f->lay[0]));
    int cur = 0, H = g->pool_h, W = g->pool_w;
    for (int l = 0; l < 4; l++) {
        mark(f, ACT_SECTION_LAYER1 + l);
        for (int i = 0; i < 2; i++) {
            const act_block *b = &tr->blocks[l][i];
            int t1 = (cur + 1) % 4, t2 = (cur + 2) % 4, yb = (cur + 3) % 4;
            int Ho = act_conv_out(H, &b->conv1), Wo = act_conv_out(W, &b->conv1);
            if (conv_norm(f, &b->conv1, f->lay[cur], N, H, W, act_nobuf(), ACT_EPI_RELU,
                          f->lay[t1], err, errlen))
                return -1;
            act_buf res = f->lay[cur];
            if (b->has_down) {
                if (conv_norm(f, &b->down, f->lay[cur], N, H, W, act_nobuf(), ACT_EPI_NONE,
                              f->lay[t2], err, errlen))
                    return -1;
                res = f->lay[t2];
            }
            if (conv_norm(f, &b->conv2, f->lay[t1], N, Ho, Wo, res, ACT_EPI_RELU, f->lay[yb], err,
                          errlen))
                return -1;
            cur = yb;
            H = Ho;
            W = Wo;
        }
    }
    mark(f, ACT_SECTION_KEYPOINTS);
    int K = f->kp_conv[t].cout;
    OP(be->conv2d(be, &f->kp_conv[t], f->lay[cur], N, H, W, act_nobuf(), ACT_EPI_NONE, f->kp_map));
    OP(be->spatial_softmax(be, f->kp_map, N, K, H * W, tr->pos_grid, f->kp_xy));
    OP(be->linear(be, &f->kp_out[t], f->kp_xy, N, ACT_EPI_RELU, tok));
    return 0;
}

/* Post-norm layers: x = LN1(x + SA(x)); [x = LN2(x + CA(x, mem))]; x = LN(x + FF(x)). */
/* x = LayerNorm(res + out(attention(q, k, v))), res the residual (x itself, or decoder layer
 * 0's constant input): one op where the backend fuses it for this many rows, else attention,
 * the output projection and add_layernorm. */
static int attend(act_fwd *f, act_buf q, int qs, act_buf k, act_buf v, int kvs, int Bs, int Lq,
                  int Lk, act_buf pad, const act_mha *a, const act_ln *ln, act_buf res, char *err,
                  size_t errlen) {
    act_backend *be = f->be;
    const act_config *c = &f->m->cfg;
    int E = c->hidden_dim, rows = Bs * Lq, nh = c->nheads;
    if (be->attention_out_ln && rows <= be->fused_attn_max_rows) {
        OP(be->attention_out_ln(be, q, qs, k, v, kvs, Bs, Lq, Lk, nh, E / nh, pad, &a->out, res, ln,
                                c->ln_eps, f->x));
        return 0;
    }
    OP(be->attention(be, q, qs, k, v, kvs, Bs, Lq, Lk, nh, E / nh, pad, f->att));
    OP(be->linear(be, &a->out, f->att, rows, ACT_EPI_NONE, f->o));
    OP(be->add_layernorm(be, res, f->o, ln, c->ln_eps, rows, E, f->x));
    return 0;
}

static int self_attn(act_fwd *f, const act_mha *a, const act_ln *ln, int Bs, int L, act_buf pad,
                     char *err, size_t errlen) {
    act_backend *be = f->be;
    int E = f->m->cfg.hidden_dim;
    OP(be->linear(be, &a->qkv, f->x, Bs * L, ACT_EPI_NONE, f->qkv));
    return attend(f, f->qkv, 3 * E, act_at(f->qkv, E), act_at(f->qkv, 2 * E), 3 * E, Bs, L, L, pad,
                  a, ln, f->x, err, errlen);
}

/* Decoder layer `layer`'s cross-attention. Layer 0's input and query projection are the
 * constants of decoder_prefix: for one sequence (Bs 1) read where they are, else broadcast into
 * f->x and f->q by the step; with kv_grouped every layer's K/V is ready in f->kv, layer i in
 * columns [2E*i, 2E*(i+1)) of rows of 2E * dec_layers. */
static int cross_attn(act_fwd *f, int layer, int Bs, int L, int Lm, char *err, size_t errlen) {
    act_backend *be = f->be;
    const act_dec_layer *dl = &f->m->dec[layer];
    int E = f->m->cfg.hidden_dim;
    if (layer > 0) OP(be->linear(be, &dl->cross_attn.q, f->x, Bs * L, ACT_EPI_NONE, f->q));
    act_buf k = f->kv;
    int kvs = 2 * E;
    if (f->kv_grouped) {
        k = act_at(f->kv, (size_t)2 * E * layer);
        kvs = 2 * E * f->m->cfg.dec_layers;
    } else {
        OP(be->linear(be, &dl->cross_attn.kv, f->mem, Bs * Lm, ACT_EPI_NONE, f->kv));
    }
    int one = layer == 0 && Bs == 1;
    return attend(f, one ? f->dec0_q : f->q, E, k, act_at(k, E), kvs, Bs, L, Lm, act_nobuf(),
                  &dl->cross_attn, &dl->ln2, one ? f->dec0_x : f->x, err, errlen);
}

static int feed_forward(act_fwd *f, const act_linear *ff1, const act_linear *ff2, const act_ln *ln,
                        int rows, char *err, size_t errlen) {
    act_backend *be = f->be;
    const act_config *c = &f->m->cfg;
    act_epilogue epi = c->activation == ACT_ACT_GELU ? ACT_EPI_GELU : ACT_EPI_RELU;
    OP(be->linear(be, ff1, f->x, rows, epi, f->ff));
    OP(be->linear(be, ff2, f->ff, rows, ACT_EPI_NONE, f->o));
    OP(be->add_layernorm(be, f->x, f->o, ln, c->ln_eps, rows, c->hidden_dim, f->x));
    return 0;
}

/* Decoder layer 0 up to its cross-attention, which reads only weights (the input is query_embed
 * for every sample): x0 = LN1(q + SA(q)) and x0 Wq^T + bq, run once with the ops of a step at
 * batch 1 and kept; a step of one sequence reads them where they are, a larger one broadcasts
 * them (gather_rows with row stride 0), instead of running a QKV GEMM, an attention and a query
 * GEMM per layer-0 pass. */
static int decoder_prefix(act_fwd *f, char *err, size_t errlen) {
    act_backend *be = f->be;
    const act_model *m = f->m;
    const act_dec_layer *dl = &m->dec[0];
    int E = m->cfg.hidden_dim, H = m->cfg.pred_horizon;
    OP(be->broadcast_rows(be, m->query, 1, H, E, f->x));
    if (self_attn(f, &dl->self_attn, &dl->ln1, 1, H, act_nobuf(), err, errlen)) return -1;
    OP(be->linear(be, &dl->cross_attn.q, f->x, H, ACT_EPI_NONE, f->q));
    OP(be->copy(be, f->dec0_x, f->x, (size_t)H * E));
    OP(be->copy(be, f->dec0_q, f->q, (size_t)H * E));
    OP(be->sync(be));
    return 0;
}

/* CVAE posterior: tokens [cls, qpos, actions] + pos -> encoder -> latent_proj(token 0) -> z. */
static int posterior(act_fwd *f, int B, int sample, act_buf z, char *err, size_t errlen) {
    act_backend *be = f->be;
    const act_model *m = f->m;
    const act_config *c = &m->cfg;
    int E = c->hidden_dim, H = c->pred_horizon, Lp = H + 2, L = c->latent_dim;
    OP(be->linear(be, &m->enc_qpos, f->qn, B, ACT_EPI_NONE, f->e_qp));
    OP(be->linear(be, &m->enc_action, f->an, B * H, ACT_EPI_NONE, f->e_act));
    OP(be->posterior_assemble(be, m->cls_embed, f->e_qp, f->e_act, B, H, E, f->pos_post, f->x));
    for (int i = 0; i < c->enc_layers; i++) {
        const act_enc_layer *el = &m->enc[i];
        if (self_attn(f, &el->attn, &el->ln1, B, Lp, f->pad, err, errlen) ||
            feed_forward(f, &el->ff1, &el->ff2, &el->ln2, B * Lp, err, errlen))
            return -1;
    }
    OP(be->gather_rows(be, f->cls_rows, f->x, B, E, (size_t)Lp * E));   /* token 0 of each */
    OP(be->linear(be, &m->latent_proj, f->cls_rows, B, ACT_EPI_NONE, f->ml));
    /* mu, logvar and kl side by side in lat_out: one download brings all three */
    OP(be->latent(be, f->ml, B, L, sample, f->seed8, f->lat_out, act_at(f->lat_out, (size_t)B * L),
                  act_at(f->lat_out, (size_t)2 * B * L), z));
    return 0;
}

/* rows the decoder runs for mode: B per path (prior, posterior) */
static int decoded_rows(int B, int mode) {
    return ((mode & ACT_FWD_PRIOR) ? B : 0) + ((mode & ACT_FWD_POSTERIOR) ? B : 0);
}

static int step_ops(act_fwd *f, int B, int mode, char *err, size_t errlen) {
    act_backend *be = f->be;
    const act_model *m = f->m;
    const act_config *c = &m->cfg;
    act_fwd_stage *s = &f->stage;
    int prior = mode & ACT_FWD_PRIOR, post = mode & ACT_FWD_POSTERIOR;
    int ncam = c->num_cams, NB = ncam * B, E = c->hidden_dim, H = c->pred_horizon;
    int A = c->action_dim, L = c->latent_dim, Lm = 2 + ncam;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    size_t imsz = (size_t)be->image_channels * f->g.in_h * f->g.in_w;
    int Bd = decoded_rows(B, mode), zoff = prior ? B : 0;

    /* at large batches camera c+1's frames cross PCIe while the trunk runs on camera c */
    int gather = mode & ACT_FWD_GATHER;
    int lanes = be->upload_lane && be->pipeline_min_batch > 0 && B >= be->pipeline_min_batch &&
                !f->profile && !gather;

    mark(f, ACT_SECTION_UPLOAD);
    if (gather) {   /* frame i = camera i / B of sample i % B, each read where the caller has it */
        OP(be->upload(be, f->frame_ptrs, s->frame_ptrs, (size_t)NB * sizeof(uint64_t)));
        OP(be->gather(be, f->frames, f->frame_ptrs, NB, fsz));
    } else if (lanes) {
        for (int cam = 0; cam < ncam; cam++)
            OP(be->upload_lane(be, act_at(f->frames, (size_t)cam * B * fsz), s->frames[cam], B * fsz, cam));
    } else {   /* camera c's B frames sit max_batch frames after camera c-1's in staging */
        OP(be->upload_rows(be, f->frames, s->frames[0], B * fsz, ncam, (size_t)f->max_batch * fsz));
    }
    OP(be->upload(be, f->qpos, s->qpos, (size_t)B * c->obs_dim));
    if (post) {
        OP(be->upload(be, f->acts, s->actions, (size_t)B * H * A));
        OP(be->upload(be, f->pad, s->pad, (size_t)B * (H + 2)));
        if (mode & ACT_FWD_SAMPLE) OP(be->upload(be, f->seed8, s->seed8, 8));
    }

    mark(f, ACT_SECTION_PREPROCESS);
    /* the qpos (and recorded actions) are normalized by the first preprocess launch */
    act_norm_job side[ACT_MAX_NORM_JOBS] = {
        {f->qpos, f->qn, B, c->obs_dim, m->qpos_lo, m->qpos_hi, c->norm_type, c->norm_eps},
        {f->acts, f->an, B * H, A, m->action_lo, m->action_hi, c->norm_type, c->norm_eps}};
    int nside = post ? 2 : 1;
    if (!lanes) OP(be->preprocess(be, f->frames, NB, c->image_h, c->image_w, c, f->img, side, nside));

    if (m->n_trunks == 1 && !lanes) {
        if (trunk(f, 0, f->img, NB, f->tok, err, errlen)) return -1;
    } else {   /* per camera: its own trunk, or the shared one; with lanes after its upload */
        for (int cam = 0; cam < ncam; cam++) {
            act_buf img = act_at(f->img, (size_t)cam * B * imsz);
            if (lanes) {
                OP(be->lane_wait(be, cam));
                OP(be->preprocess(be, act_at(f->frames, (size_t)cam * B * fsz), B, c->image_h,
                                  c->image_w, c, img, side, cam == 0 ? nside : 0));
            }
            if (trunk(f, m->n_trunks == 1 ? 0 : cam, img, B,
                      act_at(f->tok, (size_t)cam * B * c->vision_dim), err, errlen))
                return -1;
        }
    }

    mark(f, ACT_SECTION_LATENT);
    if (post) {
        if (posterior(f, B, (mode & ACT_FWD_SAMPLE) != 0, act_at(f->z, (size_t)zoff * L), err, errlen))
            return -1;
        OP(be->linear(be, &m->latent_out, act_at(f->z, (size_t)zoff * L), B, ACT_EPI_NONE, f->lat));
    }
    mark(f, ACT_SECTION_MEMORY);
    OP(be->linear(be, &m->dec_qpos, f->qn, B, ACT_EPI_NONE, f->d_qp));
    OP(be->linear(be, &m->visual_proj, f->tok, NB, ACT_EPI_NONE, f->vis));
    /* the prior's latent token is the constant lat_prior (set up once), the posterior's in lat */
    for (int half = 0; half < Bd / B; half++) {
        act_buf lat = prior && half == 0 ? f->lat_prior : f->lat;
        OP(be->memory_assemble(be, lat, f->d_qp, f->vis, B, ncam, E, f->pos_mem, m->mem_type,
                               act_at(f->mem, (size_t)half * B * Lm * E)));
    }
    /* layer 0 starts after its self-attention, with its cross-attention query ready (one
     * sequence reads both where decoder_prefix left them: cross_attn) */
    mark(f, ACT_SECTION_DECODER);
    if (Bd > 1) {
        OP(be->gather_rows(be, f->x, f->dec0_x, Bd, (size_t)H * E, 0));
        OP(be->gather_rows(be, f->q, f->dec0_q, Bd, (size_t)H * E, 0));
    }
    if (f->kv_grouped)
        OP(be->linear_group(be, f->kv_group, c->dec_layers, f->mem, Bd * Lm, f->kv));
    for (int i = 0; i < c->dec_layers; i++) {
        const act_dec_layer *dl = &m->dec[i];
        if ((i > 0 && self_attn(f, &dl->self_attn, &dl->ln1, Bd, H, act_nobuf(), err, errlen)) ||
            cross_attn(f, i, Bd, H, Lm, err, errlen) ||
            feed_forward(f, &dl->ff1, &dl->ff2, &dl->ln3, Bd * H, err, errlen))
            return -1;
    }
    /* the normalized chunk and the denormalized one side by side: one download */
    act_buf out_norm = f->outs, out = act_at(f->outs, (size_t)Bd * H * A);
    mark(f, ACT_SECTION_HEAD);
    OP(be->linear(be, &m->action_head, f->x, Bd * H, ACT_EPI_NONE, out_norm));
    OP(be->normalize(be, out_norm, Bd * H, A, m->action_lo, m->action_hi, c->norm_type,
                     c->norm_eps, 1, out));

    mark(f, ACT_SECTION_DOWNLOAD);
    OP(be->download(be, s->outs, f->outs, (size_t)2 * Bd * H * A));
    if (post) OP(be->download(be, s->lat_out, f->lat_out, (size_t)2 * B * L + B));
    mark(f, ACT_SECTION_COUNT);
    return 0;
}

long act_fwd_retry_wait(int fails, long base) {
    if (fails < 1 || fails > ACT_FWD_RETRIES || base <= 0) return -1;
    long w = base;
    for (int i = 1; i < fails; i++) w = w > LONG_MAX / 10 ? LONG_MAX : w * 10;
    return w;
}

/* "prior + sampled posterior, frames gathered": the step a (B, mode) key runs, for messages */
static const char *step_name(int mode, char *buf, size_t len) {
    snprintf(buf, len, "%s%s%s%s", (mode & ACT_FWD_PRIOR) ? "prior" : "",
             (mode & ACT_FWD_PRIOR) && (mode & ACT_FWD_POSTERIOR) ? " + " : "",
             (mode & ACT_FWD_POSTERIOR) ? ((mode & ACT_FWD_SAMPLE) ? "sampled posterior" : "posterior") : "",
             (mode & ACT_FWD_GATHER) ? ", frames gathered" : "");
    return buf;
}

int act_fwd_step(act_fwd *f, int B, int mode, int use_graphs, char *err, size_t errlen) {
    act_backend *be = f->be;
    if (B < 1 || B > f->max_batch || !(mode & (ACT_FWD_PRIOR | ACT_FWD_POSTERIOR)) ||
        ((mode & ACT_FWD_GATHER) && !be->gather))
        return act_errf(err, errlen, "forward: batch %d (max %d), mode %d is not a valid step", B,
                        f->max_batch, mode);
    int key = ACT_FWD_KEY(B, mode);
    act_fwd_retry *r = &f->retry[key];
    char name[64];
    int ran = 0, graphs = use_graphs && r->wait == 0;
    if (use_graphs && r->wait > 0) r->wait--;   /* an eager step towards the retry */
    if (graphs) {
        ran = be->graph_replay(be, key);
        if (ran < 0) return act_errf(err, errlen, "forward: graph replay: %s", be->err);
    }
    if (!ran) {
        int cap = graphs ? be->begin_capture(be, key) : 0;   /* 1: capturing, 0: eager */
        int rc = cap < 0 ? act_errf(err, errlen, "forward: begin capture: %s", be->err) : 0;
        if (!rc) rc = step_ops(f, B, mode, err, errlen);
        if (!rc && graphs && be->end_capture(be, key))
            rc = act_errf(err, errlen, "forward: end capture: %s", be->err);
        /* a failed step still waits for what it enqueued: a gather may be reading the caller's
         * memory, which the caller frees once act_run has returned */
        if (rc) be->sync(be);
        if (rc && cap == 0) return -1;
        if (!rc && cap == 1) {
            if (r->retried)
                fprintf(stderr, "act-engine: batch %d (%s): graph captured on retry %d\n", B,
                        step_name(mode, name, sizeof name), r->fails);
            /* a capture that holds renews the retries: the graph may be dropped later (a conv
             * workspace that grows drops them all) and its recapture fail for a passing reason */
            r->retried = 0;
            r->fails = 0;
        }
        if (rc) {
            /* the capture failed (to begin, an op in it, or to end or instantiate it): the step
             * runs eagerly now (its inputs are still in the staging blocks), and so do the key's
             * next steps until its retry (act_fwd_retry; none left: from now on) */
            if (r->fails < 255) r->fails++;
            r->wait = act_fwd_retry_wait(r->fails, f->retry_base);
            r->retried = r->wait > 0;
            char then[96] = "from now on";
            if (r->wait > 0)
                snprintf(then, sizeof then, "for its next %ld step%s, then tries a capture again "
                         "(retry %d of %d)", r->wait, r->wait == 1 ? "" : "s", r->fails, ACT_FWD_RETRIES);
            fprintf(stderr, "act-engine: batch %d (%s): graph capture failed: %s; this step runs "
                    "without a graph %s\n", B, step_name(mode, name, sizeof name), err, then);
            if (step_ops(f, B, mode, err, errlen)) {
                be->sync(be);
                return -1;
            }
        }
    }
    if (be->sync(be)) return act_errf(err, errlen, "forward: sync: %s", be->err);
    /* the step's outputs in the staging blocks (their layout follows B and mode) */
    const act_config *c = &f->m->cfg;
    act_fwd_stage *s = &f->stage;
    int Bd = decoded_rows(B, mode);
    size_t L = (size_t)c->latent_dim;
    s->act_norm = s->outs;
    s->act = s->outs + (size_t)Bd * c->pred_horizon * c->action_dim;
    s->mu = s->lat_out;
    s->logvar = s->lat_out + B * L;
    s->kl = s->lat_out + 2 * B * L;
    return 0;
}
