"""A small classifier on scikit-learn's handwritten digits, trained through ddp_abci.fit.

    pip install 'ddp_abci[examples]'                 # scikit-learn: the digits ship inside its wheel
    mpirun -n 2 python -m ddp_abci.examples.digits   # last line: held-out accuracy 0.9xx

It takes the trainer's flags (parse_command_line: --epochs, --bs, --ckpt-dir, --resume,
--stop-after, ...), so the job scripts run it as TRAIN_SCRIPT=ddp_abci/examples/digits.py
with checkpoints, the walltime's stop and chains of jobs (docs/abci.md, "your own model").

1,797 8x8 images in 10 classes; 1,437 train, 360 held out (a fixed, stratified split).
Items are (image, label) tuples, the loss is cross-entropy, and the held-out accuracy is
the exact mean over the 360 images of a per-image 0/1, gathered across ranks with
gather_for_metrics inside the Trainer's evaluation.
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ddp_abci import Evaluation, fit, parse_command_line


def load_digits_split(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise SystemExit("error: this example needs scikit-learn; install it with pip install 'ddp_abci[examples]'") \
            from None
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)  # pixels 0..16 -> 0..1
    y = torch.tensor(digits.target, dtype=torch.long)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=360, stratify=y, random_state=seed)
    return TensorDataset(x_tr, y_tr), TensorDataset(x_te, y_te)


def classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def correct(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return (model(images).argmax(dim=1) == labels).float()  # one 0/1 per image


def main(argv: list[str] | None = None) -> int:
    # This example's defaults; every one can be given on the command line (--help lists them).
    config, launch, _ = parse_command_line(argv, epochs=30, global_batch=64, lr=3e-3, betas=(0.9, 0.999),
                                           eval_every=30)
    train_set, test_set = load_digits_split()
    torch.manual_seed(0)
    # The default optimizer is Adam with config.lr and config.betas; pass optimizer=... for another.
    final: dict = {}
    status = fit(classifier(), train_set, cross_entropy, config,
                 evaluation=Evaluation(test_set, {"accuracy": correct}, on_eval=final.update), launch=launch)
    if final:  # on_eval runs on rank 0 only
        print(f"held-out accuracy {final['accuracy']:.3f}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
