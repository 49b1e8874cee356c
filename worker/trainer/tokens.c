/* tokens.c - the sampling prompt: bytes with escapes, or token ids. */
#include "tokens.h"

#include <ctype.h>  /* isxdigit */
#include <errno.h>  /* errno */
#include <stdlib.h> /* strtol */

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
