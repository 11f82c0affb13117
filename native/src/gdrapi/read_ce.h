/*
 * read_ce.h - libgdrapi's large reads through the copy engine (read_ce.c):
 * gdr_copy_from_mapping hands a read of at least gp_rd_floor bytes here, and
 * reads it through the mapping (BAR1) itself when this returns nonzero.
 */
#ifndef GDRPY_READ_CE_H
#define GDRPY_READ_CE_H

#include <stdatomic.h>
#include <stddef.h>

#include "internal.h"

/* Reads of fewer bytes never leave gdr_copy_from_mapping's BAR1 path: the
 * only check the small path pays.  4 KiB, or less where a gdr_t was opened
 * with a smaller GDRPY_GDRAPI_READ_CE. */
GP_HIDDEN extern _Atomic size_t gp_rd_floor;

/* A gdr_t's read policy, from GDRPY_GDRAPI_READ_CE when it is opened:
 * GP_RD_AUTO (unset or "auto": the crossover measured once per device),
 * GP_RD_OFF ("off": BAR1 only), else the size from which reads take the
 * copy engine.  A value that does not parse is reported and taken as auto. */
#define GP_RD_AUTO ((size_t)0)
#define GP_RD_OFF ((size_t)-1)
GP_HIDDEN size_t gp_rd_policy(void);

/* What a read needs of its mapping. */
typedef struct gp_rd_src {
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    int device;
    int sim;          /* sim backend: auto means BAR1 only */
    size_t policy;    /* the gdr_t's gp_rd_policy() */
    const char *user; /* CPU address of the pinned address */
    size_t avail;     /* bytes from `user` the engine may read (pinned and backed) */
} gp_rd_src;

/* Copies n bytes at map_src (a range the caller checked and announced: it
 * stays mapped) into dst through the copy engine when this device reads
 * that size faster so; returns 0 once the bytes are in dst, nonzero when the
 * caller must read through the mapping. */
GP_HIDDEN int gp_rd_large(const gp_rd_src *s, void *dst, const void *map_src, size_t n);

#endif /* GDRPY_READ_CE_H */
