"""Every exit status a run ends with, and the decision at its end: one home for both. The job
scripts and the chain's rules (jobs.py) read the same numbers; standard library only, and
nothing newer than Python 3.9, for a login node's Python.

    0   done: the run trained what it was asked, or found nothing left to train
    2   bad input: a refused setting (UsageError, before training: nothing written), or one rank's
        loss_fn or batch failing mid-run (RankFailed: the last checkpoint is kept); fix what it names
    65  diverged (Diverged): the loss or gradients stopped being finite; last good checkpoint kept
    69  a rank stopped answering within --timeout (parallel/watchdog.py): resubmit, check the named host
    74  a checkpoint could not be written (SaveFailed): free space or fix the folder, then --resume
    75  stopped by SIGTERM/SIGUSR1/SIGINT or --stop-after, checkpoint saved: resubmit with --resume
"""
from __future__ import annotations

from typing import Any

EXIT_DONE = 0
EXIT_USAGE = 2
EXIT_DIVERGED = 65     # sysexits' EX_DATAERR: the run's numbers, not the machine, went wrong
EXIT_RANK_LOST = 69    # EX_UNAVAILABLE: a rank stopped answering
EXIT_SAVE_FAILED = 74  # EX_IOERR
EXIT_STOPPED = 75      # EX_TEMPFAIL: stopped early with the checkpoint saved


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
