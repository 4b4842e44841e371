/* fuzz_json.c - the JSON parser (engine/json.c) and its one consumer, the eval summary reader
 * and shard merge (engine/eval.c).
 *
 * The input is the text of a file. act_json_parse sees it NUL-terminated, as the reader hands
 * it over (an embedded NUL ends the text there); the parsed tree is walked whole. The same bytes
 * are then read as an eval summary file, and a summary that reads is merged (as one shard set),
 * totalled and written back out, which is what `act-infer eval-merge` does with it. */
#include "fuzz.h"

#include <math.h>
#include <string.h>

#include "eval.h"
#include "json.h"

static void walk(const act_json *j, int depth)
{
    FUZZ_ASSERT(depth <= 64, "tree deeper than the parser's cap of 64");
    switch (j->type) {
    case ACT_JSON_STR:
        FUZZ_ASSERT(j->str != NULL, "string without text");
        break;
    case ACT_JSON_ARR:
    case ACT_JSON_OBJ:
        FUZZ_ASSERT(j->n >= 0 && (j->n == 0 || j->items), "container of %d items", j->n);
        for (int i = 0; i < j->n; i++) {
            if (j->type == ACT_JSON_OBJ) {
                FUZZ_ASSERT(j->keys && j->keys[i], "object item %d without a key", i);
                FUZZ_ASSERT(act_json_get(j, j->keys[i]) != NULL, "key '%s' not found", j->keys[i]);
                (void)act_json_num(j, j->keys[i]);
            }
            walk(&j->items[i], depth + 1);
        }
        break;
    default:
        break;
    }
}

int act_fuzz_json(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    char err[256];
    act_json *j = act_json_parse(text, err, sizeof err);
    if (j) {
        walk(j, 1);
        act_json_free(j);
    } else {
        FUZZ_ASSERT(strncmp(err, "line ", 5) == 0, "error without its line: '%s'", err);
    }
    free(text);

    const char *path = act_fuzz_tmp_file("summary.json", data, size);
    if (!path) return 0;
    char e[1024] = "";
    act_eval_summary s;
    if (act_eval_read_json(path, &s, e, sizeof e) != 0) {
        FUZZ_ASSERT(e[0], "summary refused without a message");
        return 0;
    }
    FUZZ_ASSERT(s.n_shards >= 1 && s.shard_count >= 1, "shards %d of %d", s.n_shards, s.shard_count);
    for (int i = 0; i < s.n_shards; i++)
        FUZZ_ASSERT(s.shards[i] >= 0 && s.shards[i] < s.shard_count, "shard %d of %d", s.shards[i], s.shard_count);
    act_eval_sums o;
    int failed = 0;
    if (act_eval_overall(&s, &o, &failed) == 0) {
        (void)act_eval_means_of(&o, s.kl_weight);
        free(o.joint_l1);
    }
    act_eval_summary m;
    if (act_eval_merge(&s, 1, &m, e, sizeof e) == 0) {
        const char *out = act_fuzz_tmp_file("merged.json", (const uint8_t *)"", 0);
        if (out && act_eval_write_json(&m, out, e, sizeof e) == 0) {
            act_eval_summary back;
            FUZZ_ASSERT(act_eval_read_json(out, &back, e, sizeof e) == 0, "a merged summary does not read back: %s", e);
            FUZZ_ASSERT(back.n_episodes == m.n_episodes, "read back %d of %d episodes", back.n_episodes,
                        m.n_episodes);
            act_eval_free(&back);
        }
        act_eval_free(&m);
    }
    act_eval_free(&s);
    return 0;
}
