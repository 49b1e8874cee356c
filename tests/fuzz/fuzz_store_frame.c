/* fuzz_store_frame.c - libFuzzer target for the store's frame decoder and payload parser
 * (common/store_proto.c), the code that reads bytes from any peer that can reach the port.
 *
 * Input layout: byte 0 picks the decoder (request or response side) and the limits (the
 * defaults or small ones, so that limit checks are reached); byte 1 seeds the sizes of the
 * chunks the rest is fed in, since a frame split anywhere must decode the same. Every frame
 * cut is parsed; a parsed frame is re-encoded and must give back the same bytes, so the parser
 * can neither accept more nor read other bytes than the writer produces.
 *
 *   tests/fuzz/run.sh 20    builds with clang -fsanitize=fuzzer,address,undefined and runs */
#include <stdint.h> /* uint8_t */
#include <stdlib.h> /* abort */
#include <string.h> /* memcmp */

#include "store_proto.h"

/* Rebuilds the frame of m with the writer and compares it with the bytes received. */
static void check_reencode(const mgpu_store_msg_t *m, const mgpu_store_frame_t *f)
{
    mgpu_store_buf_t b = {0};
    size_t at = mgpu_store_buf_frame_begin(&b, m->op, m->status, m->id);
    uint8_t op = m->op & (uint8_t)~MGPU_STORE_RESP;
    int resp = (m->op & MGPU_STORE_RESP) != 0;

    if (op == MGPU_STORE_OP_HELLO && m->u8 != MGPU_STORE_PROTO_VERSION &&
        (!resp || m->status == MGPU_STORE_ST_OK)) {
        mgpu_store_buf_free(&b); /* another version's HELLO: only its first byte was read */
        return;
    } else if (resp && m->status != MGPU_STORE_ST_OK) {
        mgpu_store_buf_bytes(&b, m->val.p, m->val.len);
    } else if (!resp) {
        switch (op) {
        case MGPU_STORE_OP_HELLO:
            mgpu_store_buf_u8(&b, m->u8);
            mgpu_store_buf_bytes(&b, m->key.p, m->key.len);
            break;
        case MGPU_STORE_OP_SET:
            mgpu_store_buf_bytes(&b, m->key.p, m->key.len);
            mgpu_store_buf_bytes(&b, m->val.p, m->val.len);
            break;
        case MGPU_STORE_OP_GET:
            mgpu_store_buf_u32(&b, m->u32);
            mgpu_store_buf_bytes(&b, m->key.p, m->key.len);
            break;
        case MGPU_STORE_OP_ADD:
            mgpu_store_buf_bytes(&b, m->key.p, m->key.len);
            mgpu_store_buf_i64(&b, m->i64);
            break;
        case MGPU_STORE_OP_COMPARE_SET:
            mgpu_store_buf_bytes(&b, m->key.p, m->key.len);
            mgpu_store_buf_bytes(&b, m->val.p, m->val.len);
            mgpu_store_buf_bytes(&b, m->val2.p, m->val2.len);
            break;
        case MGPU_STORE_OP_WAIT:
        case MGPU_STORE_OP_CHECK:
        case MGPU_STORE_OP_ON_CLOSE:
        case MGPU_STORE_OP_ON_IDLE: {
            uint32_t pos = 0, n = 0;
            mgpu_store_slice_t k;
            if (op == MGPU_STORE_OP_WAIT || op == MGPU_STORE_OP_ON_IDLE)
                mgpu_store_buf_u32(&b, m->u32);
            mgpu_store_buf_u32(&b, m->nkeys);
            while (mgpu_store_keys_next(m, &pos, &k)) {
                mgpu_store_buf_bytes(&b, k.p, k.len);
                n++;
            }
            if (n != m->nkeys)
                abort();
            break;
        }
        case MGPU_STORE_OP_DELETE:
        case MGPU_STORE_OP_AUTH:
            mgpu_store_buf_bytes(&b, m->key.p, m->key.len);
            break;
        case MGPU_STORE_OP_NUM_KEYS:
            break;
        case MGPU_STORE_OP_PING:
            mgpu_store_buf_u32(&b, m->u32);
            break;
        default:
            abort();
        }
    } else {
        switch (op) {
        case MGPU_STORE_OP_HELLO:
            mgpu_store_buf_u8(&b, m->u8);
            mgpu_store_buf_bytes(&b, m->val.p, m->val.len);
            break;
        case MGPU_STORE_OP_AUTH:
            mgpu_store_buf_bytes(&b, m->val2.p, m->val2.len);
            break;
        case MGPU_STORE_OP_CHECK:
        case MGPU_STORE_OP_DELETE:
            mgpu_store_buf_u8(&b, m->u8);
            break;
        case MGPU_STORE_OP_SET:
        case MGPU_STORE_OP_WAIT:
        case MGPU_STORE_OP_ON_CLOSE:
        case MGPU_STORE_OP_ON_IDLE:
            break;
        case MGPU_STORE_OP_GET:
            mgpu_store_buf_bytes(&b, m->val.p, m->val.len);
            break;
        case MGPU_STORE_OP_ADD:
        case MGPU_STORE_OP_NUM_KEYS:
            mgpu_store_buf_i64(&b, m->i64);
            break;
        case MGPU_STORE_OP_COMPARE_SET:
            mgpu_store_buf_u8(&b, m->u8);
            mgpu_store_buf_bytes(&b, m->val.p, m->val.len);
            break;
        case MGPU_STORE_OP_PING:
            mgpu_store_buf_u32(&b, m->u32);
            break;
        default:
            abort();
        }
    }
    if (mgpu_store_buf_frame_end(&b, at) != 0 || b.len != MGPU_STORE_HDR_SIZE + f->len ||
        memcmp(b.p + MGPU_STORE_HDR_SIZE, f->payload, f->len) != 0)
        abort();
    mgpu_store_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mgpu_store_limits_t small = {64, 256, 8}, def = mgpu_store_limits_default();
    mgpu_store_dec_t d;
    mgpu_store_frame_t f;
    mgpu_store_msg_t m;
    mgpu_err_t err;
    const mgpu_store_limits_t *lim;
    uint32_t seed;
    size_t pos = 2;
    int failed = 0;

    if (size < 2)
        return 0;
    lim = data[0] & 2 ? &small : &def;
    seed = data[1] | 1u;
    mgpu_store_dec_init(&d, lim, data[0] & 1);
    while (pos < size && !failed) {
        size_t chunk;
        seed = seed * 1103515245u + 12345u;
        chunk = 1 + (seed >> 16) % 64;
        if (chunk > size - pos)
            chunk = size - pos;
        if (mgpu_store_dec_feed(&d, data + pos, chunk, &err) != 0)
            abort(); /* only allocation can fail, and inputs are small */
        pos += chunk;
        for (;;) {
            int rc = mgpu_store_dec_next(&d, &f, &err);
            if (rc < 0) {
                failed = 1;
                /* a failed decoder stays failed */
                if (mgpu_store_dec_next(&d, &f, &err) >= 0)
                    abort();
                break;
            }
            if (rc == 0)
                break;
            if (f.len > size || f.payload < d.buf || f.payload + f.len > d.buf + d.len)
                abort();
            if (mgpu_store_msg_parse(&f, lim, &m, &err) == 0)
                check_reencode(&m, &f);
        }
    }
    mgpu_store_dec_free(&d);
    return 0;
}
