"""The one interface objectives use to reach an encoder family (BERT, ModernBERT).

Objectives never name a transformers class: they ask the backbone for a masked LM, a bare
encoder, a generator or a per-token discriminator, run them through `encode`, and read the
FLOPs from it. Every model it builds is one of transformers' own classes, so exports load with
`AutoModel*.from_pretrained` and no custom code.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from core.errors import CheckpointError, ConfigError, MissingFileError
from core.json_file import read_json
from model.vocabulary_loss import Head

if TYPE_CHECKING:  # the config section is read here, never built: no import cycle with model.encoder
    from model.encoder import EncoderConfig

# What an objective may ask a backbone for (`Objective.needs`); a backbone lists what it provides. The builders
# below by name; "pair_head": `pair_logits` (NSP/SOP); "hidden_projection": `output_projection` reads hidden-size
# vectors (not ALBERT's, which reads the factorized embedding size); "permutation_lm": XLNet's two streams.
CAPABILITIES = ("masked_lm", "encoder", "discriminator", "generator", "pair_head", "hidden_projection", "permutation_lm")
try:  # transformers 5 checks a config's values through huggingface_hub's strict dataclasses
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub (transformers 4.x) has none
    StrictDataclassError = ValueError
# What reading a config dict of wrong values raises (transformers 5: a str hidden_size, heads not dividing it, ...).
CONFIG_VALUE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, StrictDataclassError)
# Weights are read in float32 whatever dtype a folder was saved in: transformers 5 loads the saved dtype by default,
# 4.x float32, and training, fine-tuning and probes keep float32 masters (precision is the engine's choice).
LOAD_DTYPE = torch.float32


def transformers_major() -> int:
    """The major version of the installed transformers."""
    import transformers

    return int(transformers.__version__.split(".")[0])


RELATIVE_POSITIONS = ("relative_key", "relative_key_query")


def relative_positions_available() -> bool:
    """transformers 5.0 removed BERT's, ELECTRA's and ALBERT's relative position embeddings (its PR 41170): 5.x
    builds or loads such a model with no error, runs absolute positions and ignores the trained distance embeddings."""
    return transformers_major() < 5


def relative_refusal(what: str) -> str:
    """The one line that refuses relative positions under transformers 5."""
    import transformers

    return (f"{what}: transformers {transformers.__version__} has no relative position embeddings (removed in 5.0) and "
            "would run absolute ones; use model.architecture=modernbert (rotary positions, relative in every "
            "transformers) or model.position_embedding=absolute, or run transformers<5")


@dataclasses.dataclass
class NoOptions:
    """A family that reads no `model.*` key beyond the shape every family reads."""


def family_keys() -> dict[str, object]:
    """Every registered family's own `model.*` keys, with the default that means "left unset"."""
    from model.backbones import REGISTRY, backbone_for  # the registry imports this module

    return {f.name: f.default for name in REGISTRY for f in dataclasses.fields(backbone_for(name).options_class)}


def readers_of(key: str) -> str:
    """' (model.architecture=X reads it)' for the registered families whose options have this key, else ''."""
    from model.backbones import REGISTRY, backbone_for  # the registry imports this module

    readers = [name for name in REGISTRY if key in backbone_for(name).family_keys]
    return f" (model.architecture={' or '.join(readers)} reads it)" if readers else ""


def check_saved_config(data: dict, where: str) -> None:
    """Refuse (ConfigError) a saved transformers config (a config.json's dict) that the installed transformers would
    run differently from the one that wrote it: relative positions under 5.x, or its own `requires_transformers`."""
    import transformers
    from packaging.specifiers import SpecifierSet

    position = data.get("position_embedding_type", "absolute")
    if position in RELATIVE_POSITIONS and not relative_positions_available():
        raise ConfigError(relative_refusal(f"{where} has position_embedding_type={position}"))
    wanted = data.get("requires_transformers")
    if wanted and not SpecifierSet(wanted).contains(transformers.__version__, prereleases=True):
        raise ConfigError(f"{where} loads correctly only in transformers{wanted} (its config.json's "
                          f"requires_transformers), not in the installed {transformers.__version__}")


