"""Kernels: hand-written OpenCL C (``*.cl`` beside this file) and the small launchers that build
them with compile-time parameters and describe their launches for ``nn`` and ``llm``."""

from __future__ import annotations

from .launch import Launch, LaunchPlan, kernel, program, source

__all__ = ["Launch", "LaunchPlan", "kernel", "program", "source"]
