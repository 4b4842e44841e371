"""The mutants of tests/mutation/run.py --cpu: id -> (file under engine/, text, replacement, what the
replacement breaks), as mutants.py is for the kernels. The CPU backend is the oracle the CUDA
kernels are held to, so a slip here that no test sees would be copied into the kernels' checks.
Written by hand, one per plausible slip (a transform coefficient, an index, a bound, an eps, a
chunk boundary, an epilogue order), each a bug the backend could have had and still compiled.
Several sit on paths only some shapes, batch sizes, thread counts or switches take (the
ACT_CPU_* variables, the AVX-512 clone): which ones, and which tests reach them, is in README.md."""
# id: (file, old, new, note)
M = {
 # cpu_winograd.c: F(2x2,3x3) and F(4x4,3x3)
 "WG1": ("cpu_winograd.c", "{0.5, -0.5, 0.5}, {0, 0, 1}}", "{0.5, 0.5, -0.5}, {0, 0, 1}}", "F(2x2) filter transform: G's third row signs swapped"),
 "WG2": ("cpu_winograd.c", "{1.0 / 24, -1.0 / 12, 1.0 / 6},", "{1.0 / 24, -1.0 / 12, -1.0 / 6},", "F(4x4) filter transform: G's fifth row, last tap sign"),
 "WG3": ("cpu_winograd.c", "return (long)c->cout * c->cin <= WINO4_MAX_FILTER ? 4 : 2;", "return (long)c->cout * c->cin < WINO4_MAX_FILTER ? 4 : 2;", "default tile: 128x128 filters (layer2) get F(2x2), not F(4x4)"),
 "WG4": ("cpu_winograd.c", "for (int c = W + 1; c < PW; c++) t[c] = 0.0f;", "for (int c = W + 2; c < PW; c++) t[c] = 0.0f;", "input transform: right padding column not zeroed (stale scratch)"),
 "WG5": ("cpu_winograd.c", "r[k] = (y >= 0 && y < H) ? x + (size_t)y * W : zero;", "r[k] = (y >= 0 && y <= H) ? x + (size_t)y * W : zero;", "input transform: bottom padding row read from past the map"),
 "WG7": ("cpu_winograd.c", "        t3[c] = a1[c] - a3[c];", "        t3[c] = a3[c] - a1[c];", "F(2x2) B^T d: fourth row negated"),
 "WG8": ("cpu_winograd.c", "o5[tx] = 4.0f * d[1] - 5.0f * d[3] + d[5];", "o5[tx] = 4.0f * d[1] - 5.0f * d[3] + d[4];", "F(4x4) (B^T d) B: sixth column reads d[4] for d[5]"),
 "WG9": ("cpu_winograd.c", "s3[tx] = b + 8.0f * d + m5[tx];", "s3[tx] = b + 8.0f * d;", "F(4x4) A^T m: last output row without m5"),
 "WG11": ("cpu_winograd.c", "for (int i = 0; i < m && y0 + i < H; i++)", "for (int i = 0; i < m; i++)", "output transform: bottom tile rows past the map written (into the next plane)"),
 "WG12": ("cpu_winograd.c", "q->epi, q->y + o, q->rows + (size_t)t * q->rows_stride);", "q->epi, q->y + o, q->rows);", "output transform: every thread on thread 0's scratch"),
 "WG13": ("cpu_winograd.c", "q->V + (size_t)ci * q->GT + (size_t)j * q->T, (size_t)q->cin * q->GT,", "q->V + (size_t)ci * q->GT, (size_t)q->cin * q->GT,", "input transform: every image of a group onto the first one's tiles"),
 "WG14": ("cpu_winograd.c", "int g = N - n0 < (int)G ? N - n0 : (int)G;\n        size_t GT", "int g = (int)G;\n        size_t GT", "last group of images taken whole (reads and writes past the batch)"),
 "WG15": ("cpu_winograd.c", "size_t f4 = 6 * (4 * t4 + 2) > 40 * t4 ? 6 * (4 * t4 + 2) : 40 * t4;", "size_t f4 = 6 * (4 * t4 + 2) > 36 * t4 ? 6 * (4 * t4 + 2) : 36 * t4;", "row scratch sized 36 TW for F(4x4)'s 40 TW output transform"),
 "WG16": ("cpu_winograd.c", "(packed ? act_cpu_pgemm_pack_index(co, ci, cin) : (size_t)co * cin + ci)", "(packed ? act_cpu_pgemm_pack_index(ci, co, cout) : (size_t)co * cin + ci)", "packed filters: rows and columns swapped in the packing"),
 # cpu_stem.c: the direct 7x7 stride-2 conv
 "ST2": ("cpu_stem.c", "Wq = blocks * PX + (k - 1) / s;", "Wq = blocks * PX;", "stem planes lack the columns the last block's taps read past PX"),
 "ST3": ("cpu_stem.c", "int Hp = (Ho - 1) * s + k;", "int Hp = (Ho - 1) * s + k - 1;", "stem planes one padded row short (last taps read the next plane)"),
 "ST4": ("cpu_stem.c", "int npx = q->Wo - ox0 < PX ? q->Wo - ox0 : PX;", "int npx = PX;", "stem stores a whole block past the row's end"),
 "ST5": ("cpu_stem.c", "                    hi[j] += w[j] * x1;", "                    hi[j] += w[j] * x0;", "narrow (AVX2) stem block: upper 8 pixels from the lower half's inputs"),
 "ST6": ("cpu_stem.c", "q.tap_off[kx] = (size_t)(kx % s) * Hp * Wq + kx / s;", "q.tap_off[kx] = (size_t)(kx % s) * Hp * Wq + (kx + 1) / s;", "stem tap offset within the parity plane off by one"),
 "ST7": ("cpu_stem.c", "c->cin > 4 || c->cout % CB ||", "c->cin > 4 || c->cout % CB_NARROW ||", "stem taken for output channels in 4s (16-channel blocks read past cout)"),
 "ST8": ("cpu_stem.c", "(c->stride != 1 && c->stride != 2) || residual ||", "(c->stride != 1 && c->stride != 2) ||", "stem taken for a conv with a residual (which it ignores)"),
 "ST9": ("cpu_stem.c", "int g = N - n0 < (int)G ? N - n0 : (int)G;", "int g = (int)G;", "stem: last group of images taken whole (reads and writes past the batch)"),
 "ST10": ("cpu_stem.c", "size_t taps = (size_t)c->cin * k * k, per_image = (size_t)c->cin * s * Hp * Wq;", "size_t taps = (size_t)c->cin * k * k, per_image = (size_t)c->cin * Hp * Wq;", "stem: a padded image's floats counted for one parity plane (groups overrun the workspace)"),
 # cpu_pgemm.c and cpu_linear_packed.c
 "PG1": ("cpu_pgemm.c", "return ((size_t)(i / 8) * K + k) * 8 + i % 8;", "return ((size_t)(i / 8) * K + k) * 8 + 7 - i % 8;", "packing index: a panel's rows reversed"),
 "PG2": ("cpu_pgemm.c", "(1u << tail) - 1);", "(1u << (tail - 1)) - 1);", "masked tail one column short"),
 "PG3": ("cpu_pgemm.c", "int nv = (nb + 15) / 16, tail", "int nv = nb / 16 + 1, tail", "vectors per block: a full 48-column block counted as 4"),
 "PL1": ("cpu_linear_packed.c", "if (M < 1 || M > PLIN_MAX_ROWS || l->row0 % 8 || l->out % 8) return 1;", "if (M < 1 || M > PLIN_MAX_ROWS || l->out % 8) return 1;", "packed linear taken for row views off the 8-row panels"),
 "PL3": ("cpu_linear_packed.c", "q->xt, q->M, q->yt + (size_t)j0 * q->M, q->M);", "q->xt, q->M, q->yt + (size_t)lo * q->M, q->M);", "packed linear: a thread's y^T rows offset by panels, not rows"),
 # cpu_gemm.c: the split over the pool
 "SG1": ("cpu_gemm.c", "    if (b > dim) b = dim;\n", "", "split: last piece not clipped to M or N (writes past C)"),
 "SG2": ("cpu_gemm.c", "pieces = (dim + SPLIT_STEP - 1) / SPLIT_STEP;", "pieces = dim / SPLIT_STEP;", "split: the partial last 16 rows/columns dropped"),
 "SG3": ("cpu_gemm.c", "q->trans_b ? q->B + (size_t)a * q->ldb : q->B + a", "q->trans_b ? q->B + a : q->B + (size_t)a * q->ldb", "split by columns: B offsets of the two layouts swapped"),
 # pool.c
 "POL1": ("pool.c", "*hi = (int)((long long)items * (i + 1) / n);", "*hi = *lo + items / n;", "chunks of items/n: the remainder (last chunk's tail) dropped"),
 "POL2": ("pool.c", "if (lo < hi) fn(arg, idx, lo, hi);", "if (lo < hi) fn(arg, 0, lo, hi);", "helpers pass thread index 0 (share the caller's scratch)"),
 # cpu_vision.c
 "VI2": ("cpu_vision.c", "(int)rintf((float)(rh - oh) / 2.0f), (int)rintf((float)(rw - ow) / 2.0f),", "(rh - oh) / 2, (rw - ow) / 2,", "center crop offsets truncated, not rounded half to even"),
 "VI3": ("cpu_vision.c", "const uint8_t *row = img + ((size_t)(y + q->top) * wi + q->left) * 3;", "const uint8_t *row = img + ((size_t)(y + q->top) * wi) * 3;", "no-resize path: crop's left offset dropped"),
 "VI4": ("cpu_vision.c", "q.un[c][v] = q.norm ? (q.u[v] - pre_mean[c]) / pre_std[c] : q.u[v];", "q.un[c][v] = q.norm ? (q.u[v] - pre_mean[c]) / pre_std[0] : q.u[v];", "no-resize path: every channel divided by R's std"),
 "VI6": ("cpu_vision.c", "            float t = (g[i] + b) + r[i];\n            o[i] = t < 0.0f ? 0.0f : t;", "            float t = g[i] + b;\n            o[i] = (t < 0.0f ? 0.0f : t) + r[i];", "conv epilogue: ReLU before the residual"),
 "VI7": ("cpu_vision.c", "o[i] = act_cpu_epi((g[i] + b) + (r ? r[i] : 0.0f), epi);", "o[i] = act_cpu_epi(g[i] + b, epi);", "conv epilogue, generic case (GELU): residual dropped"),
 "VI8": ("cpu_vision.c", "while (b > a && (b - 1) * s - p + kw >= W) b--;", "while (b > a && (b - 1) * s - p + kw > W) b--;", "im2col: right edge reads one column past the row"),
 "VI9": ("cpu_vision.c", "if (direct && g > 1) {", "if (direct && g > 2) {", "1x1 conv: a group of two images multiplied in place as if side by side"),
 "VI10": ("cpu_vision.c", "int full = (W - 2) / 2 + 1;", "int full = (W - 1) / 2 + 1;", "maxpool: the full-window columns one too many for odd widths"),
 "VI12": ("cpu_vision.c", "float rstd = (float)(1.0 / sqrt(sq / (double)gsz + 1e-5));", "float rstd = (float)(1.0 / sqrt(sq / (double)gsz));", "GroupNorm eps dropped"),
 "VI13": ("cpu_vision.c", "float ga = gamma ? gamma->data[g * cpg + c] : 1.0f;", "float ga = gamma ? gamma->data[c] : 1.0f;", "GroupNorm gamma indexed within the group"),
 "VI14": ("cpu_vision.c", "                    if (r) v += r[j];\n                    yo[j] = act_cpu_epi(v, epi);", "                    v = act_cpu_epi(v, epi);\n                    yo[j] = r ? v + r[j] : v;", "GroupNorm: activation before the residual"),
 "VI15": ("cpu_vision.c", "for (int i = 0; i < HW; i++) sum += expf(xi[i] - m);\n        for (int i = 0; i < HW; i++) {\n            float pr = expf(xi[i] - m) / sum;",
          "for (int i = 0; i < HW; i++) sum += expf(xi[i]);\n        for (int i = 0; i < HW; i++) {\n            float pr = expf(xi[i]) / sum;", "spatial softmax without max subtraction"),
 # cpu_transformer.c and cpu_ops.h
 "TR1": ("cpu_transformer.c", "float scale = 1.0f / sqrtf((float)dh);", "float scale = 1.0f / sqrtf((float)(nh * dh));", "attention scale 1/sqrt(E), not 1/sqrt(dh)"),
 "TR2": ("cpu_transformer.c", "if (pad && pad[(size_t)b * Lk + j]) continue;", "if (pad && pad[(size_t)b * Lq + j]) continue;", "attention mask row stride Lq, not Lk"),
 "TR3": ("cpu_transformer.c", "                        l *= r;\n", "", "online softmax: running sum not rescaled with a new max"),
 "TR4": ("cpu_transformer.c", "float rstd = (float)(1.0 / sqrt(sq / E + eps)), fm = (float)mean;", "float rstd = (float)(1.0 / sqrt(sq / E)), fm = (float)mean;", "LayerNorm eps dropped"),
 "TR6": ("cpu_ops.h", "return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));", "return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));", "GELU tanh approximation instead of erf"),
 "TR9": ("cpu_transformer.c", "yr[i] = inverse ? (xr[i] + 1.0f) / 2.0f * range + a : 2.0f * (xr[i] - a) / range - 1.0f;", "yr[i] = inverse ? (xr[i] + 1.0f) / 2.0f * range : 2.0f * (xr[i] - a) / range - 1.0f;", "min_max denormalize without the + min"),
 "TR10": ("cpu_transformer.c", "float sd = fmaxf(b, eps);", "float sd = b;", "mean_std without the eps clamp"),
 "TR12": ("cpu_transformer.c", "zz = m + act_normal_eps(seed, (uint64_t)b * L + i) * expf(0.5f * lv);", "zz = m + act_normal_eps(seed, (uint64_t)i) * expf(0.5f * lv);", "sampled latent: the same noise for every sample of the batch"),
 # backend_cpu.c
 "BC1": ("backend_cpu.c", "(const char *)host + (size_t)r * host_pitch * es, n * es);", "(const char *)host + (size_t)r * n * es, n * es);", "upload_rows: host pitch ignored (cameras' frames read packed)"),
 "BC3": ("backend_cpu.c", "float *wr = act_aligned_alloc(((size_t)act_pool_threads(ctx->pool) + 1) * (rows ? rows : 1) *", "float *wr = act_aligned_alloc(((size_t)act_pool_threads(ctx->pool)) * (rows ? rows : 1) *", "row scratch without room for the zero row (read past the allocation)"),
}
