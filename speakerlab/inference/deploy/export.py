"""Export an embedding model to TorchScript or ONNX, with a dynamic batch and time axis.

    speakerlab-export --checkpoint exp/mini --format onnx --waveform --out campplus.onnx
    speakerlab-export --checkpoint exp/mini --format onnx --waveform --int8 static \
        --calibration data/val --trials data/test --out campplus.int8.onnx
    speakerlab-export --3dspeaker eres2net_base --weights pretrained.bin --format torchscript --out m.pt

`--waveform` (ONNX): one file from samples to embedding. Its inputs are `wave (B, N)` float samples at the
model's rate (or the `--input-rate` declared, resampled inside the graph) and `lengths (B,)` int64 (each row's
samples; a padded batch gives each row its own embedding), its output `embedding (B, D)`; the model's own
front end is in the graph (Kaldi fbank without dither and its mean normalisation, or the ReDimNet2 log-mel:
speakerlab.inference.deploy.graph), and its metadata says what it is (speakerlab.inference.deploy.runtime.META: model,
rate, feature spec, embedding size, speakerlab version, the exp dir's calibrated threshold where scoring wrote
one; the checkpoint's digest and the exp dir's calibration.json when it is this checkpoint's: LLRs and operating
points, speakerlab.scoring.calibration_file; neither for int8 files, whose scores differ). It runs without torch
(speakerlab.inference.deploy.runtime, `speakerlab-embed --onnx`). After writing, the file is checked against the PyTorch
path (audio -> features -> model) on two lengths, alone and as a padded batch.

`--int8 dynamic|static` quantises the model part (speakerlab.inference.deploy.quantize; static ranges from
`--calibration DIR`'s audio), then compares it with the fp32 file and prints the comparison: cosine to fp32 on
the calibration audio and, with `--trials DIR` (a data dir with wav.scp and trials), both EERs. A file whose
int8 EER is more than `--max-eer-increase` points above fp32's, or whose mean cosine is below `--min-cosine`,
is not written (exit 1) unless `--force`; the numbers go into its metadata either way.

Without `--waveform` both formats take the features of the model's front end `(B, T, F)` (input `feats`;
the export line prints which) and return `embedding (B, D)`; feature extraction stays outside. Models on a
self-supervised encoder (transformers' WavLM, HuBERT, wav2vec 2.0, w2v-BERT) export with `--waveform` only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn as nn

from speakerlab.commands import CommandParser, require_packages
from speakerlab.inference.deploy.quiet import quiet_libraries
from speakerlab.inference.deploy.runtime import FEATURES_FORMAT, FORMAT, META
from speakerlab.inference.verify import exp_calibration, scored_threshold
from speakerlab.outputs import OutputError, check_not_input, check_path_output, output_path

# Options of the int8 quantisation and its check (speakerlab-export refuses them without --int8).
INT8_ONLY = ("calibration", "calibration_utts", "trials", "max_eer_increase", "min_cosine", "force")


class ExportMismatch(RuntimeError):
    """The exported file does not give what the PyTorch model gives: it is not written."""


def checked_write(out, write, check) -> float:
    """`write(tmp)` then `check(tmp)` (-> the largest difference), next to `out`; the file becomes `out` only when
    the check passes, so an export that disagrees with PyTorch is never left where a user would load it."""
    with output_path(out, suffix=Path(out).suffix) as tmp:
        write(tmp)
        return check(tmp)


def export_torchscript(model: nn.Module, path, feat_dim: int) -> None:
    """Script the model over `(B, T, feat_dim)` features (trace as a fallback for models that script cannot
    compile) and save it."""
    model = model.eval()
    try:
        scripted = torch.jit.script(model)
    except Exception:  # some layers (e.g. checkpointing wrappers) only trace
        with torch.no_grad():
            scripted = torch.jit.trace(model, torch.randn(2, 200, feat_dim))
    scripted.save(str(path))


def export_onnx(model: nn.Module, path, feat_dim: int, opset: int = 18):
    """ONNX through torch.export over `(B, T, feat_dim)` features, batch and frame axes dynamic (any length >= 16
    frames); written to `path` when given (with the features format in its metadata), and returned (an
    onnx.ModelProto)."""
    import onnx

    from speakerlab.inference.deploy.graph import EMBEDDING, FEATS, set_metadata, torch_to_onnx

    # 537 frames: every size derived from time (e.g. CAM++ segments) is >= 2 and not a multiple of
    # anything, so torch.export does not specialise a size-1 or exactly-divisible axis.
    graph = torch_to_onnx(model, torch.randn(2, 537, feat_dim), (FEATS, EMBEDDING), min_length=16, opset=opset)
    if path is not None:
        written = onnx.ModelProto()
        written.CopyFrom(graph)
        set_metadata(written, {META["format"]: FEATURES_FORMAT})
        onnx.save(written, str(path))
    return graph


def check_export(model: nn.Module, path, fmt: str, feat_dim: int, lengths=(200, 317), atol: float = 1e-4) -> float:
    """Largest |exported - PyTorch| over two input lengths of `(2, T, feat_dim)`; raises when above `atol`."""
    worst = 0.0
    for frames in lengths:
        x = torch.randn(2, frames, feat_dim, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            ref = model.eval()(x).numpy()
        if fmt == "onnx":
            import onnxruntime as ort

            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            got = sess.run(None, {"feats": x.numpy()})[0]
        else:
            # Without the profiling executor's optimisation passes: the first calls of a large
            # scripted graph would otherwise spend seconds re-optimising for each new shape.
            with torch.no_grad(), torch.jit.optimized_execution(False):
                got = torch.jit.load(str(path))(x).numpy()
        if got.shape != ref.shape:
            raise ExportMismatch(f"output shape {got.shape} != {ref.shape} at {frames} frames")
        worst = max(worst, float(np.abs(got - ref).max()))
    if worst > atol:
        raise ExportMismatch(f"the exported model differs from PyTorch by {worst:.2e} (> {atol})")
    return worst


def waveform_metadata(embedder, src, input_rate: int, threshold=None, calibration=None) -> Dict[str, str]:
    """The metadata of a waveform file (runtime.META) of `embedder` built from `src` (a speakerlab.sources
    Source): what the runtime needs to batch, check and describe it; the checkpoint's digest and `calibration` (a
    scoring.calibration_file.Calibration of that checkpoint) when given."""
    from speakerlab import __version__
    from speakerlab.dataio.waveform.resample import rate_ratio

    spec = embedder.spec
    up, down = rate_ratio(input_rate, spec.sample_rate)
    # The shortest input whose resampled length gives MIN_FRAMES frames.
    model_samples = embedder.min_samples
    min_samples = -(-model_samples * down // up)
    batching = {"by": "samples"}
    if spec.kind == "kaldi_fbank" and spec.config.snip_edges and input_rate == spec.sample_rate:
        batching = {"by": "frames", "window": spec.config.window_size, "shift": spec.config.window_shift}
    meta = {
        "format": FORMAT,
        "model": src.model_name,
        "source": src.describe(),
        "version": __version__,
        "sample_rate": str(input_rate),
        "features": json.dumps(spec.to_dict()),
        "embedding_size": str(torch_waveform(embedder, input_rate)(np.ones((1, min_samples), np.float32)).shape[1]),
        "batching": json.dumps(batching),
        "min_samples": str(min_samples),
    }
    if threshold is not None:
        meta["threshold"], meta["threshold_source"] = f"{threshold[0]:.6f}", threshold[1]
    if src.digest:
        meta["model_id"] = src.digest
    if calibration is not None:
        meta["calibration"] = calibration.to_json()
    return {META[k]: v for k, v in meta.items()}


def torch_waveform(embedder, input_rate: int):
    """The PyTorch path a waveform file must equal: `(1, N)` samples at `input_rate` -> `(1, D)` numpy."""
    from speakerlab.inference.deploy.graph import WaveFrontEnd

    front = WaveFrontEnd(embedder.spec, input_rate).eval()

    @torch.no_grad()
    def run(wave: np.ndarray) -> np.ndarray:
        return embedder.model(front(torch.from_numpy(wave))).float().numpy()

    return run


def waveform_errors(sess, reference, waves) -> Tuple[float, float]:
    """A waveform file's session against `reference` (`(1, N)` samples -> `(1, D)` embedding, the PyTorch path) on
    `waves`, each alone (batch 1) and all as one zero-padded batch with their lengths: the largest |file -
    reference| of each, over max(1, the reference's largest |value|)."""
    ref = np.concatenate([reference(w[None]) for w in waves])
    lengths = np.array([len(w) for w in waves], np.int64)
    padded = np.zeros((len(waves), lengths.max()), np.float32)
    for i, w in enumerate(waves):
        padded[i, : len(w)] = w
    alone = np.concatenate(
        [sess.run(None, {"wave": w[None], "lengths": lengths[i : i + 1]})[0] for i, w in enumerate(waves)]
    )
    batch = sess.run(None, {"wave": padded, "lengths": lengths})[0]
    scale = max(1.0, float(np.abs(ref).max()))
    return float(np.abs(alone - ref).max()) / scale, float(np.abs(batch - ref).max()) / scale


def check_waveform(embedder, path, input_rate: int, seconds=(1.37, 4.21), atol: float = 1e-4) -> float:
    """Largest waveform_errors over waves of `seconds` alone and as one padded batch; raises ExportMismatch when
    above `atol`."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    waves = [(0.1 * rng.standard_normal(int(s * input_rate))).astype(np.float32) for s in seconds]
    worst = max(waveform_errors(sess, torch_waveform(embedder, input_rate), waves))
    if worst > atol:
        raise ExportMismatch(f"the waveform file differs from the PyTorch path by {worst:.2e} (> {atol})")
    return worst


def calibration_audio(data_dir: Path, input_rate: int, limit: int) -> Tuple[List[str], List[np.ndarray]]:
    """Up to `limit` utterances of a data dir's wav.scp (ids, waves at `input_rate`), in its order."""
    from speakerlab.dataio.audio import AudioError, read_first_channel
    from speakerlab.dataio.tables.lists import ListError, read_wav_scp
    from speakerlab.dataio.waveform.resample import resample

    scp = Path(data_dir) / "wav.scp"
    if not scp.exists():
        raise ListError(f"{data_dir}: no wav.scp (give a data dir)")
    table = read_wav_scp(scp)
    if not table:
        raise ListError(f"{scp}: no utterances")
    ids = list(table)[:limit] if limit else list(table)
    waves = []
    for u in ids:
        try:
            wave, sr = read_first_channel(table[u][1], lambda m: None)
        except AudioError as e:  # the list's line, as the runtime names it
            raise AudioError(f"{scp}:{table[u][0]}: {u}: {e}") from None
        waves.append(resample(wave, sr, input_rate))
    return ids, waves


def write_waveform(embedder, args, meta: Dict[str, str], name: str) -> str:
    """Build, check and write the waveform file of `args` (fp32, or int8 after its accuracy check); returns the
    line to print. Raises QuantizeError / ExportMismatch (nothing written) / SystemExit(1) (int8 refused)."""
    import copy
    import tempfile

    import onnx

    from speakerlab.inference.deploy import quantize
    from speakerlab.inference.deploy.graph import front_end_graph, merged_graph, model_graph, set_metadata, with_lengths

    rate = args.input_rate or embedder.spec.sample_rate
    front, model = front_end_graph(embedder.spec, rate), model_graph(embedder.model, embedder.spec)
    fp32 = with_lengths(merged_graph(copy.deepcopy(front), model))
    set_metadata(fp32, meta)
    if not args.int8:
        err = checked_write(args.out, lambda tmp: onnx.save(fp32, tmp), lambda tmp: check_waveform(embedder, tmp, rate))
        return f"max |diff| vs the PyTorch path, alone and padded: {err:.2e}"
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "fp32.onnx"
        onnx.save(fp32, ref)
        check_waveform(embedder, ref, rate)
        ids, waves = calibration_audio(args.calibration, rate, args.calibration_utts)
        feats = [_features(embedder, rate, w) for w in waves]
        model8 = quantize.quantize_model_graph(model, args.int8, feats, name)
        int8 = with_lengths(merged_graph(front, model8))
        trials = None
        if args.trials:
            t_ids, t_waves = calibration_audio(args.trials, rate, 0)
            trials = (t_ids, t_waves, Path(args.trials) / "trials")
        cand = Path(tmp) / "int8.onnx"
        onnx.save(int8, cand)
        report = quantize.int8_report(str(ref), str(cand), waves, trials)
        problem = quantize.refusal(report, args.max_eer_increase, args.min_cosine)
        report.update(mode=args.int8, refused=problem or "")
        # int8 embeddings are not the checkpoint's: neither its digest nor its calibration goes with them.
        fp32_only = (META["model_id"], META["calibration"])
        set_metadata(int8, {**{k: v for k, v in meta.items() if k not in fp32_only}, META["int8"]: json.dumps(report)})
        print(f"export: int8 {args.int8}: {quantize.describe(report)}", file=sys.stderr)
        if problem and not args.force:
            print(
                f"error: int8 {args.int8} of {name} refused, {args.out} not written: {problem} "
                "(--force writes it anyway)",
                file=sys.stderr,
            )
            raise SystemExit(1)
        with output_path(args.out, suffix=".onnx") as out:
            onnx.save(int8, str(out))
    return f"int8 {args.int8}{' (refused, written with --force: ' + problem + ')' if problem else ''}"


def _features(embedder, rate: int, wave: np.ndarray) -> np.ndarray:
    from speakerlab.inference.deploy.graph import WaveFrontEnd

    with torch.no_grad():
        return WaveFrontEnd(embedder.spec, rate)(torch.from_numpy(wave[None])).numpy()


def main(argv=None) -> int:
    with quiet_libraries():
        return export(argv)


def export(argv=None) -> int:
    """`speakerlab-export` (see the module docstring) -> its exit code."""
    from speakerlab.devices import use_threads
    from speakerlab.frontends import FRONT_ENDS
    from speakerlab.inference.embedder import Embedder, add_source_args, source_from_args

    ap = CommandParser(prog="speakerlab-export", description=__doc__.split("\n")[0])
    add_source_args(ap)
    ap.add_argument("--format", choices=["onnx", "torchscript"], help="what to write (--waveform, --int8: onnx)")
    ap.add_argument("--out", required=True, help="the exported file (.onnx or .pt)")
    ap.add_argument("--waveform", action="store_true", help="ONNX from samples (B, N) + lengths (B,): front end inside")
    ap.add_argument("--input-rate", type=int, help="with --waveform: the rate of the input samples (resampled inside)")
    ap.add_argument("--int8", choices=["dynamic", "static"], help="with --waveform: quantise the model part")
    ap.add_argument("--calibration", metavar="DIR", help="data dir (wav.scp) of int8 calibration and the cosine check")
    ap.add_argument("--calibration-utts", type=int, default=200, help="utterances of --calibration used")
    ap.add_argument("--trials", metavar="DIR", help="data dir with wav.scp and trials: the int8 EER check")
    ap.add_argument("--max-eer-increase", type=float, default=0.2, help="int8 EER points above fp32 allowed")
    ap.add_argument("--min-cosine", type=float, default=0.98, help="least mean cosine of int8 to fp32")
    ap.add_argument("--force", action="store_true", help="write an int8 file the check refused")
    args = ap.parse_args(argv)
    if args.format is None and not (args.waveform or args.int8):
        ap.error("--format onnx|torchscript is required (--waveform alone implies onnx)")
    args.format = args.format or "onnx"
    suffix = Path(args.out).suffix.lower()
    named = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript"}.get(suffix)
    if named and named != args.format:  # the runtime would call such a file unreadable, not of the other format
        right = ".onnx" if args.format == "onnx" else ".pt"
        ap.error(f"--out {args.out}: a {suffix} name for a {args.format} file: name it {right}")
    if (args.waveform or args.int8) and args.format != "onnx":
        ap.error("--waveform and --int8 are ONNX options (--format onnx)")
    if args.int8 and not (args.waveform and args.calibration):
        ap.error("--int8 needs --waveform and --calibration DIR (its audio calibrates and checks the int8 model)")
    if args.calibration_utts < 1:  # a negative count dropped that many from the list's end
        ap.error(f"--calibration-utts must be >= 1, got {args.calibration_utts}")
    if args.input_rate is not None and not args.waveform:
        ap.error("--input-rate goes with --waveform")
    given = [f"--{d.replace('_', '-')}" for d in INT8_ONLY if getattr(args, d) != ap.get_default(d)]
    if given and not args.int8:  # else a forgotten --int8 would write the fp32 file as if checked
        ap.error(f"{', '.join(given)} go with --int8 dynamic|static (the int8 calibration and check), not an fp32 file")
    try:
        src = source_from_args(ap, args)
        threads_line = use_threads(args.threads)[1]
        embedder = Embedder(src.build(), src.features, "cpu", src.describe())  # exported graphs are traced on the CPU
    except (ValueError, ImportError) as e:  # a SourceError names the file
        print(f"error: {e}", file=sys.stderr)
        return 2
    if FRONT_ENDS[embedder.spec.kind].encoder_input and not args.waveform:
        print(
            f"error: a model on a self-supervised encoder ({embedder.spec.kind} input) exports with --waveform only "
            "(--format onnx --waveform): its input is not (B, T, F) features",
            file=sys.stderr,
        )
        return 2
    try:  # recipes install requirements.txt only
        if args.format == "onnx":
            require_packages("ONNX export", ("onnx", "onnxscript", "onnxruntime"), "pip install -e '.[export]'")
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        check_path_output(args.out)  # a device or a folder refused before the work
        check_not_input([args.out], [src.path])  # the model file it exports (an exp dir's: its latest checkpoint)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, feat_dim = embedder.model, embedder.spec.feat_dim
    if args.waveform:
        scored = scored_threshold(args.checkpoint, src.digest) if args.checkpoint else None
        threshold = (scored[0], str(scored[1])) if scored else None
        try:
            found = None
            if args.checkpoint and not args.int8:
                found = exp_calibration(args.checkpoint, src.digest, lambda m: print(f"warning: {m}", file=sys.stderr))
            rate = args.input_rate or embedder.spec.sample_rate
            meta = waveform_metadata(embedder, src, rate, threshold, found[0] if found else None)
            done = write_waveform(embedder, args, meta, src.model_name)
        except ValueError as e:  # a QuantizeError, an unreadable calibration list or audio file
            print(f"error: {e}", file=sys.stderr)
            return 2
        except ExportMismatch as e:
            print(f"error: {args.out} not written: {e}", file=sys.stderr)
            return 1
        rate, model_rate = args.input_rate or embedder.spec.sample_rate, embedder.spec.sample_rate
        takes = f"takes {rate} Hz input" + (f", resampled inside to {model_rate} Hz" if rate != model_rate else "")
        carried = f"; calibration {found[1]} carried" if found else ""
        print(
            f"export: {args.out} (waveform ONNX, {takes}; {embedder.spec.describe()}); {done}{carried}; {threads_line}",
            file=sys.stderr,
        )
        return 0
    write = export_onnx if args.format == "onnx" else export_torchscript
    try:
        err = checked_write(
            args.out,
            lambda tmp: write(model, tmp, feat_dim),
            lambda tmp: check_export(model, tmp, args.format, feat_dim=feat_dim),
        )
    except ExportMismatch as e:
        print(f"error: {args.out} not written: {e}", file=sys.stderr)
        return 1
    print(
        f"export: {args.out} ({args.format}; input: {embedder.spec.describe()}); "
        f"max |diff| vs PyTorch at 2 lengths: {err:.2e}; {threads_line}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
