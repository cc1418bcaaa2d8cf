"""Waveform-in ONNX graphs: the model's own front end and the model in one file that takes float samples.

    graph = waveform_graph(embedder, model_graph)              # (B, N) samples + (B,) lengths -> (B, D)

Built from two graphs the torch exporter writes, joined here with the `onnx` package:

- the front end, `WaveFrontEnd`: the input rate's samples, resampled to the model's rate when a rate is declared
  (speakerlab.dataio.waveform.speed.Resampler, the torch path's polyphase filter), then the kind's module
  (speakerlab.features.spec.build_features: Kaldi fbank without dither and its mean normalisation, or the
  ReDimNet2 log-mel), kept fp32 whatever the model graph becomes (an int8 mel matrix would ruin the features);
- the model graph over features `(B, T, F)` (speakerlab.inference.deploy.export.export_onnx), fp32 or int8.

Merged, they map `wave (B, N)` to `embedding (B, D)` with every row taken whole. `with_lengths` wraps that
in the graph users get, with `lengths (B,)` int64 beside the wave: when every length is N (a batch of equal
lengths, how the runtime batches) the merged graph runs once on the batch; otherwise it runs on each row cut to
its length, so a padded batch gives each utterance its own embedding, exactly as alone. Both are one ONNX Loop
whose body holds the merged graph and its weights (stored once): one trip over the batch, or one per row.
"""

from __future__ import annotations

import warnings
from typing import Dict, List

import onnx
import torch
import torch.nn as nn
from onnx import TensorProto, helper

from speakerlab.dataio.waveform.resample import rate_ratio
from speakerlab.dataio.waveform.speed import Resampler
from speakerlab.features.spec import build_features
from speakerlab.frontends import FeatureSpec

WAVE, LENGTHS, FEATS, EMBEDDING = "wave", "lengths", "feats", "embedding"


class WaveFrontEnd(nn.Module):
    """`(B, N)` float samples at `input_rate` -> the model input `(B, T, F)` of `spec`: polyphase resampling to
    `spec.sample_rate` when the rates differ (the runtime's and torch path's filter), then the front end."""

    def __init__(self, spec: FeatureSpec, input_rate: int):
        super().__init__()
        self.resample = None
        if input_rate != spec.sample_rate:
            self.resample = Resampler(*rate_ratio(input_rate, spec.sample_rate))
        self.features = build_features(spec)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        if self.resample is not None:
            wave = self.resample(wave)
        return self.features(wave)


