/*
 * backend_sim.c - host memory standing in for GPU memory.
 *
 * A sim allocation is a memfd mapped once at a 64 KiB aligned address: that
 * view is the "device side" (what cuMemcpy would reach; its address is the
 * "device pointer").  A mapping is a second MAP_SHARED mmap of the same memfd,
 * so stores through the mapping are seen on the device side and vice versa,
 * as with a BAR1 mapping.  Freeing an allocation while it is pinned keeps the
 * memfd alive for the pin (as an RM handle keeps GPU pages alive); a new
 * allocation always gets new pages, so an old mapping never aliases it.
 *
 * It is a test double: never chosen by `auto`, and reported as "sim".
 * Two switches model GPUs of other kinds (read by every allocation / every
 * context):
 *  - GDRPY_SIM_BACKING=4k: an allocation is backed only up to the next
 *    4 KiB, as CUDA's memory object behind a large cuMemAlloc allocation is;
 *    the rest of its last 64 KiB GPU page is no one's memory (reserved with
 *    no access).  Pins of the whole GPU page are accepted, and their tail
 *    stays unreachable (docs/security.md).  Default: backed to 64 KiB.
 *  - GDRPY_SIM_COHERENT=1: the "GPU" has a coherent CPU-GPU link, so pin
 *    flag FORCE_PCIE is accepted; default: a PCIe GPU, which refuses it
 *    (GDRPY_ENOTSUPP, as GDRCopy).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define SIM_ALIGN GDRPY_GPU_PAGE_SIZE
#define SIM_MAX_BYTES (1ull << 40)

typedef struct sim_alloc {
    struct sim_alloc *next;
    uint64_t base; /* device-side address */
    size_t size;   /* rounded to 64 KiB: the address range it owns */
    size_t backed; /* bytes from base with memory behind them (<= size) */
    size_t req;    /* requested size */
    int fd;
    int refs; /* 1 for the allocation itself (until freed) + pins */
    int freed;
} sim_alloc;

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_alloc *sim_list;

/* Drops one reference; the last one unmaps the device-side view (kept until
 * then so that a copy in flight in another thread never loses its pages),
 * closes the memfd and forgets the allocation. */
static void sim_release_locked(sim_alloc *a)
{
    if (--a->refs > 0) return;
    for (sim_alloc **pp = &sim_list; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    munmap((void *)(uintptr_t)a->base, a->size);
    close(a->fd);
    free(a);
}

/* A child of fork() starts with this lock in whatever state the forking
 * thread saw; the child never shares the parent's objects, so reset it.
 * Like GPU memory, the parent's sim allocations are not inherited: each
 * device-side view is replaced by private zero-filled memory at the same
 * address (a pointer kept from before fork reads zeros, its writes stay in
 * the child, nothing faults and the range is never reused), the memfds are
 * closed, and the allocations are forgotten, so the child can neither pin
 * them nor reach the parent's bytes.  (Mappings of pins get the same
 * treatment in core.c.) */
static void sim_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&sim_lock, &fresh, sizeof fresh);
    for (sim_alloc *a = sim_list; a; a = a->next) {
        mmap((void *)(uintptr_t)a->base, a->size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        close(a->fd);
    }
    sim_list = NULL; /* the records leak in the child: a few bytes each */
}

__attribute__((constructor)) static void sim_init(void)
{
    pthread_atfork(NULL, NULL, sim_atfork_child);
}

