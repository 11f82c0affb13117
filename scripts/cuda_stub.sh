# cuda_stub.sh - sourced by the scripts that link against the CUDA driver on a
# machine without one (ucx_build.sh, osu_build.sh).
#
#   cuda_stub SONAME OUTDIR HEADER...
#
# Writes OUTDIR/<base>.so (base: SONAME up to ".so"), a LINK-TIME STUB: every
# cu*/nvml* name found in the HEADERs as an empty function, with soname SONAME, so
# that a program links with NEEDED SONAME and the driver's own library serves it at
# run time.  A stub must never be installed or carried.
cuda_stub() {
    local soname=$1 out=$2 base=${1%%.so*}
    shift 2
    local c="$out/${base}_stub.c"
    mkdir -p "$out"
    { echo "/* generated link-time stub: never install or carry */"
      cat "$@" | grep -oE '\b(cu|nvml)[A-Z][A-Za-z0-9_]*\b' | sort -u |
          sed 's/.*/void &(void) {}/'
    } > "$c"
    gcc -shared -fPIC -o "$out/$base.so" -Wl,-soname,"$soname" "$c"
}
