"""What a job says to its tracking worker: one JSON object a line, in this order: Open once, Steps once
an epoch, Finish once. Both ends use these classes; a line that is none of them fails the worker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union


@dataclass
class Open:
    """Open the job's MLflow run."""

    uri: Optional[str]
    start_dir: str
    out_dir: str
    experiment_name: str
    run_name: str
    tags: Dict[str, str]
    params: Dict[str, str]


@dataclass
class Steps:
    """The history rows and evaluations since the last Steps."""

    rows: List[dict] = field(default_factory=list)
    epoch_eval: List[dict] = field(default_factory=list)


@dataclass
class Finish:
    """End the run as status (FINISHED, FAILED, KILLED), with the error that failed it."""

    status: str
    error: Optional[str] = None


Message = Union[Open, Steps, Finish]
_OPS = {"open": Open, "steps": Steps, "finish": Finish}
_NAMES = {cls: op for op, cls in _OPS.items()}


def encode(message: Message) -> str:
    # vars, not dataclasses.asdict, which would deep-copy every row of the history
    return json.dumps({"op": _NAMES[type(message)], **vars(message)}) + "\n"


def decode(line: str) -> Message:
    fields = json.loads(line)
    return _OPS[fields.pop("op")](**fields)
