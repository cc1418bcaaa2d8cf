#!/usr/bin/env bash
# egs/mini_ssl: speaker embeddings without speaker labels on egs/mini's synthetic corpus, labels hidden, CPU only.
#   bash egs/mini_ssl/run.sh                       # stages 1-5: SimCLR, then its EER on the test trials
#   bash egs/mini_ssl/run.sh --stage 10 --stop_stage 10 --rounds 1   # pseudo-label rounds, then
#   bash egs/mini_ssl/run.sh --stage 4 --stop_stage 5 --exp exp/ssl_pl1
#   bash egs/mini_ssl/run.sh --config ../../conf/mini/dino.yaml --exp exp/dino   # DINO instead
# Stages (the numbers of every recipe): 1 the corpus (egs/mini's), its training set as an unlabelled data dir
# (wav.scp only; data/train keeps the true labels, read by nothing but stage 10's purity print), its MUSAN/RIR
# lists; 2 lists checked, lengths indexed, fbank stores of val/test, the noise bank; 3 self-supervised training
# (conf/mini/simclr.yaml; every crop augmented on its own from the noise bank); 4 embeddings; 5 scoring and the
# no-training baseline; 10 pseudo-label rounds: embed, cluster, train the supervised CAM++ from the last model.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
help_message="Usage: bash egs/mini_ssl/run.sh [--stage N] [--stop_stage N] [--option value ...]"

opt stage 1
opt stop_stage 5
opt data data
opt exp exp/ssl                   # stages 3-5 (and 4-5 of a round: exp/ssl_pl<r>)
opt config ../../conf/mini/simclr.yaml  # or dino.yaml (DINO)
opt supervised_config ../../conf/mini/campplus.yaml  # stage 10: the supervised recipe trained on the clusters
opt rounds 1 count                # stage 10: pseudo-label rounds
opt clusters 400 clusters         # stage 10: pseudo-speakers (the corpus's 400 voices; "estimate": AHC on a sample
                                  # says how many). 400 with none dropped beat 1,600 with half dropped on the
                                  # validation EER (9.83 against 11.56 %; bench/RESULTS.md, "How pure must a round's
                                  # labels be")
opt drop 0 share                  # stage 10: share of least confident utterances dropped (0.2: validation 10.44 %)
opt hardware cpu
opt seed 1234
opt jobs 2 count
opt corpus_opts ""
opt train_overrides ""            # stage 3
opt round_epochs 20 count         # stage 10: each round's epochs. 20 against 10, from the 30-epoch start: validation
                                  # EER 0.8 and 1.0 points lower (two seeds), test EER 1.3 and 1.7; from the 10-epoch
                                  # start 0.06 and 1.0 (bench/RESULTS.md, "A round of 20 epochs, a second seed")
opt round_overrides ""            # stage 10's training, e.g. "optim.lr=0.006"
launch_options none

. ../tools/parse_options.sh
# Stage 10's pseudo-labels need scikit-learn: a fresh clone's environment gets it here
export SPEAKERLAB_REQUIREMENTS="${SPEAKERLAB_REQUIREMENTS:-egs/tools/requirements-selfsup.txt}"
. ../tools/env.sh

unlabelled="$data/train_unlabelled"
# Without per-crop augmentation the crops of one utterance share its session (background noise, SNR, level):
# self-supervision then learns the session, not the voice (docs/selfsup.md, "What self-supervision learns on this
# corpus").
train_data=(data.train="$unlabelled" data.val="$data/val" augment.lists="$data/musan_rirs")
preflight --config "$config" --exp-dir "$exp" --hardware "$hardware" "${train_data[@]}" $train_overrides

if stage_on 1; then
  log "stage 1: synthetic corpus -> $data; its training set without labels -> $unlabelled"
  speakerlab-synth --out "$data" --seed "$seed" --jobs "$jobs" $corpus_opts
  mkdir -p "$unlabelled"
  cp "$data/train/wav.scp" "$unlabelled/wav.scp"
  speakerlab-musan-rirs prepare --raw-dir "$data" --out "$data/musan_rirs"
fi

if stage_on 2; then
  log "stage 2: features: lists checked, lengths indexed; fbank stores of val/test (stage 3 reads the audio)"
  speakerlab-prepare --data "$unlabelled" --data "$data/val" --data "$data/test"
  speakerlab-feature-store --config "$supervised_config" --data "$data/val" --data "$data/test"
  speakerlab-noise-bank --lists "$data/musan_rirs"
fi

if stage_on 3; then
  log "stage 3: self-supervised $config on $unlabelled -> $exp"
  launch speakerlab-train --config "$config" --exp-dir "$exp" --hardware "$hardware" "${train_data[@]}" \
    $train_overrides
fi

if stage_on 4; then
  log "stage 4: embeddings of $data/test"
  speakerlab-extract --checkpoint "$exp" --data "$data/test" --out "$exp/embeddings/test.npz"
fi

if stage_on 5; then
  log "stage 5: score the test trials; then the no-training baseline"
  speakerlab-score --embeddings "$exp/embeddings/test.npz" --trials "$data/test/trials" --out "$exp/scores/test"
  speakerlab-baseline --data "$data/test" --out "$exp/scores/test_baseline"
fi

if stage_on 10; then
  count="--clusters $clusters"; [ "$clusters" = estimate ] && count="--estimate"
  pseudo_label_opts="$count --drop $drop --seed $seed --true-labels $data/train/utt2spk"
  # The rounds train with the corpus's augmentation and the equaliser: without them a round on these clusters lost
  # ground (bench/RESULTS.md, "Contrastive views that share no audio, and a random equaliser"). AAM margin 0.5, not
  # the supervised recipe's 0.2: on clusters four-fifths wrong it gained 0.8-0.9 points from both starts measured
  # (bench/RESULTS.md, "The round's margin from the 30-epoch start"); --round_overrides loss.margin=M comes after it.
  pseudo_label_rounds "$rounds" "$exp" "$unlabelled" "$supervised_config" data.val="$data/val" data.feats=false \
    augment.lists="$data/musan_rirs" augment.eq_prob=1 loss.margin=0.5 train.epochs="$round_epochs" \
    $round_overrides
fi
log "done"
