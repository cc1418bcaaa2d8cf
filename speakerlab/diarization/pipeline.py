"""Who spoke when in one recording: speech regions -> sub-segments -> embeddings -> clusters -> turns.

    diarizer = Diarizer(load_embedder("exp/campplus"), vad=make_vad("silero"))
    result = diarizer.diarize(wave, sample_rate, SpeakerCount(2, 6))    # or diarizer.diarize_file(path)
    result.turns          # [Turn(start, end, "spk00"), ...] in time order, seconds
    result.embeddings     # (N, D) per sub-segment, result.subsegments (N, 2) seconds, result.labels (N,)
    result.centroids      # (K, D): the mean unit embedding of each speaker, unit length

Each speech region (from the VAD, or given: oracle speech) is cut into windows of `window` seconds every
`hop` seconds, the last one ending at the region's end; a region shorter than a window is one
sub-segment. Sub-segments shorter than `min_embed` seconds (or than the model's shortest input, `min_samples`)
are embedded from a window of that length centred on them (so a 0.3 s region still gets an embedding), and a
recording shorter than the window is repeated up to it (padding by repetition, never silence); a recording
shorter than the model's shortest input is refused with the one line every command gives
(speakerlab.inference.common.too_short). All windows of a recording go through
`Embedder.embed_waves` in batches of `batch_size` on the embedder's device. Where two sub-segments
overlap, the boundary between their speakers is put in the middle of the overlap; adjacent pieces of
one speaker within a region are joined. With a `FrontCache` (cache.py), `diarize_file` takes the speech
regions and embeddings a run before made for the same file, VAD, model and settings.

Without a segmentation model every instant gets at most one speaker, so the second speaker of an overlap is
missed speech in the DER. With one (`segmenter`, speakerlab.diarization.segmenter), the recording goes the
segmentation way instead (speakerlab.diarization.segmented): an embedding per (window, local speaker) from its
frames without overlap, clustered, then frames with two speakers where the segmenter hears two.

A `Diarizer` keeps no state between calls: its embedder's model runs under `torch.no_grad` in eval mode
and its VAD keeps none, so several threads may call one `Diarizer` at once and get what each would get
alone (tests/test_diarization.py checks this).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.tables.rttm import Interval, Turn
from speakerlab.dataio.waveform.resample import resample
from speakerlab.diarization.cache import CacheEntry, FrontCache
from speakerlab.diarization.clustering.cluster import MAX_UNITS, METHODS, VBX_DEFAULTS, SpeakerCount, cluster, normalize
from speakerlab.diarization.clustering.plda import PLDA, PLDAError
from speakerlab.diarization.clustering.vbx import VBxParams
from speakerlab.diarization.segmented import diarize_segmented
from speakerlab.diarization.vad import VAD_RATE, Detector
from speakerlab.inference.common import check_finite, model_key, too_short

# Nothing here imports torch: with a waveform ONNX file (speakerlab.inference.deploy.runtime) diarization runs in the
# torch-free install.
if TYPE_CHECKING:
    from speakerlab.diarization.segmenter import OnnxSegmenter
    from speakerlab.inference.deploy.runtime import OnnxEmbedder
    from speakerlab.inference.embedder import Embedder


@dataclass(frozen=True)
class DiarizeOptions:
    """Sub-segmentation and clustering settings (seconds, see the module docstrings)."""

    window: float = 1.5
    hop: float = 0.75
    min_embed: float = 0.5
    batch_size: int = 64
    method: str = "spectral"
    pruning: float = 0.1
    threshold: float = 0.5
    merge_cosine: Optional[float] = 0.7
    seed: int = 0
    max_units: int = MAX_UNITS
    fa: float = VBX_DEFAULTS.fa
    fb: float = VBX_DEFAULTS.fb
    loop_p: float = VBX_DEFAULTS.loop_p
    vbx_init: float = VBX_DEFAULTS.init_threshold
    # --segmentation with ahc or vbx: the local speakers of one window may not share a cluster (constrained.py).
    cannot_link: bool = False
    # VBx's stay probability on the segmentation's (window, local speaker) embeddings: they interleave the local
    # speakers of each window, not one speaker after another, so no HMM stay (0) by measurement: count right in 16
    # of 30 validation conversations against 12 at 0.5, DER 17.00 against 17.65 % (bench/RESULTS.md, the segmentation
    # model).
    seg_loop_p: float = 0.0
    seg_window: float = 5.0
    seg_step: float = 1.0

    @property
    def vbx(self) -> VBxParams:
        return VBxParams(fa=self.fa, fb=self.fb, loop_p=self.loop_p, init_threshold=self.vbx_init)

    @property
    def seg_vbx(self) -> VBxParams:
        """VBx's settings on the segmentation's embeddings: `vbx` with `seg_loop_p`."""
        return VBxParams(fa=self.fa, fb=self.fb, loop_p=self.seg_loop_p, init_threshold=self.vbx_init)

    def __post_init__(self):
        problems = []
        if not 0 < self.hop <= self.window:
            problems.append(f"need 0 < hop <= window, got hop {self.hop}, window {self.window}")
        if not 0 < self.min_embed <= self.window:
            problems.append(f"need 0 < min_embed <= window, got {self.min_embed}")
        if not 0 < self.seg_step <= self.seg_window:
            problems.append(f"need 0 < seg_step <= seg_window, got {self.seg_step}, {self.seg_window}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if self.method not in METHODS:
            problems.append(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not 0 < self.pruning <= 1:
            problems.append(f"pruning must lie in (0, 1], got {self.pruning}")
        if not 0 < self.threshold < 2:  # a cosine distance: 0 (same direction) to 2 (opposite)
            problems.append(f"threshold must lie in (0, 2), got {self.threshold}")
        if self.merge_cosine is not None and not -1 <= self.merge_cosine <= 1:
            problems.append(f"merge_cosine must lie in [-1, 1] (1: never merge), got {self.merge_cosine}")
        if self.max_units < 0 or 0 < self.max_units < 2:
            problems.append(f"max_units must be 0 (no limit) or >= 2, got {self.max_units}")
        try:
            VBxParams(fa=self.fa, fb=self.fb, loop_p=self.loop_p, init_threshold=self.vbx_init)
            VBxParams(fa=self.fa, fb=self.fb, loop_p=self.seg_loop_p, init_threshold=self.vbx_init)
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class Diarization:
    """The result for one recording (see the module docstring); `notes` are what a user should know
    (no speech, a speaker count that could not be met)."""

    duration: float
    speech: List[Interval]
    turns: List[Turn]
    subsegments: np.ndarray  # (N, 2) seconds
    labels: np.ndarray  # (N,) int, 0..K-1
    embeddings: np.ndarray  # (N, D) float32
    centroids: np.ndarray  # (K, D) float32, unit length
    notes: List[str] = field(default_factory=list)
    cached: List[str] = field(default_factory=list)  # what came from the cache: "speech", "embeddings"
    # Wall seconds of each stage run: "speech" (VAD or segmentation), "embeddings", "clustering".
    seconds: Dict[str, float] = field(default_factory=dict)

    @property
    def speakers(self) -> List[str]:
        return [speaker_name(k) for k in range(len(self.centroids))]


def speaker_name(k: int) -> str:
    return f"spk{k:02d}"


def subsegments(regions: Sequence[Interval], window: float, hop: float) -> List[Tuple[int, float, float]]:
    """Speech regions -> (region index, start, end) windows: every `hop` from the region's start, the
    last one ending at its end; a region of at most `window` seconds is one piece."""
    out = []
    for r, (start, end) in enumerate(regions):
        if end - start <= window:
            out.append((r, start, end))
            continue
        count = int(np.ceil((end - start - window) / hop - 1e-9)) + 1
        for i in range(count):
            s = min(start + i * hop, end - window)
            out.append((r, s, s + window))
    return out


def labels_to_turns(pieces: Sequence[Tuple[int, float, float]], labels: np.ndarray) -> List[Turn]:
    """Sub-segments with speaker labels -> turns: overlaps split in the middle, neighbours of one speaker
    within a region joined."""
    turns: List[Turn] = []
    last_region = -1
    for i, (region, start, end) in enumerate(pieces):
        if i + 1 < len(pieces) and pieces[i + 1][0] == region:
            end = min(end, 0.5 * (end + pieces[i + 1][1]))
        if i > 0 and pieces[i - 1][0] == region:
            start = max(start, 0.5 * (pieces[i - 1][2] + start))
        name = speaker_name(int(labels[i]))
        if turns and region == last_region and turns[-1].speaker == name:
            turns[-1] = Turn(turns[-1].start, end, name)
        else:
            turns.append(Turn(start, end, name))
        last_region = region
    return turns


def embed_window(
    wave: np.ndarray, rate: int, start: float, end: float, min_len: float, min_samples: int = 0
) -> np.ndarray:
    """Samples of [start, end], widened about its centre to `min_len` seconds (at least `min_samples`, the
    model's shortest input) within the wave; a wave shorter than that is repeated up to it."""
    need = max(int(round(min_len * rate)), min_samples)
    a, b = int(round(start * rate)), int(round(end * rate))
    if b - a < need:
        a = max(0, min(len(wave) - need, (a + b - need) // 2))
        b = a + need
    piece = wave[a:b]
    return piece if len(piece) >= need else np.resize(piece, need)


class Diarizer:
    """`Embedder` + speech detector + options (+ the PLDA that vbx clustering needs, fitted to this
    embedder's embeddings) -> `Diarization`s (see the module docstring)."""

    def __init__(
        self,
        embedder: Union["Embedder", "OnnxEmbedder"],
        vad: Optional[Detector] = None,
        options: DiarizeOptions = DiarizeOptions(),
        plda: Optional[PLDA] = None,
        cache: Optional[FrontCache] = None,
        segmenter: Optional["OnnxSegmenter"] = None,
    ):
        if options.method == "vbx" and plda is None:
            raise ValueError("vbx clustering needs a PLDA (speakerlab-plda fits one; --plda FILE)")
        model_id = getattr(embedder, "model_id", "")
        if plda is not None and plda.model_id and model_id and plda.model_id != model_id:
            raise PLDAError(
                f"{plda.where}the PLDA was fitted to the embeddings of model {plda.model_id}, this embedder is "
                f"{model_id}: fit one to this model's embeddings (speakerlab-plda)"
            )
        self.embedder = embedder
        self.vad = vad
        self.options = options
        self.plda = plda
        self.cache = cache
        self.segmenter = segmenter
        self.model_key = model_key(embedder) if cache is not None else ""  # the cache's key of the embeddings

    def diarize_file(
        self,
        path: str,
        count: Optional[SpeakerCount] = None,
        speech: Optional[Sequence[Interval]] = None,
        warn: Optional[Callable[[str], None]] = None,
    ) -> Diarization:
        """A file of any rate (first channel of several, with a message to `warn` naming it); with a cache,
        its speech regions and embeddings are taken from there when a run before made them (cache.py)."""
        wave = self.embedder.read(path, warn)
        entry = None
        if self.cache is not None:
            entry = self.cache.entry(path, repr(self.vad), self.model_key)
        return self.diarize(wave, self.embedder.sample_rate, count, speech, name=str(path), entry=entry)

    def diarize(
        self,
        wave: np.ndarray,
        sample_rate: int,
        count: Optional[SpeakerCount] = None,
        speech: Optional[Sequence[Interval]] = None,
        name: str = "",
        entry: Optional[CacheEntry] = None,
    ) -> Diarization:
        """`(samples,)` float audio at `sample_rate` -> `Diarization`. `speech`: the regions to use
        (oracle speech); otherwise the VAD's. `count`: the speakers allowed (default `SpeakerCount()`, 1 to
        20, estimated). `name` prefixes messages; `entry`: this recording's cache entry."""
        opt = self.options
        count = count or SpeakerCount()
        wave = np.asarray(wave, dtype=np.float32)
        rate = self.embedder.sample_rate
        if sample_rate != rate:
            wave = resample(wave, sample_rate, rate)
        duration = len(wave) / rate
        short = too_short(len(wave), self.embedder)
        if short:  # windows could only repeat it: refused, as every command refuses such input
            raise AudioError(f"{name}: {short}" if name else short)
        notes: List[str] = []
        cached: List[str] = []
        seconds: Dict[str, float] = {}
        t0 = time.perf_counter()
        if speech is None and self.segmenter is not None:
            kit = {"embedder": self.embedder, "segmenter": self.segmenter, "options": opt, "plda": self.plda}
            parts = diarize_segmented(wave, rate, count, **kit, name=name, entry=entry)
            turns = [Turn(s, e, speaker_name(k)) for s, e, k in parts.pop("turns")]
            return Diarization(duration=duration, turns=turns, **parts)
        if speech is None:
            if self.vad is None:
                raise ValueError("no speech regions given and no VAD to find them")
            speech = entry.speech() if entry else None
            if speech is not None:
                cached.append("speech")
            else:
                speech = self.vad(wave if rate == VAD_RATE else resample(wave, rate, VAD_RATE))
                if entry:
                    entry.put_speech(speech)
        seconds["speech"] = time.perf_counter() - t0
        regions = [(max(0.0, s), min(duration, e)) for s, e in speech if min(duration, e) > max(0.0, s)]
        pieces = subsegments(regions, opt.window, opt.hop)
        if not pieces:
            notes.append(f"{name}: no speech found: no turns")
            empty = np.zeros((0, 0), np.float32)
            none = np.zeros(0, np.int64)
            return Diarization(duration, regions, [], np.zeros((0, 2)), none, empty, empty, notes, cached, seconds)
        need = self.embedder.min_samples
        settings = (opt.window, opt.hop, opt.min_embed)
        t0 = time.perf_counter()
        emb = entry.embeddings(settings, regions) if entry else None
        if emb is not None and len(emb) == len(pieces):
            cached.append("embeddings")
        else:
            windows = [embed_window(wave, rate, s, e, opt.min_embed, need) for _, s, e in pieces]
            emb = self.embedder.embed_waves(windows, max_batch=opt.batch_size)
            check_finite([f"{name} {s:.2f}-{e:.2f} s" for _, s, e in pieces], emb)
            if entry:
                entry.put_embeddings(settings, regions, emb)
        seconds["embeddings"] = time.perf_counter() - t0
        if count.min > len(pieces):
            notes.append(
                f"{name}: {count.min} speakers asked for, but the speech gives only {len(pieces)} "
                f"sub-segment(s): {len(pieces)} speaker(s) at most"
            )
        t0 = time.perf_counter()
        labels = cluster(
            emb,
            count,
            opt.method,
            opt.seed,
            opt.pruning,
            opt.threshold,
            opt.merge_cosine,
            opt.max_units,
            self.plda,
            opt.vbx,
        )
        seconds["clustering"] = time.perf_counter() - t0
        x = normalize(emb)
        centroids = normalize(np.stack([x[labels == k].mean(axis=0) for k in range(labels.max() + 1)]))
        return Diarization(
            duration=duration,
            speech=regions,
            turns=labels_to_turns(pieces, labels),
            subsegments=np.array([(s, e) for _, s, e in pieces]),
            labels=labels,
            embeddings=emb,
            centroids=centroids.astype(np.float32),
            notes=notes,
            cached=cached,
            seconds=seconds,
        )
