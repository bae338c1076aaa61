"""What a checkpoint says its model was trained as: its model configuration, the
registered model of its ``--arch``, and its attention settings (read by the loading
hooks in :mod:`.patches`, by :mod:`.tools.check` and by the scripts)."""

from argparse import Namespace

from .trained_configuration import geometry_attributes, trained_settings


def model_config(state):
    """The model's configuration (an ``argparse.Namespace`` or omegaconf node) of a checkpoint."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("model") is not None:
        return cfg["model"]
    return state.get("args")


def model_name(config) -> str:
    """The registered model name (``distattn_transformer``, ``transformer``, ...) of an ``--arch``."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    arch = getattr(config, "arch", None) or getattr(config, "_name", None)
    return ARCH_MODEL_NAME_REGISTRY.get(arch, arch)


def architecture_defaults(config) -> dict:
    """attribute -> value of each attention-geometry attribute (:func:`geometry_attributes`)
    that ``config`` lacks, as fairseq builds the model then: its ``--arch`` function fills
    an absent attribute (``getattr(args, "decoder_attention_heads", 8)``, some from another:
    the decoder's width defaults to the encoder's), so it runs on the attributes present."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    attrs = geometry_attributes(model_name(config))
    missing = [attr for attr in attrs if getattr(config, attr, None) is None]
    arch = getattr(config, "arch", None) or getattr(config, "_name", None)
    if not missing or arch not in ARCH_CONFIG_REGISTRY:
        return {}
    both_sides = [f"{side}_{name}" for side in ("encoder", "decoder") for name in ("attention_heads", "embed_dim")]
    args = Namespace(**{attr: getattr(config, attr) for attr in both_sides if getattr(config, attr, None) is not None})
    try:
        ARCH_CONFIG_REGISTRY[arch](args)
    except Exception:  # an architecture that needs more of its configuration: nothing to fall back on
        return {}
    return {attr: getattr(args, attr, None) for attr in missing}


def settings_of(config):
    """:func:`trained_settings` of a model configuration (an attention-geometry attribute it
    lacks: its architecture's default)."""
    return trained_settings(config, model_name(config), architecture_defaults(config))
