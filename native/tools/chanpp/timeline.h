/*
 * timeline.h - `gdrpy_chanpp --timeline`: batches taken apart on both sides
 * (timeline.c).
 */
#ifndef CHANPP_TIMELINE_H
#define CHANPP_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "gdrpy_channel.h"

/* The kernel's stamps (-DGDRPY_PP_RSTAMPS, channel_kernels.cu): entries of
 * 8 u64, indexed by a round's first message & (CHANPP_TL_ENTRIES - 1). */
#define CHANPP_TL_ENTRIES 4096u
#define CHANPP_TL_BYTES (CHANPP_TL_ENTRIES * 64u)
/* where the kernel finds the stamps array's device address */
#define CHANPP_TL_DEV_OFFSET 96u

/* Checks a batch's answers (gdrpy_chanpp's check_batch): 0 when all right. */
typedef int (*chanpp_check_fn)(const unsigned char (*ans)[16], const uint32_t *lens,
                               const uint32_t *tags, const gdrpy_chan_msg_t *bm, int batch,
                               uint64_t seq, size_t size);

typedef struct chanpp_timeline chanpp_timeline_t;

/* Sends up to 100 batches (after 20 untimed; fewer when 100 batches would
 * not fit the kernel's 4096 entries) of the `batch` (>= 2) messages bm,
 * `size` bytes each, and keeps the host's times.  stamps: a CPU mapping of
 * the kernel's array (CHANPP_TL_BYTES, zeroed here first), or NULL (sim, or
 * a kernel without stamps: host columns only).  *seq: messages sent so far
 * (advanced).  NULL, with a message on stderr, on error. */
chanpp_timeline_t *chanpp_timeline_run(gdrpy_chan_t *ch, const gdrpy_chan_msg_t *bm, int batch,
                                       size_t size, int64_t timeout_ns, uint64_t *seq,
                                       void *stamps, chanpp_check_fn check);

/* Prints the {"path": "timeline", ...} line and frees t.  Call it once the
 * kernel has stopped (its last stamps are written after its last answers;
 * the stop's release orders them before the status the host waited for). */
void chanpp_timeline_report(chanpp_timeline_t *t);

/* The kernel columns' arithmetic on made-up stamps (the tool's
 * --timeline-selftest): 0 when right, else 1 with a message on stderr. */
int chanpp_timeline_selftest(void);

#endif
