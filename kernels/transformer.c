/* transformer.c - the plain-C fp32 reference of a GPT-2 block's ops (transformer.h). Loops
 * are written for clarity and a fixed summation order, not speed: they are what faster
 * kernels are checked against. Sums over a row (LayerNorm's statistics, softmax) run in
 * double, so the reference's own rounding stays far below the tolerances it is held to. */
#include "transformer.h"

#include "cpu_ref.h" /* mgpu_cpu_softmax_xent, mgpu_cpu_adamw_step */

#include <math.h>   /* sqrt, tanh, cosh, cos */
#include <string.h> /* memset, memcpy */

#define LN_EPS 1e-5                      /* torch.nn.LayerNorm's default */
#define GELU_K_DOUBLE 0.7978845608028654 /* sqrt(2 / pi), in double */

void mgpu_gpt_layernorm_forward(int n, int c, const float *x, const float *w, const float *b,
                                float *y, float *mean, float *rstd)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * c;
        float *yi = y + (size_t)i * c;
        double m = 0.0, var = 0.0;
        for (int j = 0; j < c; j++)
            m += xi[j];
        m /= c;
        for (int j = 0; j < c; j++)
            var += ((double)xi[j] - m) * ((double)xi[j] - m);
        var /= c; /* biased, as torch's */
        double s = 1.0 / sqrt(var + LN_EPS);
        for (int j = 0; j < c; j++)
            yi[j] = (float)(((double)xi[j] - m) * s) * w[j] + b[j];
        mean[i] = (float)m;
        rstd[i] = (float)s;
    }
}

void mgpu_gpt_layernorm_backward(int n, int c, const float *dy, const float *x, const float *w,
                                 const float *mean, const float *rstd, float *dx, float *dw,
                                 float *db)
{
    for (int i = 0; i < n; i++) {
        const float *dyi = dy + (size_t)i * c, *xi = x + (size_t)i * c;
        float *dxi = dx + (size_t)i * c;
        double m = mean[i], s = rstd[i];
        /* dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * w */
        double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
        for (int j = 0; j < c; j++) {
            double norm = ((double)xi[j] - m) * s, dnorm = (double)w[j] * dyi[j];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= c;
        dnorm_norm_mean /= c;
        for (int j = 0; j < c; j++) {
            double norm = ((double)xi[j] - m) * s, dnorm = (double)w[j] * dyi[j];
            db[j] += dyi[j];
            dw[j] += (float)(norm * dyi[j]);
            dxi[j] += (float)(s * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
        }
    }
}

void mgpu_gpt_gelu_forward(size_t n, const float *x, float *y)
{
    for (size_t i = 0; i < n; i++) {
        double xi = x[i];
        y[i] = (float)(0.5 * xi * (1.0 + tanh(GELU_K_DOUBLE * (xi + 0.044715 * xi * xi * xi))));
    }
}

void mgpu_gpt_gelu_backward(size_t n, const float *x, const float *dy, float *dx)
{
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], u = GELU_K_DOUBLE * (xi + 0.044715 * xi * xi * xi);
        double th = tanh(u), ch = cosh(u);
        double du = GELU_K_DOUBLE * (1.0 + 3.0 * 0.044715 * xi * xi);
        double grad = 0.5 * (1.0 + th) + 0.5 * xi * du / (ch * ch);
        dx[i] += (float)(grad * dy[i]);
    }
}

void mgpu_gpt_linear_forward(int n, int c, int oc, const float *inp, const float *w,
                             const float *bias, float *out)
{
    for (int i = 0; i < n; i++) {
        const float *xi = inp + (size_t)i * c;
        for (int o = 0; o < oc; o++) {
            const float *wo = w + (size_t)o * c;
            float acc = bias != NULL ? bias[o] : 0.0f;
            for (int j = 0; j < c; j++)
                acc += xi[j] * wo[j];
            out[(size_t)i * oc + o] = acc;
        }
    }
}

void mgpu_gpt_linear_backward(int n, int c, int oc, const float *dout, const float *inp,
                              const float *w, float *dinp, float *dw, float *dbias)
{
    for (int i = 0; i < n; i++) {
        const float *di = dout + (size_t)i * oc, *xi = inp + (size_t)i * c;
        for (int o = 0; o < oc; o++) {
            float d = di[o];
            const float *wo = w + (size_t)o * c;
            float *dwo = dw + (size_t)o * c;
            if (dinp != NULL) {
                float *dxi = dinp + (size_t)i * c;
                for (int j = 0; j < c; j++)
                    dxi[j] += d * wo[j];
            }
            for (int j = 0; j < c; j++)
                dwo[j] += d * xi[j];
            if (dbias != NULL)
                dbias[o] += d;
        }
    }
}

