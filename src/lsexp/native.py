"""C++ kernels for what MindSpore's CPU lacks, as its aot Custom operators take them: a source file that
lsexp ships, built once per machine with the machine's C++ compiler ($CXX, else g++) and cached in
lsexp's cache folder (lsexp.config.paths.cache_dir), keyed by the source and the compiler.

MindSpore can compile an aot source itself, but into akg_kernel_meta/ under the working directory, which
would leave a folder in the user's; this builds into the cache, through a temporary file renamed into
place, so that concurrent jobs (a sweep, xdist) never load a half-written library.

Without a compiler, or a cache folder it can write, library() says why and the caller takes its portable
path (MindSpore ops)."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

from lsexp.config.paths import cache_dir

FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")

_said: set = set()
_built: Dict[Tuple[Path, Path], Tuple[Optional[Path], str]] = {}  # per process: (source, cache) -> answer


def _compiler() -> Optional[str]:
    return shutil.which(os.environ.get("CXX") or "g++")


def _key(source: bytes, compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    what = [version, " ".join(FLAGS), platform.machine()]
    return hashlib.sha256(source + "\n".join(what).encode()).hexdigest()[:16]


def _allowed(path: Path) -> bool:
    # MindSpore loads an aot library only from under $MS_CUSTOM_AOT_WHITE_LIST, when that is set
    allowed = os.environ.get("MS_CUSTOM_AOT_WHITE_LIST")
    if not allowed:
        return True
    return any(path.resolve().is_relative_to(Path(p).expanduser().resolve())
               for p in allowed.split(os.pathsep) if p)


def _build(source: Path) -> Tuple[Optional[Path], str]:
    compiler = _compiler()
    if compiler is None:
        return None, f"no C++ compiler ({os.environ.get('CXX') or 'g++'}) on PATH; set CXX to one"
    text = source.read_bytes()
    folder = cache_dir() / "kernels"
    path = folder / f"{source.stem}-{_key(text, compiler)}.so"
    if not _allowed(path):
        return None, f"{path} is outside MS_CUSTOM_AOT_WHITE_LIST; add {folder} to it"
    if path.exists():
        return path, ""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=folder)
        os.close(fd)
    except OSError as err:
        return None, f"cannot write {folder} ({err.strerror}); set LSEXP_CACHE_DIR to a folder you can write"
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", tmp, str(source)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return None, f"{compiler} could not build {source.name}: {last}"
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path, ""


def library(source: Path) -> Tuple[Optional[Path], str]:
    """(the shared library built from `source`, ""), from the cache or compiled now; (None, why) when it
    cannot be had on this machine."""
    key = (Path(source), cache_dir())
    if key not in _built:
        _built[key] = _build(key[0])
    return _built[key]


def built(source: Path, fallback: str) -> Optional[str]:
    """library(source)'s path as a string, or None after saying once per process, as a warning, that
    `fallback` (what runs instead) and why."""
    path, why = library(source)
    if path is None and why not in _said:
        _said.add(why)
        logging.getLogger(__name__).warning("lsexp: %s: %s", fallback, why)
    return None if path is None else str(path)


def forget() -> None:
    """Ask again at the next library() call, as a new process would."""
    _built.clear()
