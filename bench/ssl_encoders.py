"""Peak memory and training samples/s of the published self-supervised front-ends, random weights (not named
ssl.py: run as a script, this directory comes first on sys.path and would shadow the standard library's ssl).

    python bench/ssl_encoders.py                         # every case on the CPU, 2 crops of 3 s, 3 timed steps
    python bench/ssl_encoders.py --device cuda --batch 64 --precision bf16 --cases wavlm_base_plus_mhfa_joint

Each case is one training step of the recipe's model (speakerlab.models.ssl) at its stage's setting: the encoder
frozen (stage 1 of the WavLM recipes), LoRA on the frozen encoder (stage 1 of w2v-BERT 2.0's), or the whole model
(the joint stages): front-end (the wave, or w2v-BERT's stacked fbank) -> encoder -> back-end -> AAM head ->
backward -> AdamW step. The encoders are built from the architecture values of their published config.json files
(microsoft/wavlm-base-plus, facebook/w2v-bert-2.0; transformers' WavLMConfig and Wav2Vec2BertConfig defaults are
those values, spelled out below) with random weights: nothing is downloaded, and speed and memory do not depend on
the weights. Every case runs in a process of its own, so the peak resident memory (CPU; ru_maxrss) or the peak of
allocated GPU memory is the case's alone. Steps are timed after one warm-up step; the median and the range of
`--repeats` steps are printed, with the command and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Architecture values of the published config.json files.
WAVLM_BASE_PLUS = dict(
    model_type="wavlm",
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    conv_dim=[512] * 7,
    conv_kernel=[10, 3, 3, 3, 3, 2, 2],
    conv_stride=[5, 2, 2, 2, 2, 2, 2],
    feat_extract_norm="group",
    do_stable_layer_norm=False,
    num_conv_pos_embeddings=128,
    num_conv_pos_embedding_groups=16,
    num_buckets=320,
    max_bucket_distance=800,
)
W2V_BERT_2 = dict(
    model_type="wav2vec2-bert",
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    feature_projection_input_dim=160,
    conv_depthwise_kernel_size=31,
    position_embeddings_type="relative_key",
    left_max_position_embeddings=64,
    right_max_position_embeddings=8,
    add_adapter=False,
)
# case -> (model, encoder, back-end arguments as in the recipe configs, stage)
CASES = {
    "wavlm_base_plus_mhfa_frozen": ("ssl_mhfa", WAVLM_BASE_PLUS, {"heads": 64, "compression_dim": 128}, "frozen"),
    "wavlm_base_plus_mhfa_joint": ("ssl_mhfa", WAVLM_BASE_PLUS, {"heads": 64, "compression_dim": 128}, "joint"),
    "w2v_bert_2_mfa_lora": ("ssl_mfa", W2V_BERT_2, {"adapter_dim": 128}, "lora"),
    "w2v_bert_2_mfa_lora_checkpointing": ("ssl_mfa", W2V_BERT_2, {"adapter_dim": 128}, "lora+checkpointing"),
}
LORA = {"r": 64, "alpha": 128, "dropout": 0.0, "target_modules": ["linear_q", "linear_v"]}
SPEAKERS = 5994  # VoxCeleb2 dev


def run_case(name: str, args) -> dict:
    """One case in this process: {median_s, min_s, max_s, samples_per_s, peak_gb, params_m, trainable_m}."""
    import torch

    from speakerlab.features.spec import build_features
    from speakerlab.frontends import FeatureSpec, W2VBertFbankConfig, WaveformConfig
    from speakerlab.models import build_model
    from speakerlab.train.losses.margin import AAMSoftmax

    model_name, encoder, backend, stage = CASES[name]
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(
        model_name,
        encoder=encoder,
        lora=LORA if stage.startswith("lora") else None,
        gradient_checkpointing=stage.endswith("checkpointing"),
        **backend,
    )
    model.set_encoder_frozen(stage == "frozen")
    model, head = model.to(device).train(), AAMSoftmax(256, SPEAKERS).to(device)  # both back-ends: 256-dim
    config = W2VBertFbankConfig() if encoder is W2V_BERT_2 else WaveformConfig()
    features = build_features(FeatureSpec(config, encoder is W2V_BERT_2)).to(device)
    params = [p for p in [*model.parameters(), *head.parameters()] if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    wave = 0.1 * torch.randn(args.batch, int(args.seconds * 16000), device=device)
    labels = torch.randint(0, SPEAKERS, (args.batch,), device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    def step():
        x = features(wave)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            emb = model(x)
        loss, _ = head(emb.float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    median = statistics.median(times)
    return {
        "median_s": median,
        "min_s": min(times),
        "max_s": max(times),
        "samples_per_s": args.batch / median,
        "peak_gb": peak,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable_m": sum(p.numel() for p in params) / 1e6,
    }


def machine(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=2, help="crops per step")
    ap.add_argument("--seconds", type=float, default=3.0, help="crop length (the recipes' 3 s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps after the warm-up")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run this case here and print its JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one, args)))
        return 0
    command = "python bench/ssl_encoders.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"# {command.strip()}")
    print(f"# {machine(args.device)}; batch {args.batch} x {args.seconds:g} s, {args.precision}, {args.repeats} steps")
    print("| case | params (M) | trained (M) | step s (median, range) | samples/s | peak memory GB |")
    print("|---|---|---|---|---|---|")
    for name in args.cases:
        child = [sys.executable, __file__, "--one", name, "--device", args.device, "--batch", str(args.batch)]
        child += ["--seconds", str(args.seconds), "--repeats", str(args.repeats), "--precision", args.precision]
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {name} | failed: {done.stderr.strip().splitlines()[-1]} | | | | |")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"| {name} | {r['params_m']:.1f} | {r['trainable_m']:.2f} | {r['median_s']:.2f} "
            f"({r['min_s']:.2f}-{r['max_s']:.2f}) | {r['samples_per_s']:.2f} | {r['peak_gb']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
