/* test_serve_protocol.c - the act-serve codec (engine/protocol.c) on its own.
 * A valid PREDICT decodes to exactly what was encoded; then thousands of random mutations
 * (flipped bytes, truncations, forged counts and lengths) must each be refused with a known
 * code and a message, or decode to a request that still satisfies the contract - never crash,
 * read past the payload or write past the contract-sized buffer (CI runs this under ASan). Also: header checks, HELLO and the
 * contract, the size limit that bounds every allocation, and frames in shared memory (offsets
 * that must land inside the attached area, SHM_ATTACH). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto_test_config.h"
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

    /* a client name may be any name (PROTOCOL.md): up to 255 printable bytes, e.g. a 63-byte pod
     * host name plus a worker index; a control byte in it is refused */
    char longname[256];
    for (int i = 0; i < 255; i++) longname[i] = (char)('a' + i % 26);
    longname[255] = 0;
    for (int bad = 0; bad < 2; bad++) {
        buf h = { 0 };
        for (int i = 0; i < 5; i++) put_u32(&h, 0);
        if (bad) longname[100] = '\n';
        put_name(&h, longname);
        int rc = act_proto_parse_hello(h.p, (uint32_t)h.n, &hello, msg, sizeof msg);
        CHECK(bad ? rc == ACT_E_MALFORMED && strstr(msg, "client name")
                  : rc == 0 && strlen(hello.client_name) == 255 && !strcmp(hello.client_name, longname),
              "255-byte client name (%s): rc %d %s", bad ? "with a newline" : "printable", rc, msg);
        free(h.p);
    }

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

/* A PREDICT whose cameras are in shared memory: encoding 2, an nbytes-long field holding the
 * offset (8 bytes when well-formed); camera raw_cam (if >= 0) travels raw instead. */
static buf make_shm_predict(const act_config *c, const uint64_t *offs, uint32_t nbytes, int raw_cam, const uint8_t *raw)
{
    buf b = { 0 };
    size_t frame = (size_t)c->image_h * c->image_w * 3;
    float q[16] = { 0.25f, -0.5f, 1.0f, 2.0f, -3.0f };
    put_u64(&b, 3);
    put_u32(&b, 0);
    put_u32(&b, (uint32_t)c->obs_dim);
    put(&b, q, 4 * (size_t)c->obs_dim);
    put_u32(&b, (uint32_t)c->num_cams);
    for (int k = 0; k < c->num_cams; k++) {
        uint8_t enc = k == raw_cam ? ACT_ENC_RAW : ACT_ENC_SHM, field[16] = { 0 };
        put_name(&b, c->camera_names[k]);
        put(&b, &enc, 1);
        put_u32(&b, (uint32_t)c->image_h);
        put_u32(&b, (uint32_t)c->image_w);
        if (k == raw_cam) {
            put_u32(&b, (uint32_t)frame);
            put(&b, raw, frame);
        } else {
            memcpy(field, &offs[k], 8);
            put_u32(&b, nbytes);
            put(&b, field, nbytes);
        }
    }
    return b;
}

