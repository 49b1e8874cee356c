#!/usr/bin/env python3
"""store_abuse.py - talks to a running mgpu store the wrong ways (tests/integration).

    store_abuse.py HOST PORT TOKEN HOLD_UNTIL_FILE

Speaks the frame format of common/store_proto.h (12-byte header: "MG", op, status, u32 id,
u32 payload length, little-endian; fields u8, u32, i64, bytes = u32 length + bytes) and its
handshake (HELLO with a nonce, AUTH with an HMAC-SHA256 proof of the token, the server's proof
back). The token never goes on the wire, not even in the abuses. Each abuse
runs on a connection of its own and must end with the server closing that connection (an
error frame first is allowed and checked). Then a well-behaved client (right token) must still
get answers. Two nasty connections stay open (half a frame, never finished; a connection that
never says HELLO) until HOLD_UNTIL_FILE exists, so the job ends while they are held.
Prints one line per check; exits 1 on the first that fails.
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

HELLO, SET, GET, ADD, PING, AUTH = 1, 2, 3, 4, 10, 12
ST_OK, ST_AUTH, ST_VERSION, ST_PROTOCOL = 0, 3, 4, 5
VERSION = 2

host, port, token, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4]


def b(x):
    return struct.pack("<I", len(x)) + x


def frame(op, rid, payload, length=None):
    return b"MG" + bytes([op, 0]) + struct.pack("<II", rid, len(payload) if length is None else length) + payload


def conn():
    s = socket.create_connection((host, port), timeout=10)
    s.settimeout(10)
    return s


def read_until_close(s, limit=15.0):
    """All bytes the server sends until it closes; raises if it keeps the connection open."""
    data = b""
    end = time.time() + limit
    while time.time() < end:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        except socket.timeout:
            continue
        if not chunk:
            return data
        data += chunk
    raise AssertionError("the server kept the connection open for %.0f s" % limit)


def frames(data):
    out = []
    while len(data) >= 12:
        assert data[:2] == b"MG", "response without the magic: %r" % data[:16]
        op, st = data[2], data[3]
        rid, n = struct.unpack("<II", data[4:12])
        out.append((op, st, rid, data[12:12 + n]))
        data = data[12 + n:]
    return out


def expect_closed(name, payload, statuses):
    s = conn()
    try:
        s.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while we were still writing: fine
    data = read_until_close(s)
    s.close()
    fs = frames(data)
    for op, st, rid, body in fs:
        assert st in statuses, "%s: answered status %d (expected one of %s): %r" % (name, st, statuses, body)
    print("closed ok: %s (%s)" % (name, "; ".join("status %d: %s" % (st, body[4:].decode(errors="replace")) for _, st, _, body in fs) or "no answer"))


def proof(tok, first, second, side):
    return hmac.new(tok, first + second + b"mgpu-store-v2 " + side, hashlib.sha256).digest()


def handshake(s, rid, tok=None):
    """HELLO and AUTH with tok (default: the right token); the AUTH answer (status, body)."""
    tok = token if tok is None else tok
    cn = os.urandom(32)
    st, body = roundtrip(s, HELLO, rid, bytes([VERSION]) + b(cn))
    assert st == ST_OK and body[0] == VERSION and len(body) == 1 + 4 + 32, (st, body)
    sn = body[5:]
    st, body = roundtrip(s, AUTH, rid + 1, b(proof(tok, sn, cn, b"client")))
    if st == ST_OK:
        assert body == b(proof(tok, cn, sn, b"server")), "the server's proof does not match"
    return st, body


def expect_refused_auth(name, tok):
    s = conn()
    st, body = handshake(s, 3, tok)
    assert st == ST_AUTH, "%s: AUTH answered status %d: %r" % (name, st, body)
    read_until_close(s)
    s.close()
    print("closed ok: %s (status %d: %s)" % (name, st, body[4:].decode(errors="replace")))


def roundtrip(s, op, rid, payload):
    s.sendall(frame(op, rid, payload))
    hdr = b""
    while len(hdr) < 12:
        c = s.recv(12 - len(hdr))
        assert c, "connection closed awaiting the answer to op %d" % op
        hdr += c
    assert hdr[:2] == b"MG" and hdr[2] == op | 0x80, "bad answer header %r" % hdr
    st = hdr[3]
    rid2, n = struct.unpack("<II", hdr[4:12])
    body = b""
    while len(body) < n:
        c = s.recv(n - len(body))
        assert c, "connection closed in an answer"
        body += c
    assert rid2 == rid, "answer id %d for request %d" % (rid2, rid)
    return st, body


# 1. garbage: an HTTP request
expect_closed("garbage bytes", b"GET / HTTP/1.1\r\nHost: store\r\n\r\n" + os.urandom(64), {ST_PROTOCOL})
# 2. the right magic, an op that does not exist
expect_closed("unknown op 0x7f", b"MG\x7f\x00" + struct.pack("<II", 1, 4) + b"junk", {ST_PROTOCOL})
# 3. an oversized frame header before HELLO: payload length 0xFFFFFFFF
expect_closed("oversized frame (0xFFFFFFFF) before HELLO", frame(GET, 1, b"", 0xFFFFFFFF), {ST_PROTOCOL})
# 4. a request before HELLO
expect_closed("PING before HELLO", frame(PING, 2, struct.pack("<I", 7)), {ST_PROTOCOL, ST_AUTH})
# 5. AUTH with the proof of a wrong token, an empty one, the right one plus a byte
if token:  # a store without a token (every node on loopback) takes any
    expect_refused_auth("AUTH with a wrong token", b"not-the-token")
    expect_refused_auth("AUTH with an empty token", b"")
    expect_refused_auth("AUTH with the token plus a byte", token + b"x")
# AUTH before HELLO, and a version-1 HELLO (which carried a token in clear: here a dummy)
expect_closed("AUTH before HELLO", frame(AUTH, 7, b(os.urandom(32))), {ST_PROTOCOL})
expect_closed("HELLO of protocol version 1", frame(HELLO, 8, bytes([1]) + b(b"dummy")), {ST_VERSION})
# 6. HELLO with an unknown protocol version
expect_closed("HELLO with version 99", frame(HELLO, 6, bytes([99]) + b(os.urandom(32))), {ST_VERSION})
# 7. after a good handshake: an oversized frame, and a malformed payload (trailing bytes)
s = conn()
st, body = handshake(s, 10)
assert st == ST_OK, "the handshake with the right token: status %d %r" % (st, body)
s.sendall(frame(SET, 11, b"", 0xFFFFFFFF))
data = read_until_close(s)
assert all(f[1] == ST_PROTOCOL for f in frames(data)), frames(data)
print("closed ok: oversized frame (0xFFFFFFFF) after HELLO")
s = conn()
handshake(s, 20)
s.sendall(frame(PING, 21, struct.pack("<I", 1) + b"trailing"))
data = read_until_close(s)
assert all(f[1] == ST_PROTOCOL for f in frames(data)), frames(data)
print("closed ok: PING with trailing bytes")
s = conn()
handshake(s, 30)
s.sendall(frame(HELLO, 32, bytes([VERSION]) + b(os.urandom(32))))
data = read_until_close(s)
assert all(f[1] == ST_PROTOCOL for f in frames(data)), frames(data)
print("closed ok: HELLO twice")

# 8. held open while the job goes on: half a frame, and a connection that never says HELLO
half = conn()
half.sendall(frame(HELLO, 40, bytes([VERSION]) + b(os.urandom(32)))[:7])
mute = conn()

# 9. a well-behaved client still gets answers
s = conn()
st, body = handshake(s, 50)
assert st == ST_OK, (st, body)
st, body = roundtrip(s, PING, 51, struct.pack("<I", 0xC0FFEE))
assert st == ST_OK and struct.unpack("<I", body)[0] == 0xC0FFEE, (st, body)
st, body = roundtrip(s, SET, 52, b(b"test/abuse/key") + b(b"value-1"))
assert st == ST_OK, (st, body)
st, body = roundtrip(s, GET, 53, struct.pack("<I", 1000) + b(b"test/abuse/key"))
assert st == ST_OK and body == b(b"value-1"), (st, body)
s.close()
print("store answers ok after the abuse")
sys.stdout.flush()

end = time.time() + 60
while not os.path.exists(hold) and time.time() < end:
    time.sleep(0.05)
half.close()
mute.close()
print("held connections released")
