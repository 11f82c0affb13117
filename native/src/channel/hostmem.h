/*
 * hostmem.h - page-locked host memory mapped into the device, for the
 * channel's completion ring (cuMemHostAlloc(PORTABLE | DEVICEMAP) through the
 * core's libcuda loader, cudadrv.h; sim: page-aligned zeroed host memory
 * whose "device address" is its host address).  Deliberately minimal:
 * gdrpy_host_alloc (src/staging/hostmem.c) is the general facility; this
 * one maps the memory into the device and stays out of that table.
 */
#ifndef GDRPY_HOSTMEM_H
#define GDRPY_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

typedef struct gp_hostmem {
    void *ptr;     /* CPU address (NULL when empty) */
    uint64_t dptr; /* device address of ptr */
    size_t size;
    int cuda; /* 1: cuMemHostAlloc, 0: aligned_alloc */
    int device;
} gp_hostmem;

/* Zero-filled; 0 or a gdrpy status with the thread's message set. */
GP_HIDDEN int gp_hostmem_alloc(int device, int is_real, size_t size, gp_hostmem *out);
GP_HIDDEN void gp_hostmem_free(gp_hostmem *hm);

#endif
