/* output.h - turning a worker's byte stream into whole, prefixed lines.
 *
 * A line buffer collects bytes until newlines; each feed returns the complete lines, each
 * preceded by the rank's prefix, in one contiguous block, so that one write(2) of the block
 * puts them on the console without tearing against other workers' lines. A partial line waits
 * for its newline (or the end of the stream, when it is completed with one); a line longer
 * than MGPU_LINE_MAX is not held whole: each feed past that hands on what there is of it, the
 * raw bytes exactly as written and on the console as a line that goes on (as live output
 * shows one, below).
 *
 * Live output, for a console a person watches: mgpu_linebuf_live hands on the part of the
 * unfinished line not yet shown (a progress bar's "\r" updates, a prompt), so it appears at
 * once. The console then shows the line as it grows: the prefix where it starts, and again
 * after each '\r' of it that more text follows, so a redrawn bar keeps its prefix. When
 * another stream must write to the same console first, the caller ends the shown line there
 * (a newline) and calls mgpu_linebuf_detach: the rest of the line comes later with a prefix of
 * its own, and lines of two ranks never mix on one console line. What was shown is not shown
 * again; the raw lines (log files, the stderr tail) are whole lines as ever. Pure: no I/O
 * here. */
#ifndef MGPU_OUTPUT_H
#define MGPU_OUTPUT_H

#include <stddef.h> /* size_t */

#define MGPU_LINE_MAX (1u << 20)

typedef struct mgpu_linebuf {
    char *part; /* the unfinished line */
    size_t plen, pcap;
    size_t shown; /* bytes of part already handed on by mgpu_linebuf_live */
    int live;     /* the console's current line is this one (it has its prefix there) */
    int at_cr;    /* the last byte shown was '\r': the console's cursor is at column 0 */
} mgpu_linebuf_t;

/* Where feed lays out the lines it hands back. One is enough for any number of line buffers
 * used from one thread: a block is consumed before the next feed. */
typedef struct mgpu_outbuf {
    char *buf;
    size_t cap;
} mgpu_outbuf_t;

/* --duplicate_stdout_filters / --duplicate_stderr_filters: the substrings a line must contain
 * (one of them) to be copied to the run's filtered log. */
typedef struct mgpu_line_filters {
    int n;          /* 0: copy nothing */
    char buf[1024]; /* the n substrings, each NUL-terminated, one after the other */
} mgpu_line_filters_t;

/* Parses torchrun's list: comma-separated, ",," a comma inside a substring. Empty entries are
 * left out, so "" copies nothing. Returns 0, or -E2BIG when the list does not fit. */
int mgpu_line_filters_parse(const char *s, mgpu_line_filters_t *f);
/* 1 when the n bytes of line contain one of f's substrings. */
int mgpu_line_filters_match(const mgpu_line_filters_t *f, const char *line, size_t n);

/* Expands a torchrun-style template: ${role_name}, ${local_rank}, ${rank}. */
void mgpu_prefix_format(const char *tmpl, const char *role, int local_rank, int rank, char *out,
                        size_t len);

/* Appends data; *block receives the complete lines, each prefixed, and *blen their length
 * (0 when none is complete yet). raw (may be NULL) receives the same lines without prefixes
 * (for the per-rank log files). Returns 0 or -ENOMEM. */
int mgpu_linebuf_feed(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix, const char *data,
                      size_t n, const char **block, size_t *blen, const char **raw, size_t *rlen);
/* The unfinished line's bytes not yet shown, for the console: up to its last '\r' (all = 0:
 * an update is complete there), or all of them (all = 1: the stream went quiet). *blen = 0
 * when there is nothing to show. Returns 0 or -ENOMEM. */
int mgpu_linebuf_live(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix, int all,
                      const char **block, size_t *blen);
/* Another stream wrote to the console after the caller ended this line's shown part there. */
void mgpu_linebuf_detach(mgpu_linebuf_t *lb);
/* Bytes of the unfinished line not yet shown. */
size_t mgpu_linebuf_unshown(const mgpu_linebuf_t *lb);
/* At the end of the stream: the last partial line, completed with a newline. */
int mgpu_linebuf_flush(mgpu_linebuf_t *lb, mgpu_outbuf_t *ob, const char *prefix,
                       const char **block, size_t *blen, const char **raw, size_t *rlen);
void mgpu_linebuf_free(mgpu_linebuf_t *lb);
/* Gives back memory a burst of long lines left behind (an idle launcher stays small). */
void mgpu_outbuf_trim(mgpu_outbuf_t *ob);
void mgpu_outbuf_free(mgpu_outbuf_t *ob);

#endif
