"""The run's one-line failures: each is printed as one `error: ...` line and ends the run
with its own exit status (the job scripts read it to decide whether to resubmit).

    0   done
    2   bad input: a refused setting (UsageError, before training: nothing written), or one rank's
        loss_fn or batch failing mid-run (RankFailed: the last checkpoint is kept); fix what it names
    65  diverged (Diverged): the loss or gradients stopped being finite; last good checkpoint kept
    69  a rank stopped answering within --timeout (parallel.watchdog): resubmit with --resume, check the named host
    74  a checkpoint could not be written (SaveFailed): free space or fix the folder, then --resume
    75  stopped by SIGTERM/SIGUSR1/SIGINT or --stop-after, checkpoint saved (parallel.signals.EXIT_STOPPED): resubmit
"""

EXIT_USAGE = 2
EXIT_DIVERGED = 65   # sysexits' EX_DATAERR: the run's numbers, not the machine, went wrong
EXIT_SAVE_FAILED = 74  # sysexits' EX_IOERR


class RunError(Exception):
    """A failure the message explains in one line, naming the fix; no traceback."""

    exit_status = EXIT_USAGE
    # Most failures are seen alike by every rank, so only rank 0 prints them; a rank's own
    # failure (it could not reach rank 0) is printed by that rank.
    same_on_every_rank = True


class UsageError(RunError):
    """A setting or input that cannot work; the message names the fix.

    Raised before any training starts, so that nothing is written or overwritten.
    """


class RankFailed(UsageError):
    """One rank's own failure (its loss_fn raised, its batch could not be collated): that
    rank says so, with its rank and host, and ends the job at once (exit 2), without
    waiting for the others to time out in the next collective."""

    same_on_every_rank = False


class Diverged(RunError):
    """Every rank agreed that the loss or the gradient norm is no longer finite."""

    exit_status = EXIT_DIVERGED


class SaveFailed(RunError):
    """Rank 0 could not write a checkpoint; every rank stops at the same step."""

    exit_status = EXIT_SAVE_FAILED


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most `limit` characters: its message with the
    whitespace folded (tracebacks of C++ errors span many lines), else its type's name."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
