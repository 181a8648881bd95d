"""Providers: vendor libraries (CLBlast, VkFFT) as guests on clops' context and queue, chosen
per call against generated kernels.

A provider declares what it does (``specs``: ops, dtypes, layouts; ``backends``: devices),
borrows the device's queue, takes :class:`Operand`\\ s (a runtime ``Buffer``, an element offset,
shape and element strides), waits for the buffers' pending work, and returns an ``Event`` that
is recorded on the buffers it read and wrote. Operands it cannot take as they are get an
on-device relayout (:mod:`clops.kernels.layout`). Nothing goes through the host.

The hook for the array layer (``matmul``, ``fft``)::

    from clops import providers
    p = providers.choose("gemm", device, "float32", (m, n, k),
                         generated_cost=lambda: providers.measure(run_generated, device))
    if p is not None:
        event = p.gemm(device, a, b, c)      # Operands (M, K), (K, N), (M, N)
    else:
        run_generated()

``choose(op, device, dtype, shape_key, generated_cost=None) -> Provider | None`` checks
capability first (library present, op, dtype and device extensions, backend and driver,
``CLOPS_PROVIDERS``), then takes the cheaper of the capable providers and the generated kernel,
measured once per (op, dtype, shape class, device) and kept on disk in
``<cache dir>/providers.json``. ``None`` means: run the generated kernel. Ops and their
``shape_key``: ``gemm`` (M, N, K), ``gemm_batched`` (batch, M, N, K), ``gemv`` (M, N),
``fft`` / ``rfft`` / ``irfft`` (batch, n), with the complex dtype of the transform.

``CLOPS_PROVIDERS`` (comma-separated, later items win): ``all`` (default: any provider, by
cost), ``none`` (generated kernels only), ``NAME`` (an allow-list of providers, by cost),
``-NAME`` (deny), ``+NAME`` or ``NAME!`` (force: used whenever capable, never measured).
E.g. ``CLOPS_PROVIDERS=-vkfft``, ``CLOPS_PROVIDERS=+clblast``. With ``CLOPS_DEBUG=1`` each
choice is printed once (``CLOPS_DEBUG=2``: every call and every skipped provider, with why);
under ``clops.profile()`` provider calls are records of kind ``"provider"`` and choices records
of kind ``"marker"`` named ``"choose OP: CHOICE"``.
"""

from __future__ import annotations

from ..kernels.operand import Operand, measure
from .base import OpSpec, Provider, ProviderError, ProviderUnavailableError, guarded_call
from .clblast import CLBlastProvider
from .registry import (
    GENERATED,
    Decision,
    Policy,
    capable,
    choices,
    choose,
    clear_choices,
    get,
    parse_policy,
    policy,
    providers,
    register,
    report,
    shape_class,
    unregister,
)
from .vkfft import VkFFTProvider

CLBLAST = register(CLBlastProvider())
VKFFT = register(VkFFTProvider())

__all__ = [
    "CLBLAST", "GENERATED", "VKFFT", "CLBlastProvider", "Decision", "OpSpec", "Operand",
    "Policy", "Provider", "ProviderError", "ProviderUnavailableError", "VkFFTProvider",
    "capable", "choices", "choose", "clear_choices", "get", "guarded_call", "measure",
    "parse_policy", "policy", "providers", "register", "report", "shape_class", "unregister",
]
