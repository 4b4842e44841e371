/* test_serve_protocol.c - the act-serve codec (engine/protocol.c) on its own.
 * A valid PREDICT decodes to exactly what was encoded; then thousands of random mutations
 * (flipped bytes, truncations, forged counts and lengths) must each be refused with a known
 * code and a message, or decode to a request that still satisfies the contract - never crash,
 * read past the payload or write past the contract-sized buffer (CI runs this under ASan). Also: header checks, HELLO and the
 * contract, and the size limit that bounds every allocation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"

static int failures;
#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                        \
            fputc('\n', stderr);                                 \
            failures++;                                          \
        }                                                        \
    } while (0)

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static act_config make_cfg(void)
{
    act_config c;
    memset(&c, 0, sizeof c);
    c.obs_dim = 5;
    c.action_dim = 4;
    c.pred_horizon = 6;
    c.num_cams = 3;
    strcpy(c.camera_names[0], "l_vis");
    strcpy(c.camera_names[1], "r_vis");
    strcpy(c.camera_names[2], "front");
    c.image_h = 8;
    c.image_w = 6;
    strcpy(c.model_hash, "0123456789abcdef");
    return c;
}

typedef struct buf { uint8_t *p; size_t n, cap; } buf;
static void put(buf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = 2 * (b->n + n);
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }   /* x86-64/aarch64: little-endian */
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_name(buf *b, const char *s)
{
    uint8_t n = (uint8_t)strlen(s);
    put(b, &n, 1);
    put(b, s, n);
}

