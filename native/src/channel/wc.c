/* wc.c - gp_wc_zero, the one helper of wc.h that is not inline. */
#include "wc.h"

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
