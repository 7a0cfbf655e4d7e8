"""Environment variables set for a block and restored after it (`environ`).

Starting Ray reads its settings from the environment (the local cluster's working directory and
import path, its log deduplication), so the sweep's Ray executor and the Ray table engine set
them around ``ray.init`` and give the process its own values back afterwards, whether the start
succeeded or raised.

Example:
    >>> import os
    >>> with environ(SHORTCUTLAB_EXAMPLE="1"):
    ...     os.environ["SHORTCUTLAB_EXAMPLE"]
    '1'
    >>> "SHORTCUTLAB_EXAMPLE" in os.environ
    False
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def environ(**values: str | None) -> Iterator[None]:
    """Set the environment variables `values` for the block (None: leave that one as it is);
    afterwards every one of them, None ones included, has its old value again, or is unset if it
    was unset."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is not None:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
