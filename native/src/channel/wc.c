/* wc.c - out-of-line copies of wc.h's helpers (core.c's gdrpy_writev). */
#include "wc.h"

#undef gp_wc_fence
#undef gp_wc_store_nofence

void gp_wc_fence(void) { gp_wc_fence_inline(); }

void gp_wc_store_nofence(void *dst, const void *src, size_t n) { gp_wc_store_inline(dst, src, n); }

void gp_wc_zero(void *dst, size_t n)
{
    memset(dst, 0, n);
    __asm__ __volatile__("" ::: "memory");
}
