/* infer_info.c - `act-infer info`: what a deployment needs to know about a weight file before
 * wiring it to a robot or a simulator: the contract (dims, horizon, cameras in order, frame
 * size), preprocessing, normalization, size and provenance. Human text by default, --json for
 * scripts. Loads the model only (no session), so it works on a machine without the backend. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "act.h"
#include "infer_common.h"
#include "json.h"
#include "model.h"

static const char *USAGE =
    "usage: act-infer info --model M.actw [--json]\n"
    "  --model M.actw   weight file (weights/FORMAT.md)\n"
    "  --json           print one JSON object instead of text\n";

static const char *norm_name(act_norm_type t) { return t == ACT_NORM_MEAN_STD ? "mean_std" : "min_max"; }

static void json_floats(FILE *f, const act_tensor *t) {
    fputc('[', f);
    for (int64_t i = 0; t && i < t->numel; i++) fprintf(f, "%s%.9g", i ? ", " : "", t->data[i]);
    fputc(']', f);
}

static void print_json(const act_model *m, const char *path, long long fsize) {
    const act_config *c = act_model_config(m);
    FILE *f = stdout;
    fprintf(f, "{\n  \"path\": ");
    act_json_write_string(f, path);
    fprintf(f, ",\n  \"file_size\": %lld,\n  \"arch\": \"act_resnet\",\n", fsize);
    fprintf(f, "  \"obs_dim\": %d, \"action_dim\": %d, \"pred_horizon\": %d, \"obs_horizon\": %d, "
               "\"num_action_steps\": %d,\n", c->obs_dim, c->action_dim, c->pred_horizon, c->obs_horizon,
            c->num_action_steps);
    fprintf(f, "  \"camera_names\": [");
    for (int i = 0; i < c->num_cams; i++) {
        fprintf(f, "%s", i ? ", " : "");
        act_json_write_string(f, c->camera_names[i]);
    }
    fprintf(f, "],\n  \"image_height\": %d, \"image_width\": %d,\n", c->image_h, c->image_w);
    fprintf(f, "  \"preprocess\": {\"input_height\": %d, \"input_width\": %d, \"crop_height\": %d, "
               "\"crop_width\": %d, \"imagenet_norm\": %s},\n", c->input_h, c->input_w, c->crop_h, c->crop_w,
            c->imagenet_norm ? "true" : "false");
    fprintf(f, "  \"vision\": {\"norm\": \"%s\", \"separate_trunks\": %s, \"num_keypoints\": %d, "
               "\"output_dim\": %d, \"feature_height\": %d, \"feature_width\": %d},\n",
            c->vision_norm == ACT_VISION_GROUPNORM ? "groupnorm" : "batchnorm",
            c->separate_trunks ? "true" : "false", c->num_keypoints, c->vision_dim, c->feat_h, c->feat_w);
    fprintf(f, "  \"head\": {\"hidden_dim\": %d, \"nheads\": %d, \"enc_layers\": %d, \"dec_layers\": %d, "
               "\"dim_feedforward\": %d, \"latent_dim\": %d, \"activation\": \"%s\", \"kl_weight\": %.9g, "
               "\"layer_norm_eps\": %.9g},\n", c->hidden_dim, c->nheads, c->enc_layers, c->dec_layers,
            c->ff_dim, c->latent_dim, c->activation == ACT_ACT_GELU ? "gelu" : "relu", c->kl_weight, c->ln_eps);
    const char *lo = c->norm_type == ACT_NORM_MEAN_STD ? "mean" : "min";
    const char *hi = c->norm_type == ACT_NORM_MEAN_STD ? "std" : "max";
    fprintf(f, "  \"norm\": {\"type\": \"%s\", \"eps\": %.9g,\n", norm_name(c->norm_type), c->norm_eps);
    fprintf(f, "    \"qpos_%s\": ", lo); json_floats(f, m->qpos_lo);
    fprintf(f, ",\n    \"qpos_%s\": ", hi); json_floats(f, m->qpos_hi);
    fprintf(f, ",\n    \"action_%s\": ", lo); json_floats(f, m->action_lo);
    fprintf(f, ",\n    \"action_%s\": ", hi); json_floats(f, m->action_hi);
    fprintf(f, "},\n  \"n_params\": %lld,\n  \"model_hash\": \"%s\",\n  \"source_sha256\": ",
            (long long)c->n_params, c->model_hash);
    act_json_write_string(f, c->source_sha256);
    fprintf(f, ",\n  \"converter_version\": ");
    act_json_write_string(f, c->converter_version);
    fprintf(f, ",\n  \"compressed\": %s\n}\n", m->w && m->w->compressed ? "true" : "false");
}

static void print_text(const act_model *m, const char *path, long long fsize) {
    const act_config *c = act_model_config(m);
    printf("model          %s (%.1f MiB%s)\n", path, fsize / 1048576.0,
           m->w && m->w->compressed ? ", zstd" : "");
    printf("model hash     %s\n", c->model_hash);
    printf("source sha256  %s\n", c->source_sha256[0] ? c->source_sha256 : "(unknown)");
    printf("converter      %s\n", c->converter_version[0] ? c->converter_version : "(unknown)");
    printf("parameters     %lld\n", (long long)c->n_params);
    printf("contract       qpos[%d] + %d camera(s) uint8 %dx%dx3 -> chunk[%d][%d]\n", c->obs_dim,
           c->num_cams, c->image_h, c->image_w, c->pred_horizon, c->action_dim);
    printf("cameras        ");
    for (int i = 0; i < c->num_cams; i++) printf("%s%s", i ? ", " : "", c->camera_names[i]);
    printf("   (token order)\n");
    printf("execution      obs_horizon %d, num_action_steps %d\n", c->obs_horizon, c->num_action_steps);
    printf("preprocess     /255 -> bilinear resize to %dx%d", c->input_h, c->input_w);
    if (c->crop_h) printf(" -> center crop %dx%d", c->crop_h, c->crop_w);
    if (c->imagenet_norm) printf(" -> ImageNet mean/std");
    printf("\n");
    printf("vision         ResNet18 (%s, %s trunk) -> SpatialSoftmax K=%d -> %d, feature map %dx%d\n",
           c->vision_norm == ACT_VISION_GROUPNORM ? "GroupNorm" : "BatchNorm folded",
           c->separate_trunks ? "one per camera" : "shared", c->num_keypoints, c->vision_dim, c->feat_h, c->feat_w);
    printf("head           hidden %d, %d heads, %d encoder + %d decoder layers, ffn %d, latent %d, %s, kl_weight %g\n",
           c->hidden_dim, c->nheads, c->enc_layers, c->dec_layers, c->ff_dim, c->latent_dim,
           c->activation == ACT_ACT_GELU ? "gelu" : "relu", c->kl_weight);
    printf("normalization  %s (eps %g) of qpos and actions\n", norm_name(c->norm_type), c->norm_eps);
}

int act_cmd_info(int argc, char **argv) {
    const char *model = NULL, *val;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(USAGE, stdout); return 0; }
        if (!strcmp(argv[i], "--json")) { json = 1; continue; }
        if ((r = infer_opt(argc, argv, &i, "--model", &val)) != 0) {
            if (r < 0) return infer_usage("info", USAGE, "--model needs a value");
            model = val;
            continue;
        }
        return infer_usage("info", USAGE, "unknown argument '%s'", argv[i]);
    }
    if (!model) return infer_usage("info", USAGE, "--model is required");
    char err[ACT_ERR_LEN];
    act_model *m;
    if (act_model_load(model, &m, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer info: %s\n", err);
        return INFER_EXIT_FAIL;
    }
    struct stat st;
    long long fsize = stat(model, &st) == 0 ? (long long)st.st_size : -1;
    if (json) print_json(m, model, fsize);
    else print_text(m, model, fsize);
    act_model_free(m);
    return INFER_EXIT_OK;
}
