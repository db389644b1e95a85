"""What a marked step's tests need (PostgreSQL, a launcher, a browser): skipped, saying why, when it is
missing; failed instead where CI sets the step's LSEXP_REQUIRE_* variable to 1."""

import os

import pytest


def unavailable(variable: str, reason: str):
    if os.environ.get(variable) == "1":
        pytest.fail(f"{variable}=1 but {reason}")
    pytest.skip(reason)
