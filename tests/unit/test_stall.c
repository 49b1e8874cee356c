/* test_stall.c - the stall rule and the report's first line on synthetic snapshots. */
#include <fcntl.h>    /* AT_FDCWD */
#include <string.h>   /* memset */
#include <sys/stat.h> /* utimensat */

#include "check.h"
#include "pages.h"
#include "stall.h"

#define S 1000000000LL /* one second in ns */

/* n ranks started at t = 0, alive, with no progress yet. */
static void start(mgpu_stall_rank_t *r, int n)
{
    memset(r, 0, (size_t)n * sizeof *r);
    for (int i = 0; i < n; i++) {
        r[i].alive = 1;
        r[i].rank = r[i].local_rank = i;
        r[i].pid = 100 + i;
        r[i].start_ns = 1 * S;
    }
}

/* A libmgpu rank at step, in phase since t, having entered coll collectives (the last one at
 * since_coll, finished when done). */
static void page(mgpu_stall_rank_t *r, int64_t step, uint32_t phase, int64_t t, uint64_t coll,
                 int done, int64_t since_coll)
{
    r->attached = 1;
    r->page.magic = MGPU_PROGRESS_MAGIC;
    r->page.version = MGPU_PROGRESS_VERSION;
    r->page.moves++;
    r->page.moved_ns = t;
    r->page.step = step;
    r->page.phase = phase;
    r->page.phase_ns = t;
    r->page.coll_entered = coll;
    r->page.coll_done = done ? coll : coll - 1;
    if (coll > 0) {
        mgpu_progress_coll_t *c = &r->page.ring[(coll - 1) % MGPU_PROGRESS_RING];
        c->seq = coll;
        c->op = MGPU_COLL_ALLREDUCE;
        c->bucket = 3;
        c->bytes = 4u << 20;
        c->since_ns = since_coll;
    }
}

static void test_no_stall_while_every_rank_moves(void)
{
    mgpu_stall_rank_t r[2];
    start(r, 2);
    for (int64_t t = 2; t <= 60; t += 2) {
        r[0].lines++;
        r[0].line_ns = t * S;
        r[1].heartbeat_ns = 1000 * S + t * S; /* realtime = monotonic + 1000 s */
        mgpu_stall_update(r, 2, t * S + S / 2, 1000 * S + t * S + S / 2);
        CHECK_INT(mgpu_stall_detect(r, 2, t * S + S / 2, 5.0), 0);
    }
    CHECK_INT(r[1].heartbeats, 1);
}

static void test_silent_rank_behind_printing_ones(void)
{
    mgpu_stall_rank_t r[4];
    char line[1024];

    start(r, 4);
    for (int i = 0; i < 4; i++) {
        r[i].lines = 2;
        r[i].line_ns = (i == 3 ? 2 : 3) * S; /* rank 3 printed its last line a second earlier */
        snprintf(r[i].last_line, sizeof r[i].last_line, "step %d", i == 3 ? 1 : 2);
    }
    mgpu_stall_update(r, 4, 4 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 4, 6 * S, 5.0), 0);
    CHECK_INT(mgpu_stall_detect(r, 4, 7 * S, 5.0), 1); /* rank 3: 5 s without progress */
    CHECK_INT(r[3].stalled && r[3].culprit, 1);
    CHECK_INT(mgpu_stall_detect(r, 4, 9 * S, 5.0), 4); /* all of them now, rank 3 behind */
    CHECK_INT(r[3].culprit, 1);
    CHECK_INT(r[0].culprit + r[1].culprit + r[2].culprit, 0);
    mgpu_stall_describe(r, 4, 9 * S, "n1", line, sizeof line);
    CHECK_CONTAINS(line, "stall: rank 3 (local 3, pid 103, host n1) has printed nothing and sent "
                         "no heartbeat for 7 s (its last line: \"step 1\")");
    CHECK_CONTAINS(line, "ranks 0, 1, 2 have been quiet for 6 s");
}

static void test_exited_ranks_are_not_stalled(void)
{
    mgpu_stall_rank_t r[2];
    start(r, 2);
    r[1].alive = 0;
    mgpu_stall_update(r, 2, 2 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 2, 100 * S, 5.0), 1);
    CHECK_INT(r[1].stalled, 0);
    CHECK_INT(r[0].culprit, 1);
}

static void test_timeout_zero_is_off(void)
{
    mgpu_stall_rank_t r[1];
    start(r, 1);
    mgpu_stall_update(r, 1, 2 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 1, 1000 * S, 0.0), 0);
}

/* The request's example: rank 2 in forward while the others wait in the all-reduce. */
static void test_rank_not_in_the_collective_is_named(void)
{
    mgpu_stall_rank_t r[4];
    char line[1024];

    start(r, 4);
    for (int i = 0; i < 4; i++)
        if (i == 2)
            page(&r[i], 1531, MGPU_PHASE_FORWARD, 10 * S, 4592, 1, 9 * S);
        else
            page(&r[i], 1531, MGPU_PHASE_ALLREDUCE, 11 * S, 4593, 0, 11 * S);
    for (int i = 0; i < 4; i++)
        r[i].seen_coll_done = r[i].page.coll_done; /* seen finishing at an earlier check */
    mgpu_stall_update(r, 4, 12 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 4, 14 * S, 5.0), 0);
    CHECK_INT(mgpu_stall_detect(r, 4, 15 * S, 5.0), 1);
    CHECK_INT(r[2].culprit, 1);
    CHECK_INT(mgpu_stall_detect(r, 4, 72 * S, 5.0), 4);
    CHECK_INT(r[2].culprit, 1);
    CHECK_INT(r[0].culprit + r[1].culprit + r[3].culprit, 0);
    mgpu_stall_describe(r, 4, 72 * S, "n1", line, sizeof line);
    CHECK_STR(line, "stall: rank 2 (local 2, pid 102, host n1) has been in forward of step 1531 "
                    "for 62 s; ranks 0, 1, 3 have waited in all-reduce #4593 (bucket 3, 4 MiB) "
                    "for 61 s");
}

