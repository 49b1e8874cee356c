/* hosts.c - hostfile, host lists, slot selection, the hosts' environment and command (see
 * hosts.h). */
#include "hosts.h"

#include <arpa/inet.h> /* inet_pton */
#include <ctype.h>     /* isalnum */
#include <errno.h>     /* errno */
#include <stdarg.h>    /* va_list */
#include <stdio.h>     /* fopen */
#include <stdlib.h>    /* realloc */
#include <string.h>    /* strcmp */
#include <strings.h>   /* strncasecmp */
#include <unistd.h>    /* read */

#include "escape.h" /* mgpu_escape_inplace */
#include "fdio.h"   /* mgpu_fdio_write_all */

/* Options an ssh launch sets for each host itself: not passed on, nor their PET_ variables. */
const char *const mgpu_cli_hosts_local[] = {
    "hostfile",       "hosts",      "include",    "exclude",         "ssh",         "export",
    "watch_stdin",    "dry_run",    "nnodes",     "node_rank",       "master_addr", "master_port",
    "nproc_per_node", "local_addr", "rdzv_token", "rdzv_token_file", "summary",     NULL};

int mgpu_hosts_read_token(const char *what, char *out, size_t len, mgpu_err_t *err)
{
    size_t n = 0;
    ssize_t r;
    char c;

    mgpu_fdio_write_all(2, MGPU_HOSTS_READY_LINE "\n", strlen(MGPU_HOSTS_READY_LINE) + 1);
    /* A byte at a time: what follows the line belongs to --watch_stdin. */
    while ((r = read(0, &c, 1)) == 1 || (r < 0 && errno == EINTR)) {
        if (r < 0 || c == '\r')
            continue;
        if (c == '\n' || n + 1 >= len)
            break;
        out[n++] = c;
    }
    if (n == 0 || n + 1 >= len) {
        memset(out, 0, len);
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s=-: expected the token (1 to %zu characters) on the first line of "
                            "stdin",
                            what, len - 2);
    }
    out[n] = '\0';
    return 0;
}

void mgpu_hosts_free(mgpu_hosts_t *h)
{
    free(h->v);
    h->v = NULL;
    h->n = 0;
}

static mgpu_host_t *find(mgpu_hosts_t *h, const char *name)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->v[i].name, name) == 0)
            return &h->v[i];
    return NULL;
}

/* A host name, IPv4 or IPv6 address as ssh takes it: no blanks, quotes or shell characters,
 * no leading '-' (ssh would read an option); a ':' only in an IPv6 address (--hosts writes
 * one in brackets, [fd00::1]:SLOTS). */
static int name_ok(const char *s)
{
    struct in6_addr a6;
    if (inet_pton(AF_INET6, s, &a6) == 1)
        return 1;
    if (*s == '\0' || *s == '-')
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr(".-_", *s))
            return 0;
    return 1;
}

static int add(mgpu_hosts_t *h, const char *name, int slots, const char *origin, mgpu_err_t *err)
{
    mgpu_host_t *prev = find(h, name), *v;

    if (prev != NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: host '%s' is already listed at %s", origin,
                            name, prev->origin);
    if (strlen(name) >= sizeof h->v[0].name || !name_ok(name))
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s: '%s': expected a host name (letters, digits, '.', '-' and '_') "
                            "or an IPv4 or IPv6 address",
                            origin, name);
    if (slots < 1 || slots > MGPU_MAX_LOCAL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: host '%s': slots=%d: expected 1 to %d", origin,
                            name, slots, MGPU_MAX_LOCAL);
    if (h->n >= MGPU_HOSTS_MAX)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: more than %d hosts", origin, MGPU_HOSTS_MAX);
    if ((v = realloc(h->v, sizeof *v * (size_t)(h->n + 1))) == NULL)
        return mgpu_err_set(err, -ENOMEM, "%s: out of memory", origin);
    h->v = v;
    v = &h->v[h->n++];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->origin, sizeof v->origin, "%s", origin);
    v->slots = v->nsel = slots;
    for (int s = 0; s < slots; s++)
        v->sel[s] = s;
    return 0;
}

/* "N" as a number of slots, or -1. */
static int slots_of(const char *s)
{
    char *end;
    long n;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    n = strtol(s, &end, 10);
    return *end != '\0' || errno != 0 || n > 1000000 ? -1 : (int)n;
}

