"""Model and policy files: a format tag plus tensors and plain values, loaded with
`weights_only=True` so that opening a file never runs code from it."""

from pathlib import Path

import torch

from autoshard.core.atomic import atomic_file
from autoshard.core.errors import ConfigError


def save_tagged(path: str | Path, fmt: str, payload: dict) -> None:
    """Write `payload` with its format tag, all at once."""
    with atomic_file(path) as tmp:
        torch.save({"format": fmt, **payload}, tmp)


def load_tagged(path: str | Path, fmt: str, what: str, stage: str) -> dict:
    """The payload of a file written by `save_tagged` with format `fmt`; a missing file names
    the `dvc repro` target that makes it, anything else that is not one of ours says so."""
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found (run `dvc repro {stage}`)") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same clear error
        raise ConfigError(f"{path}: not a {what} file ({exc.__class__.__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        raise ConfigError(f"{path}: not an autoshard {what} ({fmt})")
    return payload
