"""The NVIDIA RM interface items the nvrm backend uses, one record each.

Each record: (key, expression over the driver's public headers, expression over
our own definitions in native/src/backends/nvrm/abi.h).  ``scripts/nvrm_abi_extract.py``
evaluates the first against a driver tag's headers; ``tests/test_nvrm_abi.py``
evaluates the second against ours and compares, per branch.
"""
from __future__ import annotations

# Headers of the driver tree (paths relative to the tag's root) the probe includes.
HEADER_DIRS = (
    "src/common/sdk/nvidia/inc",
    "src/nvidia/arch/nvalloc/unix/include",
)
HEADERS = (
    "nvtypes.h",
    "nvos.h",
    "nv_escape.h",
    "nv-ioctl.h",
    "nv-ioctl-numbers.h",
    "nv-unix-nvos-params-wrappers.h",
    "class/cl0000.h",
    "class/cl0080.h",
    "ctrl/ctrl0000/ctrl0000gpu.h",
    "ctrl/ctrl0000/ctrl0000unix.h",
)


def _struct(key: str, theirs: str, ours: str, fields: list[tuple[str, str, str]]):
    """size + offset (+ size) of each field: (name, their member, our member)."""
    out = [(f"{key}.sizeof", f"sizeof({theirs})", f"sizeof({ours})")]
    for name, tf, of in fields:
        out.append((f"{key}.{name}.offset", f"offsetof({theirs}, {tf})",
                    f"offsetof({ours}, {of})"))
        out.append((f"{key}.{name}.size", f"sizeof((({theirs} *)0)->{tf})",
                    f"sizeof((({ours} *)0)->{of})"))
    return out


def _const(name: str, ours: str | None = None):
    return (f"const.{name}", f"({name})", f"({ours or name})")


RECORDS: list[tuple[str, str, str]] = [
    # escapes (ioctl nr) and the ioctl magic
    _const("NV_IOCTL_MAGIC"),
    _const("NV_ESC_CARD_INFO"),
    _const("NV_ESC_CHECK_VERSION_STR"),
    _const("NV_ESC_RM_FREE"),
    _const("NV_ESC_RM_CONTROL"),
    _const("NV_ESC_RM_ALLOC"),
    _const("NV_ESC_RM_DUP_OBJECT"),
    _const("NV_ESC_RM_MAP_MEMORY"),
    _const("NV_ESC_RM_UNMAP_MEMORY"),
    # CHECK_VERSION_STR
    _const("NV_RM_API_VERSION_CMD_QUERY"),
    _const("NV_RM_API_VERSION_STRING_LENGTH", "sizeof(((nv_version_t *)0)->version)"),
    # classes
    _const("NV01_ROOT_CLIENT"),
    _const("NV01_DEVICE_0"),
    # controls and their constants
    _const("NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2"),
    _const("NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO"),
    _const("NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD"),
    _const("NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM", "NV_IMPORT_OBJECT_TYPE_VIDMEM"),
    _const("NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE",
           "sizeof(((nv0000_export_info_t *)0)->metadata)"),
    _const("NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS",
           "(sizeof(((nv0000_import_t *)0)->objects) / sizeof(uint32_t))"),
    # NVOS33 flags: the caching-type field (bits hi:lo) and its values
    ("const.NVOS33_FLAGS_CACHING_TYPE.lo", "(0 ? NVOS33_FLAGS_CACHING_TYPE)",
     "(NVOS33_CACHING_TYPE_LO)"),
    ("const.NVOS33_FLAGS_CACHING_TYPE.hi", "(1 ? NVOS33_FLAGS_CACHING_TYPE)",
     "(NVOS33_CACHING_TYPE_HI)"),
    _const("NVOS33_FLAGS_CACHING_TYPE_CACHED", "NVOS33_CT_CACHED"),
    _const("NVOS33_FLAGS_CACHING_TYPE_UNCACHED", "NVOS33_CT_UNCACHED"),
    _const("NVOS33_FLAGS_CACHING_TYPE_WRITECOMBINED", "NVOS33_CT_WRITECOMBINED"),
    _const("NVOS33_FLAGS_CACHING_TYPE_WRITEBACK", "NVOS33_CT_WRITEBACK"),
    _const("NVOS33_FLAGS_CACHING_TYPE_UNCACHED_WEAK", "NVOS33_CT_UNCACHED_WEAK"),
]
RECORDS += _struct("nv_ioctl_card_info_t", "nv_ioctl_card_info_t", "nv_card_info_t", [
    ("valid", "valid", "valid"),
    ("pci_info.domain", "pci_info.domain", "domain"),
    ("pci_info.bus", "pci_info.bus", "bus"),
    ("pci_info.slot", "pci_info.slot", "slot"),
    ("pci_info.function", "pci_info.function", "function"),
    ("pci_info.vendor_id", "pci_info.vendor_id", "vendor_id"),
    ("pci_info.device_id", "pci_info.device_id", "device_id"),
    ("gpu_id", "gpu_id", "gpu_id"),
    ("interrupt_line", "interrupt_line", "interrupt_line"),
    ("reg_address", "reg_address", "reg_address"),
    ("reg_size", "reg_size", "reg_size"),
    ("fb_address", "fb_address", "fb_address"),
    ("fb_size", "fb_size", "fb_size"),
    ("minor_number", "minor_number", "minor_number"),
    ("dev_name", "dev_name", "dev_name"),
])
RECORDS += _struct("nv_ioctl_rm_api_version_t", "nv_ioctl_rm_api_version_t", "nv_version_t", [
    ("cmd", "cmd", "cmd"),
    ("reply", "reply", "reply"),
    ("versionString", "versionString", "version"),
])
_H = ("hRoot", "hObjectParent")
RECORDS += _struct("NVOS00_PARAMETERS", "NVOS00_PARAMETERS", "nv_os00_t", [
    (f, f, f) for f in (*_H, "hObjectOld", "status")])
