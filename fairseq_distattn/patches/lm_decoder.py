"""fairseq's ``TransformerLanguageModel.build_model`` with another decoder class (or factory)."""

from contextlib import contextmanager

from fairseq.models import transformer_lm as fairseq_lm


@contextmanager
def language_model_decoder(decoder_class):
    """fairseq's LM ``build_model`` names its decoder class at module level and has
    no build hook; swapping that name for the build keeps all of fairseq's
    embedding/adaptive-input logic without copying it. ``decoder_class``: anything
    called as fairseq calls ``TransformerDecoder(args, dictionary, embed_tokens,
    no_encoder_attn=True)``."""
    fairseq_decoder = fairseq_lm.TransformerDecoder
    fairseq_lm.TransformerDecoder = decoder_class
    try:
        yield
    finally:
        fairseq_lm.TransformerDecoder = fairseq_decoder
