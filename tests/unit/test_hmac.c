/* test_hmac.c - SHA-256 against the FIPS 180-4 examples and HMAC-SHA256 against RFC 4231. */
#include <string.h> /* strlen, memset */

#include "check.h"
#include "sha256.h"

static void hex(const uint8_t *d, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < MGPU_SHA256_LEN; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * MGPU_SHA256_LEN] = '\0';
}

static void check_sha(const void *p, size_t n, const char *want)
{
    uint8_t d[MGPU_SHA256_LEN];
    char h[2 * MGPU_SHA256_LEN + 1];
    mgpu_sha256(p, n, d);
    hex(d, h);
    CHECK_STR(h, want);
}

static void check_hmac(const void *key, size_t klen, const void *msg, size_t mlen, const char *want)
{
    uint8_t d[MGPU_SHA256_LEN];
    char h[2 * MGPU_SHA256_LEN + 1];
    mgpu_sha256_hmac(key, klen, msg, mlen, NULL, 0, NULL, 0, d);
    hex(d, h);
    CHECK_STR(h, want);
    /* the same message cut into three parts */
    if (mlen >= 3) {
        mgpu_sha256_hmac(key, klen, msg, 1, (const uint8_t *)msg + 1, mlen / 2 - 1,
                         (const uint8_t *)msg + mlen / 2, mlen - mlen / 2, d);
        hex(d, h);
        CHECK_STR(h, want);
    }
}

static void t_sha256_fips_180_4(void)
{
    static char million[1000000];
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    check_sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
              "nopqrlmnopqrsmnopqrstnopqrstu",
              112, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    memset(million, 'a', sizeof million);
    check_sha(million, sizeof million,
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void t_sha256_in_pieces(void)
{
    /* updates of every size across block boundaries give the one-shot digest */
    uint8_t msg[300], a[MGPU_SHA256_LEN], b[MGPU_SHA256_LEN];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 31 + 7);
    mgpu_sha256(msg, sizeof msg, a);
    for (size_t step = 1; step < 70; step++) {
        mgpu_sha256_t c;
        mgpu_sha256_init(&c);
        for (size_t at = 0; at < sizeof msg; at += step)
            mgpu_sha256_update(&c, msg + at, at + step > sizeof msg ? sizeof msg - at : step);
        mgpu_sha256_final(&c, b);
        CHECK(memcmp(a, b, sizeof a) == 0);
    }
}

static void t_hmac_rfc_4231(void)
{
    uint8_t k20[20], k25[25], k131[131], d50[50];
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const char *m7 =
        "This is a test using a larger than block-size key and a larger than block-size "
        "data. The key needs to be hashed before being used by the HMAC algorithm.";

    memset(k20, 0x0b, sizeof k20);
    check_hmac(k20, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k20, 0xaa, sizeof k20);
    memset(d50, 0xdd, sizeof d50);
    check_hmac(k20, 20, d50, 50,
               "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++)
        k25[i] = (uint8_t)(i + 1);
    memset(d50, 0xcd, sizeof d50);
    check_hmac(k25, 25, d50, 50,
               "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k131, 0xaa, sizeof k131);
    check_hmac(k131, 131, m6, strlen(m6),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    check_hmac(k131, 131, m7, strlen(m7),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

static void t_equal_and_wipe(void)
{
    uint8_t a[32] = {1, 2, 3}, b[32] = {1, 2, 3};
    CHECK(mgpu_sha256_equal(a, b, sizeof a));
    b[31] = 1;
    CHECK(!mgpu_sha256_equal(a, b, sizeof a));
    CHECK(mgpu_sha256_equal(a, b, 0));
    mgpu_sha256_wipe(a, sizeof a);
    for (size_t i = 0; i < sizeof a; i++)
        CHECK_INT(a[i], 0);
}

int main(void)
{
    RUN(t_sha256_fips_180_4);
    RUN(t_sha256_in_pieces);
    RUN(t_hmac_rfc_4231);
    RUN(t_equal_and_wipe);
    return check_done();
}
