"""The exception types for bad input: the CLI prints the message on one line, exit code 2."""


class CollapsecheckError(Exception):
    """A problem with the user's input (a file, a line, an option), not a bug in collapsecheck.

    The message names what is at fault and, where there is one, what to do about it. It is
    kept to one line, whatever text from the input it quotes.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


class DirectoryBusy(CollapsecheckError):
    """Another process holds an output directory (a second watcher on one results cache)."""
