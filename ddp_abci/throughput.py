"""Tokens a second and model FLOPs utilization (MFU), as nanoGPT and torchtitan print them.

A run counts tokens when it is told what an item holds: --tokens-per-item (a language model's
block size), or fit(count_tokens=fn), fn(batch) -> the tokens in one of this rank's batches
(its padding left out, say), summed over the step's micro-batches and multiplied by the ranks
(the shares are the same size: DistributedSampler's, or the stream's). MFU is the model's FLOPs
a second (tokens/s x FLOPs a token) over the devices' peak:

    flops_per_token   --flops-per-token N, or auto: 6 x the parameters (the forward's 2N and the
                      backward's 4N a token: nanoGPT's estimate_mfu and the PaLM paper's
                      appendix B, without their attention term 12 L H Q T, which a long context
                      adds: give the number there)
    peak              --peak-tflops, else PEAKS below for the device and precision; any other
                      device (the CPU, fp32) has none: "MFU unknown", never a guess

Imports nothing heavy at the top: the status command reads these names on a login node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Dense tensor-core peaks a device, FLOP/s, by (a part of the device's name, precision), most
# specific first. Sources: torchtitan's torchtitan/tools/utils.py get_peak_flops (read at commit
# 02581674), which cites NVIDIA's product pages for A100, H100 (SXM, PCIe, NVL) and H200 and
# gives their BF16 figures; FP16 tensor cores have the same dense peak on these parts (the
# table of NVIDIA's "Hopper architecture in depth", as quoted at forums.developer.nvidia.com
# t/218102: A100 312 and 312, H100 SXM5 1000 and 1000 (rounded), H100 PCIe 800 and 800; and
# glennklockwood.com/garden/processors/h100: 989.4 both). V100: "up to 125 Tensor TFLOPS"
# (FP16, NVIDIA's "Programming Tensor Cores in CUDA 9"); it has no BF16 tensor cores, so bf16
# there has no peak.
PEAKS: tuple[tuple[str, str, float, str], ...] = (
    ("H200", "bf16", 989e12, "nvidia.com/en-us/data-center/h200 (via torchtitan)"),
    ("H200", "fp16", 989e12, "nvidia.com/en-us/data-center/h200 (via torchtitan)"),
    ("H100 NVL", "bf16", 835e12, "nvidia.com/en-us/data-center/h100 (via torchtitan)"),
    ("H100 NVL", "fp16", 835e12, "nvidia.com/en-us/data-center/h100 (via torchtitan)"),
    ("H100 PCIe", "bf16", 756e12, "nvidia.com/en-us/data-center/h100 (via torchtitan)"),
    ("H100 PCIe", "fp16", 756e12, "nvidia.com/en-us/data-center/h100 (via torchtitan)"),
    ("H100", "bf16", 989e12, "nvidia.com/en-us/data-center/h100, SXM (via torchtitan)"),
    ("H100", "fp16", 989e12, "nvidia.com/en-us/data-center/h100, SXM (via torchtitan)"),
    ("A100", "bf16", 312e12, "nvidia.com/en-us/data-center/a100 (via torchtitan)"),
    ("A100", "fp16", 312e12, "nvidia.com/en-us/data-center/a100 (via torchtitan)"),
    ("V100", "fp16", 125e12, "developer.nvidia.com/programming-tensor-cores-cuda-9-0"),
)


def device_peak(device_name: str, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device, where the figure comes from) for a device's name (as
    torch.cuda.get_device_name gives it) and the run's precision; (None, why) where unknown."""
    for part, kind, flops, source in PEAKS:
        if part in device_name and kind == precision:
            return flops, source
    return None, f"no peak known for {device_name or 'this device'} in {precision}"


@dataclass(frozen=True)
class Throughput:
    """What a run's samples a second mean in tokens and MFU. tokens_per_item: 0 when the run
    counts tokens itself (count_tokens) or not at all; flops_per_token and peak_flops: None
    where unknown (then no MFU)."""

    tokens_per_item: int
    flops_per_token: float | None
    peak_flops: float | None      # one device's
    world_size: int
    peak_source: str = ""

    def tokens_per_s(self, samples_per_s: float | None, tokens_per_sample: float | None = None) -> float | None:
        """Tokens a second over all ranks, from samples a second and the tokens an item holds
        (counted, `tokens_per_sample`, or --tokens-per-item)."""
        per = tokens_per_sample if tokens_per_sample else self.tokens_per_item
        return samples_per_s * per if samples_per_s and per else None

    def mfu(self, tokens_per_s: float | None) -> float | None:
        """The model's FLOPs a second over all devices' peak (0 to 1), None where unknown."""
        if not tokens_per_s or not self.flops_per_token or not self.peak_flops:
            return None
        return tokens_per_s * self.flops_per_token / (self.peak_flops * self.world_size)

    def words(self, tokens_per_s: float | None) -> str:
        """", 1,234 tokens/s, MFU 41.2%" for the progress line ("" without tokens)."""
        if tokens_per_s is None:
            return ""
        mfu = self.mfu(tokens_per_s)
        return f", {tokens_per_s:,.0f} tokens/s" + (f", MFU {100 * mfu:.1f}%" if mfu is not None else
                                                     (", MFU unknown" if self.flops_per_token else ""))


def plan_throughput(config: Any, model: Any, device: Any, precision: str, world_size: int,
                    counts_tokens: bool) -> tuple[Throughput | None, str]:
    """The run's Throughput, and the line that says how MFU is reached ("" when tokens are not
    counted: no --tokens-per-item and no count_tokens)."""
    if not config.tokens_per_item and not counts_tokens:
        return None, ""
    params = sum(p.numel() for p in model.parameters())
    if config.flops_per_token == "auto":
        flops, how = 6.0 * params, f"6 x {params:,} parameters (auto: attention's term left out)"
    else:
        flops, how = (float(config.flops_per_token) or None), f"{float(config.flops_per_token):.4g} (--flops-per-token)"
    precision = "fp32" if precision == "no" else precision  # --amp no: full precision
    if config.peak_tflops:
        peak, source = config.peak_tflops * 1e12, "--peak-tflops"
    else:
        name = _device_name(device)
        peak, source = device_peak(name, precision)
    throughput = Throughput(config.tokens_per_item, flops, peak, world_size, source)
    if flops is None:
        return throughput, "throughput: tokens/s counted; no MFU (--flops-per-token N, or auto)"
    if peak is None:
        return throughput, f"throughput: FLOPs a token {how}; MFU unknown: {source} (give --peak-tflops)"
    return throughput, (f"throughput: FLOPs a token {how}; peak {peak / 1e12:g} TFLOPS a device in {precision} "
                        f"({source})")


def _device_name(device: Any) -> str:
    if getattr(device, "type", "") != "cuda":
        return str(getattr(device, "type", device))
    import torch  # noqa: PLC0415

    return torch.cuda.get_device_name(device)
