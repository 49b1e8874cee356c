/* store_proto.h - the wire format of mgpu's key-value store, shared by the server
 * (launcher/store_server.c) and the blocking client (common/store.c).
 *
 * mgpu speaks its own protocol rather than PyTorch's TCPStore protocol, which is not stable
 * across PyTorch releases: the command numbers were renumbered (2.0/2.1 against 2.3 and
 * later), a handshake was added, and one version prefixed every command with a magic number.
 * Every integer is little-endian, whatever the host.
 *
 * Frame = 12-byte header + payload:
 *
 *   offset size  field
 *   0      2     magic "MG" (0x4D 0x47): a peer speaking something else fails on its first bytes
 *   2      1     op: a request op below, or (op | 0x80) in the response to it
 *   3      1     status: 0 in requests; an MGPU_STORE_ST_* code in responses
 *   4      4     request id: chosen by the client, echoed by the server, so answers are
 *                matched to requests (a client may pipeline). Id 0 in an error response is
 *                the server's word on the whole connection (too many connections, a frame it
 *                could not cut), sent before it closes
 *   8      4     payload length in bytes (bounded by the decoder's limits)
 *
 * Payload fields, in order: u8, u32, i64, and bytes = u32 length + that many bytes (keys,
 * values, nonces, proofs). A payload must be consumed exactly: trailing bytes are an error.
 *
 *   op            request payload                          response payload (status OK)
 *   1 HELLO       u8 version, bytes client nonce (32)      u8 server version, bytes server
 *                                                          nonce (32)
 *   12 AUTH       bytes client proof (32)                  bytes server proof (32)
 *   2 SET         bytes key, bytes value                   -
 *   3 GET         u32 timeout_ms, bytes key                bytes value
 *   4 ADD         bytes key, i64 delta                     i64 new value
 *   5 COMPARE_SET bytes key, bytes expected, bytes desired u8 exists, bytes value (after the op)
 *   6 WAIT        u32 timeout_ms, u32 n, n x bytes key     -
 *   7 CHECK       u32 n, n x bytes key                     u8 ready (1 = all exist)
 *   8 DELETE      bytes key                                u8 deleted (1 = it existed)
 *   9 NUM_KEYS    -                                        i64 number of keys
 *   10 PING       u32 nonce                                u32 nonce
 *   11 ON_CLOSE   u32 2n, n x (bytes key, bytes value)      -
 *   13 ON_IDLE    u32 timeout_ms, u32 2n, n x (bytes key,   -
 *                 bytes value)
 *
 * ON_CLOSE registers, for this connection, keys the server sets (each only if it has no value
 * then) when the connection closes for any reason but the server's own shutdown: how a peer's
 * death wakes the others that wait on those keys, like ZooKeeper's ephemeral nodes. A new
 * ON_CLOSE replaces the last one; 0 pairs clears it. Values are bounded like keys.
 *
 * ON_IDLE is ON_CLOSE's counterpart for a peer that is silent rather than gone (a host cut off
 * the network, a stopped process: no FIN, no RST ever comes): once timeout_ms pass without a
 * frame from this connection, the server sets its ON_IDLE keys (each only if it has no value
 * then) and closes it, which then sets its ON_CLOSE keys that are still missing. A peer keeps
 * its lease with any request (PING). A new ON_IDLE replaces the last; 0 pairs clears it. The
 * two lists let readers tell a silence from a close.
 *
 * The handshake proves knowledge of the token (the shared secret, "" when the server has none)
 * without sending it: a capture of the traffic neither reveals it nor can be replayed. Both
 * nonces are 32 random bytes, fresh per connection; proofs are HMAC-SHA256 keyed with the token:
 *
 *   server proof = HMAC(token, client nonce || server nonce || "mgpu-store-v2 server")
 *   client proof = HMAC(token, server nonce || client nonce || "mgpu-store-v2 client")
 *
 * The client sends HELLO; the server answers with its nonce; the client sends AUTH with its
 * proof; the server compares it with the expected one in constant time and answers ST_AUTH, or
 * OK with its own proof, which the client checks in turn (a server that does not know the
 * token is not the job's store: the client closes). The client proves first so that a stranger
 * who connects learns nothing it could test guesses of the token against offline. The two
 * context strings differ, so neither side's proof can be replayed as the other's. A server
 * without a token accepts any client proof (and proves with the empty token). Only HELLO and then
 * AUTH are accepted until AUTH succeeds, within the server's deadline (2 s by default), in frames
 * of at most MGPU_STORE_PREAUTH_MAX bytes; a server whose slots for authenticated clients are all
 * taken answers AUTH with ST_BUSY and closes, and a client retries that (with backoff) until its
 * own deadline.
 *
 * A response whose status is not OK carries one field: bytes message (human-readable).
 * HELLO must be the first request of a connection; its version is MGPU_STORE_PROTO_VERSION and a
 * server that speaks another answers ST_VERSION and closes (version 1 sent the token itself). The
 * header and HELLO's first byte (the version) keep their meaning in every version; what follows may
 * change. timeout_ms: 0 = do not wait, MGPU_STORE_WAIT_FOREVER = no deadline. A malformed or
 * oversized frame is a protocol error: the server answers ST_PROTOCOL (best effort) and closes that
 * connection only.
 *
 * Ownership: the decoder owns its buffer; a frame it returns points into that buffer and stays
 * valid until the next call of reserve, feed or next on the same decoder. */
