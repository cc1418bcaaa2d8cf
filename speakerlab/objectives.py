"""The settings of the self-supervised objectives: the config's `dino` section (loss.name dino), torch-free like
the config that reads it (speakerlab.train.losses.dino implements it).

Defaults are the published DINO speaker recipes', each with its source: WeSpeaker examples/voxceleb/v3/dino
(conf/ecapa_tdnn.yaml: ECAPA c512 3.016% Vox1-O, c1024 2.627%, 150 epochs), 3D-Speaker egs/voxceleb/sv-rdino
(RDINO, 3.29% in the paper, 3.05% re-run) and the DINO paper (Caron et al., ICCV 2021).
"""

from __future__ import annotations

from dataclasses import dataclass

from speakerlab.settings import ConfigError, setting


@dataclass
class DinoSettings:
    """Self-distillation without labels: a student (the embedding model + a projection head) is trained to match,
    on every crop of an utterance, a teacher's sharpened and centred output on the other global crops; the teacher
    is the student's exponential moving average."""

    # Projection head: MLP of head_layers linear layers (hidden_dim wide, BatchNorm between when head_batchnorm)
    # to bottleneck_dim, L2-normalised, then a weight-normalised linear layer onto `prototypes` (its norm fixed to 1).
    prototypes: int = setting(65536, ge=2)  # WeSpeaker dino_head_args.out_dim
    hidden_dim: int = setting(2048, ge=1)  # DINO's head
    bottleneck_dim: int = setting(256, ge=1)  # DINO's head
    head_layers: int = setting(3, ge=0)  # WeSpeaker nlayers; 0: no MLP, SimCLR on the embedding (WeSpeaker mlp False)
    head_batchnorm: bool = True  # WeSpeaker use_bn, 3D-Speaker use_bn_in_head
    # Multi-crop: crops of one loaded training crop (data.crop_seconds, which must hold the longest) at random
    # offsets; the teacher sees the global crops, the student all of them.
    global_crops: int = setting(2, ge=2)  # WeSpeaker global_chunk_num
    global_seconds: float = setting(3.0, gt=0)  # WeSpeaker global_chunk_len 300 frames
    local_crops: int = setting(4, ge=0)  # WeSpeaker local_chunk_num
    local_seconds: float = setting(2.0, gt=0)  # WeSpeaker local_chunk_len 200 frames
    # Global crops that share no audio: crop g is cut from the g-th of global_crops equal parts of the loaded crop
    # (data.crop_seconds >= global_crops x global_seconds). Off (the papers'): anywhere, so on utterances not much
    # longer than two crops they share most of their audio, words included: a match that needs no voice.
    disjoint_globals: bool = False
    # Sharpening: softmax temperatures; the teacher's rises linearly from teacher_temp_start over the warm-up.
    student_temp: float = setting(0.1, gt=0)  # WeSpeaker student_temp
    teacher_temp: float = setting(0.07, gt=0)  # WeSpeaker, 3D-Speaker teacher_temp
    teacher_temp_start: float = setting(0.04, gt=0)  # WeSpeaker, 3D-Speaker warmup_teacher_temp
    teacher_temp_warmup_epochs: float = setting(30.0, ge=0)  # 3D-Speaker 30; WeSpeaker 0.2 x 150 epochs
    # Centering: the teacher's outputs minus a running mean of them (momentum per optimizer step).
    center_momentum: float = setting(0.9, ge=0, lt=1)  # WeSpeaker center_momentum
    # The teacher's EMA momentum rises from teacher_momentum to 1 along a half cosine over the run.
    teacher_momentum: float = setting(0.996, ge=0, le=1)  # WeSpeaker, 3D-Speaker momentum_teacher
    freeze_prototypes_epochs: float = setting(1.0, ge=0)  # the prototype layer takes no gradient this long
    # (WeSpeaker, 3D-Speaker freeze_last_layer: 1)
    # The self-distillation term (teacher, prototypes); 0 with contrastive_weight > 0 is SimCLR alone: no teacher
    # pass, no prototypes, no local crops
    distill_weight: float = setting(1.0, ge=0)
    # Contrastive term: InfoNCE between the global crops of the micro-batch, the crops of one utterance positives,
    # every other crop a negative, on the unit outputs of the head's MLP (the bottleneck). SimCLR: WeSpeaker
    # examples/voxceleb/v3/simclr (8.52% Vox1-O, ECAPA c512); beside self-distillation: C3-DINO (Zhang et al. 2022).
    contrastive_weight: float = setting(0.0, ge=0)
    contrastive_temp: float = setting(0.07, gt=0)  # WeSpeaker simclr_args T
    koleo_weight: float = setting(0.0, ge=0)  # KoLeo spreading term on the student's unit embeddings (DINOv2: 0.1)
    # RDINO's regularisers on the student's embeddings (the mean over the global crops, per micro-batch): diversity,
    # a hinge pulling each dimension's std across the batch up to 1; redundancy elimination, the squared
    # off-diagonal covariances / D. 3D-Speaker sv-rdino: lambd 0.2 x std_coeff 10 = 2.0, lambd 0.2 x cov_coeff 1 = 0.2.
    diversity_weight: float = setting(0.0, ge=0)
    redundancy_weight: float = setting(0.0, ge=0)
    # End of run: the embeddings are collapsed when their spread (per-dimension std of the unit embeddings across
    # the batch x sqrt(D): about 1 when spread over the sphere, 0 when all alike) is below this.
    collapse_spread: float = setting(0.05, ge=0, lt=1)


def check_dino(d: DinoSettings, crop_seconds: float) -> None:
    """The rules that tie the dino section's keys to each other and to data.crop_seconds (ConfigError naming the
    key)."""
    for key, seconds in (("dino.global_seconds", d.global_seconds), ("dino.local_seconds", d.local_seconds)):
        if seconds > crop_seconds and (key != "dino.local_seconds" or d.local_crops):  # no local crops: unused
            raise ConfigError(
                f"config key '{key}' ({seconds:g}) must be <= data.crop_seconds ({crop_seconds:g}): the crops "
                "are cut from the loaded training crop"
            )
    if d.disjoint_globals and d.global_crops * d.global_seconds > crop_seconds + 1e-9:
        raise ConfigError(
            f"config key 'dino.disjoint_globals': {d.global_crops} global crops of {d.global_seconds:g} s that share "
            f"no audio need data.crop_seconds >= {d.global_crops * d.global_seconds:g} (it is {crop_seconds:g})"
        )
    if d.distill_weight == 0 and d.contrastive_weight == 0:
        raise ConfigError("config key 'dino.distill_weight': 0 with dino.contrastive_weight 0 leaves nothing to learn")
    if d.head_layers == 0 and d.distill_weight > 0:
        raise ConfigError(
            "config key 'dino.head_layers': 0 (no projection MLP) is for SimCLR alone (dino.distill_weight 0); "
            "self-distillation's prototypes need the bottleneck"
        )
    if d.distill_weight == 0 and d.local_crops:
        raise ConfigError(
            f"config key 'dino.local_crops' ({d.local_crops}): without self-distillation (dino.distill_weight 0) "
            "only the global crops are contrasted; set it to 0"
        )
