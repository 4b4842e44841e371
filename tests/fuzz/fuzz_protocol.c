/* fuzz_protocol.c - the act-serve wire codec (engine/protocol.c) on hostile bytes.
 *
 * Input: byte 0 picks the decoder (header, HELLO + contract, PREDICT copying, PREDICT viewing;
 * with bit 7 set, HELLO becomes SHM_ATTACH and the viewing PREDICT gets a shared-memory area),
 * byte 1 the model contract (three cameras of 8x6, or one camera of 4x4 and larger dims), the
 * rest is the frame header or payload exactly as a peer would send it, copied into a buffer of
 * its exact size so the sanitizers see any overread. PREDICT decodes into a buffer of exactly
 * act_proto_predict_bytes, as the server's recycled buffers are. What an accepted PREDICT must
 * satisfy is checked: every pointer inside its buffer (or, viewing, inside the payload), finite
 * qpos and actions, is_pad in {0, 1}; every refusal carries a known code and a message. */
#include "fuzz.h"

#include <math.h>
#include <string.h>

#include "../proto_test_config.h"
#include "protocol.h"

/* 0: the codec tests' contract; 1: one camera of 4x4 with larger dims and a long name */
static act_config contract(int which)
{
    act_config c = act_proto_test_config();
    if (which == 1) {
        c.obs_dim = 16;
        c.action_dim = 16;
        c.pred_horizon = 16;
        c.num_cams = 1;
        strcpy(c.camera_names[0], "a_camera_name_of_31_characters_");
        c.image_h = 4;
        c.image_w = 4;
    }
    return c;
}

/* frames are summed into it so every byte of an accepted frame is read */
static volatile unsigned g_sink;

static void check_refusal(int code, const char *msg, int lo)
{
    FUZZ_ASSERT(code >= lo && code <= ACT_E_BAD_SHM, "refused with code %d", code);
    FUZZ_ASSERT(msg[0] != 0, "code %d (%s) without a message", code, act_err_code_name(code));
    /* the server sends the message back: it must build */
    size_t n;
    uint8_t *e = act_proto_build_error(1, code, msg, &n);
    FUZZ_ASSERT(e && n >= ACT_PROTO_HDR + 16, "error frame did not build");
    free(e);
}

static int inside(const void *p, size_t n, const void *base, size_t len)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;   /* integers: p may lie in another object */
    return a >= b && n <= len && a - b <= len - n;
}

/* view 2: the viewing parse of a connection with shared memory attached (an area of exactly
 * two frames and 5 bytes, so offsets near its end are refused or read to its last byte) */
static void fuzz_predict(const act_config *c, uint8_t *p, uint32_t len, int view)
{
    size_t bytes = act_proto_predict_bytes(c), frame = (size_t)c->image_h * c->image_w * 3;
    size_t shm_len = 2 * frame + 5;
    uint8_t *shm = view == 2 ? malloc(shm_len) : NULL;
    if (shm) memset(shm, 7, shm_len);
    void *data = malloc(bytes);
    char msg[512] = "";
    act_predict r;
    int code = view == 2 ? act_proto_parse_predict_shm(c, p, len, &r, data, shm, shm_len, msg, sizeof msg)
             : view ? act_proto_parse_predict_view(c, p, len, &r, data, msg, sizeof msg)
                    : act_proto_parse_predict(c, p, len, &r, data, msg, sizeof msg);
    if (code) {
        check_refusal(code, msg, ACT_E_MALFORMED);
        free(data);
        free(shm);
        return;
    }
    FUZZ_ASSERT(len <= act_proto_max_payload(c, ACT_MSG_PREDICT, 1), "accepted %u bytes above the limit", len);
    size_t na = (size_t)c->pred_horizon * c->action_dim;
    FUZZ_ASSERT(inside(r.qpos, 4 * (size_t)c->obs_dim, data, bytes), "qpos outside the buffer");
    for (int i = 0; i < c->obs_dim; i++) FUZZ_ASSERT(isfinite(r.qpos[i]), "accepted qpos[%d] = %g", i, r.qpos[i]);
    unsigned sum = 0;
    for (int k = 0; k < c->num_cams; k++) {
        FUZZ_ASSERT(inside(r.images[k], frame, data, bytes) || (view && inside(r.images[k], frame, p, len)) ||
                        (shm && inside(r.images[k], frame, shm, shm_len)),
                    "camera %d frame outside the buffer, the payload and the shared memory", k);
        for (size_t i = 0; i < frame; i++) sum += r.images[k][i];   /* every byte readable */
    }
    FUZZ_ASSERT(!(r.flags & ACT_PREDICT_SAMPLE_LATENT) || r.actions, "sample_latent accepted without actions");
    if (r.flags & ACT_PREDICT_HAS_ACTIONS) {
        FUZZ_ASSERT(r.actions && r.is_pad, "HAS_ACTIONS accepted without the chunk");
        FUZZ_ASSERT(inside(r.actions, 4 * na, data, bytes) && inside(r.is_pad, (size_t)c->pred_horizon, data, bytes),
                    "action chunk outside the buffer");
        for (size_t i = 0; i < na; i++) FUZZ_ASSERT(isfinite(r.actions[i]), "accepted a non-finite action");
        for (int t = 0; t < c->pred_horizon; t++) FUZZ_ASSERT(r.is_pad[t] <= 1, "accepted is_pad %u", r.is_pad[t]);
    } else {
        FUZZ_ASSERT(!r.actions && !r.is_pad, "action chunk set without HAS_ACTIONS");
    }
    g_sink = sum;
    /* the reply the server would send for it */
    act_result_hdr h = { r.request_id, 0, 1, 0, 0, NAN };
    float *chunk = calloc(na, sizeof(float));
    size_t n;
    uint8_t *res = act_proto_build_result(&h, chunk, c->pred_horizon, c->action_dim, &n);
    FUZZ_ASSERT(res && n == ACT_PROTO_HDR + 36 + 4 * na, "result frame of %zu bytes", n);
    free(res);
    free(chunk);
    free(data);
    free(shm);
}

