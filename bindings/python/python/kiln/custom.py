"""Ops defined in Python: a NumPy function made a Kiln op with :func:`custom_op`.

The op joins the library's run-time registry (the one C's ``kiln_register_op`` fills),
so graphs built in Python call it like a catalogue op, ONNX nodes of its domain and
name import to it, the CPU backend runs it between its own kernels, and
:func:`kiln.grad` differentiates through it when it has a gradient::

    def swish_grad(inputs, outputs, output_grads):
        (x,), (y,), (gy,) = inputs, outputs, output_grads
        s = 1 / (1 + np.exp(-x))
        return [gy * (s + y * (1 - s))]

    @kiln.custom_op("my.ops", "Swish", gradient=swish_grad)
    def swish(x):
        return x / (1 + np.exp(-x))

    y = swish(g.parameter("x", "f32", ["N", 8]))   # a node of my.ops::Swish

The function takes one NumPy array per input (``None`` for an absent optional one) and
the node's attributes as keyword arguments, and returns one array per output (a tuple
or list when there are several), converted to the inferred dtype; its inputs are fresh
copies it may keep. ``infer(*types, **attrs)`` gives each output's ``(shape, dtype)``
from the inputs' (dims are ints or symbol names, dtypes Kiln's names such as ``"f32"``
or NumPy's); without it every output has input 0's type. ``gradient(inputs, outputs,
output_grads, **attrs)`` returns one array (or ``None``: zero) per input; an output the
loss does not use has gradient ``None``. Kernels run with the GIL, from the thread that
runs the step; infer must not build on a graph (it runs while one is being built).
"""

import functools as _functools
import inspect as _inspect

from . import _kiln


class CustomOp:
    """A Python function registered as the op ``domain::name``. Called on values of a
    graph it adds a node of the op; called on anything else it is the plain function."""

    def __init__(self, function, domain, name, inputs, outputs, infer, gradient, pure):
        if inputs is None:
            inputs = _positional_count(function)
        self.function = function
        self.op_name = _kiln.register_op(
            domain,
            name,
            function,
            inputs=inputs,
            outputs=outputs,
            infer=infer,
            gradient=gradient,
            pure=pure,
            doc=function.__doc__ or "",
        )
        self.domain, self.name = domain, name
        _functools.update_wrapper(self, function)

    def __call__(self, *inputs, name="", **attrs):
        graph = next((v.graph for v in inputs if isinstance(v, _kiln.Value)), None)
        if graph is None:
            return self.function(*inputs, **attrs)
        return graph.op(self.op_name, list(inputs), name=name, **attrs)

    def unregister(self):
        """Removes the op (and its gradient op) from the registry; graphs and executables
        that use it keep working. Whether it was still registered."""
        return _kiln.unregister_op(self.domain, self.name)

    def __repr__(self):
        return f"<kiln.CustomOp {self.op_name}>"


def _positional_count(function):
    params = _inspect.signature(function).parameters.values()
    kinds = (_inspect.Parameter.POSITIONAL_ONLY, _inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is p.empty)


def custom_op(domain, name, *, infer=None, gradient=None, inputs=None, outputs=1, pure=True):
    """Registers the decorated NumPy function as the op ``domain::name`` (see the
    module's docs) and returns it as a :class:`CustomOp`. ``inputs`` defaults to the
    function's positional parameters without defaults; ``pure=False`` keeps the op from
    being computed at compile time on constant inputs."""

    def register(function):
        return CustomOp(function, domain, name, inputs, outputs, infer, gradient, pure)

    return register
