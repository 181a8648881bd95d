"""Kernels: every hand-written OpenCL C kernel, ``<family>.cl`` beside the ``<family>.py`` that
builds it with compile-time parameters and describes its launches (runtime ``Launch``\\ es or
enqueues on runtime Buffers); ``launch.py`` loads and builds them. Families: matmul
(``matmul.cl``, the CPU layout ``matmul_cpu.cl``, quantized GEMV), gemm (``gemm.cl``,
``gemm_cpu.cl``), attention, layer (a decode row's decoder layer in one persistent launch),
norm, activation, sample, paged (the batched KV cache), moe (a mixture of experts' routing),
fft, layout (relayout for providers and FFT), random, gather, scan, sort, linalg; ``operand.py``
holds the strided operand the layout, FFT and provider code share. The kernels import only the
runtime and the graph; ``nn``, ``llm``, the array layer and the providers call them."""

from __future__ import annotations

from .launch import Launch, LaunchPlan, kernel, program, source

__all__ = ["Launch", "LaunchPlan", "kernel", "program", "source"]
