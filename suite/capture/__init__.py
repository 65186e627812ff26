"""Capture of models into `OpGraph` workloads: PyTorch modules (torch.fx or torch.export) and ONNX files.

* `capture_module(module, example_inputs, example_kwargs=..., name=..., mode=...)`: see `suite.capture.fx`;
* `capture_export(module, example_inputs, example_kwargs=..., name=..., mode=...)`: the same through
  torch.export, for models that torch.fx cannot trace (Python branches on input sizes): see
  `suite.capture.export`;
* `capture_onnx(path_or_model, name=..., mode=...)`: see `suite.capture.onnx_import`;
* FLOP rules in `suite.capture.flops`, the shared IR in `suite.capture.ir`, training graphs in
  `suite.capture.training`.

`CAPTURE_VERSION` is part of every zoo workload's source hash: bump it whenever a change here changes the
graphs that capture produces (costs, folding, training lowering), so cached graphs are rebuilt.
Importing this package does not import torch; the front ends do.
"""

from __future__ import annotations

from typing import Any

CAPTURE_VERSION = 2


def capture_module(module: Any, example_inputs: Any = (), **kwargs: Any) -> Any:
    """`suite.capture.fx.capture` (imports torch on first use)."""
    from suite.capture.fx import capture

    return capture(module, example_inputs, **kwargs)


def capture_export(module: Any, example_inputs: Any = (), **kwargs: Any) -> Any:
    """`suite.capture.export.capture` (imports torch on first use)."""
    from suite.capture.export import capture

    return capture(module, example_inputs, **kwargs)


def capture_onnx(model: Any, **kwargs: Any) -> Any:
    """`suite.capture.onnx_import.import_onnx`."""
    from suite.capture.onnx_import import import_onnx

    return import_onnx(model, **kwargs)


__all__ = ["CAPTURE_VERSION", "capture_export", "capture_module", "capture_onnx"]
