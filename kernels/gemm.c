/* gemm.c - the plain-C GEMM: the CPU backend's product and the reference of gemm.cu and
 * small_gemm.cu. Single-threaded, packed panels and a register-tiled micro-kernel. */
#include "cpu_ref.h" /* cpu_impl_t, VECTORIZE, the reference functions */

#include <string.h> /* memset */

/* Packs op(A)[i0 .. i0+mc, p0 .. p0+kc) as panels of MR rows: panel[p * MR + r], zero rows
 * past mc so the micro-kernel never branches. */
static void pack_a(int trans, const float *restrict a, int lda, int i0, int mc, int p0, int kc,
                   float *restrict dst)
{
    if (trans) {
        /* op(A) = A^T: row p of A holds column p of every panel. Each row's mc floats are
         * read once, in order, and dealt out to the panels (a panel after another read all
         * kc rows again, 16 bytes of each). */
        for (int p = 0; p < kc; p++) {
            const float *row = a + (size_t)(p0 + p) * lda + i0;
            for (int ip = 0; ip < mc; ip += MR) {
                float *d = dst + (size_t)ip * kc + (size_t)p * MR;
                int mr = mc - ip < MR ? mc - ip : MR;
                for (int r = 0; r < mr; r++)
                    d[r] = row[ip + r];
                for (int r = mr; r < MR; r++)
                    d[r] = 0.0f;
            }
        }
        return;
    }
    for (int ip = 0; ip < mc; ip += MR) {
        int mr = mc - ip < MR ? mc - ip : MR;
        for (int p = 0; p < kc; p++) {
            for (int r = 0; r < mr; r++) {
                int i = i0 + ip + r, kk = p0 + p;
                dst[p * MR + r] = a[(size_t)i * lda + kk];
            }
            for (int r = mr; r < MR; r++)
                dst[p * MR + r] = 0.0f;
        }
        dst += (size_t)kc * MR;
    }
}

/* Packs op(B)[p0 .. p0+kc, j0 .. j0+nc) as panels of NR columns: panel[p * NR + c]. */
static void pack_b(int trans, const float *restrict b, int ldb, int p0, int kc, int j0, int nc,
                   int NR, float *restrict dst)
{
    for (int jp = 0; jp < nc; jp += NR) {
        int nr = nc - jp < NR ? nc - jp : NR;
        for (int p = 0; p < kc; p++) {
            int kk = p0 + p;
            if (!trans && nr == NR) {
                memcpy(dst + p * NR, b + (size_t)kk * ldb + j0 + jp, sizeof(float) * NR);
                continue;
            }
            for (int c = 0; c < nr; c++) {
                int j = j0 + jp + c;
                dst[p * NR + c] = trans ? b[(size_t)j * ldb + kk] : b[(size_t)kk * ldb + j];
            }
            for (int c = nr; c < NR; c++)
                dst[p * NR + c] = 0.0f;
        }
        dst += (size_t)kc * NR;
    }
}

/* acc = sum over p of a[p][r] * b[p][:], for an MR x 8 tile (panels of 8 columns). */
static void micro_kernel_4x8(int kc, const float *restrict a, const float *restrict b,
                             float acc[MR][NR_MAX])
{
    v4f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    for (int p = 0; p < kc; p++) {
        v4f b0, b1;
        memcpy(&b0, b + p * 8, sizeof b0);
        memcpy(&b1, b + p * 8 + 4, sizeof b1);
        const float *ap = a + p * MR;
        c00 += ap[0] * b0;
        c01 += ap[0] * b1;
        c10 += ap[1] * b0;
        c11 += ap[1] * b1;
        c20 += ap[2] * b0;
        c21 += ap[2] * b1;
        c30 += ap[3] * b0;
        c31 += ap[3] * b1;
    }
    memcpy(&acc[0][0], &c00, sizeof c00);
    memcpy(&acc[0][4], &c01, sizeof c01);
    memcpy(&acc[1][0], &c10, sizeof c10);
    memcpy(&acc[1][4], &c11, sizeof c11);
    memcpy(&acc[2][0], &c20, sizeof c20);
    memcpy(&acc[2][4], &c21, sizeof c21);
    memcpy(&acc[3][0], &c30, sizeof c30);
    memcpy(&acc[3][4], &c31, sizeof c31);
}

