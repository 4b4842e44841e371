/* frames.h - camera-like synthetic RGB frames: a two-colour gradient (a lit table), a few
 * coloured discs and boxes (objects, gripper) and per-pixel sensor noise, deterministic in the
 * seed. Benchmarks feed them so caches and data-dependent paths see what a robot camera gives;
 * the parity tests use them for the full-size model, whose bf16 error on uniform-noise frames
 * (all high frequencies, which no camera produces) is a different and larger quantity.
 * defines: act_synthetic_frame */
#ifndef ACT_FRAMES_H
#define ACT_FRAMES_H
#include <stdint.h>

/* img: h x w x 3 uint8, row-major RGB (the layout act_inputs.images takes) */
void act_synthetic_frame(uint8_t *img, int h, int w, uint64_t seed);

#endif
