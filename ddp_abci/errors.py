"""The run's one-line failures: each is printed as one `error: ...` line and ends the run
with its own exit status (exits.py lists them all; the job scripts read them to decide whether
to resubmit)."""

from .exits import EXIT_DIVERGED, EXIT_SAVE_FAILED, EXIT_USAGE


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


class RankFailed(RunError):
    """One rank's own failure mid-run (its loss_fn raised, its batch could not be collated):
    that rank says so, with its rank and host, and ends the job at once (exit 2, as bad input),
    without waiting for the others to time out in the next collective."""

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
