"""prometheus_client's internals: ``MetricWrapperBase``, the base of its metric classes, which
``Remembered`` extends to look each labelled child up once."""

from __future__ import annotations

from typing import Any, TypeVar

from prometheus_client.metrics import MetricWrapperBase

from cascade.overrides import require

require("prometheus-client", ">=0.26,<0.27", __name__)

_M = TypeVar("_M", bound=MetricWrapperBase)


class Remembered(MetricWrapperBase):
    """A metric whose ``labels(...)`` children are looked up once per label set: the library
    checks the names, converts the values and takes a lock on every call, which the request
    path would pay a dozen times per request. Removing children forgets them here too. Placed
    before the library's class in the bases (``class Counter(Remembered, Counter)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._children: dict[tuple[Any, ...], Any] = {}

    def labels(self: _M, *labelvalues: object, **labelkwargs: object) -> _M:
        key = tuple(labelkwargs.items()) if labelkwargs else labelvalues  # names and values
        children = self._children  # type: ignore[attr-defined]  # _M is always a Remembered
        child = children.get(key)
        if child is None:
            child = children[key] = super().labels(*labelvalues, **labelkwargs)
        return child

    def remove(self, *labelvalues: Any) -> None:
        self._children.clear()
        super().remove(*labelvalues)

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._children.clear()
        super().remove_by_labels(labels)

    def clear(self) -> None:
        self._children.clear()
        super().clear()
