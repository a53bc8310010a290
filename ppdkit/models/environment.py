"""Environment variables set for the length of a `with` block and put back as they were after it (unset where they
were unset): the PATH a native build runs with, the state API a local Ray is pinned to, the rank variables and gloo
interface of a training rank run in this process."""

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
