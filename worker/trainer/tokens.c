/* tokens.c - token files read whole, checked id by id. */
#include "tokens.h"

#include <ctype.h>  /* isxdigit */
#include <errno.h>  /* errno, ENOMEM */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* strerror */
#include <unistd.h> /* read, close */

#include "data.h" /* mgpu_data_open_regular */

int mgpu_tokens_load(const char *path, int text, int vocab, mgpu_tokens_t *out, mgpu_err_t *err)
{
    unsigned char *raw = NULL;
    size_t size = 0, got = 0;
    int fd = -1, rc;

    out->ids = NULL;
    out->n = 0;
    if ((rc = mgpu_data_open_regular(path, text ? "data_text" : "data_tokens", &fd, &size, err)) <
        0) {
        return MGPU_E_CONFIG; /* a data file's fault: the message names it */
    }
    if (!text && size % 2 != 0) {
        close(fd);
        return mgpu_err_set(err, MGPU_E_CONFIG,
                            "%s: %zu bytes, expected whole little-endian uint16 tokens (an even "
                            "size)",
                            path, size);
    }
    raw = malloc(size ? size : 1);
    if (raw == NULL) {
        close(fd);
        return mgpu_err_set(err, -ENOMEM, "tokens: malloc(%zu) for %s failed", size, path);
    }
    while (got < size) {
        ssize_t r = read(fd, raw + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG, "%s: read: %s", path,
                              r < 0 ? strerror(errno) : "file shrank while read");
            goto out;
        }
        got += (size_t)r;
    }
    size_t n = text ? size : size / 2;
    out->ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (out->ids == NULL) {
        rc = mgpu_err_set(err, -ENOMEM, "tokens: malloc of %zu ids for %s failed", n, path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = text ? raw[i] : (int32_t)(raw[2 * i] | (raw[2 * i + 1] << 8));
        if (!text && id >= vocab) {
            rc = mgpu_err_set(err, MGPU_E_CONFIG,
                              "%s: token %d at byte offset %zu, expected below vocab = %d", path,
                              (int)id, 2 * i, vocab);
            goto out;
        }
        out->ids[i] = id;
    }
    out->n = n;
    rc = 0;
out:
    if (rc < 0)
        mgpu_tokens_free(out);
    free(raw);
    close(fd);
    return rc;
}

void mgpu_tokens_free(mgpu_tokens_t *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = 0;
}

void mgpu_tokens_split(size_t n, double eval_fraction, size_t *n_train, size_t *n_eval)
{
    size_t e = (size_t)((double)n * eval_fraction + 0.5);
    *n_eval = e < n ? e : n;
    *n_train = n - *n_eval;
}

size_t mgpu_tokens_windows(size_t n, int context)
{
    return n > (size_t)context ? (n - 1) / (size_t)context : 0;
}

int mgpu_tokens_prompt(const char *prompt, int text, int vocab, int32_t *out, int max, int *n,
                       mgpu_err_t *err)
{
    const char *p = prompt;
    int k = 0;

    *n = 0;
    if (*p == 0) {
        out[0] = text ? '\n' : 0;
        *n = 1;
        return 0;
    }
    while (*p != 0) {
        long id;
        if (k == max)
            return mgpu_err_set(err, MGPU_E_CONFIG, "prompt: more than %d tokens", max);
        if (text) {
            unsigned char c = (unsigned char)*p++;
            if (c == '\\') {
                char e = *p++;
                if (e == 'n')
                    c = '\n';
                else if (e == 't')
                    c = '\t';
                else if (e == '\\')
                    c = '\\';
                else if (e == 'x' && isxdigit((unsigned char)p[0]) &&
                         isxdigit((unsigned char)p[1])) {
                    char hex[3] = {p[0], p[1], 0};
                    c = (unsigned char)strtol(hex, NULL, 16);
                    p += 2;
                } else
                    return mgpu_err_set(err, MGPU_E_CONFIG,
                                        "prompt = '%s': unknown escape at byte %d, expected \\n, "
                                        "\\t, \\\\ or \\xNN",
                                        prompt, (int)(p - prompt) - 2);
            }
            out[k++] = c;
            continue;
        }
        char *end;
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == 0)
            break;
        errno = 0;
        id = strtol(p, &end, 10);
        if (end == p || errno != 0 || id < 0 || id >= vocab)
            return mgpu_err_set(err, MGPU_E_CONFIG,
                                "prompt = '%s': expected token ids in 0..%d separated by spaces",
                                prompt, vocab - 1);
        out[k++] = (int32_t)id;
        p = end;
    }
    *n = k;
    if (k == 0)
        return mgpu_err_set(err, MGPU_E_CONFIG, "prompt = '%s': no token", prompt);
    return 0;
}
