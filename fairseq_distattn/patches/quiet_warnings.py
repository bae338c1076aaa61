"""Silence the start-up warnings every fairseq 0.12 command prints on stderr.

fairseq 0.12 builds its configuration through hydra's deprecated 1.0 API and
calls torch in ways torch 2.x deprecates, so each ``fairseq-*`` command prints
about 25 lines of warnings the user can do nothing about, which bury the real
errors. Importing the plugin (``--user-dir fairseq_distattn``) happens before
fairseq composes its configuration, so filters added here cover them.

Each filter names one known message (matched from its start) and the module
the warning is attributed to, so the same text raised from anywhere else, and
every other warning, still shows.
"""

import warnings

# (category, message regex, module regex): the module is the one Python names
# in front of the warning, i.e. where the warning is attributed.
KNOWN_WARNINGS = (
    # hydra 1.3, called by fairseq.dataclass.initialize / fairseq.dataclass.utils
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental", r"hydra\."),
    (UserWarning, r"\s*The version_base parameter is not specified", r"hydra\."),
    (UserWarning, r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'", r"hydra\."),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated", r"hydra\."),
    # hydra raises this one with a fixed stacklevel of 11, so where Python attributes
    # it depends on the depth of fairseq's call: the pseudo-module "sys" when that
    # is above the stack ("sys:1:" under fairseq-train), the fairseq-* script itself
    # (__main__) under fairseq-generate, or a fairseq module; the message names hydra
    (
        UserWarning,
        r"\s*'[^']*' is validated against ConfigStore schema with the same name\.\n"
        r"This behavior is deprecated in Hydra",
        r"(sys|__main__)\Z|fairseq(_cli)?\.",
    ),
    # fairseq's data loaders always ask for pinned memory, which a CPU-only torch cannot give
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found", r"torch\.utils\.data\."),
    # fairseq's train/valid steps use torch.cuda.amp.autocast(enabled=False) even on CPU
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", r"fairseq\."),
    # fairseq's MultiheadAttention (the vanilla layers) passes a bool padding mask
    # with a float attention mask to torch
    (UserWarning, r"Support for mismatched key_padding_mask and attn_mask is deprecated", r"torch\.nn\.functional\Z"),
)


def silence_known_fairseq_warnings():
    for category, message, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
