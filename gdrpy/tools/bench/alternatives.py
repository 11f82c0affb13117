"""What a Python user would pick instead: cuda-python, CuPy and PyTorch copies, next
to gdrpy's own methods."""

from __future__ import annotations

import functools

from .timing import Op, _Env

# ---------------------------------------------------------------------------
# What a Python user would pick instead

class _CudaPython:
    library = "cuda-python"

    def __init__(self, ctx, env: _Env):
        from gdrpy.memory import cuda_driver, primary_context
        self.cu = cuda_driver()
        primary_context(ctx.device)
        self.env = env
        self.dptr = int(env.buf.ptr)
        self.hptr = int(env.host.ctypes.data)
        try:
            import cuda.bindings
            self.version = getattr(cuda.bindings, "__version__", "?")
        except Exception:
            self.version = "?"
        cu = self.cu

        def check(res, _cu=cu):
            err = res[0] if isinstance(res, tuple) else res
            if int(err) != 0:
                try:
                    name = _cu.cuGetErrorName(err)[1].decode()
                except Exception:
                    name = str(err)
                raise RuntimeError(f"cuMemcpy failed: {name}")
        self.check = check

    def op(self, direction: str, n: int) -> Op:
        if direction == "h2d":
            return Op("cuMemcpyHtoD", "cuda-python cuMemcpyHtoD", "cuMemcpy(py)", self.library,
                      direction, n, self.cu.cuMemcpyHtoD, (self.dptr, self.hptr, n),
                      self.env.host[:n], self.check)
        return Op("cuMemcpyDtoH", "cuda-python cuMemcpyDtoH", "cuMemcpy(py)", self.library,
                  direction, n, self.cu.cuMemcpyDtoH, (self.hptr, self.dptr, n),
                  self.env.host[:n], self.check)

    def close(self):
        pass


class _CuPy:
    library = "cupy"

    def __init__(self, ctx, env: _Env):
        import cupy
        self.cupy = cupy
        self.version = cupy.__version__
        cupy.cuda.Device(ctx.device).use()
        self.a = cupy.asarray(env.buf)          # over our memory, through CAI
        if int(self.a.data.ptr) != int(env.buf.ptr):
            raise RuntimeError("cupy.asarray(buf) did not alias the buffer")
        self.env = env

    def op(self, direction: str, n: int) -> Op:
        av = self.a[:n]
        hv = self.env.host[:n]
        if direction == "h2d":
            return Op("cupy", "cupy ndarray.set (pageable)", "cupy", self.library, direction, n,
                      av.set, (hv,), hv)
        return Op("cupy", "cupy ndarray.get(out=) (pageable)", "cupy", self.library, direction,
                  n, functools.partial(av.get, out=hv), (), hv)

    def close(self):
        self.a = None


class _Torch:
    library = "torch"

    def __init__(self, ctx, env: _Env):
        import torch
        self.version = torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        torch.cuda.set_device(ctx.device)
        why = []
        t = None
        for how, make in (("torch.from_dlpack", lambda: torch.from_dlpack(env.buf)),
                          ("torch.as_tensor (CAI)",
                           lambda: torch.as_tensor(env.buf, device=f"cuda:{ctx.device}"))):
            try:
                cand = make()
            except Exception as e:
                why.append(f"{how}: {type(e).__name__}: {e}")
                continue
            if cand.data_ptr() != int(env.buf.ptr) or cand.numel() != env.buf.size:
                why.append(f"{how}: did not alias the buffer")
                continue
            t, self.how = cand, how + (f"; {'; '.join(why)}" if why else "")
            break
        if t is None:
            raise RuntimeError("no torch tensor over our memory: " + "; ".join(why))
        self.t = t
        self.pinned = torch.empty(env.size, dtype=torch.uint8, pin_memory=True)
        self.pinned_np = self.pinned.numpy()

    def op(self, direction: str, n: int) -> Op:
        dv = self.t[:n]
        hv = self.pinned[:n]
        if direction == "h2d":
            return Op("torch", "torch t.copy_(pinned)", "torch", self.library, direction, n,
                      dv.copy_, (hv,), self.pinned_np[:n])
        return Op("torch", "torch pinned.copy_(t)", "torch", self.library, direction, n,
                  hv.copy_, (dv,), self.pinned_np[:n])

    def close(self):
        self.t = None
        self.pinned = None
        self.pinned_np = None


_ALTERNATIVES = (("cuda-python", _CudaPython, "cuda.bindings"),
                 ("cupy", _CuPy, "cupy"),
                 ("torch", _Torch, "torch"))


def _alternatives(ctx, env: _Env, which=("cuda-python", "cupy", "torch")):
    """(providers, skipped): the other libraries' copies, each only where it
    is importable and the backend is a real GPU."""
    import importlib.util
    provs, skipped = [], []
    for name, cls, module in _ALTERNATIVES:
        if name not in which:
            continue
        if ctx.is_sim:
            skipped.append({"library": name, "reason": "sim backend: no GPU to copy to"})
            continue
        try:
            spec = importlib.util.find_spec(module.split(".")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            skipped.append({"library": name, "reason": f"{module} is not importable"})
            continue
        try:
            provs.append(cls(ctx, env))
        except Exception as e:
            skipped.append({"library": name, "reason": f"{type(e).__name__}: {e}"})
    return provs, skipped


def _gdrpy_ops(env: _Env, direction: str, n: int, transfer=None) -> list:
    """Mapping.write/read, Transfer.put/get (when ``transfer`` is given) and
    Pin.ce_write/ce_read, all between env.host and offset 0 of the pin."""
    m, pin, host = env.m, env.pin, env.host
    hv = host[:n]
    if direction == "h2d":
        ops = [Op("write", "gdrpy Mapping.write", "write", "gdrpy", direction, n,
                  m.write, (0, hv), hv)]
        if transfer is not None:
            ops.append(Op("put", "gdrpy Transfer.put (auto)", "put", "gdrpy", direction, n,
                          transfer.put, (0, hv), hv))
        ops.append(Op("ce_write", "gdrpy Pin.ce_write", "ce_write", "gdrpy", direction, n,
                      pin.ce_write, (0, hv), hv))
        return ops
    ops = [Op("read", "gdrpy Mapping.read", "read", "gdrpy", direction, n,
              m.read, (0, n, host), hv)]
    if transfer is not None:
        ops.append(Op("get", "gdrpy Transfer.get (auto)", "get", "gdrpy", direction, n,
                      transfer.get, (0, hv), hv))
    ops.append(Op("ce_read", "gdrpy Pin.ce_read", "ce_read", "gdrpy", direction, n,
                  pin.ce_read, (0, n, host), hv))
    return ops
