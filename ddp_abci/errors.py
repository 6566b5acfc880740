"""The one exception type for bad input: the command line prints its message as one line."""


class UsageError(Exception):
    """A setting or input that cannot work; the message names the fix.

    Raised before any training starts, so that nothing is written or overwritten.
    """
