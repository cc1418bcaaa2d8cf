"""Diarization with a segmentation model, pyannote community-1's way: local speakers per window -> one embedding
per (window, local speaker) from its frames without overlap -> clustering -> frame-level reconstruction.

    parts = diarize_segmented(wave, rate, count, embedder=e, segmenter=s, options=o, plda=p, name="conv0001")
    parts["turns"]      # [(start, end, speaker index), ...] in time order; the rest: Diarization's fields

speakerlab.diarization.pipeline.Diarizer calls it when it has a segmenter (and makes the `Diarization`; this module
does not import the pipeline, which imports it).

1. The segmenter (speakerlab.diarization.segmenter) gives the local speakers' activities (W, T, K) of windows of
   `options.seg_window` seconds every `options.seg_step` seconds (frames of 20 ms).
2. Each local speaker active for at least `MIN_ACTIVE` seconds of a window is embedded from the samples of the
   frames where it talks alone, joined; where those are shorter than `options.min_embed`, from all its frames
   (a voice under another is still that voice; nothing at all would lose the window's speaker).
3. The embeddings are clustered as the pipeline's sub-segments are (spectral, AHC or VBx on a PLDA, the count
   estimated or given: speakerlab.diarization.clustering.cluster), but VBx with `options.seg_loop_p` (0: they are
   not one speaker after another); with `options.cannot_link`, AHC (or VBx's AHC start) never joins two local
   speakers of one window (clustering.constrained). Each window's local speakers then take distinct clusters, the
   assignment of highest total cosine to the cluster centroids (two local speakers of one window are two people).
4. Reconstruction: each frame of the recording gets the mean, over the windows that cover it, of each cluster's
   activity, and the mean local speaker count rounded; the frame is given the `count` most active clusters.
   So overlapped frames get two speakers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.dataio.tables.rttm import Interval, merge_intervals
from speakerlab.dataio.waveform.resample import resample
from speakerlab.diarization.clustering.cluster import SpeakerCount, cluster, normalize
from speakerlab.diarization.clustering.constrained import cluster_constrained
from speakerlab.inference.common import check_finite

if TYPE_CHECKING:
    from speakerlab.diarization.cache import CacheEntry
    from speakerlab.diarization.clustering.plda import PLDA
    from speakerlab.diarization.segmenter import OnnxSegmenter

# A local speaker of a window active for less than this (seconds) is not embedded: too little to say who it is
# (its frames still count towards the number of speakers of the frame).
MIN_ACTIVE = 0.2


class LocalSpeakers:
    """The segmenter's windows over one recording: activities (W, T, K) 0/1, window w starting at recording
    frame w * step; `num_frames` frames of the recording (centres before its end), `hop` and `first` (the
    centre of frame 0) and `duration` (the recording's) in seconds."""

    def __init__(self, acts: np.ndarray, step: int, hop: float, first: float, duration: float):
        self.acts, self.step, self.hop, self.first, self.duration = acts, step, hop, first, duration
        self.num_frames = max(1, int(np.ceil((duration - first) / hop)))

    def window_frames(self, w: int) -> Tuple[int, int]:
        """The recording frames [a, b) that window w covers (within the recording), and w's first frame is a."""
        a = w * self.step
        return a, min(a + self.acts.shape[1], self.num_frames)

    def aggregate(self, values: np.ndarray) -> np.ndarray:
        """(W, T, C) per-window values -> (F, C) their mean over the windows covering each recording frame."""
        total = np.zeros((self.num_frames, values.shape[-1]))
        covers = np.zeros((self.num_frames, 1))
        for w in range(len(values)):
            a, b = self.window_frames(w)
            total[a:b] += values[w, : b - a]
            covers[a:b] += 1
        return total / np.maximum(covers, 1)

    def spans(self, frames: np.ndarray, offset: int = 0) -> List[Interval]:
        """Frame indices (of a window starting at recording frame `offset`) -> merged intervals in seconds, each
        frame reaching half a hop either side of its centre: a run of consecutive frames is one interval."""
        frames = np.asarray(frames, dtype=np.int64) + offset
        if not len(frames):
            return []
        breaks = np.flatnonzero(np.diff(frames) > 1)
        firsts, lasts = frames[np.r_[0, breaks + 1]], frames[np.r_[breaks, len(frames) - 1]]
        starts = self.first + firsts * self.hop - self.hop / 2
        return [(float(s), float(s + (b - a + 1) * self.hop)) for s, a, b in zip(starts, firsts, lasts)]


def local_speakers(
    segmenter: "OnnxSegmenter",
    wave: np.ndarray,
    rate: int,
    window: float,
    step: float,
    entry: Optional["CacheEntry"] = None,
) -> Tuple[LocalSpeakers, bool]:
    """(S,) wave at `rate` -> the segmenter's `LocalSpeakers` of windows of `window` s every `step` s, and whether
    they came from the cache `entry` (where given, what is computed is put there)."""
    found = entry.local(segmenter.model_id, window, step) if entry else None
    if found is None:
        x = wave if rate == segmenter.sample_rate else resample(wave, rate, segmenter.sample_rate)
        acts, frames = segmenter.sliding(x, window, step)
        if entry:
            entry.put_local(segmenter.model_id, window, step, acts, frames)
    else:
        acts, frames = found
    hop = segmenter.hop / segmenter.sample_rate
    local = LocalSpeakers(acts, frames, hop, float(segmenter.frame_centres(1)[0]), len(wave) / rate)
    return local, found is not None


def speaker_spans(local: LocalSpeakers, min_embed: float) -> List[Tuple[int, int, List[Interval]]]:
    """(window, local speaker, spans in seconds) of every local speaker active >= MIN_ACTIVE s in a window: the
    frames where it talks alone, or all its frames where those are shorter than `min_embed` s (module docstring)."""
    out = []
    for w in range(len(local.acts)):
        a, b = local.window_frames(w)
        acts = local.acts[w, : b - a]
        alone = acts.sum(-1) == 1
        for k in range(acts.shape[1]):
            on = acts[:, k] > 0
            if on.sum() * local.hop < MIN_ACTIVE:
                continue
            frames = np.flatnonzero(on & alone)
            if len(frames) * local.hop < min_embed:
                frames = np.flatnonzero(on)
            out.append((w, k, local.spans(frames, a)))
    return out


def gather(wave: np.ndarray, rate: int, spans: Sequence[Interval], need: int) -> np.ndarray:
    """The samples of `spans` (seconds) joined; repeated up to `need` samples when shorter."""
    piece = np.concatenate([wave[int(round(s * rate)) : int(round(e * rate))] for s, e in spans])
    return piece if len(piece) >= need else np.resize(piece, need)


def assign_within_windows(keys: Sequence[Tuple[int, int]], x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(N,) the cluster of each (window, local speaker) of `keys`: per window, distinct clusters of the highest
    total cosine between unit embeddings `x` (N, D) and `centroids` (C, D); -1 for a local speaker left without
    one (more local speakers in the window than clusters)."""
    from scipy.optimize import linear_sum_assignment

    out = np.full(len(keys), -1, dtype=np.int64)
    windows = np.array([w for w, _ in keys])
    sims = x @ centroids.T
    for w in np.unique(windows):
        rows = np.flatnonzero(windows == w)
        picked, clusters = linear_sum_assignment(-sims[rows])
        out[rows[picked]] = clusters
    return out


def keep_keys(assigned: np.ndarray, labels: np.ndarray, sims: np.ndarray, least: int) -> np.ndarray:
    """`assigned` (N,) of `assign_within_windows` with at least `least` clusters holding a (window, local speaker)
    (as many as there are clusters, at most): a cluster left without one takes its own member (`labels` (N,)) most
    like it (`sims` (N, C) cosines to the centroids) among those whose cluster keeps another; strongest first."""
    out = assigned.copy()
    for c in np.argsort(-sims.max(axis=0), kind="stable"):
        held = np.bincount(out[out >= 0], minlength=sims.shape[1])
        if (held > 0).sum() >= least:
            break
        if held[c]:
            continue
        spare = (out < 0) | (held[np.maximum(out, 0)] > 1)
        pool = np.flatnonzero(spare & (labels == c))
        pool = pool if len(pool) else np.flatnonzero(spare)
        if len(pool):
            out[pool[np.argmax(sims[pool, c])]] = c
    return out


def reconstruct(local: LocalSpeakers, keys, assigned: np.ndarray, num_clusters: int, least: int = 0) -> np.ndarray:
    """(F, C) bool: per recording frame, the `count` clusters most active over the windows covering it (count:
    the windows' mean local speaker count, rounded, at most C), among those with any activity there. Where fewer
    than `least` clusters get a frame so (a count asked for), those left out with activity, most active first,
    take the frames where they are at least half as active as at their peak, each in place of the least active
    speaker there that keeps frames elsewhere (on top of none: the frames the segmentation heard stay as many)."""
    per_cluster = np.zeros((*local.acts.shape[:2], num_clusters))
    for (w, k), c in zip(keys, assigned):
        if c >= 0:
            per_cluster[w, :, c] = np.maximum(per_cluster[w, :, c], local.acts[w, :, k])
    score = local.aggregate(per_cluster)
    count = np.minimum(np.rint(local.aggregate(local.acts.sum(-1, keepdims=True))[:, 0]), num_clusters).astype(int)
    order = np.argsort(-score, axis=1, kind="stable")
    on = np.zeros(score.shape, bool)
    rows = np.arange(len(score))
    for j in range(int(count.max(initial=0))):
        pick = rows[count > j]
        best = order[pick, j]
        keep = score[pick, best] > 0
        on[pick[keep], best[keep]] = True
    for c in np.argsort(-score.max(axis=0), kind="stable"):
        if on.any(axis=0).sum() >= least:
            break
        if on[:, c].any() or score[:, c].max() <= 0:
            continue
        for f in np.flatnonzero(score[:, c] >= 0.5 * score[:, c].max()):
            there = [k for k in np.flatnonzero(on[f]) if on[:, k].sum() > 1]
            if there:
                on[f, min(there, key=lambda k: score[f, k])] = False
                on[f, c] = True
    return on


def diarize_segmented(
    wave: np.ndarray,
    rate: int,
    count: SpeakerCount,
    *,
    embedder,
    segmenter: "OnnxSegmenter",
    options,
    plda: Optional["PLDA"] = None,
    name: str = "",
    entry: Optional["CacheEntry"] = None,
) -> dict:
    """(S,) float32 wave at `rate` (the embedder's), with a pipeline's DiarizeOptions -> the fields of its
    `Diarization` but `duration` (module docstring): `turns` as (start, end, speaker index), `subsegments` the
    embedded (window, local speaker) stretches (first to last frame used), `labels` their speakers (-1: none).
    With a cache `entry`, the windows' activities and the local speakers' embeddings come from it where a system
    before made them with the same model and settings (`cached` says which), and go into it where not."""
    t0 = time.perf_counter()
    local, from_cache = local_speakers(segmenter, wave, rate, options.seg_window, options.seg_step, entry)
    cached = ["speech"] if from_cache else []  # the segmentation: the pipeline's stage names
    found = speaker_spans(local, options.min_embed)
    seconds = {"speech": time.perf_counter() - t0}
    if not found:
        parts = clustered(local, found, np.zeros((0, 0), np.float32), count, options, plda, name, seconds)
        return {**parts, "cached": cached}
    t0 = time.perf_counter()
    need = max(int(round(options.min_embed * rate)), embedder.min_samples)
    settings = (options.min_embed, need)
    emb = entry.span_embeddings(settings, found) if entry else None
    if emb is not None and len(emb) == len(found):
        cached.append("embeddings")
    else:
        emb = embedder.embed_waves([gather(wave, rate, s, need) for _, _, s in found], max_batch=options.batch_size)
        check_finite([f"{name} window {w} speaker {k}" for w, k, _ in found], emb)
        if entry:
            entry.put_span_embeddings(settings, found, emb)
    seconds["embeddings"] = time.perf_counter() - t0
    return {**clustered(local, found, emb, count, options, plda, name, seconds), "cached": cached}


def clustered(
    local: LocalSpeakers,
    found: Sequence[Tuple[int, int, List[Interval]]],
    emb: np.ndarray,
    count: SpeakerCount,
    options,
    plda: Optional["PLDA"] = None,
    name: str = "",
    seconds: Optional[dict] = None,
) -> dict:
    """Steps 3-4 of the module docstring: the `speaker_spans` of `local` and their embeddings (N, D) -> the
    dict of `diarize_segmented` (the turns of a recording of `local.duration` seconds; bench scripts call it to
    re-cluster the same embeddings with other settings)."""
    seconds = dict(seconds or {})
    duration = local.duration
    notes: List[str] = []
    if not found:
        notes.append(f"{name}: no speech found: no turns")
        empty = np.zeros((0, 0), np.float32)
        none = {"subsegments": np.zeros((0, 2)), "labels": np.zeros(0, np.int64), "embeddings": empty}
        return {"speech": [], "turns": [], **none, "centroids": empty, "notes": notes, "seconds": seconds}
    t0 = time.perf_counter()
    if count.min > len(found):
        notes.append(
            f"{name}: {count.min} speakers asked for, but the segmentation finds {len(found)} local speaker(s)"
        )
    if options.cannot_link and options.method != "spectral":
        windows = np.array([w for w, _, _ in found])
        labels = cluster_constrained(emb, windows, count, options.method, options.threshold, plda, options.seg_vbx)
    else:
        labels = cluster(
            emb,
            count,
            options.method,
            options.seed,
            options.pruning,
            options.threshold,
            options.merge_cosine,
            options.max_units,
            plda,
            options.seg_vbx,
        )
    x = normalize(emb)
    centroids = normalize(np.stack([x[labels == c].mean(axis=0) for c in range(labels.max() + 1)]))
    keys = [(w, k) for w, k, _ in found]
    assigned = keep_keys(assign_within_windows(keys, x, centroids), labels, x @ centroids.T, count.min)
    on = reconstruct(local, keys, assigned, len(centroids), least=count.min)
    # Speakers named in order of first appearance; a cluster left without frames is dropped (as long as the count
    # asked for keeps: keep_keys and reconstruct give up to `count.min` clusters frames).
    firsts = [(int(np.argmax(on[:, c])), c) for c in range(on.shape[1]) if on[:, c].any()]
    rename = {c: i for i, (_, c) in enumerate(sorted(firsts))}
    turns = [
        (max(0.0, s), min(duration, e), rename[c]) for c in rename for s, e in local.spans(np.flatnonzero(on[:, c]))
    ]
    turns.sort()
    order = sorted(rename, key=rename.get)
    seconds["clustering"] = time.perf_counter() - t0  # with the reconstruction
    return dict(
        speech=merge_intervals((s, e) for s, e, _ in turns),
        turns=turns,
        subsegments=np.array([(s[0][0], s[-1][1]) for _, _, s in found]),
        labels=np.array([rename.get(int(c), -1) for c in assigned], dtype=np.int64),
        embeddings=emb,
        centroids=centroids[order].astype(np.float32),
        notes=notes,
        seconds=seconds,
    )
