/*
 * writev.c - gdrpy_writev (gdrpy_channel.h): several pieces into one mapped
 * pin with the write-combined stores of wc.h and a single store fence.
 */
#include "gdrpy_channel.h"
#include "internal.h"
#include "wc.h"

int gdrpy_writev(gdrpy_ctx_t h, gdrpy_pin_t ph, const gdrpy_iov_t *iov, size_t n)
{
    if (n && !iov) return gp_err(GDRPY_EINVAL, "writev: iov is NULL");
    for (size_t i = 0; i < n; i++)
        if (iov[i].len && !iov[i].buf)
            return gp_err(GDRPY_EINVAL, "writev: iov[%zu].buf is NULL", i);
    gp_ctx *c;
    gp_pin *p;
    int rc = gp_copy_begin(h, ph, 0, 0, NULL, 1, "writev", &c, &p);
    if (rc) return rc;
    /* every range before any store: nothing is written unless all fit (the
     * pin's size never changes while its in-flight count is raised) */
    for (size_t i = 0; i < n; i++)
        if (iov[i].offset > p->size || iov[i].len > p->size - iov[i].offset) {
            rc = gp_err(GDRPY_ERANGE, "writev: iov[%zu] [%zu, %zu+%zu) is outside the pinned "
                                      "%llu bytes; nothing was written",
                        i, iov[i].offset, iov[i].offset, iov[i].len,
                        (unsigned long long)p->size);
            gp_copy_end(c, p);
            return rc;
        }
    char *base = (char *)p->map_base + (p->addr - p->va);
    for (size_t i = 0; i < n; i++)
        if (iov[i].len) gp_wc_store_nofence(base + iov[i].offset, iov[i].buf, iov[i].len);
    gp_wc_fence(); /* the one store fence */
    gp_copy_end(c, p);
    return 0;
}