#ifndef MGPU_STORE_PROTO_H
#define MGPU_STORE_PROTO_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint8_t, uint32_t, int64_t */

#include "error.h" /* mgpu_err_t */

#define MGPU_STORE_PROTO_VERSION 2
#define MGPU_STORE_HDR_SIZE 12
#define MGPU_STORE_MAGIC0 0x4D /* 'M' */
#define MGPU_STORE_MAGIC1 0x47 /* 'G' */
#define MGPU_STORE_RESP 0x80   /* set in the op of a response */
#define MGPU_STORE_WAIT_FOREVER UINT32_MAX
#define MGPU_STORE_NONCE_LEN 32 /* bytes in a handshake nonce */
#define MGPU_STORE_PROOF_LEN 32 /* bytes in a handshake proof (an HMAC-SHA256) */
/* The largest frame a server reads before AUTH succeeds: a HELLO with its nonce, with room
 * for another version's HELLO to be answered ST_VERSION rather than cut. */
#define MGPU_STORE_PREAUTH_MAX 128

/* Default limits (the server's may be changed by its options). */
#define MGPU_STORE_MAX_KEY (4u << 10)          /* bytes in a key (and in the token) */
#define MGPU_STORE_MAX_VALUE (64u << 20)       /* bytes in a value */
#define MGPU_STORE_MAX_KEYS_PER_REQ (1u << 16) /* keys in one WAIT or CHECK */

enum {
    MGPU_STORE_OP_HELLO = 1,
    MGPU_STORE_OP_SET = 2,
    MGPU_STORE_OP_GET = 3,
    MGPU_STORE_OP_ADD = 4,
    MGPU_STORE_OP_COMPARE_SET = 5,
    MGPU_STORE_OP_WAIT = 6,
    MGPU_STORE_OP_CHECK = 7,
    MGPU_STORE_OP_DELETE = 8,
    MGPU_STORE_OP_NUM_KEYS = 9,
    MGPU_STORE_OP_PING = 10,
    MGPU_STORE_OP_ON_CLOSE = 11,
    MGPU_STORE_OP_AUTH = 12,
    MGPU_STORE_OP_ON_IDLE = 13,
    MGPU_STORE_OP_LAST = MGPU_STORE_OP_ON_IDLE,
};

enum {
    MGPU_STORE_ST_OK = 0,
    MGPU_STORE_ST_TIMEOUT = 1,   /* GET/WAIT: the deadline passed before the keys existed */
    MGPU_STORE_ST_BAD_VALUE = 2, /* ADD on a value that is not a decimal int64, or overflow */
    MGPU_STORE_ST_AUTH = 3,      /* wrong token (the server closes) */
    MGPU_STORE_ST_VERSION = 4,   /* protocol version not spoken (the server closes) */
    MGPU_STORE_ST_PROTOCOL = 5,  /* malformed or oversized frame (the server closes) */
    MGPU_STORE_ST_BUSY = 6,      /* no slot for this connection now: retry later (it closes) */
    MGPU_STORE_ST_LAST = MGPU_STORE_ST_BUSY,
};

typedef struct mgpu_store_limits {
    size_t max_key;   /* bytes in a key or token */
    size_t max_value; /* bytes in a value */
    size_t max_keys;  /* keys in one WAIT/CHECK */
} mgpu_store_limits_t;

/* The default limits above. */
mgpu_store_limits_t mgpu_store_limits_default(void);

/* A run of bytes inside a frame (not NUL-terminated). */
typedef struct mgpu_store_slice {
    const uint8_t *p;
    uint32_t len;
} mgpu_store_slice_t;

/* One whole frame as cut by the decoder; payload points into the decoder's buffer. */
typedef struct mgpu_store_frame {
    uint8_t op;
    uint8_t status;
    uint32_t id;
    const uint8_t *payload;
    uint32_t len;
} mgpu_store_frame_t;

/* A frame's payload, parsed and checked against the limits. Which fields are set depends on
 * op (table above); slices point into the frame. */
typedef struct mgpu_store_msg {
    uint8_t op; /* with MGPU_STORE_RESP for responses */
    uint8_t status;
    uint32_t id;
    uint8_t u8;              /* HELLO version; CHECK ready; DELETE deleted; COMPARE_SET exists */
    uint32_t u32;            /* GET/WAIT/ON_IDLE timeout_ms; PING nonce */
    int64_t i64;             /* ADD delta or new value; NUM_KEYS */
    uint32_t nkeys;          /* WAIT/CHECK: number of keys, read them with mgpu_store_keys_next */
    mgpu_store_slice_t key;  /* the key; HELLO nonce; AUTH proof; WAIT/CHECK: the key list */
    mgpu_store_slice_t val;  /* SET value; COMPARE_SET expected; GET/COMPARE_SET response value;
                                HELLO response: the server nonce; error message of a non-OK
                                response */
    mgpu_store_slice_t val2; /* COMPARE_SET desired; AUTH response: the server proof */
} mgpu_store_msg_t;

