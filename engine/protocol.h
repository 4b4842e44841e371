/* protocol.h - the act-serve wire format (docs/PROTOCOL.md): frames, messages, limits.
 * defines: act_frame_hdr, act_msg_type, act_err_code, act_proto_* encoders and decoders
 *
 * Every message is one frame: a 12-byte header (magic "ACTS", u16 version, u16 type, u32
 * payload length) and a little-endian payload. This file is pure: it parses and builds byte
 * buffers and never touches a socket, so each rule can be tested on its own. Decoders check
 * every length against the bytes present and against the model contract, and report the first
 * violation as (code, message); nothing is allocated from a length the peer sent until that
 * length has been checked against a limit derived from the model.
 */
#ifndef ACT_PROTOCOL_H
#define ACT_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>
#include "act.h"

#define ACT_PROTO_MAGIC "ACTS"
#define ACT_PROTO_VERSION 1u
#define ACT_PROTO_HDR 12u
#define ACT_PROTO_HELLO_MAX 4096u     /* HELLO/PING payloads before a contract is agreed */
#define ACT_PROTO_MSG_MAX 1024u       /* longest ERROR message */

typedef enum {
    ACT_MSG_HELLO = 1, ACT_MSG_INFO = 2, ACT_MSG_PREDICT = 3, ACT_MSG_RESULT = 4,
    ACT_MSG_ERROR = 5, ACT_MSG_PING = 6, ACT_MSG_PONG = 7,
    ACT_MSG_SHM_ATTACH = 8, ACT_MSG_SHM_OK = 9   /* Unix-socket connections only */
} act_msg_type;

/* ERROR codes. Framing errors (1-3) close the connection after the reply: the stream cannot be
 * resynchronized. The others answer one message and keep the connection. */
typedef enum {
    ACT_E_BAD_MAGIC = 1, ACT_E_BAD_VERSION = 2, ACT_E_TOO_LARGE = 3,
    ACT_E_MALFORMED = 4, ACT_E_BAD_TYPE = 5, ACT_E_NO_HELLO = 6, ACT_E_CONTRACT = 7,
    ACT_E_BAD_QPOS = 8, ACT_E_BAD_CAMERA = 9, ACT_E_BAD_FRAME = 10, ACT_E_BAD_ZSTD = 11,
    ACT_E_BAD_ACTIONS = 12, ACT_E_OVERLOADED = 13, ACT_E_SHUTTING_DOWN = 14, ACT_E_INTERNAL = 15,
    ACT_E_BAD_SHM = 16
} act_err_code;
const char *act_err_code_name(int code);   /* "bad_magic", ... (metrics labels, audit log) */

#define ACT_PREDICT_HAS_ACTIONS 1u         /* PREDICT flags */
#define ACT_PREDICT_SAMPLE_LATENT 2u
#define ACT_PREDICT_MORE 4u                /* more PREDICTs follow at once on this connection */
#define ACT_RESULT_POSTERIOR 1u            /* RESULT flags */
#define ACT_INFO_ZSTD 1u                   /* INFO flags: the server accepts zstd frames */
#define ACT_INFO_MORE 2u                   /* ... and PREDICT's ACT_PREDICT_MORE */
#define ACT_ENC_RAW 0u                     /* per-camera frame encoding */
#define ACT_ENC_ZSTD 1u
#define ACT_ENC_SHM 2u                     /* u64 offset into the connection's shared memory */
#define ACT_PROTO_SHM_MAX (1ull << 32)     /* largest shared-memory area one connection attaches */

typedef struct act_frame_hdr { uint16_t version, type; uint32_t len; } act_frame_hdr;

/* Parses a 12-byte header. Returns 0, or an error code with a message in msg. max_len is the
 * largest payload this type may have on this connection (act_proto_max_payload). */
int act_proto_parse_hdr(const uint8_t hdr[ACT_PROTO_HDR], act_frame_hdr *out, char *msg, size_t msglen);
uint32_t act_proto_max_payload(const act_config *c, int type, int handshaken);
void act_proto_put_hdr(uint8_t *dst, int type, uint32_t len);

/* HELLO: what the client expects; 0 / no cameras = accept the server's value. */
typedef struct act_hello {
    uint32_t obs_dim, action_dim, image_h, image_w;
    int num_cams;
    char camera_names[ACT_MAX_CAMS][ACT_NAME_LEN];
    char client_name[256];   /* a name: up to 255 printable bytes */
} act_hello;
int act_proto_parse_hello(const uint8_t *p, uint32_t len, act_hello *h, char *msg, size_t msglen);
int act_proto_check_contract(const act_config *c, const act_hello *h, char *msg, size_t msglen);

/* Builders return a malloc'd frame (header included) and its size in *n, or NULL. */
uint8_t *act_proto_build_info(const act_config *c, int max_batch, const char *device, size_t *n);
uint8_t *act_proto_build_error(uint64_t request_id, int code, const char *message, size_t *n);
uint8_t *act_proto_build_pong(uint64_t nonce, size_t *n);

/* SHM_ATTACH: u64 size, the bytes of the memfd that came with it (SCM_RIGHTS) to map. */
int act_proto_parse_shm_attach(const uint8_t *p, uint32_t len, uint64_t *size, char *msg, size_t msglen);
uint8_t *act_proto_build_shm_ok(uint64_t size, size_t *n);

typedef struct act_result_hdr {
    uint64_t request_id;
    uint32_t flags, batch, queue_us, infer_us;
    float kl;                              /* posterior only; NaN otherwise */
} act_result_hdr;
uint8_t *act_proto_build_result(const act_result_hdr *r, const float *chunk, int horizon,
                                int action_dim, size_t *n);

/* A decoded PREDICT: qpos, every camera's raw HWC frame in config order, the optional action
 * chunk - all inside a buffer the caller owns, sized from the model contract alone
 * (act_proto_predict_bytes), never from the peer's numbers, so a server can recycle them. */
typedef struct act_predict {
    uint64_t request_id;
    uint32_t flags;
    uint64_t seed;
    float *qpos;                           /* [obs_dim] */
    uint8_t *images[ACT_MAX_CAMS];         /* [image_h][image_w][3] each */
    float *actions;                        /* [pred_horizon][action_dim] or NULL */
    uint8_t *is_pad;                       /* [pred_horizon] or NULL */
} act_predict;

size_t act_proto_predict_bytes(const act_config *c);
/* Decodes and validates a PREDICT payload against the contract into data (act_proto_predict_bytes
 * bytes, 4-byte aligned); zstd frames are inflated (refused when the build has no zstd). On
 * error returns the code and writes msg; out->request_id is set when it could be read. */
int act_proto_parse_predict(const act_config *c, const uint8_t *p, uint32_t len, act_predict *out,
                            void *data, char *msg, size_t msglen);
/* The same, but raw frames are not copied: out->images point into p, which must then outlive
 * the request (the server hands the receive buffer to the request instead of copying ~590 KB). */
int act_proto_parse_predict_view(const act_config *c, uint8_t *p, uint32_t len, act_predict *out,
                                 void *data, char *msg, size_t msglen);
/* The view parse on a connection with shared memory attached (shm, shm_size; NULL, 0 = none):
 * a frame with encoding ACT_ENC_SHM carries a u64 offset, and out->images points at shm + offset
 * once the whole frame is checked to lie inside the area. Other parses refuse such frames. */
int act_proto_parse_predict_shm(const act_config *c, uint8_t *p, uint32_t len, act_predict *out,
                                void *data, const uint8_t *shm, uint64_t shm_size, char *msg, size_t msglen);

#endif
