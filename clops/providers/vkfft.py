"""Providers, VkFFT: complex and real FFTs through pyvkfft's OpenCL backend, on clops' context
and queue. Plans (one per queue, transform, batch, length, dtype, normalization) are kept in a
small LRU. Without pyvkfft the provider reports itself unavailable and ``clops.fft`` runs on
clops' own kernels (:mod:`clops.kernels.fft`).

Operands are contiguous rows (batch, n); an offset is passed as an OpenCL sub-buffer when it
is a multiple of the device's base address alignment, else the rows are first copied on the
device.
"""

from __future__ import annotations

import atexit
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..kernels import fft, layout
from ..kernels.operand import Operand, queue_of
from ..runtime import interop
from .base import OpSpec, Provider, ProviderError, guarded_call

if TYPE_CHECKING:
    from ..runtime.device import CLDevice, CLQueue
    from ..runtime.events import Event

_NP = {"float32": np.float32, "float64": np.float64, "complex64": np.complex64,
       "complex128": np.complex128}
_MAX_APPS = 32


class _DeviceArray:
    """The few attributes of a ``pyopencl.array.Array`` that pyvkfft reads, over a clops
    buffer (or sub-buffer)."""

    def __init__(self, data: Any, shape: tuple[int, ...], dtype: str, queue: Any) -> None:
        self.data = data
        self.shape = shape
        self.dtype = np.dtype(_NP[dtype])
        self.queue = queue
        self.size = math.prod(shape)
        self.ndim = len(shape)
        self.nbytes = self.size * self.dtype.itemsize
        self.strides = tuple(s * self.dtype.itemsize for s in
                             layout.contiguous_strides(shape))