def check_model_folder(path: str | Path, need_weights: bool = False) -> dict:
    """`read_model_folder`, then `check_saved_config` on its config (evaluation reads exports written elsewhere)."""
    data = read_model_folder(path, need_weights)
    check_saved_config(data, f"model '{path}'")
    return data


def read_model_folder(path: str | Path, need_weights: bool = False) -> dict:
    """A Hugging Face model folder's config.json as a dict, refused in one line (MissingFileError, CheckpointError)
    when it is missing or not JSON, or a weights file is truncated or damaged (or, when `need_weights`, absent)."""
    folder = Path(path)
    config = folder / "config.json"
    if not config.is_file():
        raise MissingFileError(f"model '{path}' is not a Hugging Face model folder (no config.json)")
    data = read_json(config, f"model '{path}':", "the folder is damaged or was copied incompletely: export or copy it "
                     "again", CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"model '{path}': '{config}' holds a {type(data).__name__}, not a model config")
    check_model_type(data, path)
    _check_weights(folder, need_weights)
    return data


def check_model_type(data: dict, path: str | Path) -> None:
    """Refuse a config.json that names no model type, or one the installed transformers does not know: transformers
    would stop with a traceback that asks for a newer version."""
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(f"model '{path}': its config.json names no model_type, so no model class reads it; "
                              "export or copy the folder again")
    if model_type not in CONFIG_MAPPING:
        raise CheckpointError(f"model '{path}': its config.json's model_type '{model_type}' is not one transformers "
                              f"{transformers.__version__} knows")


def load_pretrained(cls: Any, path: str | Path, **kwargs: Any) -> PreTrainedModel:
    """`cls.from_pretrained(path, **kwargs)`, refused in one line when the folder's weights do not fill the encoder its
    config.json describes: an encoder weight missing or of another shape, which transformers would initialise at
    random and go on (a pooler or a task head the folder lacks, or holds at another size, is made fresh, as
    transformers does)."""
    model, info = cls.from_pretrained(str(path), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    prefix = f"{model.base_model_prefix}."
    in_encoder = lambda key: ((model.base_model is model or key.startswith(prefix))  # noqa: E731
                              and "pooler" not in key.split("."))
    missing = sorted(k for k in info["missing_keys"] if in_encoder(k))
    reshaped = sorted(f"{k} {list(saved)} (config.json: {list(built)})" for k, saved, built in info["mismatched_keys"]
                      if in_encoder(k))
    if missing or reshaped:
        what = _counted("weight(s) missing", missing, 3) + _counted("of another shape", reshaped, 2)
        raise CheckpointError(f"model '{path}': its weights do not fit its config.json: {'; '.join(what)}; the "
                              "config.json is not the one the weights were saved with: export or copy the folder again")
    return model


def _counted(what: str, items: list[str], shown: int) -> list[str]:
    """["N WHAT (first, second, ...)"], or [] for no items."""
    return [f"{len(items)} {what} ({', '.join(items[:shown])}{', ...' if len(items) > shown else ''})"] if items else []


# The weights files transformers reads for PyTorch, safetensors first as it prefers them.
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _check_weights(folder: Path, required: bool) -> None:
    """Refuse a model folder whose weights (or shards) are truncated or damaged, or (when `required`) that has no
    weights: transformers would stop with a SafetensorError, OSError or RuntimeError traceback that names no file."""
    present = [name for name in WEIGHTS if (folder / name).is_file()]
    if not present:
        if required:
            raise CheckpointError(f"model '{folder}' has no weights (none of {', '.join(WEIGHTS)})")
        return
    files = [folder / present[0]]
    if present[0].endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(files[0].read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"model '{folder}': '{files[0]}' is not a shard index ({exc})") from None
        files = [folder / shard for shard in shards]
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"model '{folder}': weights shard '{file}' is missing; copy the whole folder again")
        with file.open("rb") as f:
            head = f.read(64)
        instead = _not_weights(head)
        if instead:
            raise CheckpointError(f"model '{folder}': '{file}' is {instead}")
        damage = _safetensors_damage(file) if file.name.endswith(".safetensors") else _pickle_damage(head, file)
        if damage:
            raise CheckpointError(f"model '{folder}': '{file}' cannot be read ({damage}); it is truncated or damaged: "
                                  "export or copy it again")


