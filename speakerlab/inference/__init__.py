"""Inference: checkpoint -> embedder (the one inference path), extraction of data dirs, export to
TorchScript / ONNX and the torch-free ONNX runtime (deploy/), the no-training baseline and the console scripts
for files. Never imports speakerlab.train."""


def load_embedder(*args, onnx=None, **kwargs):
    """`speakerlab.inference.embedder.load_embedder`, importable without torch: `load_embedder(onnx="m.onnx")`
    (with `resample=` and `threads=` of `load_onnx`, or none) needs only numpy, soundfile, scipy and onnxruntime
    (speakerlab.inference.deploy.runtime); every other source imports torch."""
    if onnx is not None and not args and set(kwargs) <= {"resample", "threads"}:
        return load_onnx(onnx, **kwargs)
    from speakerlab.inference.embedder import load_embedder as load

    return load(*args, onnx=onnx, **kwargs)


def load_onnx(path, resample: bool = True, threads=None):
    """`speakerlab.inference.deploy.runtime.load_onnx`: an OnnxEmbedder of a waveform ONNX file, on onnxruntime only."""
    from speakerlab.inference.deploy.runtime import load_onnx as load

    return load(path, resample=resample, threads=threads)
