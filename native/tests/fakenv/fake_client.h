/*
 * fake_client.h - what the fake-driver tests share on the client side: sym() finds
 * a driver entry point (or one of fakenv's test hooks) in the preloaded stand-in
 * libcuda, and struct cu_mem_prop is CUmemAllocationProp's layout (32 bytes) for
 * the tests that call cuMemCreate themselves.
 */
#ifndef GDRPY_FAKE_CLIENT_H
#define GDRPY_FAKE_CLIENT_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;

struct cu_mem_prop {
    int type, htypes, loc_type, loc_id;
    void *meta;
    unsigned char c, rdma;
    unsigned short usage;
    unsigned char res[4];
};

static void *sym(const char *n)
{
    void *p = dlsym(RTLD_DEFAULT, n);
    if (!p) {
        printf("FAIL: %s not found: run with LD_PRELOAD=.../fakenv/libcuda.so.1\n", n);
        exit(2);
    }
    return p;
}

#endif