def _not_weights(head: bytes) -> str:
    """What a weights file whose first bytes are `head` holds instead of weights, or "" (a safetensors header so begun
    would claim hundreds of GB, and no pickle or zip begins so)."""
    if not head:
        return "empty"
    if head.startswith(LFS_POINTER):
        return "a Git LFS pointer, not the weights: run `git lfs pull` in the clone it came from"
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "a web page, not the weights (a download that got a login or error page)"
    return ""


def _safetensors_damage(file: Path) -> str:
    """What is wrong with a safetensors file's header (its size included), or ""."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt"):  # reads and checks the header only
            return ""
    except SafetensorError as exc:
        return str(exc)


LFS_POINTER = b"version https://git-lfs"  # what a clone made without git-lfs holds in place of a large file
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6


def _pickle_damage(head: bytes, file: Path) -> str:
    """What is wrong with a pytorch_model.bin's zip archive (`head`: its first bytes), or "": it must hold its central
    directory, the end a truncated copy loses. Its pickle is checked only by unpickling it, which is the load itself;
    a file in torch's older formats (a bare pickle, a tar) is left to that load."""
    if not head.startswith(ZIP_MAGIC):
        return ""
    try:
        with zipfile.ZipFile(file) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:  # ValueError: a name in no encoding
        return f"its zip archive is incomplete: {exc}"
    return ""


def layer_states(out: Any) -> tuple[torch.Tensor, ...]:
    """An encoder output's hidden states by layer (embeddings first) with the last as `last_hidden_state`.

    transformers 4.x gives ModernBERT's last layer before its final norm in `hidden_states[-1]`, 5.x after it;
    `last_hidden_state` is after it in both, so every reader of "the last layer" gets one tensor on both majors."""
    return (*out.hidden_states[:-1], out.last_hidden_state)


@contextmanager
def last_hidden_state_of(model: PreTrainedModel) -> Iterator[dict]:
    """While open, each forward of a head model leaves its encoder's `last_hidden_state` in the yielded dict
    (under "last"): the tensor its head reads, which a head model's `hidden_states[-1]` is not on every major."""
    seen: dict = {}
    hook = Backbone.base(model).register_forward_hook(lambda module, args, out: seen.__setitem__("last", out[0]))
    try:
        yield seen
    finally:
        hook.remove()


