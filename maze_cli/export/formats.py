"""Writing a `PolicyGraph` as ONNX or TorchScript, and running the written model (numpy in, numpy out).

Both formats trace the graph once (torch's TorchScript-based ONNX exporter; `torch.jit.trace`), with the
batch dimension of every input and output left dynamic: Python branches inside the policy are taken as
they are at the trace, which is why `maze_cli.export.heads` keeps the data-dependent ones out of the graph.
The model is written to a temp file and checked there; only a model that passed is renamed into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np
import torch

from maze_cli.errors import ConfigError
from maze_cli.export.graph import PolicyGraph

FORMATS = ("onnx", "torchscript")
EXPORT_EXTRA = "pip install 'maze_cli[export]'"
METADATA_FILE = "maze_cli.json"  # a TorchScript file's metadata, as an extra file in its archive
OPSET = 17
TRACE_BATCH = 2  # rows the graph is traced with (not 1: a dim of size 1 may be taken for a constant)

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class UnexpressibleOperator(ConfigError):
    """The policy uses an operator the format has no counterpart for; the message names the module."""


def missing_extra(package: str, purpose: str) -> ConfigError:
    return ConfigError(f"{purpose} needs {package}, an optional extra: {EXPORT_EXTRA}")


def import_onnxruntime(purpose: str):
    try:
        import onnxruntime
    except ImportError:
        raise missing_extra("onnxruntime", purpose) from None
    return onnxruntime


def write_model(graph: PolicyGraph, fmt: str, path: Path, metadata: dict[str, str]) -> None:
    """`graph` traced and written to `path` in `fmt`, with `metadata`."""
    graph.eval()
    example = graph.example_inputs(TRACE_BATCH)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and exporter warnings: the check against the policy is the judge
        if fmt == "onnx":
            _write_onnx(graph, example, path, metadata)
        else:
            traced = torch.jit.trace(graph, example, check_trace=False)
            torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: json.dumps(metadata)})


def _write_onnx(graph: PolicyGraph, example: tuple[torch.Tensor, ...], path: Path, metadata: dict[str, str]) -> None:
    try:
        import onnx
    except ImportError:
        raise missing_extra("onnx", "format=onnx") from None
    batch = {0: "batch"}
    buffer = io.BytesIO()
    try:
        with _silenced_stdout():
            torch.onnx.export(graph, example, buffer, input_names=graph.input_names, output_names=list(graph.outputs),
                              dynamic_axes={name: batch for name in [*graph.input_names, *graph.outputs]},
                              opset_version=OPSET, dynamo=False)
    except Exception as err:  # noqa: BLE001 - the exporter raises several kinds for an operator it cannot express
        operator = _operator_in(err)
        if operator is None:
            raise
        raise UnexpressibleOperator(f"format=onnx cannot express the operator {operator} (opset {OPSET}), used by "
                                    f"{module_using(graph, example, operator)}; export format=torchscript, or change that module") from None
    model = onnx.load_from_string(buffer.getvalue())
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


@contextlib.contextmanager
def _silenced_stdout() -> Iterator[None]:
    """The process's stdout (the file descriptor) discarded: torch's exporter writes the whole graph there,
    from C++, when an operator fails it; the error says what matters in one line."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            libc.fflush(None)  # what C++ wrote through C's buffered stdout goes to the sink, not to the terminal later
            os.dup2(saved, 1)
            os.close(saved)


def _operator_in(err: Exception) -> str | None:
    """The operator an ONNX export error names (`aten::fft_rfft`), if it names one."""
    found = re.search(r"operator '?([a-z_]+::[\w.]+)'?", str(err))
    return found.group(1) if found else None


def module_using(graph: PolicyGraph, example: tuple[torch.Tensor, ...], operator: str) -> str:
    """`name (Class)` of the innermost module of `graph` whose forward calls `operator`, from the scopes
    a trace records; 'the policy' when the trace does not tell."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(graph, example, check_trace=False)
    torch._C._jit_pass_inline(traced.graph)
    modules = dict(graph.named_modules())
    for node in traced.graph.nodes():
        if node.kind() == operator:
            # a scope reads `__module.policy/__module.policy.network/...`: the last part is the innermost
            name = node.scopeName().split("/")[-1].removeprefix("__module.")
            if name in modules:
                return f"{name.removeprefix('policy.')} ({type(modules[name]).__name__})"
    return "the policy"


def load_model(path: Path, fmt: str) -> tuple[Run, dict[str, str]]:
    """A written model as a function of numpy feeds, and its metadata."""
    if fmt == "onnx":
        onnxruntime = import_onnxruntime("checking and playing an ONNX model")
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # small batches, as actors act: threads only wait
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]

        def run_onnx(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, session.run(None, dict(feeds))))

        return run_onnx, dict(session.get_modelmeta().custom_metadata_map)
    files = {METADATA_FILE: ""}
    module = torch.jit.load(str(path), _extra_files=files)
    metadata = json.loads(files[METADATA_FILE])
    inputs, outputs = [i["name"] for i in json.loads(metadata["inputs"])], json.loads(metadata["outputs"])

    def run_torchscript(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            result = module(*(torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in inputs))
        return {name: value.numpy() for name, value in zip(outputs, result)}

    return run_torchscript, metadata
