"""The error of a config that lsexp refuses: every problem found, one line each."""

from __future__ import annotations

from typing import List


class ConfigError(Exception):
    """Every problem found in one config; str() is one line per problem."""

    def __init__(self, problems: List[str]):
        self.problems = problems
        super().__init__("\n".join(f"lsexp: config error: {p}" for p in problems))
