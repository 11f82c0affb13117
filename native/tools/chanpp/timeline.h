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

/* Sends `nbatches` (<= 100, after 20 untimed) batches of the `batch`
 * messages bm (`size` bytes each) and prints one {"path": "timeline", ...}
 * line.  stamps: a CPU mapping of the kernel's array (CHANPP_TL_BYTES), or
 * NULL (sim, or a kernel without stamps: host columns only).  *seq: messages
 * sent so far (advanced).  0, or 1 with a message on stderr. */
int chanpp_timeline(gdrpy_chan_t *ch, const gdrpy_chan_msg_t *bm, int batch, size_t size,
                    int64_t timeout_ns, uint64_t *seq, void *stamps, int nbatches,
                    chanpp_check_fn check);

#endif