/* The incremental decoder: bytes go in (feed, or reserve + read + commit without a copy),
 * whole frames come out. The header is checked as soon as it is complete, so an oversized
 * frame is refused before its payload is buffered. After an error the decoder stays failed. */
typedef struct mgpu_store_dec {
    uint8_t *buf;
    size_t start; /* first byte not yet returned as a frame */
    size_t len;   /* bytes in buf */
    size_t cap;
    size_t max_payload;
    size_t chunk;  /* bytes read at once when no frame asks for more */
    int responses; /* 1: accept response ops (client); 0: request ops (server) */
    int failed;
} mgpu_store_dec_t;

/* responses: 1 for a client's decoder, 0 for a server's. lim NULL = defaults. */
void mgpu_store_dec_init(mgpu_store_dec_t *d, const mgpu_store_limits_t *lim, int responses);
void mgpu_store_dec_free(mgpu_store_dec_t *d);
/* Changes the limits of frames not yet returned (the server widens them after HELLO). */
void mgpu_store_dec_set_limits(mgpu_store_dec_t *d, const mgpu_store_limits_t *lim);
/* Bytes to read at once (and to allocate at first) when no frame needs more: the server keeps
 * it small until a peer has authenticated, so an idle or hostile connection costs little. */
void mgpu_store_dec_set_chunk(mgpu_store_dec_t *d, size_t chunk);
/* Space to read at least min bytes into (more when a known frame needs more); invalidates
 * frames returned before. -ENOMEM on allocation failure. */
int mgpu_store_dec_reserve(mgpu_store_dec_t *d, size_t min, uint8_t **p, size_t *avail);
/* n bytes were written into the space given by reserve. */
void mgpu_store_dec_commit(mgpu_store_dec_t *d, size_t n);
/* Copies n bytes in. */
int mgpu_store_dec_feed(mgpu_store_dec_t *d, const void *p, size_t n, mgpu_err_t *err);
/* 1 and *f = the next whole frame; 0 when more bytes are needed; MGPU_E_PROTOCOL on a bad or
 * oversized header. */
int mgpu_store_dec_next(mgpu_store_dec_t *d, mgpu_store_frame_t *f, mgpu_err_t *err);

/* Parses a frame's payload for its op (request or response). MGPU_E_PROTOCOL when it is
 * malformed or a field exceeds lim (NULL = defaults). */
int mgpu_store_msg_parse(const mgpu_store_frame_t *f, const mgpu_store_limits_t *lim,
                         mgpu_store_msg_t *m, mgpu_err_t *err);
/* Iterates the key list of a parsed WAIT/CHECK: *pos starts at 0; returns 1 and the next key,
 * 0 at the end. The list was validated by mgpu_store_msg_parse. */
int mgpu_store_keys_next(const mgpu_store_msg_t *m, uint32_t *pos, mgpu_store_slice_t *key);

/* An output buffer that frames are appended to. Appends never fail half-way: on allocation
 * failure the buffer is marked failed and mgpu_store_buf_frame_end returns -ENOMEM. */
typedef struct mgpu_store_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
    int failed;
} mgpu_store_buf_t;

void mgpu_store_buf_free(mgpu_store_buf_t *b);
/* Starts a frame; returns its offset, to give to mgpu_store_buf_frame_end. */
size_t mgpu_store_buf_frame_begin(mgpu_store_buf_t *b, uint8_t op, uint8_t status, uint32_t id);
/* Patches the payload length into the header; 0, or -ENOMEM if an append failed (the
 * buffer is then truncated back to where the frame began). */
int mgpu_store_buf_frame_end(mgpu_store_buf_t *b, size_t start);
void mgpu_store_buf_u8(mgpu_store_buf_t *b, uint8_t v);
void mgpu_store_buf_u32(mgpu_store_buf_t *b, uint32_t v);
void mgpu_store_buf_i64(mgpu_store_buf_t *b, int64_t v);
/* u32 length + bytes */
void mgpu_store_buf_bytes(mgpu_store_buf_t *b, const void *p, size_t n);
/* bytes with no length (the parts of a field whose length was written with buf_u32) */
void mgpu_store_buf_raw(mgpu_store_buf_t *b, const void *p, size_t n);

/* A proof of the handshake (see above): server = 1 for the server's, 0 for the client's. */
void mgpu_store_proof(const void *token, size_t tlen, int server,
                      const uint8_t cnonce[MGPU_STORE_NONCE_LEN],
                      const uint8_t snonce[MGPU_STORE_NONCE_LEN],
                      uint8_t out[MGPU_STORE_PROOF_LEN]);
/* n random bytes from getrandom(2), for nonces. 0 or -errno (detail in err). */
int mgpu_store_random(void *p, size_t n, mgpu_err_t *err);

/* Names for logs: "SET", "GET", ... ("?" when unknown); status names "ok", "timeout", ... */
const char *mgpu_store_op_name(uint8_t op);
const char *mgpu_store_status_name(uint8_t status);

#endif
