"""--amp (precision.py): what auto chooses on each device, what is refused, and the scaler."""

import pytest
import torch

from ddp_abci.errors import UsageError
from ddp_abci.precision import make_scaler, resolve_precision

CPU = torch.device("cpu")


def test_auto_precision_is_fp32_on_the_cpu():
    assert resolve_precision("auto", CPU) == "no"


@pytest.mark.parametrize("capability, chosen", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 0), "fp16")],
                         ids=["H100/H200", "A100", "V100"])
def test_auto_precision_is_bf16_where_the_gpu_computes_it_and_fp16_with_its_scaler_below(monkeypatch, capability,
                                                                                          chosen):
    # No GPU here: the device's compute capability is the one fact the choice reads.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_precision("auto", torch.device("cuda", 0)) == chosen


def test_fp16_on_the_cpu_is_refused_naming_the_alternatives():
    with pytest.raises(UsageError, match="--amp bf16 or --amp no"):
        resolve_precision("fp16", CPU)


def test_an_unknown_precision_lists_the_choices():
    with pytest.raises(UsageError, match="auto, no, fp16, bf16"):
        resolve_precision("fp8", CPU)


def test_the_grad_scaler_is_active_for_fp16_only():
    assert not make_scaler("bf16", CPU).is_enabled()
    assert not make_scaler("no", CPU).is_enabled()


def test_bf16_on_a_gpu_that_only_emulates_it_is_refused_naming_fp16(monkeypatch):
    import torch

    from ddp_abci.errors import UsageError
    from ddp_abci.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what torch says: emulation counts
    with pytest.raises(UsageError, match="only emulates bf16; use --amp fp16"):
        resolve_precision("bf16", torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_precision("bf16", torch.device("cuda", 0)) == "bf16"
