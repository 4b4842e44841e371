/* fuzz_weights.c - .actw files (engine/weights.c) and the model built from them (engine/model.c).
 *
 * The input is a whole weight file. Before it is written to a temporary file, the fields a
 * random mutation would almost always break first are made consistent again - file_size,
 * stored_size (and data_size when raw) and the FNV-1a checksum - so mutations of the metadata,
 * the directory and the data reach the checks behind them (test_weights covers the checks this
 * skips). Inputs whose header declares more than 256 MiB of tensor data are dropped: a valid
 * file may legitimately inflate that far (zstd), which is memory, not a bug. A model that loads
 * must have a config inside the ranges model.c promises, and its normalization must run. */
#include "fuzz.h"

#include <string.h>

#include "act.h"
#include "model.h"
#include "weights.h"

#define MAX_DATA ((uint64_t)256 << 20)

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void check_model(const act_model *m)
{
    const act_config *c = act_model_config(m);
    FUZZ_ASSERT(c->num_cams >= 1 && c->num_cams <= ACT_MAX_CAMS, "num_cams %d", c->num_cams);
    FUZZ_ASSERT(c->obs_dim >= 1 && c->action_dim >= 1 && c->pred_horizon >= 1, "dims %d %d %d", c->obs_dim,
                c->action_dim, c->pred_horizon);
    FUZZ_ASSERT(c->enc_layers >= 1 && c->enc_layers <= ACT_MAX_LAYERS && c->dec_layers >= 1 &&
                c->dec_layers <= ACT_MAX_LAYERS, "layers %d %d", c->enc_layers, c->dec_layers);
    FUZZ_ASSERT(c->hidden_dim % c->nheads == 0, "hidden_dim %d, nheads %d", c->hidden_dim, c->nheads);
    for (int k = 0; k < c->num_cams; k++)
        FUZZ_ASSERT(memchr(c->camera_names[k], 0, ACT_NAME_LEN) && c->camera_names[k][0], "camera name %d", k);
    int rows = 2, n = c->obs_dim > c->action_dim ? c->obs_dim : c->action_dim;
    float *x = calloc((size_t)rows * n, sizeof(float)), *y = calloc((size_t)rows * n, sizeof(float));
    act_normalize_qpos(m, x, y, rows);
    act_normalize_action(m, x, y, rows);
    act_denormalize_action(m, y, x, rows);
    free(x);
    free(y);
}

int act_fuzz_weights(const uint8_t *data, size_t size)
{
    uint8_t *f = malloc(size ? size : 1);
    memcpy(f, data, size);
    if (size >= ACTW_HEADER_SIZE && memcmp(f, ACTW_MAGIC, 4) == 0) {
        uint64_t data_offset = rd64(f + 56), compression = f[80] | (uint32_t)f[81] << 8 | (uint32_t)f[82] << 16 |
                                                           (uint32_t)f[83] << 24;
        wr64(f + 16, size);
        if (data_offset <= size) {
            wr64(f + 72, size - data_offset);
            if (compression == ACTW_RAW) wr64(f + 64, size - data_offset);
        }
        if (rd64(f + 64) > MAX_DATA) {
            free(f);
            return 0;
        }
        wr64(f + 88, act_fnv1a64(f + ACTW_HEADER_SIZE, size - ACTW_HEADER_SIZE, ACT_FNV_INIT));
    }
    const char *path = act_fuzz_tmp_file("weights.actw", f, size);
    free(f);
    if (!path) return 0;
    /* the reader first: a file it accepts has every tensor inside the blob, and only such a
     * file can make a model (a refused one would only be refused again) */
    char err[ACT_ERR_LEN] = "";
    act_weights *w = NULL;
    if (act_weights_open(path, &w, err, sizeof err) != 0) {
        FUZZ_ASSERT(err[0] && w == NULL, "refused without a message");
        return 0;
    }
    for (int i = 0; i < w->n_tensors; i++) {
        const act_tensor *t = &w->tensors[i];
        FUZZ_ASSERT(t->offset <= w->blob_elems && (size_t)t->numel <= w->blob_elems - t->offset,
                    "tensor '%s' [%zu, +%lld) outside the blob of %zu", t->name, t->offset, (long long)t->numel,
                    w->blob_elems);
        FUZZ_ASSERT(act_weights_find(w, t->name) == t, "tensor '%s' not found by name", t->name);
    }
    for (int i = 0; i < w->n_meta; i++)
        FUZZ_ASSERT(act_meta_get(w, w->meta[i].key) == w->meta[i].value, "meta '%s'", w->meta[i].key);
    act_weights_free(w);
    act_model *m = NULL;
    err[0] = 0;
    if (act_model_load(path, &m, err, sizeof err) == 0) {
        check_model(m);
        act_model_free(m);
    } else {
        FUZZ_ASSERT(err[0] && m == NULL, "model refused without a message");
    }
    return 0;
}
