# native/src/backends/nvrm/files.mk - the one list of the nvrm backend's files.
#
# native/Makefile builds NVRM_SRCS from it.  The top comment of nvrm.h and
# the file table of docs/nvrm.md repeat it word for word, and
# tests/test_nvrm_layout.py fails when they, this list or the folder
# disagree.  Lower layers first: a .c file calls functions of .c files
# listed before it only (the same test checks the built objects).
#
#   file             what it serves
nvrm_files :=
nvrm_files += files.mk       # this list
nvrm_files += abi.h          # our definitions of the RM ioctl interface
nvrm_files += abi/           # the RM interface of each driver branch, as JSON (generated)
nvrm_files += abi_tables.h   # one struct nvrm_abi per branch (generated from abi/)
nvrm_files += nvrm.h         # what the files share: state, structs, one section per file
nvrm_files += table.c        # ABI tables: choosing the one of the running driver
nvrm_files += rm.c           # RM primitives: ioctls, handles, objects, the session, CPU maps
nvrm_files += identity.c     # the identity proof: does an RM object hold the caller's bytes
nvrm_files += desc.c         # reading CUDA's records: IPC words, walks, the per-pin rule
nvrm_files += diag.c         # logs of what route V saw (GDRPY_NVRM_POOL_DIAG dumps)
nvrm_files += scratch.c      # checks on scratch memory of our own (self-test, learning)
nvrm_files += route_a.c      # route A: cuMemCreate memory with POSIX_FD: export -> import
nvrm_files += route_c.c      # route C: cuMemAlloc memory: IPC words -> dup, pins over the chunk
nvrm_files += learn_vmm.c    # learning where CUDA names VMM memory without handle types
nvrm_files += learn_pool.c   # learning where a pool's records name its chunks' memory
nvrm_files += route_v.c      # route V: VMM without handle types and pools, per pin
nvrm_files += selftest.c     # the per-device self-test (which routes work) and its report
nvrm_files += backend.c      # the gp_backend vtable: probe/open/close/pin/unpin/map/unmap

NVRM_SRCS := $(addprefix src/backends/nvrm/,$(filter %.c,$(nvrm_files)))
