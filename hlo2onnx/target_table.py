"""hlo2onnx.TARGETS's type: the targets by name, printed one line each."""
from __future__ import annotations


class TargetTable(dict):
    """A dict of hlo2onnx.Target by name whose printout is a table: a name, the runtime and device, and the
    description per line (each Target's op and dtype tables would run to ~80 KB in all)."""

    def __repr__(self) -> str:
        width = max(map(len, self), default=0)
        return "\n".join(f"{name:<{width}}  {target.runtime} on {target.device}: {target.description}"
                         for name, target in self.items())

    __str__ = __repr__