/* The same for an MR x 16 tile with 8-float AVX vectors and fused multiply-adds: compiled for
 * AVX2 + FMA whatever the build flags, called only when the CPU has them. FMA rounds once
 * where the portable kernel rounds twice, so results differ in the last bits between the two
 * paths (never between ranks of one host, which all take the same one). */
typedef float v8f __attribute__((vector_size(32)));

__attribute__((target("avx2,fma"))) static void
micro_kernel_4x16(int kc, const float *restrict a, const float *restrict b, float acc[MR][NR_MAX])
{
    v8f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    for (int p = 0; p < kc; p++) {
        v8f b0, b1;
        memcpy(&b0, b + p * 16, sizeof b0);
        memcpy(&b1, b + p * 16 + 8, sizeof b1);
        const float *ap = a + p * MR;
        c00 += ap[0] * b0;
        c01 += ap[0] * b1;
        c10 += ap[1] * b0;
        c11 += ap[1] * b1;
        c20 += ap[2] * b0;
        c21 += ap[2] * b1;
        c30 += ap[3] * b0;
        c31 += ap[3] * b1;
    }
    memcpy(&acc[0][0], &c00, sizeof c00);
    memcpy(&acc[0][8], &c01, sizeof c01);
    memcpy(&acc[1][0], &c10, sizeof c10);
    memcpy(&acc[1][8], &c11, sizeof c11);
    memcpy(&acc[2][0], &c20, sizeof c20);
    memcpy(&acc[2][8], &c21, sizeof c21);
    memcpy(&acc[3][0], &c30, sizeof c30);
    memcpy(&acc[3][8], &c31, sizeof c31);
}

int mgpu_cpu_gemm(void *impl, int trans_a, int trans_b, int m, int n, int k, float alpha,
                  const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                  mgpu_err_t *err)
{
    cpu_impl_t *ci = impl;
    const int NR = ci->nr;

    if (k == 0 || alpha == 0.0f) {
        /* Only the beta * C part is left; beta == 0 writes zeros without reading C. */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
        return 0;
    }
    for (int jc = 0; jc < n; jc += NC) {
        int nc = n - jc < NC ? n - jc : NC;
        for (int pc = 0; pc < k; pc += KC) {
            int kc = k - pc < KC ? k - pc : KC;
            /* The first K block applies beta; later ones accumulate into C. */
            int first = pc == 0;
            pack_b(trans_b, b, ldb, pc, kc, jc, nc, NR, ci->bpack);
            for (int ic = 0; ic < m; ic += MC) {
                int mc = m - ic < MC ? m - ic : MC;
                pack_a(trans_a, a, lda, ic, mc, pc, kc, ci->apack);
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR;
                    const float *bp = ci->bpack + (size_t)jr * kc;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        float acc[MR][NR_MAX];
                        if (NR == 16)
                            micro_kernel_4x16(kc, ci->apack + (size_t)ir * kc, bp, acc);
                        else
                            micro_kernel_4x8(kc, ci->apack + (size_t)ir * kc, bp, acc);
                        for (int r = 0; r < mr; r++) {
                            float *crow = c + (size_t)(ic + ir + r) * ldc + jc + jr;
                            for (int q = 0; q < nr; q++) {
                                float prev = !first ? crow[q] : beta == 0 ? 0.0f : beta * crow[q];
                                crow[q] = prev + alpha * acc[r][q];
                            }
                        }
                    }
                }
            }
        }
    }
    return 0;
}
