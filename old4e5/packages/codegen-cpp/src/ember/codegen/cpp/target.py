"""Which devices this codegen serves and the C++ dialect it writes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CppTarget:
    """The device family of this codegen and the language level of its source."""

    device_types: frozenset[str]
    language_standard: str

    def serves(self, device: torch.device) -> bool:
        """True when kernels for `device` are this codegen's to render."""
        return device.type in self.device_types


def cpp_target() -> CppTarget:
    return CppTarget(frozenset({"cpu"}), "c++17")
