"""What lsexp raises when it will not go on. Only the command-line layer (lsexp.app, lsexp.cli and the
commands' mains) turns these into lines on stderr and exit codes; everywhere else they are raised."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List


class Refused(Exception):
    """lsexp will not go on: str() is what the user reads (empty when it has been said already) and
    exit_code what the command exits with."""

    def __init__(self, message: str = "", exit_code: int = 2):
        self.exit_code = exit_code
        super().__init__(message)


class ConfigError(Refused):
    """Every problem found in one config; str() is one line per problem."""

    def __init__(self, problems: List[str]):
        self.problems = problems
        super().__init__("\n".join(f"lsexp: config error: {p}" for p in problems))


class Halt(BaseException):
    """A refusal raised inside Hydra's own machinery (its callbacks warn of an Exception and go on): like
    SystemExit it passes them, and lsexp.app reports the refusal it carries."""

    def __init__(self, refused: Refused):
        self.refused = refused
        super().__init__(str(refused))


@contextmanager
def halting() -> Iterator[None]:
    """Around what Hydra calls (a callback, a launcher): a refusal stops the command."""
    try:
        yield
    except Refused as err:
        raise Halt(err) from None
