/* sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the store's challenge and
 * response: a peer proves it knows the token without sending it.
 *
 * Small and dependency-free on purpose: the launcher links no crypto library, and the store
 * needs one hash over a few hundred bytes per connection, not speed. Nothing to own or free;
 * a context lives on the caller's stack. */
#ifndef MGPU_SHA256_H
#define MGPU_SHA256_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint8_t, uint32_t, uint64_t */

#define MGPU_SHA256_LEN 32   /* bytes in a digest */
#define MGPU_SHA256_BLOCK 64 /* bytes in a block */

typedef struct mgpu_sha256 {
    uint32_t h[8];
    uint64_t bytes; /* message bytes so far */
    uint8_t block[MGPU_SHA256_BLOCK];
    size_t used; /* bytes in block */
} mgpu_sha256_t;

void mgpu_sha256_init(mgpu_sha256_t *c);
void mgpu_sha256_update(mgpu_sha256_t *c, const void *p, size_t n);
/* Writes the digest; the context must be initialised again before reuse. */
void mgpu_sha256_final(mgpu_sha256_t *c, uint8_t out[MGPU_SHA256_LEN]);
/* The digest of one buffer. */
void mgpu_sha256(const void *p, size_t n, uint8_t out[MGPU_SHA256_LEN]);

/* HMAC-SHA256(key, m1 || m2 || m3): the message in parts so that callers need not join a
 * nonce and a context string into one buffer (a part may be NULL with length 0). */
void mgpu_sha256_hmac(const void *key, size_t klen, const void *m1, size_t n1, const void *m2,
                      size_t n2, const void *m3, size_t n3, uint8_t out[MGPU_SHA256_LEN]);

/* 1 when the n bytes of a and b are equal, in time that does not depend on where they
 * differ (for comparing a proof with the expected one). */
int mgpu_sha256_equal(const void *a, const void *b, size_t n);

/* Overwrites n bytes in a way the compiler may not drop as a dead store (secrets in memory
 * that is about to be freed or reused). */
void mgpu_sha256_wipe(void *p, size_t n);

#endif
