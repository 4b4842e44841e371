/* frames.c - camera-like synthetic frames for benchmarks and tests (see frames.h). */
#include "frames.h"
#include <stddef.h>
#include "rng.h"

static inline uint8_t clamp_u8(float v) { return v < 0.f ? 0 : v > 255.f ? 255 : (uint8_t)(v + 0.5f); }

void act_synthetic_frame(uint8_t *img, int h, int w, uint64_t seed) {
    uint64_t s = seed;
    float c0[3], c1[3], dx = act_unit(&s) - 0.5f, dy = act_unit(&s) - 0.5f;
    for (int c = 0; c < 3; c++) { c0[c] = 40 + 170 * act_unit(&s); c1[c] = 40 + 170 * act_unit(&s); }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            float t = 0.5f + dx * ((float)x / w - 0.5f) * 2 + dy * ((float)y / h - 0.5f) * 2;
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            for (int c = 0; c < 3; c++) img[((size_t)y * w + x) * 3 + c] = clamp_u8(c0[c] + (c1[c] - c0[c]) * t);
        }
    int shapes = 3 + (int)(act_unit(&s) * 4);
    for (int k = 0; k < shapes; k++) {
        float cx = act_unit(&s) * w, cy = act_unit(&s) * h, r = (0.05f + 0.15f * act_unit(&s)) * (float)(h < w ? h : w);
        int box = act_unit(&s) < 0.5f;
        float col[3] = {255 * act_unit(&s), 255 * act_unit(&s), 255 * act_unit(&s)};
        int y0 = (int)(cy - r) < 0 ? 0 : (int)(cy - r), y1 = (int)(cy + r) >= h ? h - 1 : (int)(cy + r);
        int x0 = (int)(cx - r) < 0 ? 0 : (int)(cx - r), x1 = (int)(cx + r) >= w ? w - 1 : (int)(cx + r);
        for (int y = y0; y <= y1; y++)
            for (int x = x0; x <= x1; x++) {
                float ex = x - cx, ey = y - cy;
                if (!box && ex * ex + ey * ey > r * r) continue;
                float shade = 0.75f + 0.25f * (1.0f - ey / (r + 1));   /* lit from above */
                for (int c = 0; c < 3; c++) img[((size_t)y * w + x) * 3 + c] = clamp_u8(col[c] * shade);
            }
    }
    uint64_t ns = act_splitmix64(seed ^ 0x6e6f697365ull);
    size_t n = (size_t)h * w * 3;
    for (size_t i = 0; i < n; i++) {
        if ((i & 7) == 0) ns = act_splitmix64(ns);
        int noise = (int)((ns >> ((i & 7) * 8)) & 15) - 7;
        int v = img[i] + noise;
        img[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}
