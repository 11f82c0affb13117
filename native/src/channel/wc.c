/* wc.c - out-of-line copies of wc.h's helpers (core.c's gdrpy_writev). */
#include "wc.h"

#undef gp_wc_fence
#undef gp_wc_store_nofence

void gp_wc_fence(void) { gp_wc_fence_inline(); }

void gp_wc_store_nofence(void *dst, const void *src, size_t n) { gp_wc_store_inline(dst, src, n); }

void gp_wc_zero(void *dst, size_t n)
{
#if GP_MAPPING_UNALIGNED_OK
    memset(dst, 0, n);
    __asm__ __volatile__("" ::: "memory");
#else
    /* memset may use unaligned stores or DC ZVA, which fault on Device
     * memory: zeros through the aligned-only copy kernel instead. */
    static const unsigned char zeros[4096];
    for (char *d = dst; n;) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        gdrpy_copy_to_mapping(d, zeros, k);
        d += k, n -= k;
    }
#endif
}
