"""Config -> plain dict / YAML text / ``config.yaml`` beside a run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import attrs
import yaml

from verl.config.errors import ConfigError
from verl.config.schema import RootConfig
from verl.config.yaml_io import dump_yaml

CONFIG_FILENAME = "config.yaml"


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (sub)tree: tuples become lists, key order = field order."""
    return _plain(cfg)


def _plain(value: Any) -> Any:
    if attrs.has(type(value)):
        return {f.name: _plain(getattr(value, f.name)) for f in attrs.fields(type(value))}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_yaml(cfg: Any) -> str:
    """YAML text of a config tree; ``load_config`` of it gives back an equal config.

    Raises:
        ConfigError: a free-form dict (e.g. ``override_config``) holds a value YAML cannot write.
    """
    try:
        return dump_yaml(to_dict(cfg))
    except yaml.YAMLError as exc:
        raise ConfigError(f"config cannot be written as YAML: {exc}", key="<root>") from None


def save_resolved_config(cfg: RootConfig, run_dir: str | os.PathLike[str], *, header: str | None = None) -> Path:
    """Write ``cfg`` as ``<run_dir>/config.yaml`` (atomically: temp file + rename); return its path.

    ``header`` (e.g. the base config line) is written first as ``# `` comment lines: loading the file ignores it.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / CONFIG_FILENAME
    comment = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    text = comment + to_yaml(cfg)
    fd, tmp = tempfile.mkstemp(prefix=".config.", suffix=".yaml.tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