static int read_file(const char *path, mgpu_hosts_t *out, mgpu_err_t *err)
{
    FILE *f = fopen(path, "r");
    char line[4096], origin[300];
    int lineno = 0, rc = 0;

    if (f == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "--hostfile: fopen(%s): %s", path, strerror(errno));
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        char *save = NULL, *name, *tok;
        int slots = 1;
        lineno++;
        snprintf(origin, sizeof origin, "%s:%d", path, lineno);
        if (strchr(line, '\n') == NULL && !feof(f)) {
            rc = mgpu_err_set(err, MGPU_E_USAGE, "%s: line longer than %zu bytes", origin,
                              sizeof line - 2);
            break;
        }
        line[strcspn(line, "#")] = '\0';
        if ((name = strtok_r(line, " \t\r\n", &save)) == NULL)
            continue;
        while (rc == 0 && (tok = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
            if (strncmp(tok, "slots=", 6) == 0 && (slots = slots_of(tok + 6)) >= 1)
                continue;
            if (strncmp(tok, "max_slots=", 10) == 0 && slots_of(tok + 10) >= 0)
                continue; /* Open MPI's oversubscription limit: nothing to do here */
            rc = mgpu_err_set(err, MGPU_E_USAGE,
                              "%s: '%s': expected 'HOST slots=N' (N from 1 to %d), '#' comments "
                              "and blank lines",
                              origin, tok, MGPU_MAX_LOCAL);
        }
        if (rc == 0)
            rc = add(out, name, slots, origin, err);
    }
    if (rc == 0 && ferror(f))
        rc = mgpu_err_set(err, MGPU_E_USAGE, "--hostfile: read(%s): %s", path, strerror(errno));
    fclose(f);
    if (rc == 0 && out->n == 0)
        rc = mgpu_err_set(err, MGPU_E_USAGE, "--hostfile: %s lists no host", path);
    return rc;
}

int mgpu_hosts_read_file(const char *path, mgpu_hosts_t *out, mgpu_err_t *err)
{
    int rc;
    memset(out, 0, sizeof *out);
    rc = read_file(path, out, err);
    if (rc < 0) {
        mgpu_escape_inplace(err->msg, sizeof err->msg);
        mgpu_hosts_free(out);
    }
    return rc;
}

/* An entry "[ADDR]" or "[ADDR]:REST" (an IPv6 address, whose ':' are not separators): *tok
 * becomes ADDR and *colon the ':' before REST, or NULL. An entry without '[' is left as it is;
 * -1 for a '[' without its ']' or with something other than ':' after it. */
static int unbracket(char **tok, char **colon)
{
    struct in6_addr a6;
    char *close;
    if (inet_pton(AF_INET6, *tok, &a6) == 1) /* a bare IPv6 address: all of it the host */
        *colon = NULL;
    if (**tok != '[')
        return 0;
    if ((close = strchr(*tok, ']')) == NULL || (close[1] != '\0' && close[1] != ':'))
        return -1;
    *close = '\0';
    *colon = close[1] == ':' ? close + 1 : NULL;
    (*tok)++;
    return 0;
}

