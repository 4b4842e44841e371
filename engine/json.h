/* json.h - the little JSON the eval summaries need: an escaping string writer and a small
 * parser into a tree (objects keep key order; numbers are doubles, which round-trip the %.17g
 * sums the summaries store, so merging shards is exact).
 * defines: act_json_write_string, act_json_parse, act_json_free, act_json_get, act_json_num */
#ifndef ACT_JSON_H
#define ACT_JSON_H

#include <stddef.h>
#include <stdio.h>

typedef enum { ACT_JSON_NULL, ACT_JSON_BOOL, ACT_JSON_NUM, ACT_JSON_STR, ACT_JSON_ARR, ACT_JSON_OBJ } act_json_type;

typedef struct act_json {
    act_json_type type;
    double num;                /* NUM, BOOL (0/1) */
    char *str;                 /* STR */
    int n;                     /* ARR, OBJ: children */
    struct act_json *items;    /* ARR, OBJ */
    char **keys;               /* OBJ */
} act_json;

void act_json_write_string(FILE *f, const char *s);
/* Parses text (NUL-terminated); on error returns NULL with "line L: ..." in err. */
act_json *act_json_parse(const char *text, char *err, size_t errlen);
void act_json_free(act_json *j);
const act_json *act_json_get(const act_json *obj, const char *key);   /* NULL if absent */
/* The number under key, or NAN if absent or not a number. */
double act_json_num(const act_json *obj, const char *key);

#endif
