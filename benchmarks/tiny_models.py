"""Tiny fairseq models and batches: a 2+2-layer translation model and a 2-layer
language model, 16 wide, with perturbed weights in float64, and padded random
batches for them. ``benchmarks.diagnostics.precision`` measures them; the tests
build their models with them too (``tests/model_helpers.py``). Importing this
module imports fairseq and registers the plugin's models."""

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.translation import TranslationTask

import fairseq_distattn.models  # noqa: F401 (registers the models)
from fairseq_distattn.registry import KINDS

from .common import size_flags

# a 2+2-layer translation model 16 wide with 2 heads, without dropout
TINY_WIDTHS = size_flags(dim=16, ffn=32, heads=2, layers=2)
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]
# the same, with rpr's and the segment window's options at sizes such short sentences reach
TINY = [*TINY_WIDTHS, "--max-relative-position", "3", "--window-segment-size", "2", *NO_DROPOUT]


def everywhere(mechanism: str) -> list:
    """The SPEC flags that put ``mechanism`` in every layer of every attention kind
    that accepts it (vanilla in the others)."""
    return [flag for kind in KINDS for flag in (kind.flag, mechanism if mechanism in kind.allowed else "vanilla")]


TINY_LM = [
    "--decoder-layers",
    "2",
    "--decoder-embed-dim",
    "16",
    # distattn_lm takes transformer_lm's defaults, whose token embeddings are 512 wide otherwise
    "--decoder-input-dim",
    "16",
    "--decoder-output-dim",
    "16",
    "--decoder-ffn-embed-dim",
    "32",
    "--decoder-attention-heads",
    "2",
    "--max-relative-position",
    "3",
    "--dropout",
    "0",
    "--attention-dropout",
    "0",
]


def dictionary(size=20):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def parse(task, arch, extra):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["data", "--task", task, "--arch", arch, *extra])


def translation_model(arch="distattn_transformer", extra=(), perturb=True, seed=0):
    torch.manual_seed(seed)
    args = parse("translation", arch, [*extra])
    d = dictionary()
    task = TranslationTask(args, d, d)
    model = task.build_model(args).double().eval()
    if perturb:
        perturb_parameters(model, seed)
    return model, d


def language_model(arch="distattn_lm", extra=(), seed=0):
    torch.manual_seed(seed)
    args = parse("language_modeling", arch, [*extra])
    d = dictionary()
    task = LanguageModelingTask(args, d)
    model = task.build_model(args).double().eval()
    perturb_parameters(model, seed)
    return model, d


def perturb_parameters(model, seed):
    """Move every parameter off its initial value (zero-initialised mechanism
    parameters such as DA's w, v would otherwise hide position bugs)."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)


def random_tokens(d, rows, length, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(d.nspecial, len(d), (rows, length), generator=generator)


def left_pad(sentences, pad):
    width = max(len(s) for s in sentences)
    return torch.stack(
        [torch.cat([torch.full((width - len(s),), pad, dtype=torch.long, device=s.device), s]) for s in sentences]
    )


def right_pad(sentences, pad):
    width = max(len(s) for s in sentences)
    return torch.stack(
        [torch.cat([s, torch.full((width - len(s),), pad, dtype=torch.long, device=s.device)]) for s in sentences]
    )
