"""The one exception type for bad input: the command line prints its message as one line."""


class UsageError(Exception):
    """A setting or input that cannot work; the message names the fix.

    Raised before any training starts, so that nothing is written or overwritten.
    """

    # Most bad input is seen alike by every rank, so only rank 0 prints it; a rank's own
    # failure (it could not reach rank 0) is printed by that rank.
    same_on_every_rank = True
