"""What the ranks agree every few steps (parallel/agreement.py): the deadline's line."""
import time

import pytest
import torch

from ddp_abci.parallel.signals import StopRequest


@pytest.mark.parametrize("stop_at, said", [(-30, "--stop-at is past (-30s from now): the run stops at its first check"),
                                           (3600, "--stop-at stops, saves and exits 75 with at least")])
def test_the_starts_deadline_line_says_when_the_deadline_is_already_past(stop_at, said):
    from ddp_abci.parallel.agreement import Agreement
    from ddp_abci.parallel.gradients import gradient_path

    agreement = Agreement(StopRequest(), 8, gradient_path("gloo"), torch.device("cpu"), 0, 1, guard_finite=True,
                          max_fp16_skips=0, stop_at=time.time() + stop_at)
    assert said in agreement.deadline_line()
