/*
 * diag.c - nvrm backend: what route V saw, for logs (GDRPY_LOG_LEVEL=1) and,
 * with GDRPY_NVRM_POOL_DIAG=1, a dump of where a pool's records hold a
 * chunk's mapping base (a wide read-only walk; diagnostics only: nothing
 * here decides a pin).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nvrm.h"

int nvrm_pool_diag_on(void)
{
    const char *e = getenv("GDRPY_NVRM_POOL_DIAG");
    return e && *e && *e != '0';
}

void nvrm_look_str(const struct nvrm_pool_look *st, char *s, size_t n)
{
    size_t u = (size_t)snprintf(s, n, "walk %d blocks%s%s, base at %d places (shallowest level %d)",
                                st->nb, st->full ? " (cap)" : "",
                                st->wide == 2 ? " (heap)" : st->wide ? " (wide)"
                                                                     : "",
                                st->places, st->places ? st->minlvl : -1);
    for (int k = 0; k < st->nrec && u < n; k++)
        u += (size_t)snprintf(s + u, n - u, "%s cand%d: lvl %d rule %d", k ? "," : ";", k,
                              st->rec_lvl[k], st->rec_rule[k]);
}

void nvrm_cand_log(struct nvrm_ctx *nc, const char *tag, const uint32_t *cli, const uint32_t *obj,
                   int n, uint64_t need)
{
    for (int k = 0; k < n && k < 8; k++) {
        uint32_t h = 0;
        if (nvrm_dup(nc, cli[k], obj[k], &h, "diagnostics: a candidate")) {
            gp_log(1, "nvrm: %s cand %d: client 0x%x object 0x%x: not duplicable", tag, k, cli[k],
                   obj[k]);
            continue;
        }
        uint32_t cls = nvrm_class_of(nc, h);
        uint64_t sz = nvrm_obj_size(nc, h);
        nvrm_rm_free(nc, nc->hDevice, h, "diagnostics: freeing a candidate");
        nvrm_live_add(&nc->n_mem, -1);
        gp_log(1, "nvrm: %s cand %d: client 0x%x object 0x%x: class 0x%x size 0x%llx (need 0x%llx)",
               tag, k, cli[k], obj[k], cls, (unsigned long long)sz, (unsigned long long)need);
    }
}

/* Every field holding mbase in a wide walk of the pool: level, block,
 * offset, path, and the words around it (u32, '*' marks an RM client, 'S'
 * a u64 equal to the mapping size). */
void nvrm_pool_diag(const char *tag, uint64_t pool, uint64_t mbase, uint64_t msize)
{
    if (!nvrm_pool_diag_on()) return;
    enum { B = 16384,
           L = 8,
           WIN = 96,
           MAXP = 8 };
    struct nvrm_blk *b = malloc((size_t)B * sizeof *b);
    if (!b) return;
    int nb = nvrm_walk(pool, b, B, L), lv[L + 1], np = 0;
    memset(lv, 0, sizeof lv);
    for (int i = 0; i < nb; i++) lv[b[i].level]++;
    gp_log(1, "POOLDIAG %s: pool 0x%llx chunk 0x%llx+0x%llx: wide walk %d blocks; per level "
              "%d/%d/%d/%d/%d/%d/%d/%d/%d",
           tag, (unsigned long long)pool, (unsigned long long)mbase, (unsigned long long)msize, nb,
           lv[0], lv[1], lv[2], lv[3], lv[4], lv[5], lv[6], lv[7], lv[8]);
    for (int i = 0; i < nb && np < MAXP; i++)
        for (uint32_t o = 0; o + 8 <= b[i].len && np < MAXP; o += 8) {
            uint64_t v;
            memcpy(&v, b[i].d + o, 8);
            if (v != mbase) continue;
            np++;
            char ps[96], w[1024];
            struct nvrm_path p = nvrm_path_of(b, i, o);
            nvrm_path_str(&p, ps, sizeof ps);
            size_t u = 0;
            int lo = (int)o - WIN < 0 ? 0 : (int)o - WIN;
            int hi = (int)o + WIN + 8 > b[i].len ? b[i].len : (int)o + WIN + 8;
            for (int q = lo - lo % 4; q + 4 <= hi && u < sizeof w - 16; q += 4) {
                uint32_t x;
                memcpy(&x, b[i].d + q, 4);
                uint64_t y = 0;
                if (!(q & 7) && q + 8 <= hi) memcpy(&y, b[i].d + q, 8);
                u += (size_t)snprintf(w + u, sizeof w - u, "%s%+d:%x%s%s", q == lo ? "" : " ",
                                      q - (int)o, x, nvrm_is_client(x) ? "*" : "",
                                      (!(q & 7) && y == msize) ? "S" : "");
            }
            gp_log(1, "POOLDIAG %s: base #%d level %d block %d (0x%llx) +0x%x path %s: %s", tag,
                   np, b[i].level, i, (unsigned long long)b[i].addr, o, ps, w);
        }
    if (!np) gp_log(1, "POOLDIAG %s: the mapping base is nowhere in the wide walk", tag);
    free(b);
}