/* A valid PREDICT payload with random qpos, frames and (optionally) an action chunk. */
static buf make_predict(const act_config *c, uint64_t id, int with_actions, float *qpos, uint8_t *frames, float *acts)
{
    buf b = { 0 };
    size_t frame = (size_t)c->image_h * c->image_w * 3;
    put_u64(&b, id);
    put_u32(&b, with_actions ? ACT_PREDICT_HAS_ACTIONS : 0);
    put_u32(&b, (uint32_t)c->obs_dim);
    for (int i = 0; i < c->obs_dim; i++) qpos[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    put(&b, qpos, 4 * (size_t)c->obs_dim);
    put_u32(&b, (uint32_t)c->num_cams);
    for (int k = 0; k < c->num_cams; k++) {
        uint8_t enc = ACT_ENC_RAW;
        for (size_t i = 0; i < frame; i++) frames[k * frame + i] = (uint8_t)rnd();
        put_name(&b, c->camera_names[k]);
        put(&b, &enc, 1);
        put_u32(&b, (uint32_t)c->image_h);
        put_u32(&b, (uint32_t)c->image_w);
        put_u32(&b, (uint32_t)frame);
        put(&b, frames + k * frame, frame);
    }
    if (with_actions) {
        size_t na = (size_t)c->pred_horizon * c->action_dim;
        put_u32(&b, (uint32_t)c->pred_horizon);
        put_u32(&b, (uint32_t)c->action_dim);
        for (size_t i = 0; i < na; i++) acts[i] = (float)(rnd() % 2001) / 100.0f - 10.0f;
        put(&b, acts, 4 * na);
        for (int t = 0; t < c->pred_horizon; t++) {
            uint8_t pad = t >= c->pred_horizon - 2;
            put(&b, &pad, 1);
        }
        put_u64(&b, 42);
    }
    return b;
}

static void test_roundtrip(const act_config *c)
{
    float qpos[16], acts[64];
    uint8_t frames[3 * 8 * 6 * 3];
    char msg[512];
    for (int with = 0; with < 2; with++) {
        buf b = make_predict(c, 77 + (uint64_t)with, with, qpos, frames, acts);
        act_predict r;
        void *data = malloc(act_proto_predict_bytes(c));
        int code = act_proto_parse_predict(c, b.p, (uint32_t)b.n, &r, data, msg, sizeof msg);
        CHECK(code == 0, "valid PREDICT refused: %s", msg);
        if (!code) {
            CHECK(r.request_id == 77 + (uint64_t)with, "request id %llu", (unsigned long long)r.request_id);
            CHECK(!memcmp(r.qpos, qpos, sizeof(float) * 5), "qpos differs");
            for (int k = 0; k < 3; k++) CHECK(!memcmp(r.images[k], frames + k * 144, 144), "camera %d differs", k);
            CHECK(with ? r.actions && !memcmp(r.actions, acts, sizeof(float) * 24) && r.is_pad[5] == 1 && r.seed == 42
                       : r.actions == NULL, "action chunk differs");
        }
        /* the server's form: the same decode, but raw frames are views into the payload */
        act_predict v;
        code = act_proto_parse_predict_view(c, b.p, (uint32_t)b.n, &v, data, msg, sizeof msg);
        CHECK(code == 0, "valid PREDICT refused by the view parse: %s", msg);
        if (!code) {
            CHECK(!memcmp(v.qpos, qpos, sizeof(float) * 5) && v.seed == r.seed, "view parse: qpos or seed differs");
            for (int k = 0; k < 3; k++)
                CHECK(v.images[k] >= b.p && v.images[k] + 144 <= b.p + b.n && !memcmp(v.images[k], frames + k * 144, 144),
                      "view parse: camera %d is not the payload's frame", k);
        }
        free(data);
        CHECK(b.n <= act_proto_max_payload(c, ACT_MSG_PREDICT, 1), "valid payload %zu above the limit %u", b.n,
              act_proto_max_payload(c, ACT_MSG_PREDICT, 1));
        free(b.p);
    }
    CHECK(act_proto_max_payload(c, ACT_MSG_PREDICT, 0) == 0, "PREDICT before HELLO must have no budget");
}

static void test_mutations(const act_config *c)
{
    float qpos[16], acts[64];
    uint8_t frames[3 * 8 * 6 * 3];
    char msg[512];
    int refused = 0, accepted = 0;
    void *data = malloc(act_proto_predict_bytes(c));   /* exact size: ASan sees any overrun */
    for (int it = 0; it < 20000; it++) {
        buf b = make_predict(c, 5, (int)(rnd() & 1), qpos, frames, acts);
        int kind = (int)(rnd() % 4);
        size_t n = b.n;
        if (kind == 0) {              /* flip a few bytes anywhere */
            for (int j = 0; j < 1 + (int)(rnd() % 4); j++) b.p[rnd() % b.n] ^= (uint8_t)(1 + rnd() % 255);
        } else if (kind == 1) {       /* truncate */
            n = rnd() % b.n;
        } else if (kind == 2) {       /* forge a u32 somewhere (counts, lengths, dims) */
            uint32_t v = rnd() % 3 ? rnd() : 0xFFFFFFFFu - rnd() % 8;
            memcpy(b.p + rnd() % (b.n - 4), &v, 4);
        } else {                      /* forge a header field at the start of a camera */
            uint32_t v = rnd() % 1000;
            memcpy(b.p + 8 + 4 + 4 + 20 + 4 + 1 + 5 + 1 + 4 * (rnd() % 3), &v, 4);
        }
        uint8_t *copy = malloc(n ? n : 1);   /* exact size: ASan sees any overread */
        memcpy(copy, b.p, n);
        act_predict r;
        int code = act_proto_parse_predict(c, copy, (uint32_t)n, &r, data, msg, sizeof msg);
        CHECK(code || kind != 1, "mutation %d: a PREDICT truncated to %zu of %zu bytes was accepted", it, n, b.n);
        if (code) {
            refused++;
            CHECK(code >= ACT_E_MALFORMED && code <= ACT_E_INTERNAL && msg[0], "mutation %d: code %d, msg '%s'", it, code, msg);
        } else {
            accepted++;
            for (int i = 0; i < c->obs_dim; i++) CHECK(isfinite(r.qpos[i]), "accepted a non-finite qpos");
        }
        free(copy);
        free(b.p);
    }
    free(data);
    /* flips inside pixels or qpos stay valid requests; everything structural must be refused */
    CHECK(refused > 5000 && accepted > 1000, "mutations: %d refused, %d accepted", refused, accepted);
}

static void test_header_hello_contract(const act_config *c)
{
    uint8_t h[ACT_PROTO_HDR];
    act_frame_hdr fh;
    char msg[512];
    act_proto_put_hdr(h, ACT_MSG_PREDICT, 1234);
    CHECK(act_proto_parse_hdr(h, &fh, msg, sizeof msg) == 0 && fh.type == ACT_MSG_PREDICT && fh.len == 1234, "header");
    h[0] = 'X';
    CHECK(act_proto_parse_hdr(h, &fh, msg, sizeof msg) == ACT_E_BAD_MAGIC && strstr(msg, "ACTS"), "magic: %s", msg);
    act_proto_put_hdr(h, ACT_MSG_HELLO, 0);
    h[4] = 2;
    CHECK(act_proto_parse_hdr(h, &fh, msg, sizeof msg) == ACT_E_BAD_VERSION, "version: %s", msg);

    buf b = { 0 };
    put_u32(&b, 5);
    put_u32(&b, 0);
    put_u32(&b, 8);
    put_u32(&b, 6);
    put_u32(&b, 3);
    put_name(&b, "l_vis");
    put_name(&b, "front");
    put_name(&b, "r_vis");
    put_name(&b, "worker-1");
    act_hello hello;
    CHECK(act_proto_parse_hello(b.p, (uint32_t)b.n, &hello, msg, sizeof msg) == 0 && !strcmp(hello.client_name, "worker-1"),
          "hello: %s", msg);
    CHECK(act_proto_check_contract(c, &hello, msg, sizeof msg) == ACT_E_CONTRACT && strstr(msg, "order matters"),
          "misordered cameras accepted: %s", msg);
    strcpy(hello.camera_names[1], "r_vis");
    strcpy(hello.camera_names[2], "front");
    CHECK(act_proto_check_contract(c, &hello, msg, sizeof msg) == 0, "matching contract refused: %s", msg);
    hello.obs_dim = 16;
    CHECK(act_proto_check_contract(c, &hello, msg, sizeof msg) == ACT_E_CONTRACT && strstr(msg, "obs_dim 16"), "%s", msg);
    for (size_t cut = 0; cut < b.n; cut++)
        CHECK(act_proto_parse_hello(b.p, (uint32_t)cut, &hello, msg, sizeof msg) == ACT_E_MALFORMED, "truncated hello at %zu", cut);
    free(b.p);

    size_t n;
    uint8_t *info = act_proto_build_info(c, 32, "cpu", &n);
    CHECK(info && act_proto_parse_hdr(info, &fh, msg, sizeof msg) == 0 && fh.len + ACT_PROTO_HDR == n, "INFO frame size");
    free(info);
    float chunk[24] = { 1.5f };
    act_result_hdr rh = { 9, 0, 3, 10, 20, NAN };
    uint8_t *res = act_proto_build_result(&rh, chunk, 6, 4, &n);
    CHECK(res && n == ACT_PROTO_HDR + 36 + 96 && !memcmp(res + ACT_PROTO_HDR + 36, chunk, 96), "RESULT layout");
    free(res);
}

int main(void)
{
    act_config c = make_cfg();
    test_roundtrip(&c);
    test_mutations(&c);
    test_header_hello_contract(&c);
    if (failures) {
        fprintf(stderr, "test_serve_protocol: %d failures\n", failures);
        return 1;
    }
    printf("test_serve_protocol: ok\n");
    return 0;
}
