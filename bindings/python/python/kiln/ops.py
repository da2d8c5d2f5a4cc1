"""Every op of Kiln's catalogue as a function, by its name (``kiln.ops.Conv``) and in
snake case (``kiln.ops.conv``)::

    y = kiln.ops.relu(kiln.ops.conv(x, w, b, strides=[1, 1], pads=[1, 1, 1, 1]))

Inputs are values of one graph (``None`` for an absent optional input); keyword
arguments are the op's attributes, and ``name=`` names the node. The functions and
their docstrings are made at import from the library's own catalogue, so they cannot
drift from it; so is their type stub, ``ops.pyi`` (``_stub_text``; a test checks the
committed file against it).
"""

import keyword as _keyword
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
_aliases = {}
for _name, _signature, _doc, *_ in _kiln.catalogue():
    globals()[_name] = _make(_name, _signature, _doc)
    __all__.append(_name)
    _alias = _snake(_name)
    if _alias != _name and _alias not in globals():
        globals()[_alias] = globals()[_name]
        __all__.append(_alias)
        _aliases[_alias] = _name

_ATTR_TYPES = {
    "int": "int",
    "float": "float",
    "string": "str",
    "ints": "Sequence[int]",
    "floats": "Sequence[float]",
    "strings": "Sequence[str]",
    "graph": "Graph",
}


def _identifier(name, taken):
    ident = _re.sub(r"\W", "_", name.rstrip("?.").strip()) or "x"
    if ident[0].isdigit() or _keyword.iskeyword(ident) or ident in taken:
        ident += "_"
    taken.add(ident)
    return ident


def _stub_line(name, inputs, outputs, attrs):
    taken = {"name"}
    params, variadic = [], False
    for k, i in enumerate(inputs):
        ident = _identifier(i, taken)
        # An optional input before a required one is passed, as None if absent.
        trailing = all(j.endswith(("?", "...")) for j in inputs[k:])
        if i.endswith("..."):
            params.append(f"*{ident}: Optional[Value]")
            variadic = True
        elif i.endswith("?"):
            params.append(f"{ident}: Optional[Value]" + (" = None" if trailing else ""))
        else:
            params.append(f"{ident}: Value")
    if params and not variadic:
        params.append("/")
    params.append("*" if not variadic else "")
    params = [p for p in params if p]
    params.append('name: str = ""')
    for attr, kind, required in attrs:
        default = "" if required else " = ..."
        params.append(f"{_identifier(attr, taken)}: {_ATTR_TYPES[kind]}{default}")
    if not outputs:
        result = "None"
    elif len(outputs) == 1 and not outputs[0].endswith("..."):
        result = "Value"
    elif any(o.endswith("...") for o in outputs):
        result = "Union[Value, tuple[Value, ...]]"
    else:
        result = f"tuple[{', '.join(['Value'] * len(outputs))}]"
    return f"def {name}({', '.join(params)}) -> {result}: ..."


def _stub_text():
    """The text of ``ops.pyi``: one typed signature per catalogue op and its alias."""
    lines = [
        '"""Generated from the op catalogue by ``kiln.ops._stub_text()``; do not edit."""',
        "",
        "from typing import Optional, Sequence, Union",
        "",
        "from ._kiln import Graph, Value",
        "",
    ]
    for name, _signature, _doc, inputs, outputs, attrs in _kiln.catalogue():
        lines.append(_stub_line(name, inputs, outputs, attrs))
    lines.append("")
    # `and`, `or`, … exist (through getattr) but cannot be written in a stub.
    lines.extend(f"{a} = {n}" for a, n in _aliases.items() if not _keyword.iskeyword(a))
    return "\n".join(lines) + "\n"
