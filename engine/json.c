/* json.c - JSON string writer and recursive-descent parser (see json.h). Depth is capped so a
 * hostile file cannot exhaust the stack; every error says the line. */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), or 0 */
static int utf8_len(const unsigned char *p) {
    unsigned c = p[0];
    int n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (n == 0 || c > 0xf4) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;   /* also stops at the terminating NUL */
    if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f) || (c == 0xf0 && p[1] < 0x90) ||
        (c == 0xf4 && p[1] > 0x8f))
        return 0;
    return n;
}

/* Bytes that are not UTF-8 (a file name is any bytes on Linux) are written as U+FFFD: the
 * file stays JSON that every parser reads, and the rest of the string stays as it was. */
void act_json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80) {
            int n = utf8_len(p);
            if (n == 0) { fputs("\\ufffd", f); continue; }
            fwrite(p, 1, (size_t)n, f);
            p += n - 1;
            continue;
        }
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

typedef struct { const char *s, *p; char *err; size_t errlen; int depth; } parser;

static int line_of(const parser *ps) {
    int line = 1;
    for (const char *q = ps->s; q < ps->p; q++) line += *q == '\n';
    return line;
}

static int fail(parser *ps, const char *what) {
    if (ps->err && ps->err[0] == '\0') snprintf(ps->err, ps->errlen, "line %d: %s", line_of(ps), what);
    return -1;
}

static void skip_ws(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\t' || *ps->p == '\r') ps->p++;
}

static void put_utf8(char **o, unsigned cp) {
    if (cp < 0x80) { *(*o)++ = (char)cp; }
    else if (cp < 0x800) { *(*o)++ = (char)(0xc0 | cp >> 6); *(*o)++ = (char)(0x80 | (cp & 0x3f)); }
    else { *(*o)++ = (char)(0xe0 | cp >> 12); *(*o)++ = (char)(0x80 | ((cp >> 6) & 0x3f));
           *(*o)++ = (char)(0x80 | (cp & 0x3f)); }
}

static int parse_string(parser *ps, char **out) {
    ps->p++; /* opening quote */
    const char *start = ps->p;
    size_t cap = 1;
    while (*ps->p && *ps->p != '"') {
        if (*ps->p == '\\' && ps->p[1]) ps->p++;
        ps->p++;
        cap += 3;
    }
    if (*ps->p != '"') return fail(ps, "unterminated string");
    char *buf = malloc(cap), *o = buf;
    if (!buf) return fail(ps, "out of memory");
    for (const char *q = start; q < ps->p; q++) {
        if (*q != '\\') { *o++ = *q; continue; }
        q++;
        switch (*q) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'u': {
            unsigned cp = 0;
            for (int k = 1; k <= 4; k++) {
                char h = q[k];
                if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) {
                    free(buf);
                    return fail(ps, "bad \\u escape");
                }
                cp = cp * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            put_utf8(&o, cp);
            q += 4;
            break;
        }
        default: *o++ = *q;
        }
    }
    *o = '\0';
    ps->p++;
    *out = buf;
    return 0;
}

static int parse_value(parser *ps, act_json *v);

static int parse_container(parser *ps, act_json *v, int is_obj) {
    char close = is_obj ? '}' : ']';
    v->type = is_obj ? ACT_JSON_OBJ : ACT_JSON_ARR;
    ps->p++;
    skip_ws(ps);
    int cap = 0;
    if (*ps->p == close) { ps->p++; return 0; }
    for (;;) {
        if (v->n == cap) {
            cap = cap ? cap * 2 : 8;
            act_json *ni = realloc(v->items, sizeof(act_json) * (size_t)cap);
            if (!ni) return fail(ps, "out of memory");
            v->items = ni;
            if (is_obj) {
                char **nk = realloc(v->keys, sizeof(char *) * (size_t)cap);
                if (!nk) return fail(ps, "out of memory");
                v->keys = nk;
            }
        }
        memset(&v->items[v->n], 0, sizeof(act_json));
        if (is_obj) {
            skip_ws(ps);
            v->keys[v->n] = NULL;
            if (*ps->p != '"') { v->n++; return fail(ps, "expected a string key"); }
            if (parse_string(ps, &v->keys[v->n]) != 0) { v->n++; return -1; }
            skip_ws(ps);
            if (*ps->p != ':') { v->n++; return fail(ps, "expected ':'"); }
            ps->p++;
        }
        int rc = parse_value(ps, &v->items[v->n]);
        v->n++;
        if (rc != 0) return -1;
        skip_ws(ps);
        if (*ps->p == ',') { ps->p++; continue; }
        if (*ps->p == close) { ps->p++; return 0; }
        return fail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(parser *ps, act_json *v) {
    skip_ws(ps);
    if (++ps->depth > 64) return fail(ps, "nesting deeper than 64");
    int rc = 0;
    char c = *ps->p;
    if (c == '{' || c == '[') {
        rc = parse_container(ps, v, c == '{');
    } else if (c == '"') {
        v->type = ACT_JSON_STR;
        rc = parse_string(ps, &v->str);
    } else if (!strncmp(ps->p, "true", 4) || !strncmp(ps->p, "false", 5)) {
        v->type = ACT_JSON_BOOL;
        v->num = c == 't';
        ps->p += c == 't' ? 4 : 5;
    } else if (!strncmp(ps->p, "null", 4)) {
        v->type = ACT_JSON_NULL;
        ps->p += 4;
    } else if (c == '-' || (c >= '0' && c <= '9') || !strncmp(ps->p, "NaN", 3)) {
        char *end;
        v->type = ACT_JSON_NUM;
        v->num = strtod(ps->p, &end);
        if (end == ps->p) rc = fail(ps, "bad number");
        ps->p = end;
    } else {
        rc = fail(ps, c ? "unexpected character" : "unexpected end of input");
    }
    ps->depth--;
    return rc;
}

static void free_children(act_json *j) {
    for (int i = 0; i < j->n; i++) {
        free_children(&j->items[i]);
        if (j->keys) free(j->keys[i]);
    }
    free(j->items);
    free(j->keys);
    free(j->str);
}

act_json *act_json_parse(const char *text, char *err, size_t errlen) {
    parser ps = {text, text, err, errlen, 0};
    if (err && errlen) err[0] = '\0';
    act_json *root = calloc(1, sizeof *root);
    if (!root) { snprintf(err, errlen, "out of memory"); return NULL; }
    int rc = parse_value(&ps, root);
    if (rc == 0) {
        skip_ws(&ps);
        if (*ps.p) rc = fail(&ps, "trailing characters after the value");
    }
    if (rc != 0) {
        act_json_free(root);
        return NULL;
    }
    return root;
}

void act_json_free(act_json *j) {
    if (!j) return;
    free_children(j);
    free(j);
}

const act_json *act_json_get(const act_json *obj, const char *key) {
    if (!obj || obj->type != ACT_JSON_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (obj->keys[i] && !strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

double act_json_num(const act_json *obj, const char *key) {
    const act_json *v = act_json_get(obj, key);
    return v && v->type == ACT_JSON_NUM ? v->num : NAN;
}
