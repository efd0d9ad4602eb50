"""Foreign errors become ours at the client's seam: Redis' and the broker's are
:class:`~worker.errors.Unavailable`; a generator's are raised by its ``next()``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from kombu.exceptions import OperationalError

from worker.errors import HarnessError, Unavailable
from worker.store.errors import REDIS_ERRORS

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@contextmanager
def translated() -> Iterator[None]:
    """Foreign errors become ours at the seam."""
    try:
        yield
    except HarnessError:
        raise
    except REDIS_ERRORS as exc:
        raise Unavailable(f"cannot reach Redis: {exc}") from exc
    except OperationalError as exc:
        raise Unavailable(f"cannot reach the broker: {exc}") from exc


def translate(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with translated():
            return fn(*args, **kwargs)

    return wrapper


def translate_iter(fn: Callable[P, Iterator[T]]) -> Callable[P, Iterator[T]]:
    """The same for a generator: its errors are raised by ``next()``, not by the call."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        with translated():
            yield from fn(*args, **kwargs)

    return wrapper
