/*
 * rseq_put.h - libgdrapi's small writes into a mapping as restartable
 * sequences (Linux rseq), so that they need no per-copy store to announce
 * themselves to a concurrent unmap.
 *
 * A write of 1..GP_RSEQ_PUT_MAX bytes runs inside one rseq critical section
 * that re-reads the slot's generation, state and bounds, stores the bytes and
 * fences (sfence).  An unmap stores state PINNED and then calls
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ): every critical section
 * running at that moment, or preempted inside one, is restarted at its abort
 * label before it executes another instruction of the section, and the restart
 * sees PINNED.  So once the membarrier returns, no thread writes through the
 * mapping again, without the writer having stored anything: the per-thread
 * rseq_cs pointer is set once and stays set until the kernel clears it at a
 * preemption outside a section (then it is set again, one store).
 *
 * The section must never fault: a restart happens when the writer returns to
 * user mode, and a store that faults while the unmap removes the range ends in
 * SIGSEGV first.  So libgdrapi uses it only on mappings whose pages are all
 * present from mmap to munmap (BAR1 remapped by the driver at mmap time).
 *
 * x86-64 with glibc's rseq registration (glibc >= 2.35) and a kernel with
 * membarrier's RSEQ commands (Linux >= 5.10); elsewhere, or with
 * GDRPY_GDRAPI_RSEQ=0, gp_rseq_init() returns 0 and libgdrapi announces every
 * copy in its per-thread record instead.
 */
#ifndef GDRPY_GDRAPI_RSEQ_PUT_H
#define GDRPY_GDRAPI_RSEQ_PUT_H

#include <stddef.h>
#include <stdint.h>

#define GP_RSEQ_PUT_MAX 64

/* The slot fields the critical section reads (gdrapi.c asserts the layout):
 * uint32 gen @0, int state @4 (read together as one 64-bit word), lo @16,
 * span @24. */
#define GP_RSEQ_SLOT_LO 16
#define GP_RSEQ_SLOT_SPAN 24

/* What gp_rseq_init returns: 0 (no restartable writes: use the records),
 * or which section to call. */
#define GP_RSEQ_SSE2 1 /* gp_rseq_put */
#define GP_RSEQ_AVX2 2 /* gp_rseq_put_avx2 */

/* Whether restartable writes are usable in this process, and which section
 * (call once, at load); registers membarrier's RSEQ command. */
__attribute__((visibility("hidden"))) int gp_rseq_init(void);
/* Whether GDRPY_GDRAPI_RSEQ asked for the section on every backend (force,
 * sse2: tests), also on mappings whose pages can fault (see gdrapi.c,
 * rseq_may_use).  Valid after gp_rseq_init(). */
__attribute__((visibility("hidden"))) int gp_rseq_any_backend(void);
/* In a fork child of a process where gp_rseq_init() returned nonzero: registers
 * the child's address space with membarrier again (the rseq area itself is
 * inherited); 1 if restartable writes stay usable.  Calls no dlsym, so it is
 * safe in an atfork handler. */
__attribute__((visibility("hidden"))) int gp_rseq_register(void);

/* The membarrier an unmap issues after storing PINNED: 0 on success. */
__attribute__((visibility("hidden"))) int gp_rseq_barrier(void);

#if defined(__x86_64__)
/* Writes n (1..GP_RSEQ_PUT_MAX) bytes from src to dst if the 64-bit word at
 * slot still equals want (gen | state << 32) and [dst, dst+n) lies within the
 * slot's [lo, lo+span); then sfence; returns 0.  A restart runs the section
 * again.  Where the section refuses (state, generation or range changed), or
 * this thread has no rseq registration, it jumps to gp_rseq_refused with the
 * same arguments and returns what that returns (a tail call, so the caller's
 * fast path needs no saved registers).  Only after gp_rseq_init() returned
 * nonzero. */
__attribute__((visibility("hidden"))) int gp_rseq_put(const void *slot, uint64_t want, void *dst, const void *src, size_t n);
/* The same with AVX2 32-byte stores for 33..64 bytes (GP_RSEQ_AVX2 only). */
__attribute__((visibility("hidden"))) int gp_rseq_put_avx2(const void *slot, uint64_t want,
                                                           void *dst, const void *src, size_t n);
/* Defined by the library that uses gp_rseq_put (gdrapi.c). */
__attribute__((visibility("hidden"))) int gp_rseq_refused(const void *slot, uint64_t want, void *dst, const void *src, size_t n);
#endif

#endif
