/* test_store_onclose.c - ON_CLOSE: keys the store sets when a connection closes (how a dead
 * launcher wakes the other nodes), and the store thread the launcher serves it from (opened
 * first and served later, its table written and read in place, as a launcher of one node
 * does). */
#include <errno.h>   /* EADDRINUSE, EBUSY */
#include <stdio.h>   /* snprintf */
#include <pthread.h> /* pthread_create */
#include <stdlib.h>  /* free */
#include <time.h>    /* nanosleep */

#include "check.h"
#include "clock.h" /* mgpu_clock_mono */
#include "store.h"
#include "store_thread.h"

static mgpu_store_thread_t *start(int *port)
{
    mgpu_store_server_opts_t o = {.bind_host = "127.0.0.1", .port = 0, .token = "tok"};
    mgpu_store_thread_t *t = NULL;
    mgpu_err_t e;
    CHECK_INT(mgpu_store_thread_start(&o, &t, port, &e), 0);
    return t;
}

static void test_close_sets_absent_keys_only(void)
{
    int port;
    mgpu_store_thread_t *t = start(&port);
    mgpu_store_t *a, *b;
    mgpu_err_t e;
    const char *keys[] = {"dead", "kept"}, *vals[] = {"node 1", "overwritten?"};
    void *v = NULL;
    size_t n = 0;

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &a, &e), 0);
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &b, &e), 0);
    mgpu_store_set_prefix(a, "job/");
    mgpu_store_set_prefix(b, "job/");
    CHECK_INT(mgpu_store_set(b, "kept", "first", 5, &e), 0);
    CHECK_INT(mgpu_store_on_close(a, keys, vals, 2, &e), 0);
    mgpu_store_close(a); /* as if its process died */
    CHECK_INT(mgpu_store_get(b, "dead", 5, &v, &n, &e), 0);
    CHECK_INT(n, 6);
    CHECK(memcmp(v, "node 1", 6) == 0);
    free(v);
    CHECK_INT(mgpu_store_get(b, "kept", 5, &v, &n, &e), 0);
    CHECK_INT(n, 5); /* a key with a value keeps it */
    free(v);
    mgpu_store_close(b);
    mgpu_store_thread_stop(t);
}

static void test_cleared_registration_sets_nothing(void)
{
    int port, ready = 1;
    mgpu_store_thread_t *t = start(&port);
    mgpu_store_t *a, *b;
    mgpu_err_t e;
    const char *keys[] = {"dead"}, *vals[] = {"x"}, *check[] = {"dead"};

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &a, &e), 0);
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &b, &e), 0);
    CHECK_INT(mgpu_store_on_close(a, keys, vals, 1, &e), 0);
    CHECK_INT(mgpu_store_on_close(a, NULL, NULL, 0, &e), 0);
    mgpu_store_close(a);
    CHECK_INT(mgpu_store_ping(b, &e), 0); /* the server has handled a's close by now */
    CHECK_INT(mgpu_store_check(b, check, 1, &ready, &e), 0);
    CHECK_INT(ready, 0);
    mgpu_store_close(b);
    mgpu_store_thread_stop(t);
}

/* ON_IDLE: a connection silent past its lease is given up: its idle keys are set (before the
 * close keys, which then keep only what the idle list did not set), within the sweep's period. */
static void test_idle_connection_sets_idle_keys(void)
{
    int port;
    mgpu_store_thread_t *t = start(&port);
    mgpu_store_t *a, *b;
    mgpu_err_t e;
    const char *ik[] = {"lost"}, *iv[] = {"heartbeat missed"};
    const char *ck[] = {"lost", "end"}, *cv[] = {"connection closed", "closed"};
    void *v = NULL;
    size_t n = 0;

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &a, &e), 0);
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &b, &e), 0);
    CHECK_INT(mgpu_store_on_close(a, ck, cv, 2, &e), 0);
    double t0 = mgpu_clock_mono();
    CHECK_INT(mgpu_store_on_idle(a, 0.3, ik, iv, 1, &e), 0);
    /* a says nothing more: as if its host were cut off */
    CHECK_INT(mgpu_store_get(b, "lost", 5, &v, &n, &e), 0);
    double took = mgpu_clock_mono() - t0;
    CHECK(n == 16 && memcmp(v, "heartbeat missed", 16) == 0);
    CHECK(took >= 0.29 && took < 1.5);
    free(v);
    CHECK_INT(mgpu_store_get(b, "end", 5, &v, &n, &e), 0); /* and it was closed */
    CHECK(n == 6 && memcmp(v, "closed", 6) == 0);
    free(v);
    /* its owner finds the connection gone */
    mgpu_store_set_reconnect(a, 0);
    CHECK(mgpu_store_ping(a, &e) < 0);
    mgpu_store_close(a);
    mgpu_store_close(b);
    mgpu_store_thread_stop(t);
}

static void test_pings_keep_the_lease(void)
{
    int port, ready = 1;
    mgpu_store_thread_t *t = start(&port);
    mgpu_store_t *a, *b;
    mgpu_err_t e;
    const char *ik[] = {"lost"}, *iv[] = {"x"}, *check[] = {"lost"};

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &a, &e), 0);
    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &b, &e), 0);
    CHECK_INT(mgpu_store_on_idle(a, 0.4, ik, iv, 1, &e), 0);
    for (int i = 0; i < 10; i++) { /* 1 s of pings, every 0.1 s */
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        CHECK_INT(mgpu_store_ping(a, &e), 0);
    }
    CHECK_INT(mgpu_store_check(b, check, 1, &ready, &e), 0);
    CHECK_INT(ready, 0);
    CHECK_INT(mgpu_store_on_idle(a, 0, NULL, NULL, 0, &e), 0); /* cleared: silence is fine */
    struct timespec ts = {0, 700 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK_INT(mgpu_store_ping(b, &e), 0);
    CHECK_INT(mgpu_store_check(b, check, 1, &ready, &e), 0);
    CHECK_INT(ready, 0);
    CHECK_INT(mgpu_store_ping(a, &e), 0);
    mgpu_store_close(a);
    mgpu_store_close(b);
    mgpu_store_thread_stop(t);
}