void mgpu_gpt_attention_forward(int b, int t, int c, int nh, const float *qkv, float *preatt,
                                float *att, float *out)
{
    const int hs = c / nh, c3 = 3 * c;
    const double scale = 1.0 / sqrt((double)hs);

    for (int bi = 0; bi < b; bi++) {
        for (int h = 0; h < nh; h++) {
            for (int q = 0; q < t; q++) {
                const float *qv = qkv + ((size_t)bi * t + q) * c3 + h * hs;
                float *pre = preatt + (((size_t)bi * nh + h) * t + q) * t;
                float *a = att + (((size_t)bi * nh + h) * t + q) * t;
                float mx = -INFINITY;
                for (int k = 0; k <= q; k++) {
                    const float *kv = qkv + ((size_t)bi * t + k) * c3 + c + h * hs;
                    double dot = 0.0;
                    for (int i = 0; i < hs; i++)
                        dot += (double)qv[i] * kv[i];
                    pre[k] = (float)(dot * scale);
                    mx = pre[k] > mx ? pre[k] : mx;
                }
                double sum = 0.0;
                for (int k = 0; k <= q; k++)
                    sum += exp((double)pre[k] - mx);
                for (int k = 0; k <= q; k++)
                    a[k] = (float)(exp((double)pre[k] - mx) / sum);
                float *o = out + ((size_t)bi * t + q) * c + h * hs;
                for (int i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int k = 0; k <= q; k++)
                        acc += (double)a[k] * qkv[((size_t)bi * t + k) * c3 + 2 * c + h * hs + i];
                    o[i] = (float)acc;
                }
            }
        }
    }
}

void mgpu_gpt_attention_backward(int b, int t, int c, int nh, const float *dout, const float *qkv,
                                 const float *att, float *datt, float *dpreatt, float *dqkv)
{
    const int hs = c / nh, c3 = 3 * c;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const size_t tt = (size_t)b * nh * t * t;

    memset(datt, 0, tt * sizeof(float));
    memset(dpreatt, 0, tt * sizeof(float));
    for (int bi = 0; bi < b; bi++) {
        for (int h = 0; h < nh; h++) {
            for (int q = 0; q < t; q++) {
                const size_t row = (((size_t)bi * nh + h) * t + q) * t;
                const float *a = att + row;
                float *da = datt + row, *dpre = dpreatt + row;
                const float *qv = qkv + ((size_t)bi * t + q) * c3 + h * hs;
                float *dq = dqkv + ((size_t)bi * t + q) * c3 + h * hs;
                const float *dout_q = dout + ((size_t)bi * t + q) * c + h * hs;
                /* out = att @ v: datt = dout . v, dv += att * dout */
                for (int k = 0; k <= q; k++) {
                    const float *vv = qkv + ((size_t)bi * t + k) * c3 + 2 * c + h * hs;
                    float *dv = dqkv + ((size_t)bi * t + k) * c3 + 2 * c + h * hs;
                    double acc = 0.0;
                    for (int i = 0; i < hs; i++) {
                        acc += (double)vv[i] * dout_q[i];
                        dv[i] += a[k] * dout_q[i];
                    }
                    da[k] = (float)acc;
                }
                /* softmax: dpre = att * (datt - sum(att * datt)) */
                double dot = 0.0;
                for (int k = 0; k <= q; k++)
                    dot += (double)a[k] * da[k];
                for (int k = 0; k <= q; k++)
                    dpre[k] = (float)(a[k] * (da[k] - dot));
                /* pre = scale * q . k */
                for (int k = 0; k <= q; k++) {
                    const float *kv = qkv + ((size_t)bi * t + k) * c3 + c + h * hs;
                    float *dk = dqkv + ((size_t)bi * t + k) * c3 + c + h * hs;
                    float g = dpre[k] * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += kv[i] * g;
                        dk[i] += qv[i] * g;
                    }
                }
            }
        }
    }
}