static void test_shm(const act_config *c)
{
    const size_t frame = (size_t)c->image_h * c->image_w * 3, size = 3 * frame + 10;
    uint8_t *shm = malloc(size), raw[8 * 6 * 3];
    void *data = malloc(act_proto_predict_bytes(c));
    char msg[512];
    act_predict r;
    for (size_t i = 0; i < size; i++) shm[i] = (uint8_t)rnd();
    for (size_t i = 0; i < frame; i++) raw[i] = (uint8_t)rnd();
    /* cameras in any order inside the area, the last one flush with its end */
    uint64_t offs[3] = { frame, 0, size - frame };
    buf b = make_shm_predict(c, offs, 8, -1, NULL);
    int code = act_proto_parse_predict_shm(c, b.p, (uint32_t)b.n, &r, data, shm, size, msg, sizeof msg);
    CHECK(code == 0, "valid shared-memory PREDICT refused: %s", msg);
    for (int k = 0; !code && k < 3; k++) CHECK(r.images[k] == shm + offs[k], "camera %d does not point at its offset", k);
    CHECK(!code && r.qpos[1] == -0.5f, "qpos of a shared-memory PREDICT");
    /* the other parses, and a connection without an area, refuse such frames */
    CHECK(act_proto_parse_predict_shm(c, b.p, (uint32_t)b.n, &r, data, NULL, 0, msg, sizeof msg) == ACT_E_BAD_SHM &&
          strstr(msg, "none attached"), "no area: %s", msg);
    CHECK(act_proto_parse_predict_view(c, b.p, (uint32_t)b.n, &r, data, msg, sizeof msg) == ACT_E_BAD_SHM, "view parse: %s", msg);
    CHECK(act_proto_parse_predict(c, b.p, (uint32_t)b.n, &r, data, msg, sizeof msg) == ACT_E_BAD_SHM, "copy parse: %s", msg);
    free(b.p);
    /* one byte past the end, and offsets that overflow when the frame is added */
    const uint64_t bad[] = { size - frame + 1, size, size + 1, UINT64_MAX, UINT64_MAX - frame + 1 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t o[3] = { 0, bad[i], frame };
        b = make_shm_predict(c, o, 8, -1, NULL);
        CHECK(act_proto_parse_predict_shm(c, b.p, (uint32_t)b.n, &r, data, shm, size, msg, sizeof msg) == ACT_E_BAD_SHM &&
              strstr(msg, "outside"), "offset %llu accepted: %s", (unsigned long long)bad[i], msg);
        free(b.p);
    }
    for (uint32_t nb = 0; nb <= 16; nb++) {   /* the offset field is exactly 8 bytes */
        b = make_shm_predict(c, offs, nb, -1, NULL);
        code = act_proto_parse_predict_shm(c, b.p, (uint32_t)b.n, &r, data, shm, size, msg, sizeof msg);
        CHECK(nb == 8 ? code == 0 : code == ACT_E_BAD_FRAME, "offset field of %u bytes: code %d (%s)", nb, code, msg);
        free(b.p);
    }
    /* raw and shared-memory cameras mix in one request */
    b = make_shm_predict(c, offs, 8, 1, raw);
    code = act_proto_parse_predict_shm(c, b.p, (uint32_t)b.n, &r, data, shm, size, msg, sizeof msg);
    CHECK(code == 0 && r.images[0] == shm + offs[0] && r.images[2] == shm + offs[2] && r.images[1] >= b.p &&
          r.images[1] + frame <= b.p + b.n && !memcmp(r.images[1], raw, frame), "raw + shm mix: %s", msg);
    free(b.p);
    /* mutated shared-memory requests: refused, or every frame lies inside the area or payload */
    int refused = 0;
    for (int it = 0; it < 5000; it++) {
        b = make_shm_predict(c, offs, 8, (int)(rnd() % 4) - 1, raw);
        if (rnd() & 1) {
            for (int j = 0; j < 1 + (int)(rnd() % 3); j++) b.p[rnd() % b.n] ^= (uint8_t)(1 + rnd() % 255);
        } else {
            uint32_t v = rnd() % 3 ? rnd() : (uint32_t)(size - frame + rnd() % 4);
            memcpy(b.p + rnd() % (b.n - 4), &v, 4);
        }
        code = act_proto_parse_predict_shm(c, b.p, (uint32_t)b.n, &r, data, shm, size, msg, sizeof msg);
        if (code) {
            refused++;
            CHECK(code >= ACT_E_MALFORMED && code <= ACT_E_BAD_SHM && msg[0], "shm mutation %d: code %d", it, code);
        } else {
            for (int k = 0; k < 3; k++)
                CHECK((r.images[k] >= shm && r.images[k] + frame <= shm + size) ||
                      (r.images[k] >= b.p && r.images[k] + frame <= b.p + b.n), "shm mutation %d: camera %d outside", it, k);
        }
        free(b.p);
    }
    CHECK(refused > 1000, "shm mutations: only %d refused", refused);
    free(data);
    free(shm);

    /* SHM_ATTACH: u64 size, exactly; SHM_OK echoes it */
    uint8_t att[9] = { 0 };
    uint64_t sz = 0, want = 590000;
    memcpy(att, &want, 8);
    CHECK(act_proto_parse_shm_attach(att, 8, &sz, msg, sizeof msg) == 0 && sz == want, "SHM_ATTACH: %s", msg);
    CHECK(act_proto_parse_shm_attach(att, 7, &sz, msg, sizeof msg) == ACT_E_MALFORMED, "SHM_ATTACH of 7 bytes");
    CHECK(act_proto_parse_shm_attach(att, 9, &sz, msg, sizeof msg) == ACT_E_MALFORMED, "SHM_ATTACH of 9 bytes");
    const uint64_t sizes[] = { 0, ACT_PROTO_SHM_MAX + 1, UINT64_MAX };
    for (int i = 0; i < 3; i++) {
        memcpy(att, &sizes[i], 8);
        CHECK(act_proto_parse_shm_attach(att, 8, &sz, msg, sizeof msg) == ACT_E_BAD_SHM, "SHM_ATTACH size %llu accepted",
              (unsigned long long)sizes[i]);
    }
    size_t n;
    act_frame_hdr fh;
    uint8_t *ok = act_proto_build_shm_ok(want, &n);
    CHECK(ok && n == ACT_PROTO_HDR + 8 && act_proto_parse_hdr(ok, &fh, msg, sizeof msg) == 0 && fh.type == ACT_MSG_SHM_OK &&
          !memcmp(ok + ACT_PROTO_HDR, &want, 8), "SHM_OK layout");
    free(ok);
    CHECK(!strcmp(act_err_code_name(ACT_E_BAD_SHM), "bad_shm"), "error name of bad_shm");
}

int main(void)
{
    act_config c = act_proto_test_config();
    test_roundtrip(&c);
    test_mutations(&c);
    test_header_hello_contract(&c);
    test_shm(&c);
    if (failures) {
        fprintf(stderr, "test_serve_protocol: %d failures\n", failures);
        return 1;
    }
    printf("test_serve_protocol: ok\n");
    return 0;
}
