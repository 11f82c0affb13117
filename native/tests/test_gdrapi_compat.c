/*
 * test_gdrapi_compat.c - what a GDRCopy 2.6 client can observe of
 * libgdrapi.so.2 beyond the documented calls:
 *  - gdr_open touches no CUDA state: a process that calls gdr_open and then
 *    forks has a child that can initialise CUDA and use gdrcopy itself
 *    (GDRCopy's sanity forks after gdr_open in several cases);
 *  - GDRCopy's tests look inside a gdr_t (`g->fd`, sizeof(struct gdr)) and
 *    read a gdr_mh_t as a pointer to GDRCopy's gdr_memh_t: those reads must
 *    land in readable memory, and a descriptor sent to another process must
 *    give it nothing;
 *  - error codes of the documented failure cases (GDRCopy's src/gdrapi.c).
 *
 * GDRPY_BACKEND=sim: sim memory; otherwise a GPU (cuMemAlloc memory).
 * Usage: test_gdrapi_compat [substring]
 * The last line is "test_gdrapi_compat: N passed, M failed".
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gdrapi.h"
#include "gdrapi_testmem.h"

#include "gdrapi_check.h"

/* Size of GDRCopy 2.6's gdr_memh_t on x86-64 (what its sanity test copies
 * out of a handle) and of its struct gdr. */
#define GDRCOPY_MEMH_SIZE 104
#define GDRCOPY_GDR_SIZE 48

static int libcuda_loaded(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "libcuda.so")) found = 1;
    fclose(f);
    return found;
}

/* The child's part of t_fork_after_open_child_uses_cuda: a fresh process
 * (exec'ed, so nothing of the harness is initialised) that opens, forks,
 * and lets the child initialise CUDA and pin.  Exit status: 0 ok, else the
 * step that failed (printed). */
static int fresh_fork_after_open(void)
{
    gdr_t g = gdr_open();
    if (!g) {
        fprintf(stderr, "fresh: gdr_open failed: errno %d\n", errno);
        return 10;
    }
    if (libcuda_loaded() == 1) {
        fprintf(stderr, "fresh: gdr_open loaded libcuda.so into the process\n");
        return 11;
    }
    int v = -1;
    if (gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v) != 0 || v != 1) return 12;
    if (gdr_get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v) != 0) return 13;
    if (libcuda_loaded() == 1) {
        fprintf(stderr, "fresh: gdr_get_attribute loaded libcuda.so\n");
        return 14;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return 15;
    if (pid == 0) {
        /* The child: CUDA must initialise (it fails with
         * CUDA_ERROR_NOT_INITIALIZED in a child of an initialised parent). */
        if (tm_init(NULL) != 0) {
            fprintf(stderr, "fresh child: %s\n", tm.why);
            _exit(20);
        }
        gdr_t gc = gdr_open();
        tm_buf b;
        if (!gc || tm_alloc(&b, TM_GPU_PAGE, TM_CUMEMALLOC)) _exit(21);
        gdr_mh_t mh;
        void *m = NULL;
        uint32_t w = 0x5eed1234u, r = 0;
        int rc = gdr_pin_buffer(gc, b.d, TM_GPU_PAGE, 0, 0, &mh);
        if (rc) {
            fprintf(stderr, "fresh child: pin failed %d\n", rc);
            _exit(22);
        }
        if (gdr_map(gc, mh, &m, TM_GPU_PAGE) || gdr_copy_to_mapping(mh, m, &w, 4) ||
            tm_dtoh(&r, b.d, 4) || r != w)
            _exit(23);
        /* The parent's instance is not the child's. */
        gdr_mh_t mh2;
        if (gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, &mh2) != EACCES) _exit(24);
        gdr_unmap(gc, mh, m, TM_GPU_PAGE);
        gdr_unpin_buffer(gc, mh);
        tm_free(&b);
        _exit(gdr_close(gc) ? 25 : 0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return 16;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "fresh: child status 0x%x\n", st);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 17;
    }
    /* The parent can still initialise CUDA and pin after its child did. */
    if (tm_init(NULL) != 0) return 18;
    tm_buf b;
    gdr_mh_t mh;
    if (tm_alloc(&b, TM_GPU_PAGE, TM_CUMEMALLOC) || gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, &mh))
        return 19;
    gdr_unpin_buffer(g, mh);
    tm_free(&b);
    return gdr_close(g) ? 30 : 0;
}

static const char *self_exe;

