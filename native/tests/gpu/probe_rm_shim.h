/* probe_rm_shim.h - see probe_rm_shim.c (diagnostic builds only). */
#ifndef PROBE_RM_SHIM_H
#define PROBE_RM_SHIM_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
int shim_open(int device, char *ver, size_t verlen, uint32_t *cli, uint32_t *devh);
const char *shim_err(void);
const char *shim_status(uint32_t st);
uint32_t shim_ctl(int fd, uint32_t cli, uint32_t obj, uint32_t cmd, void *p, uint32_t sz);
int shim_dup(uint32_t cli, uint32_t obj, uint32_t *h);
int shim_free(uint32_t h);
void *shim_map(uint32_t h, uint64_t off, uint64_t len, void **cookie);
void shim_unmap(uint32_t h, void *cookie);
uint32_t shim_export_info(int fd, uint16_t *maxo, uint32_t *devinst, uint8_t meta[64]);
uint32_t shim_import(int fd, int index, uint32_t *h, uint8_t *type);
void shim_close(void);
#endif
