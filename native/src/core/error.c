/* error.c - thread-local error messages and the stderr logger. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Room for the longest message we build (open's per-backend reasons plus advice); a
 * longer one ends in "..." instead of stopping mid-word.  This buffer is most of
 * the thread-local block of libgdrpy.so.0 and libgdrapi.so.2 (2136 bytes), more
 * than glibc's optional static TLS (512 bytes) for a dlopen'ed library, so there
 * its TLS is reached through the dynamic TLS descriptor.  Overridable
 * (CPPFLAGS=-DGP_MSG_LEN=256) to measure what that costs a copy. */
#ifndef GP_MSG_LEN
#define GP_MSG_LEN 2048
#endif

static __thread char tls_msg[GP_MSG_LEN];

static void mark_truncated(char *buf, size_t size, int wanted)
{
    if (wanted >= 0 && (size_t)wanted >= size) memcpy(buf + size - 4, "...", 4);
}

int gp_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
    va_end(ap);
    mark_truncated(tls_msg, sizeof tls_msg, n);
    gp_log(1, "error %s: %s", gdrpy_strerror(code), tls_msg);
    return code;
}

int gp_err_prefix(int code, const char *fmt, ...)
{
    char prefix[GP_MSG_LEN], old[GP_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tls_msg, sizeof old);
    const char *tail = old[0] ? old : gdrpy_strerror(code);
    size_t pl = strnlen(prefix, sizeof tls_msg - 3);
    memcpy(tls_msg, prefix, pl);
    memcpy(tls_msg + pl, ": ", 2);
    size_t room = sizeof tls_msg - pl - 3;
    size_t tl = strnlen(tail, room);
    memcpy(tls_msg + pl + 2, tail, tl);
    tls_msg[pl + 2 + tl] = '\0';
    return code;
}

void gp_err_clear(void) { tls_msg[0] = '\0'; }

const char *gdrpy_last_error(void) { return tls_msg; }

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
