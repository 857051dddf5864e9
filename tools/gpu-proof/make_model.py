"""Runs ../shared/tools/large-model/make_deberta.py (the production architecture, random weights) with the
TorchScript exporter: torch >= 2.9 defaults torch.onnx.export to dynamo=True, which make_deberta.py's
dynamic_axes export predates. usage: python3 make_model.py MAKE_DEBERTA_PY ARGS... (make_deberta.py's args)."""
import functools, inspect, runpy, sys

import torch

if 'dynamo' in inspect.signature(torch.onnx.export).parameters:
    torch.onnx.export = functools.partial(torch.onnx.export, dynamo=False)
script = sys.argv[1]
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name='__main__')
