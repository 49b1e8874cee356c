/* test_store_onclose.c - ON_CLOSE: keys the store sets when a connection closes (how a dead
 * launcher wakes the other nodes), and the store thread the launcher serves it from. */
#include <errno.h>  /* EADDRINUSE */
#include <stdlib.h> /* free */

#include "check.h"
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

int main(void)
{
    RUN(test_close_sets_absent_keys_only);
    RUN(test_cleared_registration_sets_nothing);
    RUN(test_thread_reports_bind_errors);
    return check_done();
}
