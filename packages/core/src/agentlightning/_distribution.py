"""Which distribution this ``agentlightning`` package came from, and whether a foreign one shares its name.

The import name ``agentlightning`` and the ``agl`` script are also used by an unrelated distribution on the
package index, named ``agentlightning``. Installed side by side, the two overwrite each other's files; the
check below finds it at import and when ``agl`` starts, and says what to uninstall.
"""

from __future__ import annotations

import importlib.metadata
import warnings

__all__ = ["DISTRIBUTION", "FOREIGN_DISTRIBUTION", "ForeignDistributionWarning", "foreign_message", "installed_version"]

DISTRIBUTION = "agentlightning-core"
"""The distribution that ships this package."""

FOREIGN_DISTRIBUTION = "agentlightning"
"""The unrelated distribution on the package index with the same import name and script name."""


class ForeignDistributionWarning(RuntimeWarning):
    """An unrelated ``agentlightning`` distribution is installed in this environment."""


def installed_version(default: str) -> str:
    """The installed version of agentlightning-core (``default`` when running from an uninstalled tree)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return default


def foreign_message() -> str | None:
    """What to do about a foreign ``agentlightning`` distribution, or ``None`` when there is none."""
    try:
        version = importlib.metadata.version(FOREIGN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return (
        f"The unrelated distribution '{FOREIGN_DISTRIBUTION}' {version} is installed in this environment; it uses "
        f"the same import name 'agentlightning' and script 'agl' as {DISTRIBUTION}, so their files overwrite each "
        f"other. Uninstall it and reinstall this one: pip uninstall {FOREIGN_DISTRIBUTION} && "
        f"pip install --force-reinstall --no-deps {DISTRIBUTION}"
    )


def warn_if_foreign() -> None:
    """Warn (`ForeignDistributionWarning`) when a foreign ``agentlightning`` distribution is installed."""
    message = foreign_message()
    if message is not None:
        warnings.warn(message, ForeignDistributionWarning, stacklevel=3)
