"""Small fairseq models and batches for the model-level tests."""

import contextlib
import sys
from pathlib import Path

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.translation import TranslationTask

import fairseq_distattn.models  # noqa: F401 (registers the models)
from fairseq_distattn.registry import KINDS

TINY = [
    "--encoder-layers",
    "2",
    "--decoder-layers",
    "2",
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--max-relative-position",
    "3",
    "--window-segment-size",
    "2",
    "--dropout",
    "0",
    "--attention-dropout",
    "0",
]


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


OLD_CHECKPOINTS = Path(__file__).resolve().parent / "data" / "old_checkpoints"


def old_checkpoint_log_probabilities(name, overrides=None):
    """What today's code gives the sentence of ``tests/data/old_checkpoints/<name>.checkpoint``
    (made by an earlier plugin revision with ``make_fixture.py``, which computes it)."""
    sys.path.insert(0, str(OLD_CHECKPOINTS))
    try:
        from make_fixture import log_probabilities
    finally:
        sys.path.remove(str(OLD_CHECKPOINTS))
    return log_probabilities(OLD_CHECKPOINTS, name, overrides)


@contextlib.contextmanager
def flex_setting(model, setting: str = None, on_cpu: bool = False):
    """Every attention module of ``model`` with ``--attention-flex setting`` (None: as built)
    and, with ``on_cpu``, handing its ops ``flex="always"`` where it takes the flex path, so
    that flex's eager form runs on the CPU too (the flag alone leaves the CPU alone)."""
    modules = [m for m in model.modules() if hasattr(m, "flex_when_taken")]
    saved = [(m.attention_flex, m.flex_when_taken) for m in modules]
    for m in modules:
        m.attention_flex = m.attention_flex if setting is None else setting
        m.flex_when_taken = "always" if on_cpu else m.flex_when_taken
    try:
        yield
    finally:
        for m, (attention_flex, flex_when_taken) in zip(modules, saved):
            m.attention_flex, m.flex_when_taken = attention_flex, flex_when_taken