int mgpu_hosts_parse_list(const char *list, mgpu_hosts_t *out, mgpu_err_t *err)
{
    char buf[8192], *save = NULL, *tok;
    int rc = 0;

    memset(out, 0, sizeof *out);
    if (strlen(list) >= sizeof buf)
        return mgpu_err_set(err, MGPU_E_USAGE, "--hosts: longer than %zu characters",
                            sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", list);
    for (tok = strtok_r(buf, ",", &save); rc == 0 && tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(tok, ':');
        int slots = 1;
        if (unbracket(&tok, &colon) < 0) {
            rc = mgpu_err_set(err, MGPU_E_USAGE,
                              "--hosts=%s: '%s': expected [IPv6 address] or [IPv6 address]:SLOTS",
                              list, tok);
            break;
        }
        if (colon != NULL) {
            *colon = '\0';
            if ((slots = slots_of(colon + 1)) < 1)
                rc = mgpu_err_set(err, MGPU_E_USAGE,
                                  "--hosts=%s: '%s:%s': expected HOST or HOST:SLOTS (SLOTS from 1 "
                                  "to %d), separated by commas",
                                  list, tok, colon + 1, MGPU_MAX_LOCAL);
        }
        if (rc == 0)
            rc = add(out, tok, slots, "--hosts", err);
    }
    if (rc == 0 && out->n == 0)
        rc = mgpu_err_set(err, MGPU_E_USAGE, "--hosts='%s': expected HOST[:SLOTS],...", list);
    if (rc < 0) {
        mgpu_escape_inplace(err->msg, sizeof err->msg);
        mgpu_hosts_free(out);
    }
    return rc;
}

/* One entry of a selection, "NAME" or "NAME:S,S": marks in keep[] (per slot of the host) what
 * it names. */
static int select_entry(mgpu_hosts_t *h, const char *opt, char *entry, unsigned char *mark,
                        mgpu_err_t *err)
{
    char *colon = strchr(entry, ':'), *save = NULL, *tok;
    mgpu_host_t *host;

    if (unbracket(&entry, &colon) < 0)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "%s: '%s': expected [IPv6 address] or [IPv6 address]:S,S,...", opt,
                            entry);
    if (colon != NULL)
        *colon = '\0';
    if ((host = find(h, entry)) == NULL)
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: host '%s' is not in the host list", opt, entry);
    unsigned char *m = mark + (size_t)(host - h->v) * MGPU_MAX_LOCAL;
    if (colon == NULL) {
        memset(m, 1, (size_t)host->slots);
        return 0;
    }
    for (tok = strtok_r(colon + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int s = slots_of(tok);
        if (s < 0 || s >= host->slots)
            return mgpu_err_set(err, MGPU_E_USAGE,
                                "%s: host '%s': slot '%s': expected a slot from 0 to %d", opt,
                                entry, tok, host->slots - 1);
        m[s] = 1;
    }
    if (colon[1] == '\0')
        return mgpu_err_set(err, MGPU_E_USAGE, "%s: host '%s': no slot after ':'", opt, entry);
    return 0;
}

static int do_select(mgpu_hosts_t *h, const char *opt, const char *spec, int include,
                     mgpu_err_t *err)
{
    unsigned char *mark = calloc((size_t)h->n, MGPU_MAX_LOCAL);
    char *buf = strdup(spec), *save = NULL, *entry;
    int rc = 0, n = 0;

    if (mark == NULL || buf == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "%s: out of memory", opt);
        goto out;
    }
    /* Entries are separated by '@' (DeepSpeed's syntax: a ',' separates slots). */
    for (entry = strtok_r(buf, "@", &save); rc == 0 && entry; entry = strtok_r(NULL, "@", &save))
        rc = select_entry(h, opt, entry, mark, err);
    if (rc < 0)
        goto out;
    for (int i = 0; i < h->n; i++) {
        mgpu_host_t *host = &h->v[i];
        unsigned char *m = mark + (size_t)i * MGPU_MAX_LOCAL;
        host->nsel = 0;
        for (int s = 0; s < host->slots; s++)
            if ((m[s] != 0) == (include != 0))
                host->sel[host->nsel++] = s;
        if (host->nsel > 0)
            h->v[n++] = *host;
    }
    h->n = n;
    if (n == 0)
        rc = mgpu_err_set(err, MGPU_E_USAGE, "%s='%s' leaves no host", opt, spec);
out:
    free(mark);
    free(buf);
    return rc;
}

int mgpu_hosts_select(mgpu_hosts_t *h, const char *include, const char *exclude, mgpu_err_t *err)
{
    int rc = 0;
    if (include != NULL && *include && exclude != NULL && *exclude)
        return mgpu_err_set(err, MGPU_E_USAGE,
                            "--include and --exclude are given both: expected one of them");
    if (include != NULL && *include)
        rc = do_select(h, "--include", include, 1, err);
    else if (exclude != NULL && *exclude)
        rc = do_select(h, "--exclude", exclude, 0, err);
    if (rc < 0)
        mgpu_escape_inplace(err->msg, sizeof err->msg);
    return rc;
}

/* ------------------------------------------------------------------ environment */

void mgpu_hosts_env_free(mgpu_hosts_env_t *e)
{
    for (int i = 0; i < e->n; i++)
        free(e->kv[i]);
    free(e->kv);
    e->kv = NULL;
    e->n = 0;
}

static int env_add(mgpu_hosts_env_t *e, const char *key, size_t klen, const char *val,
                   mgpu_err_t *err)
{
    char **kv = realloc(e->kv, sizeof *kv * (size_t)(e->n + 1)), *s;
    if (kv == NULL)
        return mgpu_err_set(err, -ENOMEM, "the hosts' environment: out of memory");
    e->kv = kv;
    if ((s = malloc(klen + strlen(val) + 2)) == NULL)
        return mgpu_err_set(err, -ENOMEM, "the hosts' environment: out of memory");
    memcpy(s, key, klen);
    s[klen] = '=';
    memcpy(s + klen + 1, val, strlen(val) + 1);
    e->kv[e->n++] = s;
    return 0;
}

static int env_name_ok(const char *s, size_t n)
{
    if (n == 0 || isdigit((unsigned char)s[0]))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return 0;
    return 1;
}

/* PET_<OPTION> of an option the ssh launch sets for each host (a host's launcher must not read
 * the local one), and the token, which never goes on a command line. */
