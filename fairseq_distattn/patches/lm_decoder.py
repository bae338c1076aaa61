"""fairseq's ``TransformerLanguageModel.build_model`` with another decoder class."""

from contextlib import contextmanager

from fairseq.models import transformer_lm as fairseq_lm


@contextmanager
def language_model_decoder(decoder_class):
    """fairseq's LM ``build_model`` names its decoder class at module level and has
    no build hook; swapping that name for the build keeps all of fairseq's
    embedding/adaptive-input logic without copying it."""
    fairseq_decoder = fairseq_lm.TransformerDecoder
    fairseq_lm.TransformerDecoder = decoder_class
    try:
        yield
    finally:
        fairseq_lm.TransformerDecoder = fairseq_decoder