int mgpu_gpt_embed_forward(int b, int t, int c, int vocab, const int32_t *tokens, const float *wte,
                           const float *wpe, float *out, mgpu_err_t *err)
{
    for (int bi = 0; bi < b; bi++) {
        for (int ti = 0; ti < t; ti++) {
            int32_t tok = tokens[(size_t)bi * t + ti];
            if (tok < 0 || tok >= vocab)
                return mgpu_err_set(err, MGPU_E_RANGE,
                                    "gpt embed: token %d at batch row %d position %d, expected "
                                    "0..%d",
                                    (int)tok, bi, ti, vocab - 1);
            const float *e = wte + (size_t)tok * c, *p = wpe + (size_t)ti * c;
            float *o = out + ((size_t)bi * t + ti) * c;
            for (int j = 0; j < c; j++)
                o[j] = e[j] + p[j];
        }
    }
    return 0;
}

void mgpu_gpt_embed_backward(int b, int t, int c, const int32_t *tokens, const float *dout,
                             float *dwte, float *dwpe)
{
    for (int bi = 0; bi < b; bi++) {
        for (int ti = 0; ti < t; ti++) {
            const float *d = dout + ((size_t)bi * t + ti) * c;
            float *de = dwte + (size_t)tokens[(size_t)bi * t + ti] * c;
            float *dp = dwpe + (size_t)ti * c;
            for (int j = 0; j < c; j++) {
                de[j] += d[j];
                dp[j] += d[j];
            }
        }
    }
}

void mgpu_gpt_residual_forward(size_t n, const float *a, const float *b, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void mgpu_gpt_accumulate(size_t n, float *dst, const float *src)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

int mgpu_gpt_tied_head(int n, int c, int vocab, const float *x, const float *wte,
                       const int32_t *targets, float *logits, float *loss, float *dx, float *dwte,
                       mgpu_err_t *err)
{
    int rc;

    mgpu_gpt_linear_forward(n, c, vocab, x, wte, NULL, logits);
    /* The backend's cross-entropy: its loss is the mean over the rows, and its gradient,
     * already divided by n, may overwrite the logits it reads. */
    rc = mgpu_cpu_softmax_xent(NULL, n, vocab, logits, targets, loss, dx != NULL ? logits : NULL,
                               err);
    if (rc != 0 || dx == NULL)
        return rc;
    mgpu_gpt_linear_backward(n, c, vocab, logits, x, wte, dx, dwte, NULL);
    return 0;
}

int mgpu_gpt_decays(int ndim)
{
    return ndim >= 2;
}

void mgpu_gpt_adamw_tensor(size_t n, float *p, const float *g, float *m, float *v,
                           const mgpu_adamw_hparams_t *hp, int decay, long long step)
{
    mgpu_adamw_hparams_t h = *hp;

    if (!decay)
        h.weight_decay = 0.0f;
    /* The backend's AdamW cannot fail on the CPU: no error to pass on. */
    (void)mgpu_cpu_adamw_step(NULL, n, p, g, m, v, &h, step, NULL);
}

double mgpu_gpt_grad_norm(int ntensors, float *const *g, const size_t *n)
{
    double sum = 0.0;

    for (int i = 0; i < ntensors; i++)
        for (size_t j = 0; j < n[i]; j++)
            sum += (double)g[i][j] * g[i][j];
    return sqrt(sum);
}

float mgpu_gpt_clip_grads(int ntensors, float *const *g, const size_t *n, double norm,
                          float max_norm)
{
    /* clip_grad_norm_'s formula: clamp(max_norm / (norm + 1e-6), max=1) */
    double coef = (double)max_norm / (norm + 1e-6);

    if (coef >= 1.0)
        return 1.0f;
    for (int i = 0; i < ntensors; i++)
        for (size_t j = 0; j < n[i]; j++)
            g[i][j] = (float)(g[i][j] * coef);
    return (float)coef;
}

float mgpu_gpt_lr(long long step, long long warmup, long long total, float lr_max, float lr_min)
{
    if (step < warmup)
        return (float)((double)lr_max * (double)(step + 1) / (double)warmup);
    if (step >= total || total <= warmup)
        return lr_min;
    double ratio = (double)(step - warmup) / (double)(total - warmup);
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)(lr_min + coeff * ((double)lr_max - lr_min));
}

uint16_t mgpu_gpt_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one (quiet) */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float mgpu_gpt_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
