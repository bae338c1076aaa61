from . import distattn_lm, distattn_transformer  # noqa: F401 (registers models and architectures)
