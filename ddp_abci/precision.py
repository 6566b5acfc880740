"""Precision: --amp {auto,no,fp16,bf16} to torch.amp autocast and GradScaler."""
from __future__ import annotations

import contextlib

import torch

from .config import AMP_CHOICES as CHOICES
from .errors import UsageError
from .options import check_choice

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_precision(amp: str, device: torch.device) -> str:
    """'auto' becomes bf16 on a GPU that computes it natively (compute capability 8.0, Ampere,
    and newer: A100, H100, H200), fp16 with loss scaling on older ones (V100), and no (fp32) on
    the CPU; combinations that cannot run are refused (a UsageError naming the fix)."""
    check_choice("--amp", amp, CHOICES)
    if amp == "auto":
        if device.type != "cuda":
            return "no"
        return "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    if amp == "fp16" and device.type != "cuda":
        raise UsageError("fp16 needs a CUDA GPU and none is available; use --amp bf16 or --amp no on the CPU")
    # Compute capability 8.0 (Ampere) brought bf16 tensor cores. torch.cuda.is_bf16_supported()
    # also answers True where a bf16 tensor can merely be created (its including_emulation=True
    # default, torch 2.13's torch/cuda/__init__.py), i.e. emulated, slower than fp32.
    if amp == "bf16" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        major, minor = torch.cuda.get_device_capability(device)
        raise UsageError(f"this GPU ({torch.cuda.get_device_name(device)}, compute capability {major}.{minor}) "
                         "only emulates bf16; use --amp fp16 (bf16 needs 8.0, Ampere, or newer)")
    return amp


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Forward pass context: torch.amp.autocast in fp16/bf16, nothing in fp32."""
    if precision == "no":
        return contextlib.nullcontext()
    return torch.amp.autocast(device.type, dtype=_DTYPES[precision])


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16: bf16 has fp32's exponent range and
    needs no loss scaling. A disabled scaler's scale/step/update are plain pass-throughs."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
