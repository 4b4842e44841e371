/* cpu_pgemm.c - the CPU backend's own product for operands packed once at load: the Winograd
 * filters of layer3-4 (cpu_winograd.c) and the decoder's weights (cpu_linear_packed.c).
 * defines: act_cpu_pgemm_ok, act_cpu_pgemm_pack_index, act_cpu_pgemm
 *
 * Why: at batch 1 a layer4 Winograd product is [512 x 512] filters times [512 x 48] transformed
 * tiles. OpenBLAS packs both operands on every call, and the filters are the large one (1 MiB a
 * position, 16 MiB a conv): its packing took about as long as the arithmetic (bench/NOTES.md,
 * session 13: 60 GFLOP/s on one thread of an AVX-512 Xeon, 105 with the filters packed at load).
 *
 * Layout of A (M x K, M a multiple of 8): panels of 8 rows, each K columns of 8 floats, so the
 * kernel reads it once, in order: A[i][k] at ((i / 8) * K + k) * 8 + i % 8. B is row-major
 * (K x N, row stride ldb), read in place; C (M x N, row stride ldc) is overwritten.
 * The kernel holds an 8 x 48 block of C in 24 AVX-512 registers, broadcasting one A value per row
 * and loading three 16-float vectors of a B row per k; the last columns take a 32- or 16-wide
 * block, the very last vector masked. Each element is a plain sum over k in order (fp32). */
#include "cpu_ops.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ACT_NO_CLONES)
#include <immintrin.h>
#define PGEMM_X86 1
#endif

size_t act_cpu_pgemm_pack_index(int i, int k, int K) {
    return ((size_t)(i / 8) * K + k) * 8 + i % 8;
}

#ifdef PGEMM_X86

/* floats of the A panel ahead of the one read (32 k steps: the filters come from beyond L2) */
#define PREFETCH_A 256

int act_cpu_pgemm_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* C[8][nv * 16] (the last vector masked by `last`) = A panel (K x 8) x B[K][nv * 16 columns];
 * nv is a constant at each call, so the loops unroll into registers */
__attribute__((target("avx512f"), always_inline)) static inline void
block(int nv, const float *a, const float *b, int K, int ldb, float *c, int ldc, __mmask16 last) {
    __m512 acc[8][3];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) acc[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++, a += 8, b += ldb) {
        __m512 bv[3];
        _mm_prefetch((const char *)(a + PREFETCH_A), _MM_HINT_T0);
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            bv[v] = v == nv - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            float *o = c + (size_t)r * ldc + 16 * v;
            if (v == nv - 1) _mm512_mask_storeu_ps(o, last, acc[r][v]);
            else _mm512_storeu_ps(o, acc[r][v]);
        }
}

__attribute__((target("avx512f"))) void act_cpu_pgemm(int M, int N, int K, const float *Ap,
                                                      const float *B, int ldb, float *C, int ldc) {
    for (int n0 = 0; n0 < N; n0 += 48) {
        int nb = N - n0 < 48 ? N - n0 : 48;
        int nv = (nb + 15) / 16, tail = nb - 16 * (nv - 1);
        __mmask16 last = (__mmask16)(tail == 16 ? 0xFFFF : (1u << tail) - 1);
        for (int i0 = 0; i0 < M; i0 += 8) {
            const float *a = Ap + (size_t)i0 * K;
            float *c = C + (size_t)i0 * ldc + n0;
            if (nv == 3) block(3, a, B + n0, K, ldb, c, ldc, last);
            else if (nv == 2) block(2, a, B + n0, K, ldb, c, ldc, last);
            else block(1, a, B + n0, K, ldb, c, ldc, last);
        }
    }
}

#else

int act_cpu_pgemm_ok(void) { return 0; }

/* never called where act_cpu_pgemm_ok is 0; a plain loop over the same layout all the same */
void act_cpu_pgemm(int M, int N, int K, const float *Ap, const float *B, int ldb, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += Ap[act_cpu_pgemm_pack_index(i, k, K)] * B[(size_t)k * ldb + j];
            C[(size_t)i * ldc + j] = s;
        }
}

#endif
