"""Kiln from Python: load, compile and run deep-learning graphs.

Two ways in:

* onnxruntime's, for scripts that already use it::

      sess = kiln.InferenceSession("model.onnx")
      (y,) = sess.run(None, {"x": x})

* Graphs built in Python, nGraph style: ``g = kiln.Graph()``, ``x = g.parameter("x",
  "f32", [kiln.Axis("batch", "N"), 784])``, ``g.constant(array)``, ``g.variable(...)``,
  any catalogue op from :mod:`kiln.ops`, the operators ``+ - * / @``, unary ``-`` and
  comparisons, ``kiln.grad(loss, [w])``, ``g.output("y", y)``.

* Kiln's own: ``kiln.load(path)`` (or ``kiln.parse(text)``) gives a :class:`Graph`,
  ``graph.compile(backend="cpu", threads=0, options={"profile": "all"})`` an
  :class:`Executable` (``options``: the compile options, as ``KILN_<KEY>`` and the
  command line's ``--option KEY=VALUE`` take them), and ``exe.run({"x": x})`` or
  ``exe(x=x)`` a dict of output arrays.

A C-contiguous input array of the input's dtype is read where it lies (do not write to
it meanwhile), any other is copied once into row-major order; outputs are Kiln's own buffers handed to NumPy without a
copy.

:class:`Tensor` is a Kiln tensor that speaks DLPack both ways: ``kiln.Tensor(x)`` and
``kiln.from_dlpack(x)`` share the memory of a C-contiguous NumPy array (or PyTorch or
JAX CPU tensor, or anything with ``__dlpack__``) and copy a strided one once into
row-major order; ``numpy.from_dlpack(t)``, ``t.numpy()`` and ``numpy.asarray(t)`` view
its memory without a copy, keeping it alive. Runs read a ``kiln.Tensor`` input of the
input's dtype in place. The GIL is released while a graph compiles and runs, so Python
threads can run one executable at once. Every error is a :class:`KilnError`, of the
subclass of its C status, carrying the library's message.
"""

import os as _os


from ._kiln import (
    Axis,
    CompileFailed,
    DeviceUnavailable,
    Executable,
    Graph,
    InvalidArgument,
    InvalidGraph,
    IoError,
    KilnError,
    NodeArg,
    ParseError,
    RunBadInput,
    RunFailed,
    Tensor,
    UnknownOp,
    Unsupported,
    Value,
    catalogue,
    grad,
    load,
    load_onnx_bytes,
    parse,
)
from . import nn, ops, optim
from .custom import CustomOp, custom_op

__all__ = [
    "Axis",
    "CompileFailed",
    "CustomOp",
    "DeviceUnavailable",
    "Executable",
    "Graph",
    "InferenceSession",
    "InvalidArgument",
    "InvalidGraph",
    "IoError",
    "KilnError",
    "NodeArg",
    "ParseError",
    "RunBadInput",
    "RunFailed",
    "Tensor",
    "UnknownOp",
    "Unsupported",
    "Value",
    "catalogue",
    "custom_op",
    "from_dlpack",
    "grad",
    "load",
    "load_onnx_bytes",
    "nn",
    "ops",
    "optim",
    "parse",
]


def from_dlpack(obj):
    """A :class:`Tensor` over the memory of ``obj``, any object with ``__dlpack__`` on
    the host (a NumPy array, a PyTorch or JAX CPU tensor), without a copy when it is
    C-contiguous and copied once into row-major order when strided. It is array-like:
    ``numpy.asarray`` (or ``.numpy()``) views it without a copy. Runs accept such objects
    directly, and ``kiln.Tensor`` too; Kiln's outputs are NumPy arrays, which speak
    DLPack themselves (versioned capsules with NumPy >= 2.1)."""
    if not hasattr(obj, "__dlpack__"):
        raise InvalidArgument(
            "obj: expected an object with __dlpack__, got " + type(obj).__name__
        )
    return Tensor(obj)


class InferenceSession:
    """A compiled model with onnxruntime's ``InferenceSession`` calls.

    ``path_or_bytes``: a path to an ``.onnx`` model or ``.kir`` text, or an ONNX
    model's bytes. ``threads``: worker threads (0: one per core). ``backend``:
    ``"cpu"``, ``"interp"`` (the reference interpreter) or ``"cuda:N"``.
    """

    def __init__(self, path_or_bytes, threads=0, backend="cpu"):
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            graph = load_onnx_bytes(bytes(path_or_bytes))
        elif isinstance(path_or_bytes, (str, _os.PathLike)):
            graph = load(_os.fspath(path_or_bytes))
        else:
            raise InvalidArgument(
                "path_or_bytes: expected a path or an ONNX model's bytes, got "
                + type(path_or_bytes).__name__
            )
        self._graph = graph
        self._exe = graph.compile(backend=backend, threads=threads)

    def run(self, output_names, input_feed, run_options=None):
        """The outputs named in ``output_names`` (all of them for ``None``), in that
        order, for the inputs in ``input_feed`` (name -> array)."""
        if run_options is not None:
            raise InvalidArgument("run_options: Kiln takes none")
        return self._exe.run_list(output_names, input_feed)

    def get_inputs(self):
        """The model's inputs: objects with ``name``, ``shape`` and ``type``."""
        return self._exe.inputs

    def get_outputs(self):
        """The model's outputs: objects with ``name``, ``shape`` and ``type``."""
        return self._exe.outputs

    @property
    def graph(self):
        """The :class:`Graph` the session compiled."""
        return self._graph

    @property
    def executable(self):
        """The compiled :class:`Executable`."""
        return self._exe
