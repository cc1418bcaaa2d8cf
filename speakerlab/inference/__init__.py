"""Inference: checkpoint -> embedder (the one inference path), extraction of data dirs, export to
TorchScript / ONNX, the no-training baseline and the console scripts for files. Never imports
speakerlab.train."""
