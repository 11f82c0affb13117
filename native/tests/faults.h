/*
 * faults.h - read_faults(p): whether a load from p raises SIGSEGV or SIGBUS
 * (caught with a handler and siglongjmp, so the test goes on).  For the
 * no-access parts of mappings: never touched, a touch must fault.
 */
#ifndef GDRPY_TESTS_FAULTS_H
#define GDRPY_TESTS_FAULTS_H

#include <setjmp.h>
#include <signal.h>
#include <string.h>

static sigjmp_buf g_fault_jmp;
static void on_fault(int sig) { siglongjmp(g_fault_jmp, sig); }

/* 1 if reading *p raises SIGSEGV or SIGBUS, 0 if it reads. */
static __attribute__((unused)) int read_faults(const volatile char *p)
{
    struct sigaction sa, old_segv, old_bus;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    int faulted = 1;
    if (sigsetjmp(g_fault_jmp, 1) == 0) {
        (void)p[0];
        faulted = 0;
    }
    sigaction(SIGSEGV, &old_segv, NULL);
    sigaction(SIGBUS, &old_bus, NULL);
    return faulted;
}

#endif
