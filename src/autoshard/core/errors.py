"""Errors the study reports to its users as one clear line."""


class ConfigError(ValueError):
    """A parameter or input file is invalid; the message names the field and the value."""


def invalid(field: str, value: object, why: str) -> ConfigError:
    """Build the error for `field` holding `value`, e.g. ``pool.dims: 18 (not a multiple of 4)``."""
    return ConfigError(f"{field}: {value!r} ({why})")