class VkFFTProvider(Provider):
    """VkFFT behind ``clops.fft``: ``fft`` (complex), ``rfft`` (real to complex) and ``irfft``
    (complex to real), each over the rows of a (batch, n) operand.

    >>> clops.providers.get("vkfft").fft(dev, x, y, inverse=True, scale=1 / n)
    """

    name = "vkfft"
    description = "VkFFT (pyvkfft, OpenCL backend): complex and real FFTs"
    _needs = {"complex128": ("cl_khr_fp64",)}
    _rows = "contiguous rows (batch, n); offsets aligned to the device's base address alignment"
    specs = (
        OpSpec("fft", frozenset({"complex64", "complex128"}), _rows, _needs),
        OpSpec("rfft", frozenset({"complex64", "complex128"}), _rows, _needs),
        OpSpec("irfft", frozenset({"complex64", "complex128"}), _rows, _needs),
    )

    def __init__(self) -> None:
        super().__init__()
        self._vk: Any = None
        self._apps: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._app_lock = threading.Lock()

    def load(self) -> None:
        try:
            import pyvkfft.config
            import pyvkfft.opencl as vk
        except ImportError as e:
            raise ImportError(
                f"pyvkfft is not installed or its OpenCL backend did not build ({e}); "
                "install it with VKFFT_BACKEND=opencl pip install pyvkfft (needs the OpenCL "
                "headers and ICD loader, e.g. opencl-headers and ocl-icd-opencl-dev)") from None
        pyvkfft.config.WARN_OPENCL_QUEUE_MISMATCH = False
        self._vk = vk
        # NOTE: applications are freed before interpreter shutdown tears pyvkfft's module down.
        atexit.register(self.free_apps)
        self.version = getattr(vk, "vkfft_version", lambda: "?")()

    def cannot_shape(self, op: str, shape_key: tuple[int, ...]) -> str | None:
        if shape_key[-1] < 2:
            return "VkFFT needs a transform length of at least 2"
        return None

    # -- layout ---------------------------------------------------------------------------------
    def accepts(self, op: str, role: str, operand: Operand) -> bool:
        if not operand.is_contiguous:
            return False
        if operand.offset == 0:
            return True
        align = _base_align(operand)
        return operand.byte_offset % align == 0

    def _array(self, op: Operand, q: CLQueue, shape: tuple[int, ...]) -> _DeviceArray:
        mem: Any = op.buffer.mem
        if op.offset:
            mem = interop.sub_buffer(op.buffer, op.byte_offset, op.nbytes)
        return _DeviceArray(mem, shape, op.dtype, q.cl_queue)

    def free_apps(self) -> None:
        """Release every cached VkFFT application."""
        with self._app_lock:
            self._apps.clear()

    def _app(self, q: CLQueue, r2c: bool, batch: int, n: int, dtype: str, norm: int) -> Any:
        key = (interop.queue_handle(q), r2c, batch, n, dtype, norm)
        with self._app_lock:
            app = self._apps.get(key)
            if app is not None:
                self._apps.move_to_end(key)
                return app
        shape = (batch, n) if batch > 1 else (n,)
        np_dtype = _NP[layout.REAL_OF[dtype]] if r2c else _NP[dtype]
        try:
            app = self._vk.VkFFTApp(shape, np_dtype, queue=q.cl_queue, ndim=1, inplace=False,
                                    norm=norm, r2c=r2c)
        except Exception as e:  # noqa: BLE001 - pyvkfft raises plain RuntimeErrors
            raise ProviderError(f"VkFFT could not make an application for a length-{n} {dtype} "
                                f"transform of {batch} rows: {e}") from e
        with self._app_lock:
            self._apps[key] = app
            while len(self._apps) > _MAX_APPS:
                self._apps.popitem(last=False)
        return app

    # -- ops ----------------------------------------------------------------------------------
    def fft(self, device: CLDevice, x: Operand, y: Operand, *, inverse: bool = False,
            scale: float = 1.0, queue: CLQueue | None = None) -> Event:
        """Complex FFT of each row of ``x`` (batch, n) into ``y``; ``scale`` multiplies the
        result (``1/n`` gives numpy's inverse)."""
        batch, n = layout.fft_rows(x)
        if x.shape != y.shape or x.dtype != y.dtype:
            raise ValueError(f"fft: {x} and {y} differ in shape or dtype")
        return self._transform(device, "fft", x, y, batch, n, inverse, scale, queue)

    def rfft(self, device: CLDevice, x: Operand, y: Operand, *, scale: float = 1.0,
             queue: CLQueue | None = None) -> Event:
        """Real-to-complex FFT: ``x`` (batch, n) float, ``y`` (batch, n//2+1) complex."""
        batch, n = layout.fft_rows(x)
        if y.size != batch * (n // 2 + 1):
            raise ValueError(f"rfft: output {y.shape} should be ({batch}, {n // 2 + 1})")
        return self._transform(device, "rfft", x, y, batch, n, False, scale, queue)

    def irfft(self, device: CLDevice, x: Operand, y: Operand, *, scale: float = 1.0,
              queue: CLQueue | None = None) -> Event:
        """Complex-to-real inverse FFT: ``x`` (batch, n//2+1) complex, ``y`` (batch, n)
        float."""
        batch, n = layout.fft_rows(y)
        if x.size != batch * (n // 2 + 1):
            raise ValueError(f"irfft: input {x.shape} should be ({batch}, {n // 2 + 1})")
        return self._transform(device, "irfft", x, y, batch, n, True, scale, queue)

    def _transform(self, device: CLDevice, op: str, x: Operand, y: Operand, batch: int, n: int,
                   inverse: bool, scale: float, queue: CLQueue | None) -> Event:
        if self._vk is None:
            why = self.unavailable_reason()
            if why is not None:
                raise ProviderError(f"vkfft is unavailable: {why}")
        q = queue_of(device, queue)
        if batch == 0 or n == 0:
            return q.marker()
        if n == 1:  # VkFFT makes no length-1 transform; it is a copy
            return fft.run(op, device, x, y, inverse=inverse, scale=scale, queue=q)
        cdt = y.dtype if op == "fft" or op == "rfft" else x.dtype
        half = n // 2 + 1
        x_shape = (batch, half) if op == "irfft" else (batch, n)
        y_shape = (batch, half) if op == "rfft" else (batch, n)
        if op == "irfft":
            # NOTE: a private copy: numpy ignores the imaginary parts of the DC and Nyquist
            # terms and VkFFT does not, so they are zeroed first (and VkFFT's C2R may write
            # to its input).
            x = layout.contiguous(device, x, queue=q)
            fft.hermitian_clean(device, x, n, queue=q)
        elif not self.accepts(op, "x", x) or x.buffer is y.buffer:
            x = layout.contiguous(device, x, queue=q)
        target = y
        if not self.accepts(op, "y", y):
            y = layout.empty(device, y.shape, y.dtype)
        # NOTE: VkFFT's own normalization (norm=1) divides the inverse by n; any other scale is
        # a separate pass over the output.
        norm = 1 if inverse and math.isclose(scale, 1.0 / n, rel_tol=1e-12) else 0
        extra = 1.0 if norm == 1 else scale
        app = self._app(q, op != "fft", batch, n, cdt, norm)
        src = self._array(x, q, x_shape if batch > 1 else x_shape[1:])
        dst = self._array(y, q, y_shape if batch > 1 else y_shape[1:])

        def enqueue(qq: CLQueue) -> None:
            try:
                if inverse:
                    app.ifft(src, dst, queue=qq.cl_queue)
                else:
                    app.fft(src, dst, queue=qq.cl_queue)
            except Exception as e:  # noqa: BLE001 - pyvkfft raises plain RuntimeErrors
                raise ProviderError(f"VkFFT {op} of {batch}x{n} {cdt} failed on "
                                    f"{device.name}: {e}") from e
            return None

        nbytes = x.nbytes + y.nbytes
        ev = guarded_call(device, enqueue, reads=[x.buffer], writes=[y.buffer], queue=q,
                          name=f"vkfft.{op}", provider=self.name, op=op, nbytes=nbytes,
                          flops=fft.flops(n, batch))
        if extra != 1.0:
            ev = layout.scale(device, y, extra, queue=q)
        if y is not target:
            ev = layout.copy(device, y, target, queue=q)
        return ev

    # -- cost ---------------------------------------------------------------------------------
    def estimate(self, op: str, device: CLDevice, dtype: str, shape_key: tuple[int, ...]) -> float:
        """Seconds: two passes over the data at a guessed bandwidth, plus the launch."""
        batch, n = shape_key
        nbytes = 2 * batch * n * layout.ITEMSIZE[dtype]
        bw = 1e12 if device.kind == "gpu" else 20e9
        return 20e-6 + 2 * nbytes / bw

    def scratch_call(self, op: str, device: CLDevice, dtype: str,
                     shape_key: tuple[int, ...]) -> Callable[[], Event]:
        x, y = layout.fft_scratch(device, op, dtype, shape_key)
        return lambda: self.run(op, device, x, y)


def _base_align(op: Operand) -> int:
    return interop.base_addr_align(op.buffer)
