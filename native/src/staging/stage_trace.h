/*
 * stage_trace.h - timeline of staged copies, for diagnostics only
 * (GDRPY_STAGING_TRACE=<file>; scripts/staging_trace.py reads the file).
 *
 * Per copy: host times of each chunk's milestones (opened to the CPU copies,
 * all pieces copied, DMA enqueue call entered/returned), the copy engine's
 * own start/end of each chunk's DMA (timing events around it, real backends),
 * and each piece's copy (CPU, start/end, bytes).  Appended to the file as
 * text when the copy ends.  Costs ~2 event records per chunk; off by default.
 */
#ifndef GDRPY_STAGE_TRACE_H
#define GDRPY_STAGE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "cudadrv.h"

enum { TR_OPEN,
       TR_COPIED,
       TR_ENQ0,
       TR_ENQ1,
       TR_NMARK };

typedef struct gp_strace gp_strace;

/* NULL unless GDRPY_STAGING_TRACE names a file (real: with timing events). */
GP_HIDDEN gp_strace *gp_strace_new(int real);
/* Inside the ring's context (real). */
GP_HIDDEN void gp_strace_free(gp_strace *t);
GP_HIDDEN void gp_strace_begin(gp_strace *t, int dir, size_t n, uint64_t nch, unsigned ppc,
                               unsigned workers, CUstream s);
GP_HIDDEN void gp_strace_mark(gp_strace *t, uint64_t ci, int what, size_t len);
/* end = 0 before chunk ci's DMA is enqueued, 1 after. */
GP_HIDDEN void gp_strace_gpu(gp_strace *t, uint64_t ci, int end, CUstream s);
GP_HIDDEN void gp_strace_piece(gp_strace *t, uint64_t g, double t0, double t1, size_t bytes);
/* Waits for the traced DMAs and appends the record to the file. */
GP_HIDDEN void gp_strace_end(gp_strace *t, int rc);
GP_HIDDEN double gp_strace_now(void);

#endif