int gdrpy_sim_alloc(size_t size, uint64_t *dptr)
{
    if (!dptr) return gp_err(GDRPY_EINVAL, "sim_alloc: output pointer is NULL");
    *dptr = 0;
    if (size == 0) return gp_err(GDRPY_EINVAL, "sim_alloc: size is 0");
    if (size > SIM_MAX_BYTES)
        return gp_err(GDRPY_EINVAL, "sim_alloc: size %zu is larger than the sim limit (1 TiB)", size);
    size_t rsize = gp_round_up(size, SIM_ALIGN);
    const char *bk = getenv("GDRPY_SIM_BACKING");
    size_t backed = bk && !strcmp(bk, "4k") ? gp_round_up(size, 4096) : rsize;
    int fd = memfd_create("gdrpy-sim", MFD_CLOEXEC);
    if (fd < 0) return gp_err(GDRPY_ENOMEM, "sim_alloc: memfd_create failed: %s", strerror(errno));
    if (ftruncate(fd, (off_t)backed) != 0) {
        int e = errno;
        close(fd);
        return gp_err(GDRPY_ENOMEM, "sim_alloc: ftruncate(%zu) failed: %s", backed, strerror(e));
    }
    /* Reserve a window with room for alignment, then place the view. */
    size_t win = rsize + SIM_ALIGN;
    char *res = mmap(NULL, win, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) {
        int e = errno;
        close(fd);
        return gp_err(GDRPY_ENOMEM, "sim_alloc: reserving %zu bytes failed: %s", win, strerror(e));
    }
    uint64_t aligned = gp_round_up((uint64_t)(uintptr_t)res, SIM_ALIGN);
    /* [backed, rsize) of the window stays reserved with no access */
    void *view = mmap((void *)(uintptr_t)aligned, backed, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED, fd, 0);
    if (view == MAP_FAILED) {
        int e = errno;
        munmap(res, win);
        close(fd);
        return gp_err(GDRPY_ENOMEM, "sim_alloc: mapping %zu bytes failed: %s", rsize, strerror(e));
    }
    size_t head = (size_t)(aligned - (uint64_t)(uintptr_t)res);
    if (head) munmap(res, head);
    size_t tail = win - head - rsize;
    if (tail) munmap((char *)view + rsize, tail);

    sim_alloc *a = calloc(1, sizeof *a);
    if (!a) {
        munmap(view, rsize);
        close(fd);
        return gp_err(GDRPY_ENOMEM, "sim_alloc: out of memory");
    }
    a->base = aligned;
    a->size = rsize;
    a->backed = backed;
    a->req = size;
    a->fd = fd;
    a->refs = 1;
    pthread_mutex_lock(&sim_lock);
    a->next = sim_list;
    sim_list = a;
    pthread_mutex_unlock(&sim_lock);
    *dptr = aligned;
    return 0;
}

/* With sim_lock held: the live allocation whose address range holds
 * [p, p+n) (backed: whose memory holds it). */
static sim_alloc *sim_find_locked(uint64_t p, size_t n, int backed)
{
    for (sim_alloc *a = sim_list; a; a = a->next) {
        size_t end = backed ? a->backed : a->size;
        if (!a->freed && p >= a->base && p < a->base + end)
            return (n <= a->base + end - p) ? a : NULL;
    }
    return NULL;
}

int gdrpy_sim_free(uint64_t dptr)
{
    pthread_mutex_lock(&sim_lock);
    sim_alloc *a = NULL;
    for (sim_alloc *x = sim_list; x; x = x->next)
        if (!x->freed && x->base == dptr) {
            a = x;
            break;
        }
    if (!a) {
        pthread_mutex_unlock(&sim_lock);
        return gp_err(GDRPY_EINVAL, "sim_free: 0x%llx is not the start of a live sim allocation",
                      (unsigned long long)dptr);
    }
    a->freed = 1;
    sim_release_locked(a);
    pthread_mutex_unlock(&sim_lock);
    return 0;
}

/* Finds the live allocation holding [dptr, dptr+n) and takes a reference on
 * it for the duration of a copy (release with sim_put). */
static int sim_get(uint64_t dptr, size_t n, sim_alloc **out)
{
    pthread_mutex_lock(&sim_lock);
    sim_alloc *a = sim_find_locked(dptr, n, 1);
    if (a) a->refs++;
    pthread_mutex_unlock(&sim_lock);
    if (!a)
        return gp_err(GDRPY_EINVAL, "0x%llx (+%zu bytes) is not inside the memory of a live "
                                    "sim allocation",
                      (unsigned long long)dptr, n);
    *out = a;
    return 0;
}

static void sim_put(sim_alloc *a)
{
    pthread_mutex_lock(&sim_lock);
    sim_release_locked(a);
    pthread_mutex_unlock(&sim_lock);
}

/* ---- backend ---------------------------------------------------------- */

static int sim_probe(int device, char *why, size_t n)
{
    if (device != 0) {
        snprintf(why, n, "the sim backend has one device (0), not %d", device);
        return GDRPY_ENODEV;
    }
    return 0;
}

static int sim_open(gp_ctx *c)
{
    snprintf(c->info.gpu_name, sizeof c->info.gpu_name, "sim (host memory, no GPU)");
    snprintf(c->info.pci_bus_id, sizeof c->info.pci_bus_id, "sim");
    snprintf(c->info.driver_version, sizeof c->info.driver_version, "sim");
    return 0;
}

