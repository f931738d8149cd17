"""The Hadoop client configuration: where it lives and what its XML files say.

The directory is ``$HADOOP_CONF_DIR``, else ``hadoop/`` of the conf directories
(``sparktf.paths``; in a checkout, what ``scripts/hdfs.sh start`` writes), the first that
holds an ``hdfs-site.xml``.
"""

from __future__ import annotations

import logging
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from sparktf import paths

__all__ = ["conf_dir", "site_properties", "xml_properties"]

log = logging.getLogger(__name__)


def conf_dir() -> Path | None:
    """The Hadoop client configuration directory (see the module docstring), None when
    there is none."""
    try:
        local = [d / "hadoop" for d in paths.conf_dirs()]
    except FileNotFoundError:  # sparktf without its conf data (a --py-files zip on executors)
        local = []
    for candidate in (os.environ.get("HADOOP_CONF_DIR"), *local):
        if candidate and (Path(candidate) / "hdfs-site.xml").is_file():
            return Path(candidate)
    return None


def xml_properties(path: Path) -> dict[str, str]:
    """The ``name: value`` pairs of a Hadoop XML configuration file (empty, with a warning,
    when it cannot be read)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        log.warning("cannot read Hadoop configuration %s: %s", path, exc)
        return {}
    props = {}
    for prop in root.iter("property"):
        name, value = prop.findtext("name"), prop.findtext("value")
        if name and value is not None:
            props[name.strip()] = value.strip()
    return props


def site_properties(name: str) -> dict[str, str]:
    """The properties of ``name`` (``core-site.xml``, ``hdfs-site.xml``) in the configuration
    directory; empty when there is no such file."""
    conf = conf_dir()
    if conf is None or not (conf / name).is_file():
        return {}
    return xml_properties(conf / name)
