"""The mutants of tests/mutation/run.py: id -> (file under kernels/, text, replacement, what the
replacement breaks). Each text must occur exactly once in its file. Written by hand, one per
plausible slip (an index, a bound, an eps, a rounding, a barrier), each one a bug that a kernel
could have had and still compiled."""
# id: (file, old, new, note)
M = {
 # preprocess.cu
 "PRE1": ("preprocess.cu", "float sy = fmaxf(sh * ((float)(y + top) + 0.5f) - 0.5f, 0.0f);",
          "float sy = fmaxf(sh * (float)(y + top), 0.0f);", "resize: y source coordinate without the half-pixel offset"),
 "PRE2": ("preprocess.cu", "((float)(y + top) + 0.5f) - 0.5f, 0.0f);\n        float sx = fmaxf(sw * ((float)(x + left)",
          "((float)(y + left) + 0.5f) - 0.5f, 0.0f);\n        float sx = fmaxf(sw * ((float)(x + top)", "crop offsets top/left swapped"),
 "PRE3": ("preprocess.cu", "x1 = x0 + (x0 < wi - 1 ? 1 : 0)", "x1 = x0 + (x0 < wi ? 1 : 0)", "x edge clamp off by one (right tap past the row)"),
 "PRE4": ("preprocess.cu", "(c == 1 ? 0.224f : 0.225f)", "(c == 1 ? 0.225f : 0.225f)", "imagenet std of G channel wrong"),
 "PRE5": ("preprocess.cu", "if (e < n0) norm_side_elem", "if (e <= n0) norm_side_elem", "side job boundary off by one"),
 "PRE6": ("preprocess.cu", "w4 = pick4(q, b.x, b.y, b.z, b.w);", "w4 = pick4(q, b.x, b.y, b.z, b.z);", "gather shift: last word wrong for sh>=12"),
 "PRE7": ("preprocess.cu", "if ((((uintptr_t)out | item_bytes) & 15) == 0) {", "if ((((uintptr_t)out) & 15) == 0) {", "gather: 16-byte path taken for item sizes not multiple of 16 (tail unwritten)"),
 # pool.cu
 "POOL1": ("pool.cu", "*hi = o * 2 + 2 > n ? n : o * 2 + 2;", "*hi = o * 2 + 1 > n ? n : o * 2 + 1;", "maxpool window 2 wide"),
 "POOL2": ("pool.cu", "*lo = o * 2 - 1 < 0 ? 0 : o * 2 - 1;", "*lo = o * 2;", "maxpool ignores padding (window starts at 2o)"),
 "POOL3": ("pool.cu", "t.u = x[(((size_t)img * H + iy) * W + ix) * cpk + cp];", "t.u = x[(((size_t)img * W + iy) * H + ix) * cpk + cp];", "maxpool vec: H/W strides swapped"),
 "POOL4": ("pool.cu", "s += expf(kld(x, xdt, base + i * step) - m);", "s += expf(kld(x, xdt, base + i * step));", "spatial softmax without max subtraction (sum; see also p)"),
 "POOL5": ("pool.cu", "size_t step = nhwc ? (size_t)K : 1;", "size_t step = nhwc ? (size_t)HW : 1;", "spatial softmax NHWC stride wrong"),
 "POOL6": ("pool.cu", "ey += p * pos[2 * i + 1];", "ey += p * pos[2 * i];", "spatial softmax y coordinate from x column"),
 # norm.cu
 "NORM1": ("norm.cu", "float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)cnt + eps);", "float rstd = 1.0f / (sqrtf(block_sum(s, red) / (float)cnt) + eps);", "groupnorm eps outside sqrt"),
 "NORM2": ("norm.cu", "float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)cnt + eps);", "float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)(cnt - 1) + eps);", "groupnorm unbiased variance"),
 "NORM3": ("norm.cu", "*c = g * cpg + (int)(i / HW);", "*c = g * cpg + (int)(i % cpg);", "groupnorm NCHW gamma channel wrong"),
 "NORM4": ("norm.cu", "float rstd = 1.0f / sqrtf(warp_sum(s) / (float)E + eps);", "float rstd = 1.0f / sqrtf(warp_sum(s) / (float)E);", "layernorm eps dropped"),
 "NORM5": ("norm.cu", "float rstd = 1.0f / sqrtf(warp_sum(s) / (float)E + eps);", "float rstd = 1.0f / sqrtf(warp_sum(s) / (float)(E - 1) + eps);", "layernorm unbiased variance"),
 "NORM6": ("norm.cu", "        float v = kld(x, xdt, base + i) + (d ? kld(d, ddt, base + i) : 0.0f);\n        kst(", "        float v = kld(x, xdt, base + i);\n        kst(", "layernorm output without the residual"),
 "NORM7": ("norm.cu", "float v = (kld(x, xdt, at) - mean) * rstd * gamma[c] + beta[c];\n        if (res) v += kld(res, rdt, at);\n        if (epi == 1) v = fmaxf(v, 0.0f);",
           "float v = (kld(x, xdt, at) - mean) * rstd * gamma[c] + beta[c];\n        if (epi == 1) v = fmaxf(v, 0.0f);\n        if (res) v += kld(res, rdt, at);", "groupnorm ReLU before residual"),
 # attention.cu
 "ATT1": ("attention.cu", "if (!key_pad || !key_pad[(size_t)b * Lk + j]) {\n                    s = 0.0f;\n                    for (int d = 0; d < dh; d++) s += qw[d] * Ks",
          "if (!key_pad || !key_pad[(size_t)b * Lq + j]) {\n                    s = 0.0f;\n                    for (int d = 0; d < dh; d++) s += qw[d] * Ks", "attention mask row stride Lq instead of Lk"),
 "ATT2": ("attention.cu", "if (!key_pad || !key_pad[(size_t)b * Lk + j]) {\n                    s = 0.0f;\n                    for (int d = 0; d < dh; d++) s += qw[d] * Ks",
          "if (!key_pad || !key_pad[(size_t)b * Lk + j] || j == Lk - 1) {\n                    s = 0.0f;\n                    for (int d = 0; d < dh; d++) s += qw[d] * Ks", "attention: mask ignored for the last key (off-by-one bound)"),
 "ATT11": ("attention.cu", "acc += pw[j] * kld(v, kvdt, kv0 + (size_t)j * kvs + d);", "acc += pw[j] * kld(k, kvdt, kv0 + (size_t)j * kvs + d);", "long attention (K/V read in place) takes V from K"),
 "ATT12": ("attention.cu", "float s = key_pad && key_pad[(size_t)b * Lk + j] ? -INFINITY : part[u];", "float s = part[u];", "long attention (K read in place) ignores the key padding mask"),
 "ATT13": ("attention.cu", "part[u] += qw[d] * kld(k, kvdt, kv0 + (size_t)(j0 + u) * kvs + d);", "part[u] += qw[d] * kld(k, kvdt, kv0 + (size_t)j0 * kvs + d);", "long attention scores every key of a group of 4 against the group's first"),
 "ATT14": ("attention.cu", "    for (int j = lane; j < Lk; j += 32) pw[j] = pw[j] / sum;\n", "", "attention probabilities left unnormalized (both attention kernels)"),
 "ATT15": ("attention.cu", "int i0 = c * per, i1", "int i0 = c * ATT_WARPS, i1", "staged attention: a block's chunk of 16 query rows starts at 4c (rows past 4 x chunks never written)"),
 "ATT3": ("attention.cu", "float e = expf(pw[j] - m);", "float e = expf(pw[j]);", "softmax without max subtraction (both attention kernels)"),
 "ATT4": ("attention.cu", "qw[d] = kld(q, qdt, qrow + d) / scale;\n        __syncwarp();", "qw[d] = kld(q, qdt, qrow + d) / scale;", "attention: __syncwarp after staging q dropped"),
 "ATT5": ("attention.cu", "        __syncwarp();                                 /* qw, pw reused by the next row */\n", "", "attention: trailing __syncwarp dropped (equivalent: the next row's own __syncwarps order qw and pw)"),
 "ATT6": ("attention.cu", "Y[jo] = t + bo[jo] + kld(x, xdt, (size_t)row * E + jo);", "Y[jo] = t + bo[jo];", "attn+out+ln: residual not added"),
 "ATT7": ("attention.cu", "for (int off = 4; off > 0; off >>= 1) t +=", "for (int off = 4; off > 1; off >>= 1) t +=", "attn+out+ln: projection reduction skips last shuffle"),
 "ATT8": ("attention.cu", "float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)E + eps);", "float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)E);", "attn+out+ln: LayerNorm eps dropped"),
 "ATT9": ("attention.cu", "    float scale = sqrtf((float)dh);\n    for (int i = threadIdx.x;", "    float scale = sqrtf((float)E);\n    for (int i = threadIdx.x;", "attn+out+ln: scale by sqrt(E) not sqrt(dh)"),
 "ATT10": ("attention.cu", "if (!key_pad || !key_pad[(size_t)b * Lk + j]) {\n                size_t kr", "if (!key_pad || !key_pad[(size_t)row * Lk + j]) {\n                size_t kr", "attn+out+ln: mask indexed by query row, not batch"),
 # elementwise.cu
 "EW1": ("elementwise.cu", "if (bias) v += bias[(i / inner) % (size_t)C];", "if (bias) v += bias[i % (size_t)C];", "bias kernel ignores inner stride (NCHW)"),
 "EW2": ("elementwise.cu", "unsigned c = (p % cpk) * P;", "unsigned c = (p % cpk);", "vec bias: channel offset missing pack width"),
 "EW3": ("elementwise.cu", "        else if (epi == 2) v = act_gelu(v);\n        pk_set", "        else if (epi == 2) v = fmaxf(v, 0.0f);\n        pk_set", "vec epilogue: GELU computed as ReLU"),
 "EW4": ("elementwise.cu", "if (inner == 1 && C % per == 0 && n / per", "if (inner == 1 && n / per", "vec path for C not multiple of pack (tail unwritten)"),
 "EW5": ("elementwise.cu", "if (res) v += pk_get<DT>(rp, k);", "if (res) v += 2.0f * pk_get<DT>(rp, k);", "vec: residual added twice"),
 "EW6": ("elementwise.cu", "kst(dst, ddt, i, kld(src, sdt, (i / n) * stride + i % n));", "kst(dst, ddt, i, kld(src, sdt, (i / n) * n + i % n));", "gather_rows ignores stride"),
 "EW7": ("common.cuh", "return inverse ? v * sd + lo : (v - lo) / sd;", "return inverse ? (v + lo) * sd : (v - lo) / sd;", "mean_std inverse normalization wrong"),
 "EW8": ("common.cuh", "float range = fmaxf(hi - lo, eps);", "float range = hi - lo;", "min_max without eps clamp"),
 # embed.cu
 "EM1": ("embed.cu", "else v = kld(vis, vdt, ((size_t)(l - 2) * B + b) * E + e);", "else v = kld(vis, vdt, ((size_t)b * ncam + (l - 2)) * E + e);", "memory: vision tokens camera-major vs batch-major"),
 "EM2": ("embed.cu", "type[(size_t)(l < 2 ? l : 2) * E + e]", "type[(size_t)(l < 2 ? l : 1) * E + e]", "memory: type embedding row for vision tokens"),
 "EM3": ("embed.cu", "s += -0.5f * (((1.0f + lv) - m * m) - expf(lv));", "s += -0.5f * ((lv - m * m) - expf(lv));", "KL without the +1"),
 "EM4": ("embed.cu", "* expf(0.5f * lv);", "* expf(lv);", "reparameterization with var instead of std"),
 "EM5": ("embed.cu", "seed |= (uint64_t)seed8[i] << (8 * i);", "seed |= (uint64_t)seed8[i] << (8 * (7 - i));", "seed bytes big-endian"),
 "EM6": ("embed.cu", "kst(out, odt, i, v + pos[(size_t)l * E + e]);", "kst(out, odt, i, v + pos[(size_t)(l < 2 ? l : l - 1) * E + e]);", "posterior: pos index off by one for action tokens"),
 # conv.cu
 "CV1": ("conv.cu", "size_t wi = nhwc ? (((size_t)co * k + ky) * k + kx) * cin + ci", "size_t wi = nhwc ? (((size_t)co * k + kx) * k + ky) * cin + ci", "direct conv NHWC weight taps transposed"),
 "CV2": ("conv.cu", "if (iy < 0 || iy >= H) continue;", "if (iy < 0 || iy > H) continue;", "direct conv bottom bound off by one"),
 "CV3": ("conv.cu", "        if (res) acc += kld(res, rdt, i);\n        if (epi == 1) acc = fmaxf(acc, 0.0f);", "        if (epi == 1) acc = fmaxf(acc, 0.0f);\n        if (res) acc += kld(res, rdt, i);", "direct conv ReLU before residual"),
 "CV4": ("conv.cu", "kst(dst, ddt, i, c < C ? w[(ko * C + c) * kk + tap] : 0.0f);", "kst(dst, ddt, i, c < C ? w[(ko * kk + tap) * C + c] : 0.0f);", "NHWC weight repack: source indexed as if already NHWC"),
 "CV9": ("conv.cu", "kst(dst, ddt, i, c < C ? w[(ko * C + c) * kk + tap] : 0.0f);", "kst(dst, ddt, i, c < C ? w[(ko * C + c) * kk + tap] : 0.1f);", "padded stem filter (ACT_CUDA_STEM_CHANNELS): taps past 3 channels not zero (test_backend_ops_emu_stem8: the harness's padding holds 3.0)"),
 "CV5": ("conv.cu", "(prec == 1 ? c->mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : !tensor_op)", "(prec == 1 ? 1 : !tensor_op)", "tf32 conv accepts ALLOW_CONVERSION (fp16 compute)"),
 "CV6": ("conv.cu", "alpha2 = res ? 1.0f : 0.0f;", "alpha2 = 1.0f;", "fused conv: z=y accumulated without a residual"),
 "CV7": ("conv.cu", "    if (prec >= 2) return act_k_conv_transforms16() || gemm_family(c->algo);\n", "", "bf16/fp16 convs held to fp32's rules: no tensor-op algorithm"),
 "CV8": ("conv.cu", "return act_k_conv_transforms16() || gemm_family(c->algo);", "return 1;", "bf16/fp16 convs take FFT/Winograd algorithms by default (find_checks.sh)"),
 # conv_find.cu
 "CF1": ("conv_find.cu", "e->transforms = p->key.prec >= 2 && act_k_conv_transforms16();", "e->transforms = 0;", "measured conv choices with and without 16-bit transforms share a cache key (algo_cache_checks.sh)"),
 # gemm_tune.cu
 "GT1": ("gemm_tune.cu", "    int as_graphs = graphs;", "    int as_graphs = graphs && reps > 1;", "GEMM tuner: a plain run inflated by the host's launch cost to the target means no graphs, batches of 1 timing the host (gemm_algo_checks.sh slow-launch)"),
 "GT2": ("gemm_tune.cu", "        if (r == 0 && reps_for(run) > reps) {", "        if (0) {", "GEMM tuner: batches never re-sized from the graph's own time (gemm_algo_checks.sh slow-launch)"),
 # gemm.cu
 "GM1": ("gemm.cu", "return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;", "return tf32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F_FAST_TF32;", "fp32/tf32 compute types swapped"),
 "GM2": ("gemm.cu", "epi == KLT_EPI_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS", "epi == KLT_EPI_RELU ? CUBLASLT_EPILOGUE_BIAS", "cuBLASLt ReLU epilogue dropped"),
 "GM3": ("gemm.cu", "LTP(cublasLtMatrixLayoutCreate(&p->b, cuda_type(xdt), (uint64_t)in, (uint64_t)M, in));", "LTP(cublasLtMatrixLayoutCreate(&p->b, cuda_type(wdt), (uint64_t)in, (uint64_t)M, in));", "x layout typed as the weight's (equivalent: backend_cuda.c converts x to the weights' dtype first)"),
 "GM4": ("gemm.cu", "while (n < 256 && !(a & n)) n <<= 1;", "while (n < 256 && !(a & (n << 1))) n <<= 1;", "alignment under-reported x2 (a 16-byte pointer reported as 8: only a slower plan)"),
 # common.cuh
 "CM1": ("common.cuh", "for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync", "for (int o = 16; o > 1; o >>= 1) v += __shfl_xor_sync", "warp_sum skips the last shuffle"),
 "CM2": ("common.cuh", "    v = warp_sum(v);\n    __syncthreads();                     /* shared32", "    v = warp_sum(v);\n    /* shared32", "block_sum: first __syncthreads dropped"),
 "CM3": ("common.cuh", "return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));", "return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));", "GELU tanh approximation instead of erf"),
 "CM4": ("common.cuh", "if (dt == KDT_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);", "if (dt == KDT_BF16) ((__nv_bfloat16 *)p)[i] = __ushort_as_bfloat16((unsigned short)(__float_as_uint(v) >> 16));", "kst bf16 truncates instead of round-to-nearest"),
 "CM5": ("common.cuh", "else if (DT == KDT_BF16) p.s[k] = __bfloat16_as_ushort(__float2bfloat16_rn(v));", "else if (DT == KDT_BF16) p.s[k] = (unsigned short)(__float_as_uint(v) >> 16);", "pk_set bf16 truncates"),
 "CM6": ("common.cuh", "v = lane < nw ? shared32[lane] : 0.0f;", "v = lane < nw - 1 ? shared32[lane] : 0.0f;", "block_sum skips the last warp"),
}
M["POOL7"] = ("pool.cu", "s += expf(kld(x, xdt, base + i * step) - m);\n    s = warp_sum(s);\n    float ex = 0.0f, ey = 0.0f;\n    for (int i = lane; i < HW; i += 32) {\n        float p = expf(kld(x, xdt, base + i * step) - m) / s;",
              "s += expf(kld(x, xdt, base + i * step));\n    s = warp_sum(s);\n    float ex = 0.0f, ey = 0.0f;\n    for (int i = lane; i < HW; i += 32) {\n        float p = expf(kld(x, xdt, base + i * step)) / s;", "spatial softmax without max subtraction (sum and p)")