static void sim_close(gp_ctx *c) { (void)c; }

static int sim_coherent(gp_ctx *c, int *coherent)
{
    (void)c;
    const char *e = getenv("GDRPY_SIM_COHERENT");
    *coherent = e && !strcmp(e, "1");
    return 0;
}

/* The GPU pages around the request, inside the allocation's address range;
 * the request must start in its memory, and only the rest of its last GPU
 * page may lie past that memory (GDRPY_SIM_BACKING=4k). */
static int sim_pin(gp_ctx *c, gp_pin *p)
{
    pthread_mutex_lock(&sim_lock);
    sim_alloc *a = sim_find_locked(p->addr, p->size, 0);
    if (!a || p->addr >= a->base + a->backed) {
        pthread_mutex_unlock(&sim_lock);
        return gp_err(GDRPY_EINVAL, "0x%llx (+%llu bytes) is not inside one live sim "
                                    "allocation, starting in its memory (the sim backend pins only "
                                    "memory from gdrpy_sim_alloc)",
                      (unsigned long long)p->addr, (unsigned long long)p->size);
    }
    a->refs++;
    pthread_mutex_unlock(&sim_lock);
    p->va = gp_round_down(p->addr, GDRPY_GPU_PAGE_SIZE);
    p->len = gp_round_up(p->addr + p->size, GDRPY_GPU_PAGE_SIZE) - p->va;
    uint64_t bend = a->base + a->backed;
    p->backed = bend < p->va + p->len ? bend - p->va : p->len;
    p->page_size = GDRPY_GPU_PAGE_SIZE;
    p->bpriv = a;
    return 0;
}

static int sim_unpin(gp_ctx *c, gp_pin *p)
{
    pthread_mutex_lock(&sim_lock);
    sim_release_locked((sim_alloc *)p->bpriv);
    pthread_mutex_unlock(&sim_lock);
    p->bpriv = NULL;
    return 0;
}

static int sim_map(gp_ctx *c, gp_pin *p)
{
    sim_alloc *a = p->bpriv;
    /* The whole pinned range, reserved with no access; the backed part
     * mapped over it.  MAP_POPULATE: every page present at return, as a BAR1
     * mapping is. */
    void *m = mmap(NULL, p->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m != MAP_FAILED &&
        mmap(m, p->backed, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, a->fd,
             (off_t)(p->va - a->base)) == MAP_FAILED) {
        int e = errno;
        munmap(m, p->len);
        m = MAP_FAILED;
        errno = e;
    }
    if (m == MAP_FAILED)
        return gp_err(GDRPY_ENOMEM, "mmap of %llu bytes failed: %s",
                      (unsigned long long)p->len, strerror(errno));
    /* Like gdrdrv's VM_DONTCOPY: a forked child does not get the mapping. */
    madvise(m, p->len, MADV_DONTFORK);
    p->map_base = m;
    p->map_len = p->len;
    p->mapping_type = GDRPY_MAPPING_CACHING;
    return 0;
}

static int sim_unmap(gp_ctx *c, gp_pin *p)
{
    if (munmap(p->map_base, p->map_len) != 0)
        return gp_err(GDRPY_EIO, "munmap failed: %s", strerror(errno));
    return 0;
}

static int sim_dev_memcpy(gp_ctx *c, int dir, uint64_t dptr, void *host, size_t n, void *stream)
{
    (void)stream; /* the sim has no streams: copies complete before returning */
    sim_alloc *a = NULL;
    int rc = sim_get(dptr, n, &a);
    if (rc) return rc;
    void *dev = (void *)(uintptr_t)dptr;
    if (dir == 0) memcpy(dev, host, n);
    else memcpy(host, dev, n);
    sim_put(a); /* a concurrent sim_free waited for this copy */
    return 0;
}

const struct gp_backend gp_backend_sim = {
    .name = "sim",
    .id = GDRPY_BACKEND_SIM,
    .is_real = 0,
    .probe = sim_probe,
    .open = sim_open,
    .close = sim_close,
    .pin = sim_pin,
    .unpin = sim_unpin,
    .map = sim_map,
    .unmap = sim_unmap,
    .get_invalidated = NULL,
    .dev_memcpy = sim_dev_memcpy,
    .coherent = sim_coherent,
};