RECORDS += _struct("NVOS21_PARAMETERS", "NVOS21_PARAMETERS", "nv_os21_t", [
    (f, f, f) for f in (*_H, "hObjectNew", "hClass", "pAllocParms", "paramsSize", "status")])
RECORDS += _struct("NVOS54_PARAMETERS", "NVOS54_PARAMETERS", "nv_os54_t", [
    (f, f, f) for f in ("hClient", "hObject", "cmd", "flags", "params", "paramsSize",
                        "status")])
RECORDS += _struct("NVOS55_PARAMETERS", "NVOS55_PARAMETERS", "nv_os55_t", [
    (f, f, f) for f in ("hClient", "hParent", "hObject", "hClientSrc", "hObjectSrc", "flags",
                        "status")])
RECORDS += _struct("nv_ioctl_nvos33_parameters_with_fd", "nv_ioctl_nvos33_parameters_with_fd",
                   "nv_os33_fd_t", [
    *[(f"params.{f}", f"params.{f}", f) for f in (
        "hClient", "hDevice", "hMemory", "offset", "length", "pLinearAddress", "status",
        "flags")],
    ("fd", "fd", "fd"),
])
RECORDS += _struct("NVOS34_PARAMETERS", "NVOS34_PARAMETERS", "nv_os34_t", [
    (f, f, f) for f in ("hClient", "hDevice", "hMemory", "pLinearAddress", "status", "flags")])
RECORDS += _struct("NV0080_ALLOC_PARAMETERS", "NV0080_ALLOC_PARAMETERS", "nv0080_alloc_t", [
    (f, f, f) for f in ("deviceId", "hClientShare", "hTargetClient", "hTargetDevice", "flags",
                        "vaSpaceSize", "vaStartInternal", "vaLimitInternal", "vaMode")])
RECORDS += _struct("NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS",
                   "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS", "nv0000_id_info_v2_t", [
    (f, f, f) for f in ("gpuId", "gpuFlags", "deviceInstance", "subDeviceInstance",
                        "sliStatus", "boardId", "gpuInstance", "numaId")])
RECORDS += _struct("NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS",
                   "NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS", "nv0000_export_info_t", [
    (f, f, f) for f in ("fd", "deviceInstance", "gpuInstanceId", "maxObjects", "metadata")])
RECORDS += _struct("NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS",
                   "NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS", "nv0000_import_t", [
    (f, f, f) for f in ("fd", "hParent", "objects", "objectTypes", "numObjects", "index")])

# Production branches covered, oldest first.
BRANCHES = ("535", "550", "560", "565", "570", "575", "580", "590", "595")

# Where a branch differs from the newest layout, our definitions carry a
# variant (native/src/backends/nvrm/abi.h) and the table says which one the
# backend uses: our type name -> the variant's, per branch.
OURS_VARIANTS: dict[str, dict[str, str]] = {
    "535": {"nv0000_export_info_t": "nv0000_export_info_v535_t"},
}


def ours_for(branch: str) -> list[tuple[str, str]]:
    """(key, expression over our definitions) for one branch."""
    subs = OURS_VARIANTS.get(branch, {})
    out = []
    for key, _, ours in RECORDS:
        for a, b in subs.items():
            ours = ours.replace(f"({a} ", f"({b} ").replace(f"({a},", f"({b},").replace(
                f"({a})", f"({b})")
        out.append((key, ours))
    return out