def torch_to_onnx(module: nn.Module, example: torch.Tensor, names, min_length: int, opset: int = 18) -> onnx.ModelProto:
    """`module` over `(B, L, ...)` -> an ONNX model with input `names[0]`, output `names[1]`, batch and length
    axes dynamic (length >= min_length), through torch.export."""
    import inspect

    arg = next(iter(inspect.signature(module.forward).parameters))
    batch = torch.export.Dim("batch", min=1, max=4096)
    length = torch.export.Dim("length", min=min_length, max=2**31 - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module.eval(),
            (example,),
            input_names=[names[0]],
            output_names=[names[1]],
            dynamic_shapes={arg: {0: batch, 1: length}},
            opset_version=opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    model = program.model_proto
    dims = model.graph.input[0].type.tensor_type.shape.dim
    if len(dims) > 1 and not dims[1].dim_param:  # measured: a second export of an LSTM in one process does this
        raise RuntimeError(
            f"the exported {names[0]} has its length axis fixed at {dims[1].dim_value} (torch.export specialised it, "
            "as it does for an LSTM exported a second time in one process); export in a new process"
        )
    return model


def front_end_graph(spec: FeatureSpec, input_rate: int) -> onnx.ModelProto:
    """`WaveFrontEnd` as ONNX: `wave (B, N)` -> `feats (B, T, F)`."""
    module = WaveFrontEnd(spec, input_rate)
    # 3 s plus an odd tail: no length axis is specialised to a round value.
    example = torch.randn(2, 3 * input_rate + 123)
    return torch_to_onnx(module, example, (WAVE, FEATS), min_length=input_rate // 10)


def model_graph(model: nn.Module, spec: FeatureSpec) -> onnx.ModelProto:
    """The model part, `feats` (its front end's output) -> `(B, D)`, as ONNX. An fbank model is traced over
    `(2, 537, F)` (every size derived from time >= 2 and a multiple of nothing, so no axis is specialised); a
    model on a self-supervised encoder over its front end's output for 3 s and a tail (the wave itself, or
    w2v-BERT's stacked fbank). The output is named apart from `embedding`: the encoders of transformers hold
    values of that name."""
    from speakerlab.frontends import FRONT_ENDS

    if not FRONT_ENDS[spec.kind].encoder_input:
        example, shortest = torch.randn(2, 537, spec.feat_dim), 16
    else:
        with torch.no_grad():
            example = build_features(spec)(torch.randn(2, 3 * spec.sample_rate + 123))
        shortest = 16 if example.dim() == 3 else spec.sample_rate // 40  # frames, or one 25 ms window of samples
    return torch_to_onnx(model, example, (FEATS, "model_embedding"), min_length=shortest)


def merged_graph(front_end: onnx.ModelProto, model: onnx.ModelProto) -> onnx.ModelProto:
    """`wave (B, N)` -> `embedding (B, D)`: the front end's `feats` fed to the model graph (fp32 or int8)."""
    from onnx import compose

    model = _same_versions(model, front_end)
    return compose.merge_models(front_end, model, io_map=[(FEATS, FEATS)], prefix2="model/")


def _same_versions(model: onnx.ModelProto, like: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with `like`'s IR version and default-domain opset when they differ (the quantiser may rewrite
    them); other domains (com.microsoft of int8 graphs) are kept, and the front end gets them when merged."""
    model.ir_version = like.ir_version
    version = next(o.version for o in like.opset_import if o.domain in ("", "ai.onnx"))
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, version)
    for o in like.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, version)
    extra = {o.domain: o.version for o in model.opset_import if o.domain not in ("", "ai.onnx")}
    known = {o.domain for o in like.opset_import}
    for domain, version in extra.items():
        if domain not in known:
            like.opset_import.append(helper.make_opsetid(domain, version))
    return model


def _copy(graph: onnx.GraphProto, name: str, tag: str, wave: str) -> List[onnx.NodeProto]:
    """The nodes of `graph` with every value it computes renamed `<tag>/<value>` and its input read from
    `wave`; its output becomes `name`. Initializers keep their names."""
    inits = {t.name for t in graph.initializer}
    out = graph.output[0].name

    def rename(v: str) -> str:
        if v == "" or v in inits:
            return v
        if v == graph.input[0].name:
            return wave
        if v == out:
            return name
        return f"{tag}/{v}"

    nodes = []
    for i, node in enumerate(graph.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{tag}/{node.name or i}"
        copy.input[:] = [rename(v) for v in node.input]
        copy.output[:] = [rename(v) for v in node.output]
        nodes.append(copy)
    return nodes


def with_lengths(merged: onnx.ModelProto) -> onnx.ModelProto:
    """`wave (B, N)` + `lengths (B,)` int64 -> `embedding (B, D)`: the merged graph as the body of one Loop, run
    once on the whole batch when all lengths are N, else once per row cut to its length (module docstring).
    Iteration i takes rows [i, i + per) and samples [0, lengths[i]), `per` = B (one trip) or 1 (B trips); the
    (trips, per, D) stack of its outputs is flattened to (B, D)."""
    g = merged.graph
    emb_type = g.output[0].type.tensor_type.elem_type
    c = helper.make_node
    ints = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    body_nodes = [
        c("Identity", ["cond_in"], ["cond_out"]),
        c("Unsqueeze", ["i", "loop/axis0"], ["loop/i"]),  # (1,)
        c("Add", ["loop/i", "len/per"], ["loop/end"]),
        c("Gather", [LENGTHS, "loop/i"], ["loop/n"], axis=0),  # lengths[0] is N when the batch is whole
        c("Concat", ["loop/i", "loop/zero"], ["loop/starts"], axis=0),
        c("Concat", ["loop/end", "loop/n"], ["loop/ends"], axis=0),
        c("Slice", [WAVE, "loop/starts", "loop/ends", "loop/axes"], ["loop/wave"]),
        *_copy(g, "loop/emb", "unit", "loop/wave"),
    ]
    # The weights are the body's own initializers: constants of the graph that uses them, which onnxruntime
    # optimises and pre-packs; read from an enclosing graph they are not, and CAM++ ran 1.16x slower (measured).
    body = helper.make_graph(
        body_nodes,
        "unit",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("loop/emb", emb_type, None),
        ],
        initializer=[*g.initializer, ints("loop/axis0", [0]), ints("loop/zero", [0]), ints("loop/axes", [0, 1])],
    )
    body.sparse_initializer.extend(g.sparse_initializer)
    nodes = [
        c("Shape", [WAVE], ["len/shape"]),
        c("Gather", ["len/shape", "len/one"], ["len/n"], axis=0),  # (1,) N
        c("Gather", ["len/shape", "len/zero"], ["len/batch"], axis=0),  # (1,) B
        c("Equal", [LENGTHS, "len/n"], ["len/full"]),
        c("Not", ["len/full"], ["len/short"]),
        c("Cast", ["len/short"], ["len/short_i"], to=TensorProto.INT64),
        c("ReduceMax", ["len/short_i"], ["len/any_short"], keepdims=1),
        c("Cast", ["len/any_short"], ["len/cut"], to=TensorProto.BOOL),  # (1,)
        c("Where", ["len/cut", "len/batch", "len/one"], ["len/trips1"]),  # B trips of one row, or one of B rows
        c("Where", ["len/cut", "len/one", "len/batch"], ["len/per"]),
        c("Squeeze", ["len/trips1", "len/zero"], ["len/trips"]),
        c("Loop", ["len/trips", ""], ["len/stack"], body=body),  # (trips, per, D)
        c("Flatten", ["len/stack"], [EMBEDDING], axis=2),
    ]
    wave_in = onnx.ValueInfoProto()
    wave_in.CopyFrom(g.input[0])
    wave_in.name = WAVE
    outer = helper.make_graph(
        nodes,
        "speakerlab_waveform",
        [wave_in, helper.make_tensor_value_info(LENGTHS, TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info(EMBEDDING, emb_type, ["batch", "embedding_size"])],
        initializer=[ints("len/zero", [0]), ints("len/one", [1])],
    )
    model = helper.make_model(outer, opset_imports=list(merged.opset_import), ir_version=merged.ir_version)
    model.functions.extend(merged.functions)
    return model


def set_metadata(model: onnx.ModelProto, values: Dict[str, str]) -> None:
    """Replace the model's metadata_props with `values` (string keys and values)."""
    del model.metadata_props[:]
    for key, value in values.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
