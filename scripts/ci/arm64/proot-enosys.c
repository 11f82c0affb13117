/*
 * proot-enosys - run a command with the faccessat2 and statx system calls
 * failing with ENOSYS (a seccomp filter, inherited by every child).
 *
 * Why: Debian bookworm's proot (5.1) knows neither faccessat2 (Linux 5.8)
 * nor statx (4.11), so it does not translate their paths into the guest
 * root: the static qemu-aarch64's glibc uses faccessat2 for every access()
 * of the guest (gcc then cannot find its cc1), and the guest's coreutils use
 * statx (ls cannot see a file it just listed).  With ENOSYS, glibc falls back
 * to faccessat and fstatat, which proot translates.
 *
 *   proot-enosys proot -q qemu-aarch64-static -r ROOT ...
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_faccessat2
#define __NR_faccessat2 439
#endif
#ifndef __NR_statx
#define __NR_statx 332
#endif

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: proot-enosys COMMAND [ARG...]\n");
        return 2;
    }
#if defined(__x86_64__)
    const unsigned arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const unsigned arch = AUDIT_ARCH_AARCH64;
#else
#error "proot-enosys: add this host's AUDIT_ARCH"
#endif
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_faccessat2, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_statx, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        fprintf(stderr, "proot-enosys: seccomp: %s\n", strerror(errno));
        return 1;
    }
    execvp(argv[1], argv + 1);
    fprintf(stderr, "proot-enosys: %s: %s\n", argv[1], strerror(errno));
    return 127;
}