class Backbone:
    """An encoder family: builders for its models, a uniform forward, and its FLOP count."""

    model_type: str = ""
    # transformers' config class of the family (saved configs and `model.init_from` folders are read with it).
    config_class: type[PretrainedConfig] = PretrainedConfig
    # Which builders below work (see CAPABILITIES); objectives run on the backbones that provide what they need.
    provides: frozenset[str] = frozenset()
    # The dataclass of this family's own `model.*` keys (flat in the `model` section, which model.encoder builds from
    # every registered family's): a family owns its options as an objective does.
    options_class: type = NoOptions
    # The `model.attn_implementation` values this family supports.
    attention_kernels: tuple[str, ...] = ("sdpa", "eager")
    # The transformers config attributes behind each `model.*` key the family reads (a key of its options included).
    # With `model.init_from`, an unset key takes the folder's value, a set shape key must equal it, and a set dropout
    # key is applied over it (model/encoder.py). A key missing here is not read with a folder.
    config_keys: dict[str, tuple[str, ...]] = {
        "vocab_size": ("vocab_size",), "hidden_size": ("hidden_size",), "num_layers": ("num_hidden_layers",),
        "num_heads": ("num_attention_heads",), "intermediate_size": ("intermediate_size",),
        "max_position_embeddings": ("max_position_embeddings",), "dropout": ("hidden_dropout_prob",),
        "attention_dropout": ("attention_probs_dropout_prob",),
    }

    def folder_values(self, config: PretrainedConfig) -> dict[str, object]:
        """The `model.*` keys of `config_keys` with their values in this transformers config; None for a key whose
        attributes are missing or disagree (ModernBERT's one `dropout` is its embedding and MLP dropouts)."""
        values = {}
        for key, attrs in self.config_keys.items():
            found = {getattr(config, attr, None) for attr in attrs}
            values[key] = found.pop() if len(found) == 1 else None
        return values

    @property
    def family_keys(self) -> tuple[str, ...]:
        """The names of this family's own `model.*` keys."""
        return tuple(f.name for f in dataclasses.fields(self.options_class))

    @property
    def has_pair_head(self) -> bool:
        """Sentence-pair (NSP/SOP) heads exist natively only where the family has token types and a pooler."""
        return "pair_head" in self.provides

    # ---- its transformers config -------------------------------------------------------
    def hf_config(self, cfg: "EncoderConfig", tokenizer: dict) -> PretrainedConfig:
        """The family's transformers config for this shape, vocabulary and special ids (a manifest's tokenizer entry)."""
        raise NotImplementedError

    def compile_mode(self, rotary_tables: bool) -> str:
        """What `train.compile: auto` compiles ("layers" or "step"), given whether the model reads its rotary cos/sin
        from tables: the mode this family's step measured fastest in on a GPU (BENCHMARKS.md, "The second run of
        the GPU queue")."""
        return "layers"

    def check(self, cfg: "EncoderConfig") -> None:
        """Refuse `model.*` keys and values this family does not read (ConfigError); families add their own checks."""
        for key, unset in family_keys().items():
            if key not in self.family_keys and getattr(cfg, key) != unset:
                raise ConfigError(f"config key 'model.{key}' does not apply to model.architecture={self.model_type}"
                                  f"{readers_of(key)}")
        if cfg.attn_implementation not in self.attention_kernels:
            raise ConfigError(f"config key 'model.attn_implementation={cfg.attn_implementation}' is not available for "
                              f"model.architecture={self.model_type} (it has {', '.join(self.attention_kernels)})")

    def from_folder(self, path: str) -> PretrainedConfig:
        """The config saved in a Hugging Face folder of this family (`model.init_from`), its files checked first."""
        # The weights are read later, by the builders: a damaged file is refused here, in one line naming it. (Whether
        # this transformers runs the config as saved is the caller's check: its message names the config key.)
        read_model_folder(path, need_weights=True)
        try:
            return self.config_class.from_pretrained(path)
        except CONFIG_VALUE_ERRORS as exc:
            raise CheckpointError(f"model '{path}': its config.json is not a valid {self.model_type} config: "
                                  f"{' '.join(str(exc).split())}") from None

    def version_limit(self, config: PretrainedConfig) -> Optional[str]:
        """The transformers versions that run this config's model as it was trained, when not every one does
        (e.g. "<5"); None when any transformers the project supports does."""
        return None

    def for_export(self, config: PretrainedConfig) -> None:
        """Set what an export's config must say for transformers' classes to read this project's inputs right."""

    def attention(self, config: PretrainedConfig, requested: str) -> str:
        """The attention kernel this config runs with (a family may need eager attention for some of its options)."""
        return requested

    # ---- builders --------------------------------------------------------------------
    def masked_lm(self, config: PretrainedConfig, init_from: Optional[str] = None, pair_head: bool = False) -> PreTrainedModel:
        """Encoder + tied MLM head (with a sentence-pair head when asked and supported), fresh or from a folder."""
        raise NotImplementedError

    def encoder(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """The bare encoder (no pooler, no head)."""
        raise NotImplementedError

    def discriminator(self, config: PretrainedConfig, init_from: Optional[str] = None) -> PreTrainedModel:
        """Encoder + a one-logit-per-token head (replaced-token detection), exportable natively."""
        raise NotImplementedError

    def generator(self, config: PretrainedConfig, width: float, layers: int, owner: PreTrainedModel) -> PreTrainedModel:
        """A smaller masked LM that shares `owner`'s embeddings where the widths allow, decoder tied to them."""
        raise NotImplementedError

    # ---- uniform access ----------------------------------------------------------------
    @staticmethod
    def base(model: PreTrainedModel) -> PreTrainedModel:
        """The encoder inside a head model (the model itself when it is one)."""
        return getattr(model, model.base_model_prefix, model)

    def mlm_head(self, model: PreTrainedModel) -> Head:
        """hidden [N, H] -> vocabulary logits [N, V] of a masked LM built here: a VocabularyHead (its transform and
        projection, which `train.vocab_loss_chunk` fuses with the loss and `output_projection` reads). A backbone
        whose head is another callable overrides `output_projection` and cannot run `train.vocab_loss_chunk`."""
        raise NotImplementedError

    def output_projection(self, model: PreTrainedModel) -> nn.Linear:
        """A masked LM's final hidden → vocabulary projection (tied to the token embeddings), without its transform."""
        return self.mlm_head(model).projection

    def encode(self, base: PreTrainedModel, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
               token_type_ids: Optional[torch.Tensor] = None, output_hidden_states: bool = False) -> Any:
        """Run an encoder (no mask: no position is padding); the output has `last_hidden_state` (and `hidden_states`,
        embeddings first)."""
        return base(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states,
                    **self._types(token_type_ids))

    def _types(self, token_type_ids: Optional[torch.Tensor]) -> dict:
        """Token types for families that have them (ModernBERT's forward takes none)."""
        return {"token_type_ids": token_type_ids} if token_type_ids is not None and self.has_pair_head else {}

    def rtd_logits(self, model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                   token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Per-token replaced-token logits [B, L] of a `discriminator`."""
        logits = model(input_ids=input_ids, attention_mask=attention_mask, **self._types(token_type_ids)).logits
        return logits.squeeze(-1) if logits.dim() == 3 else logits

    def pair_logits(self, model: PreTrainedModel, pooled: torch.Tensor) -> torch.Tensor:
        """NSP/SOP logits [B, 2] from a pair-head masked LM's pooled output."""
        raise NotImplementedError

    @staticmethod
    def word_embeddings(model: PreTrainedModel) -> nn.Embedding:
        """The token embedding matrix."""
        return model.get_input_embeddings()

    @staticmethod
    def share_embeddings(owner: PreTrainedModel, user: PreTrainedModel) -> None:
        """`user`'s encoder reads through `owner`'s embedding module (tokens, positions, norm)."""
        Backbone.base(user).embeddings = Backbone.base(owner).embeddings

    @staticmethod
    def share_base(owner: PreTrainedModel, user: PreTrainedModel) -> None:
        """`user` (a head model) runs on `owner`'s whole encoder: the same module, the same weights."""
        setattr(user, user.base_model_prefix, Backbone.base(owner))

    @staticmethod
    def tie_decoder(model: PreTrainedModel, embeddings: nn.Embedding) -> None:
        """Point a masked LM's output projection at these token embeddings."""
        model.get_output_embeddings().weight = embeddings.weight

    def resized(self, config: PretrainedConfig, **changes: Any) -> PretrainedConfig:
        """A copy of the config with some fields changed (generator shapes)."""
        out = copy.deepcopy(config)
        for key, value in changes.items():
            setattr(out, key, value)
        return out

    # ---- FLOPs (matmuls only, 2 per multiply-add; see model/flops.py) -------------------
    def encoder_flops(self, config: PretrainedConfig, seq_len: int) -> float:
        """Forward FLOPs per token of the encoder at this sequence length."""
        raise NotImplementedError


def forward_input_names(model: nn.Module) -> list[str]:
    """Which of a tokenizer's encoder inputs the model's forward takes (ModernBERT takes no token_type_ids)."""
    accepted = inspect.signature(model.forward).parameters
    return [name for name in ("input_ids", "token_type_ids", "attention_mask") if name in accepted]


def weight_decays(name: str, param: nn.Parameter) -> bool:
    """Whether weight decay applies to a parameter: to matrices, not to biases, norms or other 1-d parameters (as
    BERT does). XLNet's relative-attention biases (`r_w_bias`, `r_r_bias`, `r_s_bias`) are 2-d, and XLNet keeps every
    `*bias` out of decay: decay would pull its position and segment terms to zero."""
    ndim = len(getattr(param, "ds_shape", param.shape))  # a ZeRO-3 parameter is an empty slice; ds_shape is its shape
    return ndim >= 2 and "LayerNorm" not in name and not name.rsplit(".", 1)[-1].endswith("bias")
