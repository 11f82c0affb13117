/*
 * staging.h - internal interface of src/staging/ (page-locked host memory and
 * the staging ring; the public one is include/gdrpy_host.h).  The files here
 * use the core only through internal.h and cudadrv.h; the core knows nothing
 * of them (the ring is torn down through the context's teardown hook).
 */
#ifndef GDRPY_STAGING_H
#define GDRPY_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* How a staged write (read = 0) or read (1) of n bytes through slots of
 * `slot` bytes is cut: returns the number of chunks and, for j below it,
 * chunk j's offset and length (staging.c; for tests). */
GP_HIDDEN uint64_t gp_stage_schedule(size_t n, size_t slot, int read, uint64_t j,
                                     size_t *off, size_t *len);

#endif /* GDRPY_STAGING_H */