static void t_fork_after_open_child_uses_cuda(void)
{
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl(self_exe, self_exe, "--fresh-fork-after-open", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

static void t_open_fails_without_device_nodes(void)
{
    if (tm_env_is_sim()) {
        /* sim: opening never needs a device node */
        gdr_t g = gdr_open();
        REQUIRE(g != NULL);
        CHECK_EQ(*(int *)g, -1);
        CHECK_EQ(gdr_close(g), 0);
        return;
    }
    if (access("/dev/nvidiactl", F_OK) == 0 || access("/dev/gdrdrv", F_OK) == 0)
        SKIP("an NVIDIA device node exists here");
    errno = 0;
    gdr_t g = gdr_open();
    CHECK(g == NULL);
    CHECK_EQ(errno, ENODEV);
}

/* GDRCopy's sanity reads g->fd and copies sizeof(struct gdr) out of a gdr_t. */
static void t_gdr_t_has_gdrcopy_fd_field(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    unsigned char copy[GDRCOPY_GDR_SIZE];
    memcpy(copy, g, sizeof copy); /* must be readable */
    int fd = *(int *)g;
    if (tm.sim) {
        CHECK_EQ(fd, -1);
    } else {
        CHECK(fd >= 0);
        CHECK(fcntl(fd, F_GETFD) >= 0);
    }
    CHECK_EQ(gdr_close(g), 0);
    if (!tm.sim) CHECK(fcntl(fd, F_GETFD) < 0); /* closed with the instance */
}

/* GDRCopy's sanity casts mh.h to gdr_memh_t* and writes that many bytes to
 * a pipe: the handle must point at readable memory; stale handles must still
 * be refused. */
static void t_handle_reads_as_readable_memory(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    tm_buf b;
    REQUIRE(tm_alloc(&b, TM_GPU_PAGE, TM_CUMEMALLOC) == 0);
    gdr_mh_t mh;
    REQUIRE(gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, &mh) == 0);
    int p[2];
    REQUIRE(pipe(p) == 0);
    /* write(2) from the handle's address: EFAULT if it were not mapped. */
    CHECK_EQ(write(p[1], (const void *)(uintptr_t)mh.h, GDRCOPY_MEMH_SIZE), GDRCOPY_MEMH_SIZE);
    close(p[0]);
    close(p[1]);
    gdr_mh_t stale = mh;
    CHECK_EQ(gdr_unpin_buffer(g, mh), 0);
    void *m = NULL;
    CHECK_EQ(gdr_map(g, stale, &m, TM_GPU_PAGE), EINVAL);
    CHECK_EQ(gdr_unpin_buffer(g, stale), EINVAL);
    /* A new pin reusing storage does not revive the stale handle. */
    gdr_mh_t mh2;
    REQUIRE(gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, &mh2) == 0);
    CHECK(mh2.h != stale.h);
    CHECK_EQ(gdr_unpin_buffer(g, stale), EINVAL);
    /* A pointer to a copy of the handle's bytes (what the child builds in
     * GDRCopy's test) is not a handle. */
    unsigned char fake[GDRCOPY_MEMH_SIZE];
    memcpy(fake, (const void *)(uintptr_t)mh2.h, sizeof fake);
    gdr_mh_t forged = {(unsigned long)(uintptr_t)fake};
    CHECK_EQ(gdr_map(g, forged, &m, TM_GPU_PAGE), EINVAL);
    CHECK_EQ(gdr_unpin_buffer(g, mh2), 0);
    CHECK_EQ(gdr_close(g), 0);
    tm_free(&b);
}

static int sendfd(int sock, int fd)
{
    char c = '$';
    struct iovec iov = {&c, 1};
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = CMSG_LEN(sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    return (int)sendmsg(sock, &msg, 0);
}

static int recvfd(int sock)
{
    char c;
    struct iovec iov = {&c, 1};
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    if (recvmsg(sock, &msg, 0) <= 0) return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (!cm) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    return fd;
}

/* GDRCopy's invalidation_unix_sock_shared_fd_* pattern: the parent sends
 * g->fd and the bytes behind its handle; the child builds a gdr_t around
 * the fd and a handle around the bytes: pin and map must fail there. */
static void t_fd_and_handle_sent_to_another_process_are_useless(void)
{
    if (tm.sim) SKIP("sim instances have no descriptor (fd -1)");
    int pair[2], pp[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_DGRAM, 0, pair) == 0);
    REQUIRE(pipe(pp) == 0);
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    tm_buf b;
    REQUIRE(tm_alloc(&b, TM_GPU_PAGE, TM_CUMEMALLOC) == 0);
    gdr_mh_t mh;
    REQUIRE(gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, &mh) == 0);
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int fd = recvfd(pair[0]);
        if (fd < 0) _exit(2);
        unsigned char memh[GDRCOPY_MEMH_SIZE];
        if (read(pp[0], memh, sizeof memh) != (ssize_t)sizeof memh) _exit(3);
        gdr_t tmpl = gdr_open();
        if (!tmpl) _exit(4);
        unsigned char fake_g[256];
        memcpy(fake_g, tmpl, GDRCOPY_GDR_SIZE);
        memcpy(fake_g, &fd, sizeof fd);
        gdr_mh_t fmh = {(unsigned long)(uintptr_t)memh}, out;
        void *m = NULL;
        if (gdr_pin_buffer((gdr_t)fake_g, b.d, TM_GPU_PAGE, 0, 0, &out) == 0) _exit(5);
        if (gdr_map((gdr_t)fake_g, fmh, &m, TM_GPU_PAGE) == 0) _exit(6);
        /* The real handle value, used in the child, is refused too. */
        if (gdr_map(g, mh, &m, TM_GPU_PAGE) == 0) _exit(7);
        _exit(0);
    }
    CHECK(sendfd(pair[1], *(int *)g) >= 0);
    CHECK_EQ(write(pp[1], (const void *)(uintptr_t)mh.h, GDRCOPY_MEMH_SIZE), GDRCOPY_MEMH_SIZE);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    /* The parent's pin is intact. */
    void *m = NULL;
    CHECK_EQ(gdr_map(g, mh, &m, TM_GPU_PAGE), 0);
    if (m) CHECK_EQ(gdr_unmap(g, mh, m, TM_GPU_PAGE), 0);
    CHECK_EQ(gdr_unpin_buffer(g, mh), 0);
    CHECK_EQ(gdr_close(g), 0);
    tm_free(&b);
    close(pair[0]);
    close(pair[1]);
    close(pp[0]);
    close(pp[1]);
}