/* mgpu_store_interrupt: a call blocked without a deadline returns at once, and so do later
 * calls (no reconnection). */
typedef struct {
    mgpu_store_t *s;
    int rc;
} blocked_t;
static void *blocked_get(void *arg)
{
    blocked_t *b = arg;
    void *v = NULL;
    size_t n = 0;
    mgpu_err_t e;
    b->rc = mgpu_store_get(b->s, "never", -1, &v, &n, &e);
    free(v);
    return NULL;
}

static void test_interrupt_wakes_a_blocked_call(void)
{
    int port;
    mgpu_store_thread_t *t = start(&port);
    blocked_t b = {NULL, 1};
    mgpu_err_t e;
    pthread_t th;

    CHECK_INT(mgpu_store_connect("127.0.0.1", port, "tok", 5, &b.s, &e), 0);
    CHECK_INT(pthread_create(&th, NULL, blocked_get, &b), 0);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double t0 = mgpu_clock_mono();
    mgpu_store_interrupt(b.s);
    pthread_join(th, NULL);
    CHECK(mgpu_clock_mono() - t0 < 1.0);
    CHECK(b.rc < 0);
    CHECK_INT(mgpu_store_ping(b.s, &e), MGPU_E_CLOSED);
    mgpu_store_close(b.s);
    mgpu_store_thread_stop(t);
}

static void test_thread_reports_bind_errors(void)
{
    int port, port2;
    mgpu_store_thread_t *t = start(&port), *t2 = NULL;
    mgpu_store_server_opts_t o = {.bind_host = "127.0.0.1", .port = port};
    mgpu_err_t e;
    CHECK_INT(mgpu_store_thread_start(&o, &t2, &port2, &e), -EADDRINUSE);
    CHECK_CONTAINS(e.msg, "bind(127.0.0.1:");
    CHECK(t2 == NULL);
    mgpu_store_thread_stop(t);
}

/* A client of a store opened but not served yet: it connects (the listen backlog), then gets
 * a key the owner wrote in place. */
typedef struct early {
    int port, rc, done;
    char val[32];
} early_t;

static void *early_client(void *arg)
{
    early_t *c = arg;
    mgpu_store_t *s = NULL;
    mgpu_err_t e;
    void *v = NULL;
    size_t n = 0;

    c->rc = mgpu_store_connect("127.0.0.1", c->port, "tok", 10, &s, &e);
    if (c->rc == 0) {
        mgpu_store_set_prefix(s, "job/");
        c->rc = mgpu_store_get(s, "mine", 10, &v, &n, &e);
    }
    if (c->rc == 0) {
        snprintf(c->val, sizeof c->val, "%.*s", (int)n, (char *)v);
        c->rc = mgpu_store_set(s, "theirs", "from the client", 15, &e);
    }
    free(v);
    mgpu_store_close(s);
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_thread_opened_then_served(void)
{
    mgpu_store_server_opts_t o = {.bind_host = "127.0.0.1", .port = 0, .token = "tok"};
    mgpu_store_thread_t *t = NULL;
    early_t c = {0};
    pthread_t th;
    mgpu_err_t e;
    void *v = NULL;
    size_t n = 0;

    CHECK_INT(mgpu_store_thread_open(&o, &t, &c.port, &e), 0);
    CHECK(c.port > 0);
    CHECK_INT(mgpu_store_thread_put(t, "job/mine", "in place", 8), 0);
    CHECK_INT(mgpu_store_thread_num_keys(t), 1);
    CHECK_INT(pthread_create(&th, NULL, early_client, &c), 0);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK_INT(__atomic_load_n(&c.done, __ATOMIC_ACQUIRE), 0); /* nobody answers yet */
    CHECK_INT(mgpu_store_thread_run(t, &e), 0);
    CHECK_INT(mgpu_store_thread_run(t, &e), 0);                      /* once is enough */
    CHECK_INT(mgpu_store_thread_put(t, "job/late", "x", 1), -EBUSY); /* the loop's table now */
    pthread_join(th, NULL);
    CHECK_INT(c.rc, 0);
    CHECK_STR(c.val, "in place");
    CHECK_INT(mgpu_store_thread_num_keys(t), 2);
    mgpu_store_thread_halt_begin(t); /* told; joined below */
    mgpu_store_thread_halt_begin(t);
    mgpu_store_thread_halt(t);
    CHECK_INT(mgpu_store_thread_get(t, "job/theirs", &v, &n), 0);
    CHECK_INT(n, 15);
    CHECK_STR((char *)v, "from the client");
    free(v);
    CHECK_INT(mgpu_store_thread_get(t, "job/none", &v, &n), -ENOENT);
    CHECK(v == NULL);
    mgpu_store_thread_stop(t);
}

int main(void)
{
    RUN(test_close_sets_absent_keys_only);
    RUN(test_cleared_registration_sets_nothing);
    RUN(test_thread_reports_bind_errors);
    RUN(test_idle_connection_sets_idle_keys);
    RUN(test_pings_keep_the_lease);
    RUN(test_interrupt_wakes_a_blocked_call);
    RUN(test_thread_opened_then_served);
    return check_done();
}
