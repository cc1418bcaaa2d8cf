"""Self-supervised speech encoders of transformers (WavLM, wav2vec 2.0, HuBERT, w2v-BERT 2.0) as speaker-model
front-ends: built from a local pretrained directory (never the hub) or from a config, optionally with LoRA
(peft), returning every hidden layer.

    encoder = SSLEncoder(pretrained="/models/wavlm-base-plus")          # config.json + weights
    hidden = encoder(wave)            # (B, samples) -> (num_layers + 1) x (B, frames, hidden_size)
    encoder = SSLEncoder(config={"model_type": "wav2vec2-bert", ...})   # random weights (tests, egs/mini)
    hidden = encoder(feats)           # w2v-BERT: (B, T, 160) stacked fbank (speakerlab.features.w2vbert)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn

# config.json model_type -> (transformers class, the front-end kind it takes, default LoRA targets)
FAMILIES: Dict[str, Tuple[str, str, Tuple[str, ...]]] = {
    # WavLM's attention hands its q/k/v/out projection weights to F.multi_head_attention_forward without
    # calling those modules, so LoRA on them would never act: its default targets are the feed-forward.
    "wavlm": ("WavLMModel", "waveform", ("feed_forward.intermediate_dense", "feed_forward.output_dense")),
    "wav2vec2": ("Wav2Vec2Model", "waveform", ("q_proj", "v_proj")),
    "hubert": ("HubertModel", "waveform", ("q_proj", "v_proj")),
    "wav2vec2-bert": ("Wav2Vec2BertModel", "w2vbert_fbank", ("linear_q", "linear_v")),
}
UNREACHABLE = {"wavlm": ("q_proj", "k_proj", "v_proj", "out_proj")}
LORA_KEYS = {"r", "alpha", "dropout", "target_modules"}
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
HOW_TO_GET = (
    "on a machine with internet: `hf download microsoft/wavlm-base-plus --local-dir DIR` (or facebook/w2v-bert-2.0, "
    "microsoft/wavlm-large, ...), then copy DIR here and set model.args.pretrained to it"
)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def require_ssl():
    """transformers (and peft present), or an ImportError naming the extra that installs them. peft is looked up,
    not imported: only LoRA needs it (lora_config imports it then), and its import pulls in transformers'
    language-model code (an SSL model's build 8.0 -> 7.4 s without it on the 2-core Intel VM)."""
    import importlib.util

    try:
        if importlib.util.find_spec("peft") is None:
            raise ImportError("No module named 'peft'")
        import transformers
    except ImportError as e:
        raise ImportError(
            f"self-supervised front-ends need transformers and peft ({e}): pip install -e .[ssl]"
        ) from None
    transformers.logging.set_verbosity_error()  # no weight-loading chatter: errors still raise
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _family(model_type: Any, where: str) -> Tuple[str, str, Tuple[str, ...]]:
    if model_type not in FAMILIES:
        raise ValueError(f"{where}: model_type {model_type!r} is not a supported encoder ({', '.join(FAMILIES)})")
    return FAMILIES[model_type]


def load_pretrained(directory: str, overrides: Mapping[str, Any]) -> nn.Module:
    """The transformers model saved in `directory` (config.json + weights), local files only."""
    import json

    d = Path(directory)
    where = f"model.args.pretrained {d}"
    if not (d / "config.json").is_file():
        raise ValueError(f"{where}: no config.json there; get the weights {HOW_TO_GET}")
    if not any((d / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{where}: no weights ({' or '.join(WEIGHT_FILES)}); get them {HOW_TO_GET}")
    model_type = json.loads((d / "config.json").read_text()).get("model_type")
    cls = getattr(require_ssl(), _family(model_type, where)[0])
    try:
        return cls.from_pretrained(str(d), local_files_only=True, **overrides)
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{where}: cannot load as {cls.__name__}: {e}") from None


def preprocessor_normalizes(directory: str) -> Optional[bool]:
    """`do_normalize` of the directory's preprocessor_config.json (whether the encoder was trained on waves of
    zero mean and unit variance), None without one."""
    import json

    path = Path(directory) / "preprocessor_config.json"
    return json.loads(path.read_text()).get("do_normalize") if path.is_file() else None


def from_config(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> nn.Module:
    """A randomly initialised transformers model of `config` (a config.json as a dict, with model_type)."""
    transformers = require_ssl()
    settings = dict(config)
    model_type = settings.pop("model_type", None)
    cls = getattr(transformers, _family(model_type, "model.args.encoder")[0])
    return cls(transformers.AutoConfig.for_model(model_type, **{**settings, **overrides}))


def lora_config(lora: Mapping[str, Any], model_type: str):
    """peft's LoraConfig from `model.args.lora` ({r, alpha, dropout, target_modules}); errors name the key."""
    from peft import LoraConfig

    if not isinstance(lora, Mapping):
        raise ValueError(
            f"model.args.lora must be a mapping {{r, alpha, dropout, target_modules}} or null, got {lora!r}"
        )
    unknown = sorted(set(lora) - LORA_KEYS)
    if unknown:
        raise ValueError(f"model.args.lora: unknown key(s) {unknown} (known: {', '.join(sorted(LORA_KEYS))})")
    targets = list(lora.get("target_modules") or FAMILIES[model_type][2])
    dead = [t for t in targets if t.split(".")[-1] in UNREACHABLE.get(model_type, ())]
    if dead:
        raise ValueError(
            f"model.args.lora.target_modules {dead}: {model_type}'s attention reads these weights without calling "
            f"the modules, so LoRA there would never act; use e.g. {list(FAMILIES[model_type][2])}"
        )
    r, alpha, dropout = int(lora.get("r", 64)), float(lora.get("alpha", 128)), float(lora.get("dropout", 0.0))
    if r < 1 or alpha <= 0 or not 0 <= dropout < 1:
        raise ValueError(f"model.args.lora: need r >= 1, alpha > 0, 0 <= dropout < 1; got {dict(lora)}")
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")


class SSLEncoder(nn.Module):
    """A transformers speech encoder: `(B, samples)` waves, or `(B, T, 160)` for w2v-BERT, -> a tuple of
    `num_layers + 1` hidden states `(B, frames, hidden_size)` (the input embedding, then every layer).

    Exactly one of `pretrained` (a local directory with config.json and weights) or `config` (a config
    dict with `model_type`: random weights). SpecAugment-style masking inside the encoder is off (its
    mask embedding takes no part and is not trained); `layerdrop` is the encoder's own. `lora`:
    `{r, alpha, dropout, target_modules}` adapters (peft) on the encoder, whose other weights are then
    frozen for good. `config_dict()` rebuilds the same architecture without the directory.
    """

    def __init__(
        self,
        pretrained: Optional[str] = None,
        config: Optional[Mapping[str, Any]] = None,
        lora: Optional[Mapping[str, Any]] = None,
        gradient_checkpointing: bool = False,
        layerdrop: float = 0.0,
    ):
        super().__init__()
        if (pretrained is None) == (config is None):
            raise ValueError("model.args: give exactly one of pretrained (a directory) or encoder (a config)")
        overrides = {"apply_spec_augment": False, "layerdrop": float(layerdrop)}
        model = load_pretrained(pretrained, overrides) if pretrained else from_config(config, overrides)
        self.do_normalize = preprocessor_normalizes(pretrained) if pretrained else None
        self.model_type = model.config.model_type
        self.input_kind = FAMILIES[self.model_type][1]
        self.num_layers = int(model.config.num_hidden_layers)
        self.hidden_size = int(model.config.hidden_size)
        self._config = model.config.to_dict()
        if getattr(model, "masked_spec_embed", None) is not None:
            model.masked_spec_embed.requires_grad_(False)  # used only by the masking turned off above
        if gradient_checkpointing:  # renamed in transformers 5.2x; 5.17 has the old name only
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = None
        if lora:
            from peft import get_peft_model

            model = get_peft_model(model, lora_config(lora, self.model_type))
            self.lora = dict(lora)
        self.model = model
        self.frozen = False

    def config_dict(self) -> Dict[str, Any]:
        """The encoder's config (with model_type): rebuilds this architecture, random weights."""
        return dict(self._config)

    def trainable(self) -> List[nn.Parameter]:
        """Parameters the optimizer may update (LoRA's only, with LoRA), whether frozen now or not."""
        skip = {id(getattr(self.base_model(), "masked_spec_embed", None))}
        lora_only = self.lora is not None
        return [p for n, p in self.model.named_parameters() if id(p) not in skip and (not lora_only or "lora_" in n)]

    def base_model(self) -> nn.Module:
        return self.model.get_base_model() if self.lora else self.model

    def set_frozen(self, frozen: bool) -> None:
        """Freeze (no gradients, eval mode: dropout off) or release the trainable encoder weights."""
        self.frozen = frozen
        for p in self.trainable():
            p.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True) -> "SSLEncoder":
        super().train(mode)
        if self.frozen:
            self.model.eval()
        return self

    def depth(self, name: str) -> int:
        """Depth of the parameter `name` (relative to this module) for layer-wise LR decay: transformer
        layer i is i + 1; everything before the layers (convolutional feature encoder, projections,
        positional convolution, and norms outside the layers) is 0."""
        m = _LAYER.search(name)
        return int(m.group(1)) + 1 if m else 0

    def merge_lora(self) -> None:
        """Fold the LoRA adapters into the encoder's weights (peft's merge): plain weights, same outputs."""
        if self.lora:
            self.model = self.model.merge_and_unload()
            self.lora = None

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return self.model(x, output_hidden_states=True).hidden_states