static int pet_withheld(const char *kv, size_t klen)
{
    for (const char *const *o = mgpu_cli_hosts_local; *o; o++) {
        size_t n = strlen(*o);
        if (klen == 4 + n && strncmp(kv, "PET_", 4) == 0 && strncasecmp(kv + 4, *o, n) == 0)
            return 1;
    }
    return 0;
}

static int env_file(const char *path, mgpu_hosts_env_t *out, mgpu_err_t *err)
{
    FILE *f = fopen(path, "r");
    char line[8192];
    int lineno = 0, rc = 0;

    if (f == NULL)
        return errno == ENOENT
                   ? 0
                   : mgpu_err_set(err, MGPU_E_USAGE, "fopen(%s): %s", path, strerror(errno));
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        char *p = line, *eq;
        lineno++;
        p[strcspn(p, "\r\n")] = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        eq = strchr(p, '=');
        if (eq == NULL || !env_name_ok(p, (size_t)(eq - p)))
            rc = mgpu_err_set(err, MGPU_E_USAGE,
                              "%s:%d: '%s': expected KEY=VALUE (KEY of letters, digits and '_'), "
                              "'#' comments and blank lines",
                              path, lineno, p);
        else
            rc = env_add(out, p, (size_t)(eq - p), eq + 1, err);
    }
    fclose(f);
    return rc;
}

int mgpu_hosts_env_collect(char **environ_, mgpu_getenv_fn getenv_fn, const char *exports,
                           const char *env_path, mgpu_hosts_env_t *out, mgpu_err_t *err)
{
    static const char *const prefixes[] = {"NCCL_", "PYTHON", "CUDA_", "OMP_", "PET_"};
    int rc = 0;

    memset(out, 0, sizeof *out);
    for (char **e = environ_; rc == 0 && e != NULL && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t klen = eq ? (size_t)(eq - *e) : 0;
        int match = 0;
        for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++)
            match |= strncmp(*e, prefixes[p], strlen(prefixes[p])) == 0;
        if (eq != NULL && match && env_name_ok(*e, klen) && !pet_withheld(*e, klen))
            rc = env_add(out, *e, klen, eq + 1, err);
    }
    if (rc == 0 && exports != NULL && *exports) {
        char *buf = strdup(exports), *save = NULL, *name;
        if (buf == NULL)
            rc = mgpu_err_set(err, -ENOMEM, "--export: out of memory");
        for (name = buf ? strtok_r(buf, ",", &save) : NULL; rc == 0 && name;
             name = strtok_r(NULL, ",", &save)) {
            const char *v = getenv_fn(name);
            if (!env_name_ok(name, strlen(name)))
                rc = mgpu_err_set(err, MGPU_E_USAGE,
                                  "--export=%s: '%s': expected variable names separated by commas",
                                  exports, name);
            else if (v == NULL)
                rc = mgpu_err_set(err, MGPU_E_USAGE,
                                  "--export=%s: %s is not set here: expected variables of this "
                                  "environment",
                                  exports, name);
            else if (pet_withheld(name, strlen(name)))
                rc = mgpu_err_set(err, MGPU_E_USAGE,
                                  "--export=%s: %s is set for each host by the launch itself",
                                  exports, name);
            else
                rc = env_add(out, name, strlen(name), v, err);
        }
        free(buf);
    }
    if (rc == 0 && env_path != NULL)
        rc = env_file(env_path, out, err);
    if (rc < 0) {
        mgpu_escape_inplace(err->msg, sizeof err->msg);
        mgpu_hosts_env_free(out);
    }
    return rc;
}

/* ------------------------------------------------------------------ the command */

int mgpu_hosts_quote(char *buf, size_t len, size_t *used, const char *s)
{
    /* A word of safe characters as it is (a readable --dry-run); any other as '...' with each
     * ' written as '\'' : the one quoting every POSIX shell reads alike. */
    size_t need = 3, n = strlen(s);
    int plain = n > 0;
    for (const char *p = s; *p; p++)
        plain &= isalnum((unsigned char)*p) || strchr("-_./=:,@%+", *p) != NULL;
    if (plain) {
        if (*used + n + 2 > len)
            return -1;
        memcpy(buf + *used, s, n);
        *used += n;
        buf[(*used)++] = ' ';
        buf[*used] = '\0';
        return 0;
    }
    for (const char *p = s; *p; p++)
        need += *p == '\'' ? 4 : 1;
    if (*used + need + 1 > len)
        return -1;
    buf[(*used)++] = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(buf + *used, "'\\''", 4);
            *used += 4;
        } else {
            buf[(*used)++] = *p;
        }
    }
    buf[(*used)++] = '\'';
    buf[(*used)++] = ' ';
    buf[*used] = '\0';
    return 0;
}