/* GDRCopy: gdr_get_attribute sets *v = 0 first; unknown attributes EINVAL. */
static void t_attributes_follow_gdrcopy(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    int v = 77;
    CHECK_EQ(gdr_get_attribute(g, (gdr_attr_t)99, &v), EINVAL);
    CHECK_EQ(v, 0);
    v = 77;
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v), 0);
    CHECK_EQ(v, 1);
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v), 0);
    CHECK(v == 0 || v == 1);
    if (tm.sim) CHECK_EQ(v, 0);
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &v), 0);
    CHECK(v == 0 || v == 1);
    CHECK_EQ(gdr_close(g), 0);
}

/* Documented failure cases and GDRCopy's codes for them. */
static void t_error_codes_match_gdrcopy(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    tm_buf b;
    REQUIRE(tm_alloc(&b, TM_GPU_PAGE, TM_CUMEMALLOC) == 0);
    CHECK_EQ(gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, NULL), EINVAL);
    gdr_mh_t mh;
    REQUIRE(gdr_pin_buffer(g, b.d, TM_GPU_PAGE, 0, 0, &mh) == 0);
    void *m = NULL, *m2 = NULL;
    CHECK_EQ(gdr_map_v2(g, mh, &m, TM_GPU_PAGE, 17), EINVAL); /* unknown flag */
    CHECK_EQ(gdr_unmap(g, mh, m, TM_GPU_PAGE), EINVAL);       /* not mapped */
    uint32_t x = 1;
    CHECK_EQ(gdr_copy_to_mapping(mh, m, &x, 4), EINVAL); /* not mapped */
    REQUIRE(gdr_map(g, mh, &m, TM_GPU_PAGE) == 0);
    CHECK_EQ(gdr_map(g, mh, &m2, TM_GPU_PAGE), EAGAIN); /* mapped already */
    CHECK(m2 == NULL);
    CHECK_EQ(gdr_copy_to_mapping(mh, m, &x, 0), 0); /* size 0: no-op */
    const char *str = NULL;
    CHECK_EQ(gdr_get_mapping_type_string((gdr_mapping_type_t)9, &str), EINVAL);
    CHECK_EQ(gdr_unmap(g, mh, m, TM_GPU_PAGE), 0);
    CHECK_EQ(gdr_unpin_buffer(g, mh), 0);
    CHECK_EQ(gdr_close(g), 0);
    tm_free(&b);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--fresh-fork-after-open") == 0)
        return fresh_fork_after_open();
    self_exe = "/proc/self/exe";
    static char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        self_exe = exe;
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    /* Before tm_init: this case needs a process in which CUDA is untouched. */
    run_case("fork_after_open_child_uses_cuda", t_fork_after_open_child_uses_cuda, 0, filter);
    mem_ok = tm_init(NULL) == 0;
    printf("test_gdrapi_compat: mode %s%s%s\n", tm.sim ? "sim" : "gpu",
           mem_ok ? "" : ", unavailable: ", mem_ok ? "" : tm.why);
    run_case("open_fails_without_device_nodes", t_open_fails_without_device_nodes, 0, filter);
    run_case("gdr_t_has_gdrcopy_fd_field", t_gdr_t_has_gdrcopy_fd_field, 1, filter);
    run_case("handle_reads_as_readable_memory", t_handle_reads_as_readable_memory, 1, filter);
    run_case("fd_and_handle_sent_to_another_process_are_useless",
             t_fd_and_handle_sent_to_another_process_are_useless, 1, filter);
    run_case("attributes_follow_gdrcopy", t_attributes_follow_gdrcopy, 1, filter);
    run_case("error_codes_match_gdrcopy", t_error_codes_match_gdrcopy, 1, filter);
    tm_fini();
    printf("test_gdrapi_compat: %d skipped\n", n_skip);
    printf("test_gdrapi_compat: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
