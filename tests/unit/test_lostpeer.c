/* test_lostpeer.c - the launcher's word that a node is lost, on both sides of the progress
 * pages: mgpu_pages_set_lost (launcher/pages.c) writes it into every local rank's page, and
 * libmgpu reads it back whole (mgpu_progress_lost), however often the launcher rewrites it. */
#include "check.h"

#include <pthread.h> /* pthread_create: a writer beside the reader */
#include <stdlib.h>  /* setenv */

#include "mgpu.h"
#include "pages.h" /* mgpu_pages_open, mgpu_pages_set_lost: the launcher's side */
#include "progress.h"

#define LOST_TEXT "ranks 2-3 (node 1, host h1) lost: heartbeat missed for 15.0 s"

/* ---- the pages ------------------------------------------------------------------------ */

/* Written into every page, attached or not; bumped again by a second word; cut to the page;
 * gone after mgpu_pages_reset; a worker attaching after the word still sees it. */
static void test_pages_set_lost(void)
{
    mgpu_pages_t pg;
    mgpu_err_t err = {0, ""};
    char text[300], longer[400], path[64];
    const mgpu_progress_page_t *p;
    uint32_t seq;

    CHECK_INT(mgpu_pages_open(&pg, 3, &err), 0);
    for (int k = 0; k < 3; k++) {
        p = (const mgpu_progress_page_t *)((char *)pg.map + (size_t)k * MGPU_PROGRESS_PAGE);
        CHECK_INT(mgpu_progress_lost_seq(p), 0);
        CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 0);
        CHECK_STR(text, "");
    }
    mgpu_pages_set_lost(&pg, LOST_TEXT);
    for (int k = 0; k < 3; k++) {
        p = (const mgpu_progress_page_t *)((char *)pg.map + (size_t)k * MGPU_PROGRESS_PAGE);
        seq = mgpu_progress_lost_seq(p);
        CHECK(seq != 0 && (seq & 1) == 0);
        CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
        CHECK_STR(text, LOST_TEXT);
        CHECK_INT(p->magic, 0); /* the worker's part is untouched */
    }
    p = (const mgpu_progress_page_t *)pg.map;
    seq = mgpu_progress_lost_seq(p);
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    mgpu_pages_set_lost(&pg, longer);
    CHECK(mgpu_progress_lost_seq(p) > seq && (mgpu_progress_lost_seq(p) & 1) == 0);
    CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
    CHECK_INT(strlen(text), 255);
    CHECK_INT(mgpu_progress_lost(p, text, 8), 1); /* a short buffer gets the start */
    CHECK_STR(text, "xxxxxxx");
    mgpu_pages_set_lost(&pg, "");
    CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
    CHECK_CONTAINS(text, "a peer was lost");
    /* A worker that attaches after the word keeps it: attaching writes its own part only. */
    mgpu_pages_set_lost(&pg, LOST_TEXT);
    snprintf(path, sizeof path, "/proc/self/fd/%d", pg.fd);
    setenv(MGPU_PROGRESS_ENV_FILE, path, 1);
    setenv(MGPU_PROGRESS_ENV_SLOT, "1", 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "3", 1);
    unsetenv("MGPU_STORE_ADDR");
    unsetenv("MGPU_PROGRESS");
    {
        mgpu_init_opts_t o = {0, 5};
        mgpu_ctx_t *ctx = NULL;
        CHECK_INT(mgpu_init(&o, &ctx, &err), 0);
        p = (const mgpu_progress_page_t *)((char *)pg.map + MGPU_PROGRESS_PAGE);
        CHECK_INT(p->magic, MGPU_PROGRESS_MAGIC);
        CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 1);
        CHECK_STR(text, LOST_TEXT);
        mgpu_finalize(ctx);
    }
    mgpu_pages_reset(&pg);
    CHECK_INT(mgpu_progress_lost_seq(p), 0);
    CHECK_INT(mgpu_progress_lost(p, text, sizeof text), 0);
    mgpu_pages_close(&pg);
}

/* A reader never gets half of one text and half of another while the launcher rewrites it. */
typedef struct flip {
    mgpu_progress_page_t *page;
    volatile int stop;
} flip_t;

static void *flipper(void *arg)
{
    flip_t *f = arg;
    char a[256], b[256];

    memset(a, 'a', 255);
    memset(b, 'b', 255);
    a[255] = b[255] = '\0';
    for (int i = 0; !f->stop; i++)
        mgpu_progress_set_lost(f->page, i & 1 ? a : b);
    return NULL;
}

static void test_lost_text_never_torn(void)
{
    mgpu_progress_page_t *page = calloc(1, sizeof *page);
    flip_t f = {page, 0};
    char text[256];
    pthread_t th;
    int torn = 0, seen = 0;

    mgpu_progress_set_lost(page, "first");
    pthread_create(&th, NULL, flipper, &f);
    for (int i = 0; i < 20000; i++) {
        CHECK_INT(mgpu_progress_lost(page, text, sizeof text), 1);
        if (strcmp(text, "first") == 0 || strstr(text, "still being written") != NULL)
            continue;
        seen++;
        for (size_t k = 1; k < 255; k++)
            torn += text[k] != text[0];
        torn += strlen(text) != 255;
    }
    f.stop = 1;
    pthread_join(th, NULL);
    if (torn)
        printf("  %d torn characters in %d texts read\n", torn, seen);
    CHECK_INT(torn, 0);
    free(page);
}

int main(void)
{
    RUN(test_pages_set_lost);
    RUN(test_lost_text_never_torn);
    return check_done();
}
