/* embed.cu - gather kernels that build transformer inputs, one thread per output element, and
 * the CVAE latent (one warp per sample, so the KL sum is a warp reduction). Additions happen in
 * the seed's order: (token + pos) + type. The eps of the reparameterization comes from
 * engine/rng.h, the same counter-based generator the CPU backend uses, so both draw the same
 * noise for the same seed; the seed is read on the device so a captured graph picks up each
 * step's new seed. */
#include "embed.cuh"
#include "rng.h"

static __global__ void memory_kernel(const void *lat, int ldt, const void *qp, int qdt,
                                     const void *vis, int vdt, int B, int ncam, int E,
                                     const float *pos, const float *type, void *out, int odt) {
    int T = 2 + ncam;
    size_t n = (size_t)B * T * E;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int e = (int)(i % E), l = (int)((i / E) % T), b = (int)(i / ((size_t)E * T));
        float v;
        if (l == 0) v = kld(lat, ldt, (size_t)b * E + e);
        else if (l == 1) v = kld(qp, qdt, (size_t)b * E + e);
        else v = kld(vis, vdt, ((size_t)(l - 2) * B + b) * E + e);
        v = (v + pos[(size_t)l * E + e]) + type[(size_t)(l < 2 ? l : 2) * E + e];
        kst(out, odt, i, v);
    }
}

int act_k_memory_assemble(const void *lat, int ldt, const void *qp, int qdt, const void *vis,
                          int vdt, int B, int ncam, int E, const float *pos, const float *type,
                          void *out, int odt, cudaStream_t st, char *err, size_t errlen) {
    size_t n = (size_t)B * (2 + ncam) * E;
    if (n == 0) return 0;
    memory_kernel<<<act_grid(n), 256, 0, st>>>(lat, ldt, qp, qdt, vis, vdt, B, ncam, E, pos, type,
                                               out, odt);
    KLAUNCH(memory_kernel);
    return 0;
}

static __global__ void posterior_kernel(const float *cls, const void *qp, int qdt, const void *act,
                                        int adt, int B, int H, int E, const float *pos, void *out,
                                        int odt) {
    int T = 2 + H;
    size_t n = (size_t)B * T * E;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int e = (int)(i % E), l = (int)((i / E) % T), b = (int)(i / ((size_t)E * T));
        float v;
        if (l == 0) v = cls[e];
        else if (l == 1) v = kld(qp, qdt, (size_t)b * E + e);
        else v = kld(act, adt, ((size_t)b * H + (l - 2)) * E + e);
        kst(out, odt, i, v + pos[(size_t)l * E + e]);
    }
}

int act_k_posterior_assemble(const float *cls, const void *qp, int qdt, const void *act, int adt,
                             int B, int H, int E, const float *pos, void *out, int odt,
                             cudaStream_t st, char *err, size_t errlen) {
    size_t n = (size_t)B * (2 + H) * E;
    if (n == 0) return 0;
    posterior_kernel<<<act_grid(n), 256, 0, st>>>(cls, qp, qdt, act, adt, B, H, E, pos, out, odt);
    KLAUNCH(posterior_kernel);
    return 0;
}

static __global__ void latent_kernel(const void *ml, int mdt, int B, int L, int sample,
                                     const unsigned char *seed8, float *mu, float *logvar,
                                     float *kl, void *z, int zdt) {
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (b >= B) return;
    uint64_t seed = 0;
    if (sample)
        for (int i = 0; i < 8; i++) seed |= (uint64_t)seed8[i] << (8 * i);
    float s = 0.0f;
    for (int i = lane; i < L; i += 32) {
        float m = kld(ml, mdt, (size_t)b * 2 * L + i), lv = kld(ml, mdt, (size_t)b * 2 * L + L + i);
        if (mu) mu[(size_t)b * L + i] = m;
        if (logvar) logvar[(size_t)b * L + i] = lv;
        s += -0.5f * (((1.0f + lv) - m * m) - expf(lv));
        float zv = m;
        if (sample) zv = m + act_normal_eps(seed, (uint64_t)b * L + i) * expf(0.5f * lv);
        if (z) kst(z, zdt, (size_t)b * L + i, zv);
    }
    s = warp_sum(s);
    if (lane == 0 && kl) kl[b] = s;
}

int act_k_latent(const void *ml, int mdt, int B, int L, int sample, const unsigned char *seed8,
                 float *mu, float *logvar, float *kl, void *z, int zdt, cudaStream_t st,
                 char *err, size_t errlen) {
    if (B == 0) return 0;
    if (sample && !seed8) {
        snprintf(err, errlen, "latent: sampling needs the seed buffer");
        return -1;
    }
    const int warps = 4;
    latent_kernel<<<CEIL_DIV(B, warps), warps * 32, 0, st>>>(ml, mdt, B, L, sample, seed8, mu,
                                                            logvar, kl, z, zdt);
    KLAUNCH(latent_kernel);
    return 0;
}