static int qf(char *buf, size_t len, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Appends one formatted word, quoted. */
static int qf(char *buf, size_t len, size_t *used, const char *fmt, ...)
{
    char word[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(word, sizeof word, fmt, ap);
    va_end(ap);
    return mgpu_hosts_quote(buf, len, used, word);
}

char *mgpu_hosts_command(const mgpu_hosts_t *h, int k, const mgpu_hosts_job_t *job)
{
    const mgpu_host_t *host = &h->v[k];
    size_t len = 16384, used = 0;
    int bad = 0;
    char *buf;

    for (int i = 0; i < job->env->n; i++)
        len += 4 * strlen(job->env->kv[i]) + 4;
    for (int i = 0; i < job->nfwd; i++)
        len += 4 * strlen(job->fwd[i]) + 4;
    for (int i = 0; i < job->prog_argc; i++)
        len += 4 * strlen(job->prog_argv[i]) + 4;
    len += 4 * strlen(job->cwd) + 4 * strlen(job->launcher);
    if ((buf = malloc(len)) == NULL)
        return NULL;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "cd ");
    bad |= mgpu_hosts_quote(buf, len, &used, job->cwd);
    used += (size_t)snprintf(buf + used, len - used, "&& exec ");
    if (job->env->n > 0 || host->nsel < host->slots) {
        used += (size_t)snprintf(buf + used, len - used, "env ");
        for (int i = 0; i < job->env->n; i++)
            bad |= mgpu_hosts_quote(buf, len, &used, job->env->kv[i]);
    }
    /* Some slots of the host only (--include h:0,2): as DeepSpeed, those GPUs only. */
    if (host->nsel < host->slots) {
        char cvd[8192];
        size_t n = 0;
        for (int s = 0; s < host->nsel && n + 12 < sizeof cvd; s++)
            n += (size_t)snprintf(cvd + n, sizeof cvd - n, "%s%d", s ? "," : "", host->sel[s]);
        bad |= qf(buf, len, &used, "CUDA_VISIBLE_DEVICES=%s", cvd);
    }
    bad |= mgpu_hosts_quote(buf, len, &used, job->launcher);
    bad |= qf(buf, len, &used, "--nnodes=%d", h->n);
    bad |= qf(buf, len, &used, "--node_rank=%d", k);
    bad |= qf(buf, len, &used, "--master_addr=%s", job->master_addr);
    bad |= qf(buf, len, &used, "--master_port=%d", job->master_port);
    if (job->nproc != NULL)
        bad |= qf(buf, len, &used, "--nproc_per_node=%s", job->nproc);
    else /* the host's slots */
        bad |= qf(buf, len, &used, "--nproc_per_node=%d", host->nsel);
    bad |= qf(buf, len, &used, "--local_addr=%s", host->name);
    bad |= mgpu_hosts_quote(buf, len, &used, "--rdzv_token_file=-");
    bad |= mgpu_hosts_quote(buf, len, &used, "--watch_stdin");
    if (!job->own_prefix)
        bad |= qf(buf, len, &used, "--log_line_prefix_template=[%s:rank${rank}]:", host->name);
    /* Every host starts in the same folder, most often one file system: host k > 0 writes its
     * report with ".nodeK" before the extension, so that none replaces another's. */
    if (job->summary != NULL && job->summary[0]) {
        const char *base = strrchr(job->summary, '/'), *dot;
        base = base != NULL ? base + 1 : job->summary;
        dot = strrchr(base, '.');
        if (k == 0)
            bad |= qf(buf, len, &used, "--summary=%s", job->summary);
        else if (dot == NULL || dot == base)
            bad |= qf(buf, len, &used, "--summary=%s.node%d", job->summary, k);
        else
            bad |= qf(buf, len, &used, "--summary=%.*s.node%d%s", (int)(dot - job->summary),
                      job->summary, k, dot);
    }
    for (int i = 0; i < job->nfwd; i++)
        bad |= mgpu_hosts_quote(buf, len, &used, job->fwd[i]);
    bad |= mgpu_hosts_quote(buf, len, &used, "--");
    for (int i = 0; i < job->prog_argc; i++)
        bad |= mgpu_hosts_quote(buf, len, &used, job->prog_argv[i]);
    if (used > 0 && buf[used - 1] == ' ')
        buf[--used] = '\0';
    if (bad) {
        free(buf);
        return NULL;
    }
    return buf;
}
