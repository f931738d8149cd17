"""Where sparktf finds its configuration and keeps its run state: the one module that knows.

**Configuration** (Spark profiles ``spark/<profile>.conf``, job defaults ``jobs/<job>.json``,
recipes ``jobs/recipes/*.json``, ``log4j2.properties``, the GPU discovery script) is looked up
file by file, first found wins:

1. the user's conf directory: ``--conf-dir DIR`` of the ``sparktf`` command, or
   ``$SPARKTF_CONF_DIR``;
2. the defaults shipped in the package (``sparktf/conf`` of the installed wheel; ``conf/`` of
   a source checkout, which the wheel is built from).

A user's directory holds only what it changes: ``$SPARKTF_CONF_DIR/spark/yarn.conf`` replaces
the shipped YARN profile and nothing else.

**Run state** (the synthetic demo datasets, the local standalone cluster's logs and pid files,
packed environments, scratch of ``sparktf submit``) lives under one directory, ``home()``:
``$SPARKTF_HOME``, else ``.local/`` of a source checkout, else
``$XDG_DATA_HOME/sparktf`` (``~/.local/share/sparktf``).

This is the bottom layer: it imports nothing of sparktf.
"""

from __future__ import annotations

import os
import stat
from importlib import resources
from pathlib import Path

__all__ = [
    "CONF_DIR_ENV",
    "HOME_ENV",
    "conf_dirs",
    "conf_file",
    "conf_names",
    "default_conf_dir",
    "home",
    "installed_version",
    "private_dir_problem",
    "resolve_config",
    "source_checkout",
    "state_dir",
    "user_conf_dir",
]

CONF_DIR_ENV = "SPARKTF_CONF_DIR"
HOME_ENV = "SPARKTF_HOME"

_PACKAGE = Path(str(resources.files("sparktf")))


def installed_version() -> str | None:
    """The installed sparktf distribution's version (pyproject.toml is its one source), or
    None when sparktf runs from a checkout that is not installed."""
    from importlib import metadata

    try:
        return metadata.version("sparktf")
    except metadata.PackageNotFoundError:
        return None


def source_checkout() -> Path | None:
    """The source checkout sparktf runs from (its ``pyproject.toml`` and ``conf/`` beside the
    package), or None for an installed wheel."""
    root = _PACKAGE.resolve().parent
    if (root / "pyproject.toml").is_file() and (root / "conf" / "spark").is_dir():
        return root
    return None


def default_conf_dir() -> Path:
    """The configuration shipped with sparktf: the package's ``conf`` data, or the checkout's
    ``conf/`` it is built from."""
    packaged = _PACKAGE / "conf"
    if packaged.is_dir():
        return packaged
    root = source_checkout()
    if root is None:
        raise FileNotFoundError(f"sparktf's configuration is missing from {packaged}")
    return root / "conf"


def user_conf_dir() -> Path | None:
    """``$SPARKTF_CONF_DIR`` (what ``--conf-dir`` sets), or None."""
    value = os.environ.get(CONF_DIR_ENV)
    return Path(value).expanduser() if value else None


def conf_dirs() -> list[Path]:
    """The configuration directories in lookup order (first found wins)."""
    user = user_conf_dir()
    return ([user] if user else []) + [default_conf_dir()]


def conf_file(relative: str | os.PathLike) -> Path:
    """The first ``conf_dirs()/relative`` that exists; else the shipped default's path (which
    does not exist: callers say what is missing)."""
    for directory in conf_dirs():
        candidate = directory / relative
        if candidate.is_file():
            return candidate
    return default_conf_dir() / relative


def conf_names(subdir: str, suffix: str) -> list[str]:
    """The names (without ``suffix``) of the files in ``subdir`` of every conf directory."""
    names = set()
    for directory in conf_dirs():
        if (directory / subdir).is_dir():
            names.update(p.name[: -len(suffix)] for p in (directory / subdir).glob(f"*{suffix}"))
    return sorted(names)


def resolve_config(path: str | os.PathLike) -> Path:
    """A ``--config`` path: as given when it exists; else looked up in the conf directories,
    with a leading ``conf/`` dropped (``conf/jobs/recipes/resnet20_cifar10.json`` works from
    any directory, as the README writes it)."""
    given = Path(path).expanduser()
    if given.is_file() or given.is_absolute():
        return given
    parts = given.parts
    relative = Path(*parts[1:]) if parts and parts[0] == "conf" and len(parts) > 1 else given
    found = conf_file(relative)
    return found if found.is_file() else given


def home() -> Path:
    """The directory of sparktf's run state (see the module docstring); not created here."""
    value = os.environ.get(HOME_ENV)
    if value:
        return Path(value).expanduser().absolute()
    root = source_checkout()
    if root is not None:
        return root / ".local"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "sparktf"


def state_dir(name: str) -> Path:
    """``home()/name``, created private (0700) with its parents."""
    path = home() / name
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def private_dir_problem(path: str | os.PathLike) -> str | None:
    """Creates ``path`` 0700 if missing (its parents as usual); says what is wrong with it as a
    private directory ("is a symbolic link", "is owned by uid ...", "is writable by other
    users ...") or returns None when it is a real directory of this user no one else can
    write. For directories whose contents sparktf runs or loads (model caches, packed
    environments): the caller refuses a directory with a problem."""
    path = os.path.abspath(os.path.expanduser(path))  # no trailing "/": lstat sees a link
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.filemode(st.st_mode)})"
    return None
