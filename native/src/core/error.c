/* error.c - thread-local error messages and the stderr logger. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Room for the longest message we build (open's per-backend reasons plus advice); a
 * longer one ends in "..." instead of stopping mid-word. */
#ifndef GP_MSG_LEN
#define GP_MSG_LEN 2048
#endif

/* Each thread's message lives on the heap, allocated at its first error, and only a
 * pointer is thread-local.  A 2 KiB thread-local array made the TLS block of
 * libgdrpy.so.0 and libgdrapi.so.2 (2136 bytes) larger than glibc's optional static
 * TLS for a dlopen'ed library (512 bytes), so every copy reached its per-thread
 * record through the slower dynamic TLS path (measured +15-25 ns per
 * gdr_copy_to_mapping on the H100, glibc 2.39).  A thread whose allocation fails
 * keeps a short message in tls_small instead. */
static __thread char *tls_msg;
static __thread char tls_small[96];
static pthread_key_t msg_key;
static pthread_once_t msg_once = PTHREAD_ONCE_INIT;

/* At thread exit: forget the buffer before freeing it, so that an error raised by a
 * later destructor of the same thread allocates a new one instead of reusing it. */
static void msg_free(void *p)
{
    tls_msg = NULL;
    free(p);
}

static void msg_key_init(void) { (void)pthread_key_create(&msg_key, msg_free); }

/* The calling thread's message buffer (allocated on first use) and its size. */
static char *msg_buf(size_t *size)
{
    if (__builtin_expect(tls_msg == NULL, 0)) {
        char *m = calloc(1, GP_MSG_LEN);
        pthread_once(&msg_once, msg_key_init);
        if (m && pthread_setspecific(msg_key, m) == 0) {
            memcpy(m, tls_small, sizeof tls_small);
            tls_msg = m;
        } else {
            free(m);
            *size = sizeof tls_small;
            return tls_small;
        }
    }
    *size = GP_MSG_LEN;
    return tls_msg;
}

static void mark_truncated(char *buf, size_t size, int wanted)
{
    if (wanted >= 0 && (size_t)wanted >= size) memcpy(buf + size - 4, "...", 4);
}

int gp_err(int code, const char *fmt, ...)
{
    size_t size;
    char *msg = msg_buf(&size);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, size, fmt, ap);
    va_end(ap);
    mark_truncated(msg, size, n);
    gp_log(1, "error %s: %s", gdrpy_strerror(code), msg);
    return code;
}

int gp_err_prefix(int code, const char *fmt, ...)
{
    char prefix[GP_MSG_LEN], old[GP_MSG_LEN];
    size_t size;
    char *msg = msg_buf(&size);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, msg, size);
    const char *tail = old[0] ? old : gdrpy_strerror(code);
    size_t pl = strnlen(prefix, size - 3);
    memcpy(msg, prefix, pl);
    memcpy(msg + pl, ": ", 2);
    size_t room = size - pl - 3;
    size_t tl = strnlen(tail, room);
    memcpy(msg + pl + 2, tail, tl);
    msg[pl + 2 + tl] = '\0';
    return code;
}

void gp_err_clear(void)
{
    if (tls_msg) tls_msg[0] = '\0';
    tls_small[0] = '\0';
}

const char *gdrpy_last_error(void) { return tls_msg ? tls_msg : tls_small; }

const char *gdrpy_strerror(int code)
{
    switch (code) {
    case GDRPY_OK: return "OK";
    case GDRPY_ENOENT: return "ENOENT";
    case GDRPY_EIO: return "EIO";
    case GDRPY_ENXIO: return "ENXIO";
    case GDRPY_EBADF: return "EBADF";
    case GDRPY_EAGAIN: return "EAGAIN";
    case GDRPY_ENOMEM: return "ENOMEM";
    case GDRPY_EACCES: return "EACCES";
    case GDRPY_EBUSY: return "EBUSY";
    case GDRPY_ENODEV: return "ENODEV";
    case GDRPY_EINVAL: return "EINVAL";
    case GDRPY_ERANGE: return "ERANGE";
    case GDRPY_ENOTSUP: return "ENOTSUP";
    case GDRPY_ENOTSUPP: return "ENOTSUPP";
    default: return "EUNKNOWN";
    }
}

static int log_level(void)
{
    static int level = -1;
    if (level < 0) {
        const char *s = getenv("GDRPY_LOG_LEVEL");
        if (!s) s = getenv("GDRCOPY_LOG_LEVEL");
        int v = s ? atoi(s) : 0;
        const char *en = getenv("GDRCOPY_ENABLE_LOGGING");
        if (v <= 0 && en && atoi(en) > 0) v = 3;
        level = v > 0 ? v : 99; /* 99: silent */
    }
    return level;
}

/* GP_LOG_CONFIG: a GDRPY_* variable whose value cannot be used.  Printed
 * by default (it would otherwise be ignored silently); GDRPY_LOG_LEVEL=6
 * silences it. */
void gp_log(int level, const char *fmt, ...)
{
    if (level == GP_LOG_CONFIG) {
        int l = log_level();
        if (l != 99 && l > GP_LOG_CONFIG) return;
        char cbuf[GP_MSG_LEN];
        va_list cap;
        va_start(cap, fmt);
        vsnprintf(cbuf, sizeof cbuf, fmt, cap);
        va_end(cap);
        fprintf(stderr, "gdrpy warning: %s\n", cbuf);
        return;
    }
    if (level < log_level()) return;
    static const char *names[] = {"", "DBG", "INFO", "WARN", "ERR"};
    char buf[GP_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gdrpy %s: %s\n", names[level >= 1 && level <= 4 ? level : 1], buf);
}
