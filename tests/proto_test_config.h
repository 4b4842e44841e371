/* proto_test_config.h - the model contract the wire-codec tests speak (test_serve_protocol.c,
 * fuzz/fuzz_protocol.c): three cameras of 8x6 pixels, qpos 5, chunks of 6 x 4. Small, so that
 * whole PREDICT payloads are a few hundred bytes; only act_config matters, no weights. */
#ifndef ACT_PROTO_TEST_CONFIG_H
#define ACT_PROTO_TEST_CONFIG_H

#include <string.h>
#include "act.h"

static inline act_config act_proto_test_config(void)
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
    c.obs_horizon = 1;
    c.num_action_steps = 1;
    strcpy(c.model_hash, "0123456789abcdef");
    return c;
}

#endif
