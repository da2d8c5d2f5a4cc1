"""Every op of Kiln's catalogue as a function, by its name (``kiln.ops.Conv``) and in
snake case (``kiln.ops.conv``)::

    y = kiln.ops.relu(kiln.ops.conv(x, w, b, strides=[1, 1], pads=[1, 1, 1, 1]))

Inputs are values of one graph (``None`` for an absent optional input); keyword
arguments are the op's attributes, and ``name=`` names the node. The functions and
their docstrings are made at import from the library's own catalogue, so they cannot
drift from it.
"""

import re as _re

from . import _kiln


def _snake(name):
    s = _re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return _re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s).lower()


def _make(op_name, signature, doc):
    def op(*inputs, name="", **attrs):
        graph = next((v.graph for v in inputs if v is not None), None)
        if graph is None:
            raise _kiln.InvalidArgument(
                f"{op_name}: no input value to take the graph from (use Graph.op)"
            )
        return graph.op(op_name, list(inputs), name=name, **attrs)

    op.__name__ = op.__qualname__ = op_name
    op.__doc__ = f"{signature}\n\n{doc}"
    return op


__all__ = []
for _name, _signature, _doc in _kiln.catalogue():
    globals()[_name] = _make(_name, _signature, _doc)
    __all__.append(_name)
    _alias = _snake(_name)
    if _alias != _name and _alias not in globals():
        globals()[_alias] = globals()[_name]
        __all__.append(_alias)
