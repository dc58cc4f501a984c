"""Which devices this codegen serves and whether its toolchain is present."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TritonTarget:
    """The device family of this codegen and the state of its toolchain here."""

    device_types: frozenset[str]
    triton_version: str | None
    has_device: bool

    def serves(self, device: torch.device) -> bool:
        """True when kernels for `device` are this codegen's to render."""
        return device.type in self.device_types

    @property
    def usable(self) -> bool:
        """Triton is importable and a GPU is present, so rendered kernels can run."""
        return self.triton_version is not None and self.has_device


def triton_target() -> TritonTarget:
    version = None
    if importlib.util.find_spec("triton") is not None:
        import triton

        version = str(triton.__version__)
    return TritonTarget(frozenset({"cuda"}), version, torch.cuda.is_available())
