"""Every exit status a run or a job ends with, what each means, and the decision at a run's end:
one home for all three. The job scripts source the same numbers (scripts/lib/exits.sh, checked
against these by tests/test_exits.py); the chain's rules, fit()'s docstring, submit.sh's usage
and the docs' tables show MEANINGS. Standard library only, and nothing newer than Python 3.9,
for a login node's Python.
"""
from __future__ import annotations

from typing import Any, NamedTuple

EXIT_DONE = 0
EXIT_FAILED = 1        # Python's own status for an uncaught exception
EXIT_USAGE = 2         # argparse's, for a bad command line
EXIT_DIVERGED = 65     # sysexits' EX_DATAERR: the run's numbers, not the machine, went wrong
EXIT_RANK_LOST = 69    # EX_UNAVAILABLE: a rank stopped answering
EXIT_SAVE_FAILED = 74  # EX_IOERR
EXIT_STOPPED = 75      # EX_TEMPFAIL: stopped early with the checkpoint saved


class Meaning(NamedTuple):
    name: str        # the constant's name, as exits.sh has it too
    meaning: str     # what happened
    to_do: str       # what the user does next
    for_a_job: str   # what a job's log says after it, for the chain's next step


MEANINGS: dict[int, Meaning] = {
    EXIT_DONE: Meaning("EXIT_DONE", "done: the run trained what it was asked (also when a stop signal arrived at "
                                    "its very last step), or found nothing left to train", "nothing", "done"),
    EXIT_FAILED: Meaning(
        "EXIT_FAILED", "an unexpected failure (CUDA out of memory, an NCCL error, a bug in the user's code outside "
                       "loss_fn): Python's traceback; the last checkpoint intact",
        "once may be passing (resubmit with --resume); fix the cause if it repeats",
        "failed unexpectedly (the traceback above: CUDA out of memory, an NCCL error, a bug); the last checkpoint is "
        "intact; resubmit once for a passing fault, fix the cause if it repeats"),
    EXIT_USAGE: Meaning(
        "EXIT_USAGE", "bad input, refused before any training, nothing written; or one rank's own failure mid-run "
                      "(its loss_fn raised, its batch would not collate), said by that rank, which ends the job at "
                      "once", "fix what the error: line names",
        "refused before training (bad setting, named above); fix it, then resubmit"),
    EXIT_DIVERGED: Meaning(
        "EXIT_DIVERGED", "diverged: the loss or gradient norm stopped being finite, or fp16 skipped "
                         "--max-skipped-steps steps in a row; the last good checkpoint kept",
        "lower --lr or add --clip-norm, then --resume",
        "diverged; the last good checkpoint is kept; do not resubmit as is: lower --lr or add --clip-norm"),
    EXIT_RANK_LOST: Meaning(
        "EXIT_RANK_LOST", "a rank stopped answering: a collective did not complete within --timeout; the line names "
                          "the rank, its host, its step and what it was doing",
        "resubmit with --resume; look at the host",
        "a rank stopped answering (named above, with its host); the last checkpoint is intact: resubmit with the same "
        "CKPT_DIR, and check that host"),
    EXIT_SAVE_FAILED: Meaning(
        "EXIT_SAVE_FAILED", "a checkpoint could not be written (disk full, quota, folder gone or read-only); the "
                            "previous one intact",
        "free space or fix the folder, then --resume",
        "a checkpoint could not be written (disk full, quota, folder); free space, then resubmit"),
    EXIT_STOPPED: Meaning(
        "EXIT_STOPPED", "stopped by SIGTERM, SIGUSR1, Ctrl-C or the deadline (--stop-after, --stop-at), checkpoint "
                        "saved, work left", "resubmit with --resume",
        "stopped early with a checkpoint; resubmit with the same CKPT_DIR to continue (Open MPI's 'exited with "
        "non-zero status' block above is this exit 75: expected)"),
}


def table() -> str:
    """MEANINGS as the Markdown table README.md and docs/abci.md show (tests/test_exits.py checks them)."""
    rows = [f"| {status} | {m.meaning} | {m.to_do} |" for status, m in MEANINGS.items()]
    return "\n".join(["| status | meaning | what to do |", "| --- | --- | --- |", *rows])


def end_of_run(stopped_by: int, finished: bool, position: Any, steps_before: int, last_loss: float,
               ckpt_file: Any) -> tuple[int, str]:
    """The exit status and the run's last line, once every rank has left the loop.

    Args:
        stopped_by: the agreed stop signal's number (parallel/signals.py), or 0.
        finished: the run reached --epochs or --max-steps.
        position: where it stands (checkpointing/resume.Position: epoch, batch_in_epoch, step).
        steps_before: the step it started this process at; last_loss: the last epoch's mean loss.
        ckpt_file: the checkpoint it resumes from next, or None without --ckpt-dir.
    Returns: (EXIT_STOPPED, the stop line) when a stop left work to do; else (EXIT_DONE, the
        `done:` line, or `nothing to train` when no step was taken). A stop agreed on the very
        last step completed the run: 0.
    """
    from .parallel.signals import signal_name  # noqa: PLC0415  (signals.py imports this module)

    if stopped_by and not finished:
        return EXIT_STOPPED, (f"stopped on {signal_name(stopped_by)} at epoch {position.epoch + 1} batch "
                              f"{position.batch_in_epoch} (step {position.step}); checkpoint "
                              f"{ckpt_file or 'off (no --ckpt-dir)'}; resume with --resume; exit {EXIT_STOPPED}")
    if position.step == steps_before:
        return EXIT_DONE, f"nothing to train: already at epoch {position.epoch}, step {position.step}"
    late = f" ({signal_name(stopped_by)} arrived at the last step: the run is complete)" if stopped_by else ""
    return EXIT_DONE, f"done: {position.step} steps, last epoch loss {last_loss:.4f}{late}"
