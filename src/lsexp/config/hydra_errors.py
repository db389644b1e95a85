"""A config Hydra could not compose, as lsexp's one line: the key, the value typed, and the fix.

Hydra reports these itself in four to twenty lines (the override, OmegaConf's key/type dump, the search
path, the HYDRA_FULL_ERROR hint) and exits 1. `reported_in_one_line` lets them reach lsexp instead:
Hydra re-raises when HYDRA_FULL_ERROR=1, so it is set while Hydra composes and taken back as the job
starts, and a user who set it gets Hydra's own full report, as Hydra documents.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from contextlib import contextmanager
from functools import partial
from typing import Iterator, Optional, Sequence

from lsexp.config.errors import ConfigError, Refused
from lsexp.config.overrides import overrides_dict

_FULL_ERROR = "HYDRA_FULL_ERROR"
_SET_HERE = "_LSEXP_SET_HYDRA_FULL_ERROR"


@contextmanager
def reported_in_one_line(argv: Sequence[str]) -> Iterator[None]:
    """Around a Hydra main: a composition error becomes a ConfigError of one line, lsexp's own refusals
    pass, and any other error is reported as Hydra reports it."""
    if os.environ.get(_FULL_ERROR) == "1":
        yield
        return
    os.environ[_FULL_ERROR] = "1"
    os.environ[_SET_HERE] = "1"
    try:
        yield
    except Refused:  # lsexp's own, for the command line to report
        raise
    except Exception as ex:  # noqa: BLE001 - sorted below; nothing is swallowed
        job_begins()
        line = one_line(ex, argv)
        if line is None:
            from hydra._internal.utils import run_and_report

            run_and_report(partial(_raise, ex))  # Hydra's own stripped traceback, and exit 1
            raise
        raise ConfigError([line]) from None
    finally:
        job_begins()


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def every_job_composes(config) -> Optional[str]:
    """The line for a job of a basic sweep that Hydra cannot compose, or None. Hydra's sweeper composes
    every job too, but only after the sweep's callbacks have opened its parent run and folder; asked here
    first, a bad override leaves nothing behind. Each swept value is composed once, beside the other keys'
    first values (a composition costs ~0.2 s, so not the whole product: Hydra's own check still follows).
    Search sweepers compose per trial."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    basic = OmegaConf.select(config, "hydra.sweeper._target_") == BASIC_SWEEPER
    if not basic or not GlobalHydra.instance().is_initialized():
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    loader = GlobalHydra.instance().config_loader()
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    job: Sequence[str] = ()
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)
        for job in jobs:
            if sum(a != b for a, b in zip(job, jobs[0])) <= 1:
                loader.load_sweep_config(master_config=config, sweep_overrides=list(job))
    except Exception as ex:  # noqa: BLE001 - one that is not a composition error goes on to Hydra's report
        line = one_line(ex, arguments)
        if line is None:
            raise
        return f"{line} (the job {' '.join(job)})" if job else line
    return None


def job_begins() -> None:
    """The config is composed: from here on, errors (and the job's children) see the user's own
    HYDRA_FULL_ERROR."""
    if os.environ.pop(_SET_HERE, None) is not None:
        os.environ.pop(_FULL_ERROR, None)


def _raise(ex: BaseException) -> None:
    raise ex


def one_line(ex: BaseException, argv: Sequence[str]) -> Optional[str]:
    """The line for a composition error, or None for an error that is not one; argv are the overrides
    as typed, for the value."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    if isinstance(ex, MissingConfigException):
        return _missing_option(ex)
    if isinstance(ex, OverrideParseException):
        return f"{ex.override}: Hydra cannot parse it ({_first(ex.message)}); see Hydra's override grammar"
    if not isinstance(ex, ConfigCompositionException):
        return None
    text = str(ex)
    if text.startswith("Ambiguous value for argument"):
        typed = text.split("'", 2)[1]
        return (f"{typed}: a comma sweeps only in a multirun; add -m, or write [a,b] for a list "
                f"or quote the value for a string")
    cause = ex.__cause__
    full_key = getattr(cause, "full_key", None)
    if not full_key:
        causes = f"; {_first(str(cause))}" if cause is not None else ""
        return f"{_first(text)}{causes}"
    typed = f"{full_key}={overrides_dict(argv).get(full_key, '?')}"
    key, schema = getattr(cause, "key", None), getattr(cause, "object_type", None)
    if f"Key '{key}' not in" in str(cause) and dataclasses.is_dataclass(schema):
        return f"{typed}: {_unknown_key(str(key), schema, full_key)}"
    return f"{typed}: {_first(getattr(cause, 'msg', str(cause)))}; give {full_key} a value its schema takes"


def _missing_option(ex) -> str:
    missing = ex.missing_cfg_file or ""
    group, _, option = missing.rpartition("/")
    if not group:
        return _first(str(ex))
    # base_* are the schemas lsexp registers behind each option, not options to choose
    options = [o for o in (ex.options or []) if not o.startswith("base_")]
    close = difflib.get_close_matches(option, options, n=1)
    hint = f"did you mean {group}={close[0]}? " if close else ""
    return f"{group}={option}: no such option; {hint}the options are {', '.join(options)}"


def _unknown_key(key: str, schema, full_key: str) -> str:
    keys = [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]
    elsewhere = _has_it(key, full_key)  # then the key is no typo of one of these
    close = [] if elsewhere else difflib.get_close_matches(key, keys, n=1)
    parent = full_key.rpartition(".")[0]
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
    return f"{schema.__name__} has no key '{key}'; {hint}its keys are {', '.join(keys)}{elsewhere}"


def _has_it(key: str, full_key: str) -> str:
    """The options of the model or data set group whose schema has `key` (their options are named as
    their families are), for a key another family has: `model.scaling` on a model without it."""
    group = full_key.partition(".")[0]
    if group not in ("model", "dataset") or "." in full_key.partition(".")[2]:
        return ""
    from lsexp.config import families

    have = sorted(name for name, module in families.schemas(group).items()
                  if key in {f.name for f in dataclasses.fields(module.SCHEMA)})
    if not have:
        return ""
    return f"; {' and '.join(f'{group}={name}' for name in have)} {'has' if len(have) == 1 else 'have'} it"


def _first(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)