static void fuzz_shm_attach(const uint8_t *p, uint32_t len)
{
    uint64_t size = 0;
    char msg[512] = "";
    int code = act_proto_parse_shm_attach(p, len, &size, msg, sizeof msg);
    if (code) {
        check_refusal(code, msg, ACT_E_MALFORMED);
        return;
    }
    FUZZ_ASSERT(len == 8 && size >= 1 && size <= ACT_PROTO_SHM_MAX, "accepted %u bytes, size %llu", len,
                (unsigned long long)size);
    size_t n;
    uint8_t *ok = act_proto_build_shm_ok(size, &n);
    FUZZ_ASSERT(ok && n == ACT_PROTO_HDR + 8, "SHM_OK of %zu bytes", n);
    free(ok);
}

static void fuzz_hello(const act_config *c, const uint8_t *p, uint32_t len)
{
    act_hello h;
    char msg[512] = "";
    int code = act_proto_parse_hello(p, len, &h, msg, sizeof msg);
    if (code) {
        check_refusal(code, msg, ACT_E_MALFORMED);
        return;
    }
    FUZZ_ASSERT(h.num_cams >= 0 && h.num_cams <= ACT_MAX_CAMS, "num_cams %d", h.num_cams);
    for (int i = 0; i < h.num_cams; i++)
        FUZZ_ASSERT(memchr(h.camera_names[i], 0, ACT_NAME_LEN), "camera name %d is not terminated", i);
    FUZZ_ASSERT(memchr(h.client_name, 0, sizeof h.client_name), "client name is not terminated");
    code = act_proto_check_contract(c, &h, msg, sizeof msg);
    if (code) {
        FUZZ_ASSERT(code == ACT_E_CONTRACT, "contract refused with code %d", code);
        check_refusal(code, msg, ACT_E_CONTRACT);
        return;
    }
    size_t n;
    uint8_t *info = act_proto_build_info(c, 8, h.client_name, &n);
    FUZZ_ASSERT(info && n > ACT_PROTO_HDR, "INFO did not build");
    free(info);
}

static void fuzz_hdr(const act_config *c, const uint8_t *p, size_t len)
{
    if (len < ACT_PROTO_HDR) return;
    act_frame_hdr h;
    char msg[512] = "";
    int code = act_proto_parse_hdr(p, &h, msg, sizeof msg);
    if (code) {
        FUZZ_ASSERT(code == ACT_E_BAD_MAGIC || code == ACT_E_BAD_VERSION, "header refused with code %d", code);
        check_refusal(code, msg, ACT_E_BAD_MAGIC);
        return;
    }
    FUZZ_ASSERT(h.version == ACT_PROTO_VERSION, "accepted version %u", h.version);
    for (int hs = 0; hs < 2; hs++) {
        uint32_t max = act_proto_max_payload(c, h.type, hs);
        FUZZ_ASSERT(h.type == ACT_MSG_PREDICT ? (hs ? max > 0 : max == 0) : max == ACT_PROTO_HELLO_MAX,
                    "type %u handshaken %d: limit %u", h.type, hs, max);
    }
}

int act_fuzz_protocol(const uint8_t *data, size_t size)
{
    if (size < 2 || size - 2 > UINT32_MAX) return 0;
    int mode = data[0] % 4, shm = (data[0] & 0x80) != 0;
    act_config c = contract(data[1] % 2);
    size_t len = size - 2;
    uint8_t *p = malloc(len ? len : 1);   /* exact size: the sanitizers see any overread */
    memcpy(p, data + 2, len);
    if (mode == 0) fuzz_hdr(&c, p, len);
    else if (mode == 1 && shm) fuzz_shm_attach(p, (uint32_t)len);
    else if (mode == 1) fuzz_hello(&c, p, (uint32_t)len);
    else fuzz_predict(&c, p, (uint32_t)len, mode == 3 ? 1 + shm : 0);
    free(p);
    return 0;
}
