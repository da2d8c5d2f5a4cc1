from os import PathLike
from typing import Optional, Union

import numpy as np

from ._kiln import (
    CompileFailed as CompileFailed,
    DeviceUnavailable as DeviceUnavailable,
    Executable as Executable,
    Graph as Graph,
    InvalidArgument as InvalidArgument,
    InvalidGraph as InvalidGraph,
    IoError as IoError,
    KilnError as KilnError,
    NodeArg as NodeArg,
    ParseError as ParseError,
    RunBadInput as RunBadInput,
    RunFailed as RunFailed,
    Tensor as Tensor,
    UnknownOp as UnknownOp,
    Unsupported as Unsupported,
    load as load,
    load_onnx_bytes as load_onnx_bytes,
    parse as parse,
)

from . import nn as nn, ops as ops, optim as optim
from .custom import CustomOp as CustomOp, custom_op as custom_op

def from_dlpack(obj: object) -> Tensor: ...

class InferenceSession:
    def __init__(
        self,
        path_or_bytes: Union[str, PathLike[str], bytes],
        threads: int = 0,
        backend: str = "cpu",
    ) -> None: ...
    def run(
        self,
        output_names: Optional[list[str]],
        input_feed: dict[str, np.ndarray],
        run_options: None = None,
    ) -> list[np.ndarray]: ...
    def get_inputs(self) -> list[NodeArg]: ...
    def get_outputs(self) -> list[NodeArg]: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def executable(self) -> Executable: ...
