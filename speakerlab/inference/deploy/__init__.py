"""Deployment: export to TorchScript / ONNX (export.py; features or waveform in), the ONNX graphs it builds and
wraps (graph.py: the waveform front end, merged graphs, variable lengths), the int8 check (quantize.py) and the
torch-free runtime that runs the exported files on onnxruntime (runtime.py, shipped by runtime/pyproject.toml)."""
