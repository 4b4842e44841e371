/* protocol.c - encode and decode act-serve frames (format: docs/PROTOCOL.md, API: protocol.h).
 * A cursor reads little-endian fields and fails, never overreads, when the payload is short;
 * every decoder checks counts against ACT_MAX_CAMS and the model contract before using them. */
#define _POSIX_C_SOURCE 200809L
#include "protocol.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef ACT_WITH_ZSTD
#include <zstd.h>
#endif

static const char *const k_err_names[] = {
    "ok", "bad_magic", "bad_version", "too_large", "malformed", "bad_type", "no_hello",
    "contract", "bad_qpos", "bad_camera", "bad_frame", "bad_zstd", "bad_actions",
    "overloaded", "shutting_down", "internal", "bad_shm"
};

const char *act_err_code_name(int code)
{
    if (code < 0 || code >= (int)(sizeof k_err_names / sizeof k_err_names[0])) return "unknown";
    return k_err_names[code];
}

static int fail(char *msg, size_t msglen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msglen, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- little-endian cursor ---- */
typedef struct cursor { const uint8_t *p; size_t len, off; } cursor;

static int take(cursor *c, void *dst, size_t n)
{
    if (c->len - c->off < n) return -1;
    if (dst) memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}
static int get_u8(cursor *c, uint8_t *v) { return take(c, v, 1); }
static int get_u32(cursor *c, uint32_t *v)
{
    uint8_t b[4];
    if (take(c, b, 4)) return -1;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 0;
}
static int get_u64(cursor *c, uint64_t *v)
{
    uint32_t lo, hi;
    if (get_u32(c, &lo) || get_u32(c, &hi)) return -1;
    *v = (uint64_t)hi << 32 | lo;
    return 0;
}
/* A length-prefixed (u8) name into a NUL-terminated buffer of cap bytes. */
static int get_name(cursor *c, char *dst, size_t cap)
{
    uint8_t n;
    if (get_u8(c, &n) || (size_t)n >= cap || take(c, dst, n)) return -1;
    dst[n] = 0;
    for (int i = 0; i < n; i++)
        if (dst[i] < 0x20 || dst[i] > 0x7e) return -1;
    return 0;
}
/* Floats travel as IEEE-754 binary32 little-endian, which is the host layout on every target
 * this engine builds for (x86-64, aarch64). */
static int get_f32s(cursor *c, float *dst, size_t n) { return take(c, dst, n * sizeof(float)); }

/* ---- writer ---- */
typedef struct writer { uint8_t *p; size_t off; } writer;
static void put_u8(writer *w, uint8_t v) { w->p[w->off++] = v; }
static void put_u32(writer *w, uint32_t v)
{
    for (int i = 0; i < 4; i++) w->p[w->off++] = (uint8_t)(v >> (8 * i));
}
static void put_u64(writer *w, uint64_t v) { put_u32(w, (uint32_t)v); put_u32(w, (uint32_t)(v >> 32)); }
static void put_bytes(writer *w, const void *s, size_t n) { memcpy(w->p + w->off, s, n); w->off += n; }
static void put_name(writer *w, const char *s)
{
    size_t n = strlen(s);
    if (n > 255) n = 255;
    put_u8(w, (uint8_t)n);
    put_bytes(w, s, n);
}

void act_proto_put_hdr(uint8_t *dst, int type, uint32_t len)
{
    writer w = { dst, 0 };
    put_bytes(&w, ACT_PROTO_MAGIC, 4);
    w.p[w.off++] = (uint8_t)ACT_PROTO_VERSION;
    w.p[w.off++] = (uint8_t)(ACT_PROTO_VERSION >> 8);
    w.p[w.off++] = (uint8_t)type;
    w.p[w.off++] = (uint8_t)(type >> 8);
    put_u32(&w, len);
}

int act_proto_parse_hdr(const uint8_t hdr[ACT_PROTO_HDR], act_frame_hdr *out, char *msg, size_t msglen)
{
    if (memcmp(hdr, ACT_PROTO_MAGIC, 4) != 0)
        return fail(msg, msglen, ACT_E_BAD_MAGIC, "bad magic %02x%02x%02x%02x, expected \"ACTS\"",
                    hdr[0], hdr[1], hdr[2], hdr[3]);
    out->version = (uint16_t)(hdr[4] | hdr[5] << 8);
    out->type = (uint16_t)(hdr[6] | hdr[7] << 8);
    out->len = (uint32_t)hdr[8] | (uint32_t)hdr[9] << 8 | (uint32_t)hdr[10] << 16 | (uint32_t)hdr[11] << 24;
    if (out->version != ACT_PROTO_VERSION)
        return fail(msg, msglen, ACT_E_BAD_VERSION, "protocol version %u, this server speaks %u",
                    out->version, ACT_PROTO_VERSION);
    return 0;
}

/* Worst-case size of one camera frame on the wire: raw, or a zstd frame that did not compress. */
static uint64_t frame_bound(const act_config *c)
{
    uint64_t raw = (uint64_t)c->image_h * c->image_w * 3;
#ifdef ACT_WITH_ZSTD
    return ZSTD_compressBound((size_t)raw);
#else
    return raw;
#endif
}

uint32_t act_proto_max_payload(const act_config *c, int type, int handshaken)
{
    if (type != ACT_MSG_PREDICT) return ACT_PROTO_HELLO_MAX;
    if (!handshaken) return 0;
    uint64_t n = 8 + 4 + 4 + 4ull * c->obs_dim + 4;
    n += (uint64_t)c->num_cams * (1 + 255 + 1 + 12 + frame_bound(c));
    n += 4 + 4 + 4ull * c->pred_horizon * c->action_dim + c->pred_horizon + 8;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* ---- HELLO / contract ---- */
int act_proto_parse_hello(const uint8_t *p, uint32_t len, act_hello *h, char *msg, size_t msglen)
{
    cursor c = { p, len, 0 };
    uint32_t ncams;
    memset(h, 0, sizeof *h);
    if (get_u32(&c, &h->obs_dim) || get_u32(&c, &h->action_dim) || get_u32(&c, &h->image_h) ||
        get_u32(&c, &h->image_w) || get_u32(&c, &ncams))
        return fail(msg, msglen, ACT_E_MALFORMED, "HELLO: payload of %u bytes is truncated", len);
    if (ncams > ACT_MAX_CAMS)
        return fail(msg, msglen, ACT_E_MALFORMED, "HELLO: %u cameras declared, at most %d",
                    ncams, ACT_MAX_CAMS);
    h->num_cams = (int)ncams;
    for (int i = 0; i < h->num_cams; i++)
        if (get_name(&c, h->camera_names[i], ACT_NAME_LEN))
            return fail(msg, msglen, ACT_E_MALFORMED,
                        "HELLO: camera name %d is truncated, longer than %d bytes or not printable",
                        i, ACT_NAME_LEN - 1);
    if (get_name(&c, h->client_name, sizeof h->client_name))
        return fail(msg, msglen, ACT_E_MALFORMED, "HELLO: client name is truncated or not printable");
    if (c.off != c.len)
        return fail(msg, msglen, ACT_E_MALFORMED, "HELLO: %zu trailing bytes", c.len - c.off);
    return 0;
}

static void join_names(const char names[][ACT_NAME_LEN], int n, char *dst, size_t cap)
{
    size_t off = 0;
    dst[0] = 0;
    for (int i = 0; i < n && off < cap; i++)
        off += (size_t)snprintf(dst + off, cap - off, "%s%s", i ? "," : "", names[i]);
}

int act_proto_check_contract(const act_config *c, const act_hello *h, char *msg, size_t msglen)
{
    if (h->obs_dim && h->obs_dim != (uint32_t)c->obs_dim)
        return fail(msg, msglen, ACT_E_CONTRACT, "contract: client expects obs_dim %u, model has %d",
                    h->obs_dim, c->obs_dim);
    if (h->action_dim && h->action_dim != (uint32_t)c->action_dim)
        return fail(msg, msglen, ACT_E_CONTRACT, "contract: client expects action_dim %u, model has %d",
                    h->action_dim, c->action_dim);
    if ((h->image_h && h->image_h != (uint32_t)c->image_h) || (h->image_w && h->image_w != (uint32_t)c->image_w))
        return fail(msg, msglen, ACT_E_CONTRACT, "contract: client sends %ux%u frames, model expects %dx%d",
                    h->image_h, h->image_w, c->image_h, c->image_w);
    if (h->num_cams) {
        int same = h->num_cams == c->num_cams;
        for (int i = 0; same && i < c->num_cams; i++)
            same = strcmp(h->camera_names[i], c->camera_names[i]) == 0;
        if (!same) {
            char want[ACT_MAX_CAMS * ACT_NAME_LEN], have[ACT_MAX_CAMS * ACT_NAME_LEN];
            join_names(h->camera_names, h->num_cams, want, sizeof want);
            join_names(c->camera_names, c->num_cams, have, sizeof have);
            return fail(msg, msglen, ACT_E_CONTRACT, "contract: client cameras [%s], model cameras [%s] (order matters)",
                        want, have);
        }
    }
    return 0;
}

/* ---- builders ---- */
static uint8_t *frame_alloc(int type, size_t payload, writer *w, size_t *n)
{
    uint8_t *p = malloc(ACT_PROTO_HDR + payload);
    if (!p) return NULL;
    act_proto_put_hdr(p, type, (uint32_t)payload);
    w->p = p;
    w->off = ACT_PROTO_HDR;
    *n = ACT_PROTO_HDR + payload;
    return p;
}

uint8_t *act_proto_build_info(const act_config *c, int max_batch, const char *device, size_t *n)
{
    writer w;
    size_t payload = 10 * 4 + 16 + 2 * 256;
    for (int i = 0; i < c->num_cams; i++) payload += 1 + strlen(c->camera_names[i]);
    if (!frame_alloc(ACT_MSG_INFO, payload, &w, n)) return NULL;
    put_u32(&w, (uint32_t)c->obs_dim);
    put_u32(&w, (uint32_t)c->action_dim);
    put_u32(&w, (uint32_t)c->pred_horizon);
    put_u32(&w, (uint32_t)c->num_action_steps);
    put_u32(&w, (uint32_t)c->obs_horizon);
    put_u32(&w, (uint32_t)c->image_h);
    put_u32(&w, (uint32_t)c->image_w);
    put_u32(&w, (uint32_t)max_batch);
#ifdef ACT_WITH_ZSTD
    put_u32(&w, ACT_INFO_ZSTD | ACT_INFO_MORE);
#else
    put_u32(&w, ACT_INFO_MORE);
#endif
    put_u32(&w, (uint32_t)c->num_cams);
    for (int i = 0; i < c->num_cams; i++) put_name(&w, c->camera_names[i]);
    char hash[16];
    memset(hash, '0', sizeof hash);
    memcpy(hash, c->model_hash, strnlen(c->model_hash, sizeof hash));
    put_bytes(&w, hash, 16);
    put_name(&w, ACT_VERSION);
    put_name(&w, device ? device : "");
    /* the payload was sized for the longest strings: shrink the length field to what was written */
    act_proto_put_hdr(w.p, ACT_MSG_INFO, (uint32_t)(w.off - ACT_PROTO_HDR));
    *n = w.off;
    return w.p;
}

uint8_t *act_proto_build_error(uint64_t request_id, int code, const char *message, size_t *n)
{
    writer w;
    size_t len = strnlen(message, ACT_PROTO_MSG_MAX);
    if (!frame_alloc(ACT_MSG_ERROR, 16 + len, &w, n)) return NULL;
    put_u64(&w, request_id);
    put_u32(&w, (uint32_t)code);
    put_u32(&w, (uint32_t)len);
    put_bytes(&w, message, len);
    return w.p;
}

uint8_t *act_proto_build_pong(uint64_t nonce, size_t *n)
{
    writer w;
    if (!frame_alloc(ACT_MSG_PONG, 8, &w, n)) return NULL;
    put_u64(&w, nonce);
    return w.p;
}

int act_proto_parse_shm_attach(const uint8_t *p, uint32_t len, uint64_t *size, char *msg, size_t msglen)
{
    cursor c = { p, len, 0 };
    if (len != 8 || get_u64(&c, size))
        return fail(msg, msglen, ACT_E_MALFORMED, "SHM_ATTACH: payload must be 8 bytes (u64 size), got %u", len);
    if (*size == 0 || *size > ACT_PROTO_SHM_MAX)
        return fail(msg, msglen, ACT_E_BAD_SHM, "SHM_ATTACH: size %llu is outside 1..%llu bytes",
                    (unsigned long long)*size, (unsigned long long)ACT_PROTO_SHM_MAX);
    return 0;
}

uint8_t *act_proto_build_shm_ok(uint64_t size, size_t *n)
{
    writer w;
    if (!frame_alloc(ACT_MSG_SHM_OK, 8, &w, n)) return NULL;
    put_u64(&w, size);
    return w.p;
}

uint8_t *act_proto_build_result(const act_result_hdr *r, const float *chunk, int horizon,
                                int action_dim, size_t *n)
{
    writer w;
    size_t nf = (size_t)horizon * action_dim;
    if (!frame_alloc(ACT_MSG_RESULT, 8 + 4 * 7 + 4 * nf, &w, n)) return NULL;
    put_u64(&w, r->request_id);
    put_u32(&w, r->flags);
    put_u32(&w, r->batch);
    put_u32(&w, r->queue_us);
    put_u32(&w, r->infer_us);
    uint32_t klbits;
    memcpy(&klbits, &r->kl, 4);
    put_u32(&w, klbits);
    put_u32(&w, (uint32_t)horizon);
    put_u32(&w, (uint32_t)action_dim);
    put_bytes(&w, chunk, 4 * nf);
    return w.p;
}

/* ---- PREDICT ---- */
static int finite_all(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* The shared memory a connection attached (SHM_ATTACH); p NULL = none. */
typedef struct shm_area { const uint8_t *p; uint64_t size; } shm_area;

/* dst: where the frame goes; with view set, a raw or shared-memory frame is not copied there
 * but *viewp is pointed at it inside the payload or the shared memory. */
static int read_camera(const act_config *cfg, cursor *c, int i, uint8_t *dst, uint8_t **viewp, const shm_area *shm,
                       char *msg, size_t msglen)
{
    char name[256];
    uint8_t enc;
    uint32_t h, w, nbytes;
    if (get_name(c, name, sizeof name) || get_u8(c, &enc) || get_u32(c, &h) || get_u32(c, &w) ||
        get_u32(c, &nbytes))
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: camera %d header is truncated or its name is not printable", i);
    if (strcmp(name, cfg->camera_names[i]) != 0) {
        for (int j = 0; j < cfg->num_cams; j++)
            if (strcmp(name, cfg->camera_names[j]) == 0)
                return fail(msg, msglen, ACT_E_BAD_CAMERA,
                            "PREDICT: camera %d is '%s', expected '%s' (cameras go in model order)",
                            i, name, cfg->camera_names[i]);
        return fail(msg, msglen, ACT_E_BAD_CAMERA, "PREDICT: unknown camera '%s' at position %d, expected '%s'",
                    name, i, cfg->camera_names[i]);
    }
    if (h != (uint32_t)cfg->image_h || w != (uint32_t)cfg->image_w)
        return fail(msg, msglen, ACT_E_BAD_FRAME, "PREDICT: camera '%s' frame is %ux%u, model expects %dx%d (uint8 HWC)",
                    name, h, w, cfg->image_h, cfg->image_w);
    size_t raw = (size_t)cfg->image_h * cfg->image_w * 3;
    if (c->len - c->off < nbytes)
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: camera '%s' declares %u bytes, %zu remain",
                    name, nbytes, c->len - c->off);
    const uint8_t *src = c->p + c->off;
    c->off += nbytes;
    if (enc == ACT_ENC_RAW) {
        if (nbytes != raw)
            return fail(msg, msglen, ACT_E_BAD_FRAME, "PREDICT: camera '%s' raw frame has %u bytes, expected %zu (%dx%dx3)",
                        name, nbytes, raw, cfg->image_h, cfg->image_w);
        if (viewp) *viewp = (uint8_t *)src;
        else memcpy(dst, src, raw);
        return 0;
    }
    if (enc == ACT_ENC_SHM) {
        /* the pixels stay where the client wrote them; only their offset travels */
        uint64_t off = 0;
        if (nbytes != 8)
            return fail(msg, msglen, ACT_E_BAD_FRAME, "PREDICT: camera '%s' shared-memory frame carries %u bytes, expected an 8-byte offset",
                        name, nbytes);
        for (int k = 0; k < 8; k++) off |= (uint64_t)src[k] << (8 * k);
        if (!shm || !shm->p)
            return fail(msg, msglen, ACT_E_BAD_SHM, "PREDICT: camera '%s' is in shared memory, but this connection has none "
                        "attached (send SHM_ATTACH over the Unix socket first)", name);
        if (off > shm->size || shm->size - off < raw)
            return fail(msg, msglen, ACT_E_BAD_SHM, "PREDICT: camera '%s' frame at offset %llu (+%zu bytes) lies outside the %llu-byte shared memory",
                        name, (unsigned long long)off, raw, (unsigned long long)shm->size);
        if (viewp) *viewp = (uint8_t *)shm->p + off;
        else memcpy(dst, shm->p + off, raw);
        return 0;
    }
    if (enc != ACT_ENC_ZSTD)
        return fail(msg, msglen, ACT_E_BAD_FRAME, "PREDICT: camera '%s' has encoding %u, expected 0 (raw), 1 (zstd) or 2 (shared memory)",
                    name, enc);
#ifdef ACT_WITH_ZSTD
    unsigned long long content = ZSTD_getFrameContentSize(src, nbytes);
    if (content == ZSTD_CONTENTSIZE_ERROR)
        return fail(msg, msglen, ACT_E_BAD_ZSTD, "PREDICT: camera '%s' is not a zstd frame", name);
    if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != raw)
        return fail(msg, msglen, ACT_E_BAD_FRAME, "PREDICT: camera '%s' zstd frame inflates to %llu bytes, expected %zu",
                    name, content, raw);
    /* one frame per camera: anything after it (a second frame, skippable ones) is refused by
     * name, not by the decompressor's "destination buffer is too small" */
    size_t one = ZSTD_findFrameCompressedSize(src, nbytes);
    if (!ZSTD_isError(one) && one < nbytes)
        return fail(msg, msglen, ACT_E_BAD_ZSTD, "PREDICT: camera '%s' carries %zu bytes after its zstd frame of %zu "
                    "(one zstd frame per camera)", name, nbytes - one, one);
    size_t got = ZSTD_decompress(dst, raw, src, nbytes);
    if (ZSTD_isError(got))
        return fail(msg, msglen, ACT_E_BAD_ZSTD, "PREDICT: camera '%s' zstd frame is corrupt: %s",
                    name, ZSTD_getErrorName(got));
    if (got != raw)
        return fail(msg, msglen, ACT_E_BAD_FRAME, "PREDICT: camera '%s' zstd frame inflates to %zu bytes, expected %zu",
                    name, got, raw);
    return 0;
#else
    return fail(msg, msglen, ACT_E_BAD_ZSTD, "PREDICT: camera '%s' is zstd-compressed, but this server was built without zstd", name);
#endif
}

size_t act_proto_predict_bytes(const act_config *c)
{
    size_t na = (size_t)c->pred_horizon * c->action_dim;
    return 4 * (size_t)c->obs_dim + 4 * na + (size_t)c->num_cams * c->image_h * c->image_w * 3 + (size_t)c->pred_horizon;
}

static int parse_predict(const act_config *cfg, const uint8_t *p, uint32_t len, act_predict *out,
                         void *buf, int view, const shm_area *shm, char *msg, size_t msglen)
{
    cursor c = { p, len, 0 };
    uint32_t obs_dim, ncams;
    memset(out, 0, sizeof *out);
    if (get_u64(&c, &out->request_id)) {
        out->request_id = 0;
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: payload of %u bytes is truncated", len);
    }
    if (get_u32(&c, &out->flags) || get_u32(&c, &obs_dim))
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: payload of %u bytes is truncated", len);
    if (out->flags & ~(ACT_PREDICT_HAS_ACTIONS | ACT_PREDICT_SAMPLE_LATENT | ACT_PREDICT_MORE))
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: unknown flags 0x%x", out->flags);
    if (obs_dim != (uint32_t)cfg->obs_dim)
        return fail(msg, msglen, ACT_E_BAD_QPOS, "PREDICT: qpos has %u values, model expects obs_dim %d",
                    obs_dim, cfg->obs_dim);

    /* layout: qpos | actions | frames | is_pad, floats first so every float is aligned */
    size_t frame = (size_t)cfg->image_h * cfg->image_w * 3;
    size_t na = (size_t)cfg->pred_horizon * cfg->action_dim;
    int has_actions = (out->flags & ACT_PREDICT_HAS_ACTIONS) != 0;
    size_t qbytes = 4 * (size_t)cfg->obs_dim, abytes = 4 * na;
    uint8_t *data = buf;
    out->qpos = (float *)data;
    if (has_actions) out->actions = (float *)(data + qbytes);
    for (int i = 0; i < cfg->num_cams; i++) out->images[i] = data + qbytes + abytes + (size_t)i * frame;
    if (has_actions) out->is_pad = data + qbytes + abytes + (size_t)cfg->num_cams * frame;

    if (get_f32s(&c, out->qpos, (size_t)cfg->obs_dim))
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: qpos is truncated");
    if (!finite_all(out->qpos, (size_t)cfg->obs_dim))
        return fail(msg, msglen, ACT_E_BAD_QPOS, "PREDICT: qpos holds NaN or Inf");
    if (get_u32(&c, &ncams))
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: camera count is truncated");
    if (ncams != (uint32_t)cfg->num_cams) {
        char have[ACT_MAX_CAMS * ACT_NAME_LEN];
        join_names(cfg->camera_names, cfg->num_cams, have, sizeof have);
        return fail(msg, msglen, ACT_E_BAD_CAMERA, "PREDICT: %u cameras sent, model expects %d [%s]",
                    ncams, cfg->num_cams, have);
    }
    for (int i = 0; i < cfg->num_cams; i++) {
        int rc = read_camera(cfg, &c, i, out->images[i], view ? &out->images[i] : NULL, shm, msg, msglen);
        if (rc) return rc;
    }
    if (has_actions) {
        uint32_t hh, aa;
        if (get_u32(&c, &hh) || get_u32(&c, &aa))
            return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: action chunk header is truncated");
        if (hh != (uint32_t)cfg->pred_horizon || aa != (uint32_t)cfg->action_dim)
            return fail(msg, msglen, ACT_E_BAD_ACTIONS, "PREDICT: action chunk is [%u,%u], model expects [%d,%d]",
                        hh, aa, cfg->pred_horizon, cfg->action_dim);
        if (get_f32s(&c, out->actions, na) || take(&c, out->is_pad, (size_t)cfg->pred_horizon) ||
            get_u64(&c, &out->seed))
            return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: action chunk is truncated");
        if (!finite_all(out->actions, na))
            return fail(msg, msglen, ACT_E_BAD_ACTIONS, "PREDICT: action chunk holds NaN or Inf");
        for (int t = 0; t < cfg->pred_horizon; t++)
            if (out->is_pad[t] > 1)
                return fail(msg, msglen, ACT_E_BAD_ACTIONS, "PREDICT: is_pad[%d] = %u, expected 0 or 1", t, out->is_pad[t]);
    } else if (out->flags & ACT_PREDICT_SAMPLE_LATENT)
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: sample_latent needs an action chunk (posterior path)");
    if (c.off != c.len)
        return fail(msg, msglen, ACT_E_MALFORMED, "PREDICT: %zu trailing bytes after the last field", c.len - c.off);
    return 0;
}

int act_proto_parse_predict(const act_config *cfg, const uint8_t *p, uint32_t len, act_predict *out,
                            void *data, char *msg, size_t msglen)
{
    return parse_predict(cfg, p, len, out, data, 0, NULL, msg, msglen);
}

int act_proto_parse_predict_view(const act_config *cfg, uint8_t *p, uint32_t len, act_predict *out,
                                 void *data, char *msg, size_t msglen)
{
    return parse_predict(cfg, p, len, out, data, 1, NULL, msg, msglen);
}

int act_proto_parse_predict_shm(const act_config *cfg, uint8_t *p, uint32_t len, act_predict *out,
                                void *data, const uint8_t *shm, uint64_t shm_size, char *msg, size_t msglen)
{
    shm_area a = { shm, shm_size };
    return parse_predict(cfg, p, len, out, data, 1, &a, msg, msglen);
}
