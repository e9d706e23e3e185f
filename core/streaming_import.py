"""mosaicml-streaming, imported through one function that turns a missing or broken install into one line.

Its 0.13 metadata caps transformers<5 and numpy<2.2 (type-checker and release-age caps, not runtime needs), so
the project installs it with `pip install --no-deps` and declares what it imports itself (README, "Installing").
"""
from __future__ import annotations

import functools
import logging
from types import ModuleType

from core.errors import SetupError

REQUIREMENT = "mosaicml-streaming==0.13.0"
INSTALL = f'pip install --no-deps "{REQUIREMENT}"'
# The loader reaches into streaming's shared-memory registration (data_pipeline/loader.py), written against 0.13.
TESTED = "0.13."


@functools.cache
def require_streaming() -> ModuleType:
    """The `streaming` package, or a SetupError saying how to install it."""
    try:
        import streaming
    except ImportError as exc:
        raise SetupError(f"mosaicml-streaming cannot be imported ({exc}); install it without its stale version caps: "
                         f"{INSTALL} (README, 'Installing')") from exc
    version = getattr(streaming, "__version__", "?")
    if not version.startswith(TESTED):
        logging.getLogger("core.streaming").warning(
            "mosaicml-streaming %s is installed; the loader is tested with %s* (%s)", version, TESTED, REQUIREMENT)
    return streaming
