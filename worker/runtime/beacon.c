/* beacon.c - attaching the rank's progress page, and naming the ranks behind a collective
 * (see beacon.h). */
#include "beacon.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open, O_RDWR, O_CLOEXEC */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* getenv, strtol */
#include <string.h>   /* memset, strcmp, strerror */
#include <sys/mman.h> /* mmap, munmap */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* close, getpid */

#include "log.h" /* mgpu_warn */

/* Maps the file of MGPU_PROGRESS_FILE; 0, or -1 after a warning. */
static int mgpu_beacon_map(mgpu_beacon_t *b, const char *path, const char *slot_s)
{
    struct stat st;
    char *end = NULL;
    long slot;
    void *m;
    int fd;

    errno = 0;
    slot = strtol(slot_s, &end, 10);
    if (*slot_s == '\0' || *end != '\0' || errno != 0 || slot < 0 || slot > 1 << 20) {
        mgpu_warn("%s=\"%s\": expected a local rank (0, 1, ...); progress is not published",
                  MGPU_PROGRESS_ENV_SLOT, slot_s);
        return -1;
    }
    if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0) {
        mgpu_warn("%s: open(%s): %s; progress is not published", MGPU_PROGRESS_ENV_FILE, path,
                  strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) < 0) {
        mgpu_warn("%s: fstat(%s): %s; progress is not published", MGPU_PROGRESS_ENV_FILE, path,
                  strerror(errno));
        close(fd);
        return -1;
    }
    if (st.st_size < (off_t)(slot + 1) * MGPU_PROGRESS_PAGE) {
        mgpu_warn("%s=%ld: %s holds %lld bytes, %d pages of %d, no slot %ld; progress is not "
                  "published",
                  MGPU_PROGRESS_ENV_SLOT, slot, path, (long long)st.st_size,
                  (int)(st.st_size / MGPU_PROGRESS_PAGE), MGPU_PROGRESS_PAGE, slot);
        close(fd);
        return -1;
    }
    m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED) {
        mgpu_warn("%s: mmap(%s, %lld bytes): %s; progress is not published", MGPU_PROGRESS_ENV_FILE,
                  path, (long long)st.st_size, strerror(errno));
        return -1;
    }
    b->map_len = (size_t)st.st_size;
    b->npages = (int)(st.st_size / MGPU_PROGRESS_PAGE);
    b->slot = (int)slot;
    b->pages = (mgpu_progress_page_t *)m;
    return 0;
}

static mgpu_progress_page_t *mgpu_beacon_page(const mgpu_beacon_t *b, int slot)
{
    return (mgpu_progress_page_t *)((char *)b->pages + (size_t)slot * MGPU_PROGRESS_PAGE);
}

void mgpu_beacon_attach(mgpu_beacon_t *b, int rank)
{
    const char *on = getenv("MGPU_PROGRESS"), *path = getenv(MGPU_PROGRESS_ENV_FILE),
               *slot = getenv(MGPU_PROGRESS_ENV_SLOT);
    mgpu_progress_page_t *p;
    int64_t now;

    memset(b, 0, sizeof *b);
    b->bucket = -1;
    if (on != NULL && strcmp(on, "0") == 0)
        return;
    if (on != NULL && strcmp(on, "1") != 0 && strcmp(on, "") != 0)
        mgpu_warn("MGPU_PROGRESS=\"%s\": expected 0 (off) or 1 (on); publishing progress", on);
    if ((path != NULL) != (slot != NULL))
        mgpu_warn("%s is set but %s is not; progress is not published",
                  path != NULL ? MGPU_PROGRESS_ENV_FILE : MGPU_PROGRESS_ENV_SLOT,
                  path != NULL ? MGPU_PROGRESS_ENV_SLOT : MGPU_PROGRESS_ENV_FILE);
    else if (path != NULL && mgpu_beacon_map(b, path, slot) < 0)
        b->pages = NULL;
    p = b->pages != NULL ? mgpu_beacon_page(b, b->slot) : &b->own;
    b->lost = b->pages != NULL ? p : NULL;
    /* A restarted worker may find its predecessor's page: readers must not take it for this
     * one's until the magic comes back, and a seq left odd by a kill mid-write is evened. */
    __atomic_store_n(&p->magic, 0, __ATOMIC_RELEASE);
    if (p->seq & 1)
        __atomic_store_n(&p->seq, p->seq + 1, __ATOMIC_RELAXED);
    now = mgpu_beacon_now_ns();
    mgpu_progress_write_begin(p);
    p->moves = 1;
    p->moved_ns = now;
    p->step = -1;
    p->phase = MGPU_PHASE_INIT;
    p->pad0 = 0;
    p->phase_ns = now;
    p->coll_entered = 0;
    memset(p->ring, 0, sizeof p->ring);
    memset(p->label, 0, sizeof p->label);
    mgpu_progress_write_end(p);
    __atomic_store_n(&p->coll_done, 0, __ATOMIC_RELAXED);
    p->pid = (int32_t)getpid();
    p->rank = rank;
    __atomic_store_n(&p->version, MGPU_PROGRESS_VERSION, __ATOMIC_RELAXED);
    __atomic_store_n(&p->magic, MGPU_PROGRESS_MAGIC, __ATOMIC_RELEASE);
    b->page = p;
}