/* Everyone in a collective, one rank a collective behind: that rank is named. */
static void test_fewest_collectives_is_named(void)
{
    mgpu_stall_rank_t r[3];
    start(r, 3);
    page(&r[0], 7, MGPU_PHASE_ALLREDUCE, 10 * S, 20, 0, 10 * S);
    page(&r[1], 7, MGPU_PHASE_ALLREDUCE, 10 * S, 19, 0, 9 * S);
    page(&r[2], 7, MGPU_PHASE_ALLREDUCE, 10 * S, 20, 0, 10 * S);
    mgpu_stall_update(r, 3, 10 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 3, 30 * S, 5.0), 3);
    CHECK_INT(r[1].culprit, 1);
    CHECK_INT(r[0].culprit + r[2].culprit, 0);
}

/* A stopped rank inside the collective the others wait in is the one behind. */
static void test_stopped_rank_inside_the_collective_is_named(void)
{
    mgpu_stall_rank_t r[4];
    char line[1024];

    start(r, 4);
    for (int i = 0; i < 4; i++)
        page(&r[i], 358, MGPU_PHASE_ALLREDUCE, 10 * S, 372, 0, 10 * S);
    r[2].paused = 1;
    mgpu_stall_update(r, 4, 10 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 4, 15 * S, 5.0), 4);
    CHECK_INT(r[2].culprit, 1);
    CHECK_INT(r[0].culprit + r[1].culprit + r[3].culprit, 0);
    mgpu_stall_describe(r, 4, 15 * S, "n1", line, sizeof line);
    CHECK_STR(line, "stall: rank 2 (local 2, pid 102, host n1) is stopped (SIGSTOP, Ctrl-Z or a "
                    "debugger) and has been in all-reduce of step 358 (in all-reduce #372 "
                    "(bucket 3, 4 MiB)) for 5 s; ranks 0, 1, 3 have waited in all-reduce #372 "
                    "(bucket 3, 4 MiB) for 5 s");
}

/* A finished collective (coll_done moving) is progress even when moves stands still. */
static void test_coll_done_is_progress(void)
{
    mgpu_stall_rank_t r[1];
    start(r, 1);
    page(&r[0], 1, MGPU_PHASE_ALLREDUCE, 2 * S, 5, 0, 2 * S);
    mgpu_stall_update(r, 1, 3 * S, 0);
    r[0].page.coll_done = 5;
    mgpu_stall_update(r, 1, 6 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 1, 10 * S, 5.0), 0);
    CHECK_INT(mgpu_stall_detect(r, 1, 11 * S, 5.0), 1);
}

/* A stall ends when the rank moves again: a second stall is a new one. */
static void test_progress_ends_a_stall(void)
{
    mgpu_stall_rank_t r[2];
    start(r, 2);
    mgpu_stall_update(r, 2, 2 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 2, 7 * S, 5.0), 2);
    r[0].lines = r[1].lines = 1;
    r[0].line_ns = r[1].line_ns = 8 * S;
    mgpu_stall_update(r, 2, 8 * S, 0);
    CHECK_INT(mgpu_stall_detect(r, 2, 9 * S, 5.0), 0);
}

static void test_pages_start_blank_and_heartbeat(void)
{
    mgpu_pages_t pg;
    mgpu_progress_page_t p;
    mgpu_err_t err = {0};
    char path[64];

    CHECK_INT(mgpu_pages_open(&pg, 2, &err), 0);
    CHECK_INT(mgpu_pages_read(&pg, 0, &p), -1); /* nobody attached */
    CHECK_INT(mgpu_pages_read(&pg, 2, &p), -1);
    snprintf(path, sizeof path, "/proc/self/fd/%d", pg.heartbeat_fds[1]);
    int64_t before = mgpu_pages_heartbeat_ns(&pg, 1);
    usleep(20000);
    CHECK_INT(utimensat(AT_FDCWD, path, NULL, 0), 0); /* the one line a C worker needs */
    CHECK(mgpu_pages_heartbeat_ns(&pg, 1) > before);
    mgpu_pages_close(&pg);
}

int main(void)
{
    RUN(test_no_stall_while_every_rank_moves);
    RUN(test_silent_rank_behind_printing_ones);
    RUN(test_exited_ranks_are_not_stalled);
    RUN(test_timeout_zero_is_off);
    RUN(test_rank_not_in_the_collective_is_named);
    RUN(test_fewest_collectives_is_named);
    RUN(test_stopped_rank_inside_the_collective_is_named);
    RUN(test_coll_done_is_progress);
    RUN(test_progress_ends_a_stall);
    RUN(test_pages_start_blank_and_heartbeat);
    return check_done();
}
