/*
 * fence.h - the ordering instructions of the copy kernels, one set per
 * target architecture, and whether the mapping tolerates unaligned access.
 * Included by the kernel files (and the copylat tool); nothing here is ABI.
 *
 * What the kernels promise (copy.h): to_mapping's stores to the mapping are
 * ordered before whatever the caller does next (typically a flag store that
 * tells the GPU to read them, or a read-back); from_mapping's loads from the
 * mapping happen after the caller's earlier loads (typically the poll of a
 * flag that said the data is there) and before the caller's later loads and
 * stores (typically a "consumed" flag that lets the GPU overwrite the data).
 *
 *   gp_fence_after_stores()  end of to_mapping (n > 0)
 *   gp_fence_before_loads()  start of from_mapping (n > 0)
 *   gp_fence_after_loads()   end of from_mapping (n > 0)
 *
 * x86-64 (unchanged; the x86 kernels call _mm_sfence themselves).
 *   after stores:  SFENCE.  Stores to WC memory (and non-temporal stores)
 *                  are weakly ordered: they may sit in a write-combining
 *                  buffer and become visible after later stores.  SFENCE
 *                  makes every earlier store globally visible before any
 *                  later one.
 *   before/after loads: nothing, as the x86 kernels have always done (their
 *                  code is unchanged): x86 does not reorder ordinary loads
 *                  with older loads, nor stores with older loads.
 *
 * AArch64.  The NVIDIA driver maps BAR1 (framebuffer) memory that it reports
 * as write-combined with the Device-nGnRE attribute on arm64
 * (kernel-open/common/inc/nv-pgprot.h, NV_PGPROT_WRITE_COMBINED_DEVICE);
 * gdrdrv's mappings are Normal non-cacheable (pgprot_writecombine).  Arm
 * orders neither kind against Normal cacheable memory (host buffers, flags)
 * without a barrier.
 *   after stores:  DSB ST.  Waits until every earlier store, the mapping's
 *                  included, has completed before any later instruction
 *                  executes - not only later memory accesses but also a
 *                  system call, a doorbell or a counter read that marks the
 *                  message as sent.  The contract says "before whatever the
 *                  caller does next", which a DMB cannot promise (it orders
 *                  memory accesses against memory accesses only).  It is
 *                  Linux's wmb() on arm64 and rdma-core's mmio_flush_writes()
 *                  for write-combined doorbell copies.  GDRCopy uses the
 *                  lighter DMB ST; Linux's dma_wmb()/__iowmb() (DMB OSHST)
 *                  order Normal memory before a later MMIO write, which is
 *                  the other direction.  Its cost on real hardware (waiting
 *                  for the early write acknowledgement of the posted PCIe
 *                  writes) is not measured yet: no Arm GPU host here.
 *   before loads:  DMB OSHLD.  Orders the caller's earlier loads (the flag
 *                  poll, in host memory the GPU wrote, or through the
 *                  mapping) before the loads from the mapping; without it
 *                  the mapping may be read before the flag (Normal-NC reads
 *                  may even be speculated).  Outer shareable: the GPU is an
 *                  observer outside the CPU's inner domain.  Linux's
 *                  dma_rmb(), the barrier inside __iormb().
 *   after loads:   DMB OSHLD.  Orders the loads from the mapping before the
 *                  caller's later loads and stores (a "consumed" flag must
 *                  not become visible before the data was read; later
 *                  reads of host memory must not be satisfied first).  The
 *                  barrier Linux's readl() issues after the read.
 *   Device memory faults on unaligned accesses: the arm kernels (and the
 *   generic kernel everywhere but x86) touch the mapping only with
 *   naturally aligned accesses.
 *
 * ppc64le.  The driver maps BAR1 cache-inhibited and guarded (no write
 * combining on POWER).  lwsync and eieio do not order cache-inhibited
 * accesses against cacheable ones, so every point uses the heavyweight
 * SYNC (Linux's wmb()/rmb() and rdma-core's mmio_flush_writes() on ppc64,
 * GDRCopy's wc_store_fence/memory_fence on POWER).
 *
 * riscv64.  BAR1 lies in an I/O region: stores to it are device output (o),
 * loads device input (i).
 *   after stores:  FENCE OW,IORW  (Linux's wmb() and rdma-core use ow,ow;
 *                  we also order later loads, for read-backs).
 *   before loads:  FENCE IR,I     (earlier loads before the mapping's).
 *   after loads:   FENCE I,IORW   (Linux's __io_ar() is i,ir; we also
 *                  order later stores).
 *
 * Any other architecture stops the build here: a kernel without the right
 * fence would silently lose ordering.
 */
#ifndef GDRPY_FENCE_H
#define GDRPY_FENCE_H

#define GP_FENCE_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) || defined(__i386__)
#define GP_ARCH_NAME "x86_64"
/* WC memory accepts any alignment: the x86 kernels use overlapping
 * unaligned stores for heads and tails. */
#define GP_MAPPING_UNALIGNED_OK 1
GP_FENCE_INLINE void gp_fence_after_stores(void) { __asm__ __volatile__("sfence" ::: "memory"); }
/* Nothing at all, not even a compiler barrier: the x86 code is exactly what
 * it was before the other architectures came. */
GP_FENCE_INLINE void gp_fence_before_loads(void) {}
GP_FENCE_INLINE void gp_fence_after_loads(void) {}

#elif defined(__aarch64__)
#define GP_ARCH_NAME "aarch64"
#define GP_MAPPING_UNALIGNED_OK 0
GP_FENCE_INLINE void gp_fence_after_stores(void) { __asm__ __volatile__("dsb st" ::: "memory"); }
GP_FENCE_INLINE void gp_fence_before_loads(void) { __asm__ __volatile__("dmb oshld" ::: "memory"); }
GP_FENCE_INLINE void gp_fence_after_loads(void) { __asm__ __volatile__("dmb oshld" ::: "memory"); }

#elif defined(__powerpc64__) && defined(__LITTLE_ENDIAN__)
#define GP_ARCH_NAME "ppc64le"
#define GP_MAPPING_UNALIGNED_OK 0
GP_FENCE_INLINE void gp_fence_after_stores(void) { __asm__ __volatile__("sync" ::: "memory"); }
GP_FENCE_INLINE void gp_fence_before_loads(void) { __asm__ __volatile__("sync" ::: "memory"); }
GP_FENCE_INLINE void gp_fence_after_loads(void) { __asm__ __volatile__("sync" ::: "memory"); }

#elif defined(__riscv) && __riscv_xlen == 64
#define GP_ARCH_NAME "riscv64"
#define GP_MAPPING_UNALIGNED_OK 0
GP_FENCE_INLINE void gp_fence_after_stores(void) { __asm__ __volatile__("fence ow, iorw" ::: "memory"); }
GP_FENCE_INLINE void gp_fence_before_loads(void) { __asm__ __volatile__("fence ir, i" ::: "memory"); }
GP_FENCE_INLINE void gp_fence_after_loads(void) { __asm__ __volatile__("fence i, iorw" ::: "memory"); }

#else
#error "gdrpy: no ordering instructions are defined for CPU stores to / loads from a BAR1 (write-combined or device) mapping on this architecture; gdrpy knows x86-64, aarch64, ppc64le and riscv64. Add this one's to native/src/copy/fence.h (with the reason for each instruction) rather than building without them."
#endif

#endif /* GDRPY_FENCE_H */