void mgpu_beacon_detach(mgpu_beacon_t *b)
{
    if (b->pages != NULL)
        munmap(b->pages, b->map_len);
    b->pages = NULL;
    b->page = NULL;
    b->lost = NULL;
}

/* Appends ", n" or "n" to a list of at most 16 names, then " and N more". */
static void mgpu_beacon_list(char *list, size_t len, int *count, const char *fmt, int v)
{
    size_t used = strlen(list);
    if (++*count <= 16 && used < len)
        snprintf(list + used, len - used, *count > 1 ? ", " : "");
    used = strlen(list);
    if (*count <= 16 && used < len)
        snprintf(list + used, len - used, fmt, v);
}

int mgpu_beacon_absent(const mgpu_progress_page_t *pages, int npages, int self, uint64_t seq,
                       int remote, char *buf, size_t len)
{
    char behind[160] = "", silent[160] = "", coll[96];
    mgpu_progress_page_t me, peer;
    const mgpu_progress_coll_t *c;
    int nbehind = 0, nsilent = 0;
    size_t used;

    if (len > 0)
        buf[0] = '\0';
    if (pages == NULL || seq == 0 || self < 0 || self >= npages || len == 0)
        return 0;
    const mgpu_progress_page_t *page =
        (const mgpu_progress_page_t *)((const char *)pages + (size_t)self * MGPU_PROGRESS_PAGE);
    mgpu_progress_read(page, &me);
    c = mgpu_progress_coll(&me, seq);
    if (c == NULL)
        snprintf(coll, sizeof coll, "collective #%llu", (unsigned long long)seq);
    else if (c->bucket >= 0)
        snprintf(coll, sizeof coll, "%s #%llu (bucket %d, %llu bytes)",
                 mgpu_progress_coll_name(c->op), (unsigned long long)seq, c->bucket,
                 (unsigned long long)c->bytes);
    else
        snprintf(coll, sizeof coll, "%s #%llu (%llu bytes)", mgpu_progress_coll_name(c->op),
                 (unsigned long long)seq, (unsigned long long)c->bytes);
    for (int s = 0; s < npages; s++) {
        if (s == self)
            continue;
        page = (const mgpu_progress_page_t *)((const char *)pages + (size_t)s * MGPU_PROGRESS_PAGE);
        /* A page stuck mid-write (its writer stopped inside one) still says where it was. */
        if (mgpu_progress_read(page, &peer) < 0 &&
            (peer.magic != MGPU_PROGRESS_MAGIC || peer.version != MGPU_PROGRESS_VERSION)) {
            mgpu_beacon_list(silent, sizeof silent, &nsilent, "%d", s);
            continue;
        }
        if (peer.coll_entered < seq)
            mgpu_beacon_list(behind, sizeof behind, &nbehind, "%d", peer.rank);
    }
    if (nbehind > 0)
        used = (size_t)snprintf(buf, len, "rank%s %s%s never entered %s", nbehind > 1 ? "s" : "",
                                behind, nbehind > 16 ? " and more" : "", coll);
    else
        used = (size_t)snprintf(buf, len, "every local rank entered %s", coll);
    if (nsilent > 0 && used < len)
        used +=
            (size_t)snprintf(buf + used, len - used, "; local rank%s %s%s published no progress",
                             nsilent > 1 ? "s" : "", silent, nsilent > 16 ? " and more" : "");
    if (remote && used < len)
        snprintf(buf + used, len - used, "; ranks on other nodes: unknown");
    return nbehind;
}

int mgpu_beacon_name_absent(const mgpu_beacon_t *b, uint64_t seq, int remote, char *buf, size_t len)
{
    return mgpu_beacon_absent(b->pages, b->npages, b->slot, seq, remote, buf, len);
}
