"""Look inside a trained model: ``python -m fairseq_distattn.inspect CHECKPOINT``.

For each sentence (``--sentence``, ``--input FILE`` or standard input, BPE'd
like fairseq-interactive's input, or raw with ``--tokenizer``/``--bpe``) it
decodes with beam search, or forces a given ``--target``, and plots from that
one teacher-forced pass (a sentence longer than the model's source or target
positions, counted after BPE with </s>, is refused, as fairseq-interactive and
the hub refuse it):

- the attention probabilities of every head of every layer of each attention
  kind (encoder self, decoder self, cross);
- for a layer whose mechanism has a soft window (``inspectable.HasSoftWindow``:
  Nguyen et al. 2020) the left and right boundary distributions (eqs. 7-8),
  the soft mask M (eq. 9, or eq. 11 with segments) and each query's expected
  boundaries;
- for a layer whose mechanism depends on the positions alone
  (``inspectable.HasPositionTerm``: DA's coefficients f(w_h |i-j|) of eq. 5,
  ALiBi's, T5's and the distance mask's biases) that term per head;
- for a layer whose mechanism computes a term of the sentence itself
  (``inspectable.HasSentenceTerm``: CoPE's contextual positions p_ij) that term
  per head.

Model-level plots, per mechanism the model uses: what its layers learned
(``Mechanism.learned_values``: DA's w and v per head, as the paper's Figs.
6-7; the norms of the rpr tables by distance; any other mechanism's
parameters), its position term against the distance, and the window spans
of each layer (the mean soft-mask width, over the sentences given or a whole
``--subset``).

The printed summary (also written to ``OUT/summary.txt``) gives, per layer
and attention kind, the mechanism, its hyperparameters and learned values.

Attention is captured with hooks, nothing in the model changes: the plugin's
attention modules are asked for per-head weights (fairseq's
``need_head_weights``); fairseq's own module (vanilla layers) takes a fused
path that only returns head-averaged weights, so its per-head probabilities
are recomputed from its projections; window pointers are recomputed from the
inputs the window mechanism received.
"""

import argparse
import logging
import sys
import textwrap
from dataclasses import dataclass
from inspect import signature  # the standard library's (absolute import)
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..functional.attention import softmax_attention
from ..mechanisms.base import LearnedValues, PositionTerm
from ..modules.summary import AttentionSite, attention_sites, attention_summary
from ..registry import CROSS, DECODER_SELF, ENCODER_SELF, AttentionKind
from . import inspectable

PROG = "python -m fairseq_distattn.inspect"


# ----------------------------------------------------------------------------- loading


@dataclass
class LoadedModel:
    model: torch.nn.Module
    task: object
    description: str  # one line: checkpoint, model, --arch, updates

    @property
    def translates(self) -> bool:
        return getattr(self.model, "encoder", None) is not None

    @property
    def source_dictionary(self):
        return self.task.source_dictionary

    @property
    def target_dictionary(self):
        return self.task.target_dictionary


class InspectError(Exception):
    """A problem to report in one line (exit status 1)."""


def load_model(checkpoint: Path, args) -> LoadedModel:
    """The checkpoint's model on ``args.device``, with the task that owns its
    dictionaries: from ``--data`` (fairseq-preprocess's directory) or from
    dictionary files."""
    from fairseq import checkpoint_utils

    from .check import failure_reason, model_name

    try:
        # weights_only loading: importing this package allow-listed fairseq's config classes
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    except Exception as error:  # every reason a file cannot be read is reported alike
        raise InspectError(f"cannot read {checkpoint}: {failure_reason(error)}")
    cfg = state["cfg"]
    task = _task_with_dictionaries(cfg, args)
    model = task.build_model(cfg.model)
    try:
        model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except RuntimeError as error:
        # torch's first line names the model, the next ones each mismatch
        details = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        raise InspectError(
            f"{checkpoint} does not fit the model its configuration builds (wrong dictionaries?): "
            f"{details[0] if details else str(error)}"
        )
    model.to(args.device).eval()
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates", "?")
    name = model_name(cfg.model)
    arch = getattr(cfg.model, "arch", None) or name
    return LoadedModel(model, task, f"{checkpoint}: {name} (--arch {arch}), {updates} updates")


def _task_with_dictionaries(cfg, args):
    """The checkpoint's task (``cfg``, its languages as ``--source-lang``/``--target-lang``
    override them) with its dictionaries: from ``--data``, or from dictionary files."""
    from fairseq import tasks
    from fairseq.data import Dictionary
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from fairseq.tasks.translation import TranslationTask

    for lang in ("source_lang", "target_lang"):
        if getattr(args, lang) is not None:
            if lang not in cfg.task:
                raise InspectError(f"--{lang.replace('_', '-')}: --task {cfg.task._name} has no languages")
            setattr(cfg.task, lang, getattr(args, lang))
    task_name = cfg.task._name
    if args.data is not None:
        cfg.task.data = str(args.data)
        try:
            task = tasks.setup_task(cfg.task)
        except FileNotFoundError as error:
            raise InspectError(f"argument --data: {error}")
    elif task_name == "translation":
        if args.source_dict is None or args.target_dict is None:
            raise InspectError("a translation model needs --data DATA_BIN, or both --source-dict and --target-dict")
        task = TranslationTask(cfg.task, Dictionary.load(str(args.source_dict)), Dictionary.load(str(args.target_dict)))
    elif task_name == "language_modeling":
        if args.dict is None:
            raise InspectError("a language model needs --data DATA_BIN or --dict DICT")
        dictionary = Dictionary.load(str(args.dict))
        task = LanguageModelingTask(cfg.task, dictionary, output_dictionary=dictionary)
    else:
        raise InspectError(
            f"--task {task_name}: give --data DATA_BIN (dictionary files are read for "
            "translation and language_modeling only)"
        )
    return task


# ----------------------------------------------------------------------------- capture


@dataclass
class WindowInternals:
    """Per head, ``[H, Tq, Tk]``: the boundary distributions and the soft mask
    of one sentence (a mechanism's :class:`~fairseq_distattn.mechanisms.base.SoftWindow`)."""

    left_pointer: Tensor
    right_pointer: Tensor
    mask: Tensor
    equation: str = "eq. 9"  # the mask's equation in Nguyen et al. 2020

    @classmethod
    def of_first_sentence(cls, window) -> "WindowInternals":
        return cls(
            window.left_pointer[0].double().cpu(),
            window.right_pointer[0].double().cpu(),
            window.mask[0].double().cpu(),
            window.equation,
        )

    def expected_boundaries(self) -> Tuple[Tensor, Tensor]:
        """E[l] and E[r] per head and query, ``[H, Tq]``, in key positions."""
        positions = torch.arange(self.mask.size(-1), dtype=self.mask.dtype)
        return self.left_pointer @ positions, self.right_pointer @ positions

    def widths(self) -> Tensor:
        """``sum_j M_ij`` per head and query, ``[H, Tq]``: the window's width in
        keys. With independent boundaries l, r this is E|r - l| + 1 + P(l = r)
        (eq. 9 counts the key where both boundaries agree twice)."""
        return self.mask.sum(dim=-1)


@dataclass
class AttentionRecord:
    """What one attention did in one forward pass of one sentence."""

    site: AttentionSite
    probs: Tensor  # [H, Tq, Tk] float64 (MW: softmax * M, rows need not sum to 1)
    window: Optional[WindowInternals] = None
    sentence_term: Optional[PositionTerm] = None  # inspectable.HasSentenceTerm: CoPE's contextual positions


def _heads(module, x: Tensor) -> Tensor:
    """``[T, B, E] -> [B, H, T, D]``."""
    length, bsz, _ = x.shape
    return x.view(length, bsz, module.num_heads, module.head_dim).permute(1, 2, 0, 3)


def vanilla_probs(
    module, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor]
) -> Tensor:
    """Per-head probabilities of fairseq's ``MultiheadAttention``, ``[B, H, Tq, Tk]``,
    recomputed from its projections (its fused path returns only their mean)."""
    if module.bias_k is not None or module.add_zero_attn:
        raise InspectError("fairseq attention with --add-bias-kv or --add-zero-attn is not supported")
    causal = attn_mask is not None
    if causal:
        # fairseq's transformer passes the decoder's future mask and nothing else
        future = torch.ones(attn_mask.shape, dtype=torch.bool, device=attn_mask.device).triu(1)
        if not torch.equal(torch.isneginf(attn_mask), future) or bool(attn_mask.masked_fill(future, 0).any()):
            raise InspectError("a fairseq attention received an attn_mask other than the causal future mask")
    q, k, v = (
        _heads(module, projection(x))
        for projection, x in ((module.q_proj, query), (module.k_proj, key), (module.v_proj, value))
    )
    padding = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    return softmax_attention(q, k, v, key_padding_mask=padding, causal=causal, need_weights=True)[1]


class AttentionRecorder:
    """Hooks on every attention of a model that record, for one forward pass
    of one sentence (batch size 1), an :class:`AttentionRecord` per site."""

    def __init__(self, model):
        self.sites = attention_sites(model)
        self.records: Dict[AttentionSite, AttentionRecord] = {}
        self._windows: Dict[AttentionSite, WindowInternals] = {}
        self._sentence_terms: Dict[AttentionSite, PositionTerm] = {}
        self._handles = []

    def __enter__(self) -> "AttentionRecorder":
        for site in self.sites:
            if site.mechanism is None:
                self._handles.append(site.module.register_forward_pre_hook(self._vanilla_hook(site), with_kwargs=True))
                continue
            self._handles.append(site.module.register_forward_pre_hook(_ask_for_head_weights, with_kwargs=True))
            self._handles.append(site.module.register_forward_hook(self._weights_hook(site)))
            self._handles.append(site.mechanism.register_forward_hook(self._inputs_hook(site), with_kwargs=True))
        return self

    def __exit__(self, *exc_info):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def take(self) -> List[AttentionRecord]:
        """The records of the last forward pass, in site order."""
        missing = [site.title for site in self.sites if site not in self.records]
        if missing:
            raise InspectError(f"no attention was recorded for {', '.join(missing)}")
        records = [self.records[site] for site in self.sites]
        for record in records:
            record.window = self._windows.get(record.site)
            record.sentence_term = self._sentence_terms.get(record.site)
        self.records, self._windows, self._sentence_terms = {}, {}, {}
        return records

    def _store(self, site: AttentionSite, probs: Tensor):
        self.records[site] = AttentionRecord(site, probs[0].detach().double().cpu())

    def _vanilla_hook(self, site):
        def hook(module, args, kwargs):
            inputs = signature(module.forward).bind(*args, **kwargs).arguments
            query = inputs["query"]
            key = query if inputs.get("key") is None else inputs["key"]
            value = key if inputs.get("value") is None else inputs["value"]
            self._store(
                site, vanilla_probs(module, query, key, value, inputs.get("key_padding_mask"), inputs.get("attn_mask"))
            )

        return hook

    def _weights_hook(self, site):
        def hook(module, args, output):
            self._store(site, output[1].transpose(0, 1))  # fairseq's [H, B, Tq, Tk]

        return hook

    def _inputs_hook(self, site):
        """What the mechanism computes from its inputs: its soft window, its sentence term."""

        def hook(mechanism, args, kwargs, output):
            inputs = signature(mechanism.forward).bind(*args, **kwargs).arguments
            options = inputs["options"]
            arguments = (
                inputs["queries"],
                inputs["keys"],
                options.key_padding_mask,
                options.causal,
                options.query_offset,
            )
            window = inspectable.soft_window(mechanism, *arguments)
            if window is not None:
                self._windows[site] = WindowInternals.of_first_sentence(window)
            term = inspectable.sentence_term(mechanism, *arguments)
            if term is not None:
                self._sentence_terms[site] = term

        return hook


def _ask_for_head_weights(module, args, kwargs):
    return args, {**kwargs, "need_weights": True, "need_head_weights": True}


# ----------------------------------------------------------------------------- sentences


@dataclass
class Example:
    """One sentence to look at: the model's inputs and the tokens on the plots' axes."""

    source: Optional[Tensor]  # translation: source tokens with eos; None for a language model
    decoder_input: Tensor  # fairseq's prev_output_tokens (a language model's input)
    target: Tensor  # the tokens the decoder predicts
    target_from: str  # "given", "beam N", "reference", "text" (language model)

    @classmethod
    def forced(cls, source: Optional[Tensor], target: Tensor, target_from: str) -> "Example":
        """Teacher forcing of a target that ends with eos: the decoder reads eos
        first, then the target shifted right (fairseq's collater)."""
        return cls(source, torch.cat([target[-1:], target[:-1]]), target, target_from)


def forward(loaded: LoadedModel, example: Example):
    device = next(loaded.model.parameters()).device
    with torch.no_grad():
        if example.source is None:
            loaded.model(example.decoder_input[None].to(device))
        else:
            source = example.source[None].to(device)
            loaded.model(source, torch.tensor([source.size(1)], device=device), example.decoder_input[None].to(device))


def beam_search(loaded: LoadedModel, source: Tensor, args) -> Tensor:
    """The best hypothesis (ending with eos), as fairseq-interactive finds it."""
    generator = loaded.task.build_generator(
        [loaded.model],
        argparse.Namespace(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b, lenpen=args.lenpen),
    )
    device = next(loaded.model.parameters()).device
    lengths = torch.tensor([len(source)], device=device)
    sample = {"net_input": {"src_tokens": source[None].to(device), "src_lengths": lengths}}
    with torch.no_grad():
        return loaded.task.inference_step(generator, [loaded.model], sample)[0][0]["tokens"].cpu()


@dataclass
class PositionLimits:
    """The longest source and target (a language model: its text) the model
    takes, in tokens with </s>: ``utils.resolve_max_positions`` of the task's and
    the model's ``max_positions()``, the limit fairseq-interactive and the hub
    apply (they refuse a longer sentence: "Size of sample #0 is invalid")."""

    source: Optional[int]
    target: Optional[int]

    @classmethod
    def of(cls, loaded: LoadedModel) -> "PositionLimits":
        from fairseq import utils

        limits = utils.resolve_max_positions(loaded.task.max_positions(), loaded.model.max_positions())
        if isinstance(limits, tuple):
            return cls(*limits)
        return cls(None, limits)  # a decoder alone

    def check(self, name: str, source: Optional[Tensor], target: Optional[Tensor]):
        for what, tokens, limit in (
            ("source", source, self.source),
            ("target" if source is not None else "text", target, self.target),
        ):
            if tokens is not None and limit is not None and len(tokens) > limit:
                side = "source" if what == "source" else "target"
                raise InspectError(
                    f"{name}: the {what} is {len(tokens)} tokens long (after BPE, with </s>), but the model "
                    f"takes at most {limit} {side} positions (fairseq-interactive and the hub refuse it too)"
                )


class TextEncoder:
    """fairseq-interactive's input pipeline: optional tokenizer and BPE, then the dictionary."""

    def __init__(self, args, lang: Optional[str], dictionary):
        from fairseq.data import encoders

        self.dictionary = dictionary
        self.tokenizer = (
            None
            if args.tokenizer is None
            else encoders.build_tokenizer(
                argparse.Namespace(tokenizer=args.tokenizer, source_lang=lang or "en", target_lang=lang or "en")
            )
        )
        self.bpe = (
            None if args.bpe is None else encoders.build_bpe(argparse.Namespace(bpe=args.bpe, bpe_codes=args.bpe_codes))
        )

    def __call__(self, line: str) -> Tensor:
        line = line.strip()
        if self.tokenizer is not None:
            line = self.tokenizer.encode(line)
        if self.bpe is not None:
            line = self.bpe.encode(line)
        if not line:
            raise InspectError("an empty sentence has no attention to show")
        return self.dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long()


def read_sentences(args) -> List[Tuple[str, Optional[str]]]:
    """``(source, target or None)`` pairs from ``--sentence``/``--target`` or from
    the ``--input`` lines (``SOURCE`` or ``SOURCE<TAB>TARGET``)."""
    if args.sentence:
        targets = args.target or [None] * len(args.sentence)
        return list(zip(args.sentence, targets))
    if args.input is None:
        return []
    if args.input == "-":
        if sys.stdin.isatty():
            sys.stderr.write(f"{PROG}: reading source lines from standard input (end with Ctrl-D)\n")
        lines = sys.stdin.read().splitlines()
    else:
        lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    pairs = []
    for line in lines:
        if line.strip():
            source, _, target = line.partition("\t")
            pairs.append((source, target if target.strip() else None))
    return pairs


def subset_examples(loaded: LoadedModel, split: str, limit: int) -> List[Example]:
    """Every sentence (pair) of a binarised split of ``--data``, reference targets forced."""
    try:
        loaded.task.load_dataset(split)
    except FileNotFoundError as error:
        raise InspectError(f"argument --subset: {error}")
    dataset = loaded.task.dataset(split)
    count = len(dataset) if limit <= 0 else min(limit, len(dataset))
    examples = []
    for index in range(count):
        item = dataset[index]
        if loaded.translates:
            examples.append(Example.forced(item["source"], item["target"], "reference"))
        else:  # a language-model block already holds the model's input and its shifted target
            examples.append(Example(None, item["source"], item["target"], "reference"))
    return examples


# ----------------------------------------------------------------------------- statistics


class WindowSpans:
    """Mean window width ``sum_j M_ij`` per window site and head, over queries of all sentences seen."""

    def __init__(self):
        self.sums: Dict[AttentionSite, Tensor] = {}
        self.counts: Dict[AttentionSite, int] = {}
        self.sentences = 0

    def add(self, records: Sequence[AttentionRecord]):
        self.sentences += 1
        for record in records:
            if record.window is not None:
                widths = record.window.widths()
                self.sums[record.site] = self.sums.get(record.site, 0) + widths.sum(dim=-1)
                self.counts[record.site] = self.counts.get(record.site, 0) + widths.size(-1)

    def per_head(self) -> Dict[AttentionSite, Tensor]:
        return {site: self.sums[site] / self.counts[site] for site in self.sums}

    def lines(self, over: str) -> List[str]:
        if not self.sums:
            return []
        lines = [f"window spans: mean soft-mask width sum_j M_ij per query, in keys, over {over}"]
        for site, widths in self.per_head().items():
            lines.append(
                f"  {site.title}: {widths.mean().item():.3f} "
                f"(per head: {' '.join(f'{w:.3f}' for w in widths.tolist())})"
            )
        return lines


# ----------------------------------------------------------------------------- plots


def _figure(rows: int, columns: int, panel_width: float, panel_height: float):
    # imported here, after main() has quietened the root logger fairseq sets to DEBUG
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(columns * panel_width, rows * panel_height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots(rows, columns, squeeze=False)


def _save(figure, title: str, path: Path, written: List[Path]):
    # about 11 characters of a 10-point title per inch of figure width
    figure.suptitle(textwrap.fill(title, width=max(30, int(figure.get_figwidth() * 11))), fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    written.append(path)


LABELLED_TOKENS = 60  # beyond this many tokens an axis shows positions, not tokens


def _label_axes(ax, row_labels: Sequence[str], column_labels: Sequence[str], ylabel: str, xlabel: str):
    for labels, set_ticks, set_labels, rotation in (
        (column_labels, ax.set_xticks, ax.set_xticklabels, 90),
        (row_labels, ax.set_yticks, ax.set_yticklabels, 0),
    ):
        if len(labels) <= LABELLED_TOKENS:
            set_ticks(range(len(labels)))
            set_labels(labels, rotation=rotation, fontsize=max(4, 9 - len(labels) // 12))
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)


def _panel_size(rows: int, columns: int) -> Tuple[float, float]:
    return min(9.0, 1.6 + 0.16 * columns), min(9.0, 1.2 + 0.16 * rows)


def _heatmaps(
    matrices: Tensor,
    titles: Sequence[str],
    suptitle: str,
    row_labels,
    column_labels,
    axis_names,
    path: Path,
    written: List[Path],
    cmap: str = "viridis",
):
    heads = matrices.size(0)
    columns = min(heads, 4)
    figure, axes = _figure((heads + columns - 1) // columns, columns, *_panel_size(len(row_labels), len(column_labels)))
    for index, ax in enumerate(axes.flat):
        if index >= heads:
            ax.set_visible(False)
            continue
        image = ax.imshow(matrices[index].detach().cpu().numpy(), cmap=cmap, aspect="auto", interpolation="nearest")
        figure.colorbar(image, ax=ax, shrink=0.8)
        ax.set_title(titles[index], fontsize=9)
        _label_axes(ax, row_labels, column_labels, *axis_names)
    _save(figure, suptitle, path, written)


@dataclass
class Axes:
    """Token labels of one attention kind: queries (rows) and keys (columns)."""

    queries: List[str]
    keys: List[str]
    names: Tuple[str, str]  # (row axis name, column axis name)


def plot_sentence(
    records: Sequence[AttentionRecord], axes_of: Dict[AttentionKind, Axes], directory: Path, written: List[Path]
):
    for record in records:
        site, axes = record.site, axes_of[record.site.kind]
        heads = record.probs.size(0)
        described = f" ({site.hyperparameters})" if site.hyperparameters else ""
        weights = ", weights softmax x M" if site.name.startswith("window-mw") else ""
        _heatmaps(
            record.probs,
            [f"head {h}" for h in range(heads)],
            f"attention, {site.title}{described}{weights}",
            axes.queries,
            axes.keys,
            axes.names,
            directory / f"attention-{site.slug}.png",
            written,
        )
        if record.window is not None:
            plot_window(record, axes, directory / f"window-{site.slug}.png", written)
        position_term = (
            None
            if site.mechanism is None
            else inspectable.position_term(site.mechanism, *record.probs.shape[-2:], site.kind.causal)
        )
        for term in (position_term, record.sentence_term):
            if term is None:
                continue
            _heatmaps(
                term.values,
                [f"head {h}" for h in range(term.values.size(0))],
                f"{term.title}, {site.title}{described}",
                axes.queries,
                axes.keys,
                axes.names,
                directory / f"{term.name}-{site.slug}.png",
                written,
                cmap="magma",
            )


def plot_window(record: AttentionRecord, axes: Axes, path: Path, written: List[Path]):
    window = record.window
    heads = window.mask.size(0)
    width, height = _panel_size(len(axes.queries), len(axes.keys))
    figure, grid = _figure(heads, 3, width, height)
    left, right = window.expected_boundaries()
    rows = range(len(axes.queries))
    equation = window.equation
    for head in range(heads):
        panels = (
            (window.left_pointer, "left boundary phi_l (eq. 7)"),
            (window.right_pointer, "right boundary phi_r (eq. 8)"),
            (window.mask, f"soft mask M ({equation}), E[l] >, E[r] <"),
        )
        for column, (matrix, name) in enumerate(panels):
            ax = grid[head, column]
            image = ax.imshow(matrix[head].numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
            figure.colorbar(image, ax=ax, shrink=0.8)
            ax.set_title(f"head {head}: {name}", fontsize=8)
            _label_axes(ax, axes.queries, axes.keys, *axes.names)
        grid[head, 2].plot(left[head].numpy(), rows, ">", color="white", markersize=3)
        grid[head, 2].plot(right[head].numpy(), rows, "<", color="red", markersize=3)
    _save(figure, f"differentiable window, {record.site.title} ({record.site.hyperparameters})", path, written)


def _site_label(site: AttentionSite) -> str:
    return f"{site.slug.replace('-layer', ' L')}"


def _grouped_bars(ax, groups: Sequence[str], values: Sequence[Sequence[float]], ylabel: str):
    heads = max(len(v) for v in values)
    width = 0.8 / heads
    for head in range(heads):
        ax.bar(
            [g + (head - (heads - 1) / 2) * width for g in range(len(groups))],
            [v[head] for v in values],
            width,
            label=f"head {head}",
        )
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)


def _plot_learned_values(name: str, sites: Sequence[AttentionSite], out: Path, written: List[Path]):
    series: Dict[str, List[Tuple[AttentionSite, LearnedValues]]] = {}
    for site in sites:
        for values in site.mechanism.learned_values(site.kind.causal):
            series.setdefault(values.name, []).append((site, values))
    if not series:
        return
    figure, axes = _figure(len(series), 1, max(8.0, 1.2 * len(sites)), 3.0)
    for ax, (label, rows) in zip(axes.flat, series.items()):
        if rows[0][1].positions is None:  # per head: bars grouped by layer, the heads' legend beside
            _grouped_bars(ax, [_site_label(site) for site, _ in rows], [v.values.tolist() for _, v in rows], label)
            _legend_beside(ax)
        else:
            for site, values in rows:
                ax.plot(values.positions, values.values.detach().cpu().numpy(), marker=".", label=site.title)
            ax.set_xlabel(rows[0][1].axis)
            ax.set_ylabel(label)
            ax.legend(fontsize=6)
        ax.set_title(rows[0][1].note or label, fontsize=9)
    _save(
        figure,
        f"{name}: what each layer learned ({sites[0].mechanism.info.paper})",
        out / f"learned-{name}.png",
        written,
    )


def _plot_position_term_curves(sites: Sequence[AttentionSite], max_distance: int, out: Path, written: List[Path]):
    """Each layer's position term per head against the distance to an earlier key."""
    length = max_distance + 1
    terms = [(site, inspectable.position_term(site.mechanism, length, length, site.kind.causal)) for site in sites]
    terms = [(site, term) for site, term in terms if term is not None]
    if not terms:
        return
    columns = min(len(terms), 3)
    figure, axes = _figure((len(terms) + columns - 1) // columns, columns, 4.0, 3.0)
    distances = torch.arange(length)
    for index, ax in enumerate(axes.flat):
        if index >= len(terms):
            ax.set_visible(False)
            continue
        site, term = terms[index]
        # the last query against the keys before it: distance i - j = 0 .. max_distance
        for head, curve in enumerate(term.values[:, -1].flip(-1)):
            ax.plot(distances.numpy(), curve.detach().cpu().numpy(), label=f"head {head}")
        described = f" ({site.hyperparameters})" if site.hyperparameters else ""
        ax.set_title(f"{site.title}{described}", fontsize=8)
        ax.set_xlabel("distance i - j to an earlier key")
        ax.legend(fontsize=6)
    _save(figure, f"{terms[0][1].title} by distance, per head", out / f"{terms[0][1].name}-curves.png", written)


def _legend_beside(ax):
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_model(
    model, spans: Dict[AttentionSite, Tensor], span_note: str, max_distance: int, out: Path, written: List[Path]
):
    """Per mechanism the model uses: what its layers learned (``learned-MECH.png``)
    and their position terms against the distance (``POSITION-TERM-curves.png``);
    the window spans (``window-spans.png``)."""
    sites = [site for site in attention_sites(model) if site.mechanism is not None]
    for name in dict.fromkeys(site.name for site in sites):
        of_mechanism = [site for site in sites if site.name == name]
        _plot_learned_values(name, of_mechanism, out, written)
        _plot_position_term_curves(of_mechanism, max_distance, out, written)

    if spans:
        window_sites = list(spans)
        figure, axes = _figure(1, 1, max(8.0, 1.2 * len(window_sites)), 3.5)
        _grouped_bars(
            axes[0, 0],
            [_site_label(site) for site in window_sites],
            [spans[site].tolist() for site in window_sites],
            "mean width sum_j M_ij (keys)",
        )
        axes[0, 0].plot(
            range(len(window_sites)),
            [spans[site].mean().item() for site in window_sites],
            "k_",
            markersize=20,
            label="mean over heads",
        )
        _legend_beside(axes[0, 0])
        _save(
            figure,
            f"differentiable window: mean span per layer and head, over {span_note}",
            out / "window-spans.png",
            written,
        )


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot what a fairseq_distattn model attends to and what its mechanisms learned:\n"
        "attention heatmaps of every layer and head, window masks and boundaries, each\n"
        "mechanism's position term and learned values, and window spans; print a per-layer summary.",
        epilog="example (BPE'd input, beam search):\n"
        f"  echo 'a man is riding a bi@@ cycle .' | {PROG} \\\n"
        "      checkpoints/window/checkpoint_best.pt --data data-bin/multi30k-en-de --out inspect/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by fairseq-train")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory for the PNGs and summary.txt")
    dictionaries = parser.add_argument_group("dictionaries: --data, or the dictionary files")
    dictionaries.add_argument(
        "--data",
        type=Path,
        metavar="DATA_BIN",
        help="fairseq-preprocess's output directory (its dict.*.txt; also --subset's data)",
    )
    dictionaries.add_argument("--source-dict", type=Path, metavar="FILE", help="translation: source dict.txt")
    dictionaries.add_argument("--target-dict", type=Path, metavar="FILE", help="translation: target dict.txt")
    dictionaries.add_argument("--dict", type=Path, metavar="FILE", help="language model: its dict.txt")
    dictionaries.add_argument("-s", "--source-lang", metavar="SRC", help="source language (default: the checkpoint's)")
    dictionaries.add_argument(
        "-t", "--target-lang", metavar="TARGET", help="target language (default: the checkpoint's)"
    )

    text = parser.add_argument_group("sentences")
    text.add_argument(
        "--sentence",
        action="append",
        metavar="TEXT",
        help="a source sentence (a language model's text), as fairseq-interactive reads it; repeatable",
    )
    text.add_argument(
        "--target",
        action="append",
        metavar="TEXT",
        help="translation: force this target for the --sentence of the same rank instead of beam search",
    )
    text.add_argument(
        "--input",
        metavar="FILE",
        help="one sentence a line, optionally SOURCE<TAB>TARGET; '-' reads standard input (the default "
        "when no --sentence and no --subset is given)",
    )
    text.add_argument(
        "--tokenizer",
        choices=["moses"],
        help="Moses-tokenise raw input first (as fairseq-interactive --tokenizer moses)",
    )
    text.add_argument(
        "--bpe",
        choices=["subword_nmt"],
        help="apply BPE to raw input first (as fairseq-interactive --bpe subword_nmt; needs --bpe-codes)",
    )
    text.add_argument("--bpe-codes", metavar="FILE", help="the codes of --bpe subword_nmt")

    generation = parser.add_argument_group("beam search (translation without --target)")
    generation.add_argument("--beam", type=int, default=5, metavar="N", help="beam size (default: 5)")
    generation.add_argument(
        "--max-len-a", type=float, default=0, metavar="A", help="generate at most a*src_len+b tokens (default: 0)"
    )
    generation.add_argument(
        "--max-len-b", type=int, default=200, metavar="B", help="generate at most a*src_len+b tokens (default: 200)"
    )
    generation.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default: 1)")

    model_level = parser.add_argument_group("model-level plots")
    model_level.add_argument(
        "--subset",
        metavar="SPLIT",
        help="measure window spans over every sentence of this split of --data (reference "
        "targets forced) instead of over the sentences given",
    )
    model_level.add_argument(
        "--subset-sentences",
        type=int,
        default=0,
        metavar="N",
        help="only the first N sentences of --subset (default: 0, all)",
    )
    model_level.add_argument(
        "--max-distance", type=int, default=50, metavar="D", help="DA f(d) curves for d = 0..D (default: 50)"
    )
    parser.add_argument("--cpu", action="store_true", help="run on CPU even when a GPU is available")
    return parser


def check_arguments(parser: argparse.ArgumentParser, args):
    if not args.checkpoint.is_file():
        parser.error(f"argument checkpoint: no such file: {args.checkpoint}")
    if args.data is not None and (args.source_dict or args.target_dict or args.dict):
        parser.error("argument --data: give either --data or dictionary files, not both")
    if args.target and not args.sentence:
        parser.error("argument --target: needs --sentence (in --input files, write SOURCE<TAB>TARGET)")
    if args.target and len(args.target) != len(args.sentence):
        parser.error(f"argument --target: {len(args.target)} targets for {len(args.sentence)} --sentence")
    if args.sentence and args.input is not None:
        parser.error("argument --input: give either --sentence or --input")
    if (args.bpe is None) != (args.bpe_codes is None):
        parser.error("arguments --bpe and --bpe-codes go together")
    if args.subset is not None and args.data is None:
        parser.error("argument --subset: needs --data")
    # found missing later, these end in a traceback from deep inside fairseq or subword-nmt
    for flag, path in (
        ("--source-dict", args.source_dict),
        ("--target-dict", args.target_dict),
        ("--dict", args.dict),
        ("--bpe-codes", args.bpe_codes),
        ("--input", None if args.input == "-" else args.input),
    ):
        if path is not None and not Path(path).is_file():
            parser.error(f"argument {flag}: no such file: {path}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {args.out} exists and is not a directory")
    for flag, value, least in (
        ("--beam", args.beam, 1),
        ("--max-distance", args.max_distance, 1),
        ("--subset-sentences", args.subset_sentences, 0),
    ):
        if value < least:
            parser.error(f"argument {flag}: invalid value {value}: must be an integer >= {least}")
    if not args.sentence and args.input is None and args.subset is None:
        args.input = "-"  # fairseq-interactive's default


def run(args) -> List[str]:
    """Do the work; returns the printed lines."""
    loaded = load_model(args.checkpoint, args)
    encode_source = TextEncoder(args, getattr(loaded.task.cfg, "source_lang", None), loaded.source_dictionary)
    encode_target = TextEncoder(args, getattr(loaded.task.cfg, "target_lang", None), loaded.target_dictionary)
    limits = PositionLimits.of(loaded)
    # every sentence is encoded and checked before any work: (source, target or None to search)
    inputs: List[Tuple[Optional[Tensor], Optional[Tensor]]] = []
    for number, (source_text, target_text) in enumerate(read_sentences(args)):
        if loaded.translates:
            source = encode_source(source_text)
            target = None if target_text is None else encode_target(target_text)
        else:
            if target_text is not None:
                raise InspectError("a language model has no target: give its text as the sentence")
            source, target = None, encode_source(source_text)
        limits.check(f"sentence {number}", source, target)
        inputs.append((source, target))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    lines = [loaded.description, *attention_summary(loaded.model), ""]
    written: List[Path] = []
    spans = WindowSpans()
    for number, (source, target) in enumerate(inputs):
        if source is None:
            example = Example.forced(None, target, "text")
        elif target is not None:
            example = Example.forced(source, target, "given")
        else:
            example = Example.forced(source, beam_search(loaded, source, args), f"beam {args.beam}")
        records = record_attention(loaded, example)
        if args.subset is None:
            spans.add(records)
        directory = out / f"sentence-{number}"
        before = len(written)
        plot_sentence(records, token_axes(loaded, example), directory, written)
        lines.extend(describe_example(loaded, number, example))
        lines.append(f"  {len(written) - before} PNGs in {directory}")

    span_note = f"{spans.sentences} sentence{'s' if spans.sentences != 1 else ''} given"
    if args.subset is not None:
        for number, example in enumerate(subset_examples(loaded, args.subset, args.subset_sentences)):
            # fairseq-generate stops at such a sentence too (--skip-invalid-size-inputs-valid-test skips it)
            limits.check(f"--subset {args.subset} sentence {number}", example.source, example.decoder_input)
            spans.add(record_attention(loaded, example))
        # a language model's split is read in blocks (--sample-break-mode, --tokens-per-sample)
        span_note = f"{spans.sentences} {'sentences' if loaded.translates else 'blocks'} of {args.subset}"
    lines.extend(spans.lines(span_note))

    before = len(written)
    plot_model(loaded.model, spans.per_head(), span_note, args.max_distance, out, written)
    if len(written) > before:
        lines.append("model-level plots: " + ", ".join(str(path) for path in written[before:]))
    (out / "summary.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def record_attention(loaded: LoadedModel, example: Example) -> List[AttentionRecord]:
    with AttentionRecorder(loaded.model) as recorder:
        forward(loaded, example)
        return recorder.take()


def token_axes(loaded: LoadedModel, example: Example) -> Dict[AttentionKind, Axes]:
    def symbols(dictionary, tokens):
        return [dictionary[index] for index in tokens.tolist()]

    predicted = symbols(loaded.target_dictionary, example.target)
    decoder_input = symbols(loaded.target_dictionary, example.decoder_input)
    axes = {DECODER_SELF: Axes(predicted, decoder_input, ("query: predicted token", "key: decoder input"))}
    if example.source is not None:
        source = symbols(loaded.source_dictionary, example.source)
        axes[ENCODER_SELF] = Axes(source, source, ("query: source", "key: source"))
        axes[CROSS] = Axes(predicted, source, ("query: predicted token", "key: source"))
    return axes


def describe_example(loaded: LoadedModel, number: int, example: Example) -> List[str]:
    lines = [f"sentence {number}"]
    unknown = loaded.source_dictionary.unk()
    if example.source is not None:
        lines.append(f"  source: {loaded.source_dictionary.string(example.source)}")
        unknowns = int((example.source == unknown).sum())
        if unknowns:
            lines.append(f"  note: {unknowns} source token(s) are not in the dictionary (<unk>); is the input BPE'd?")
        lines.append(f"  target ({example.target_from}): {loaded.target_dictionary.string(example.target)}")
    else:
        lines.append(f"  text: {loaded.target_dictionary.string(example.target)}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    args.device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    # fairseq configures the root logger at DEBUG when its wav2vec2 models are
    # imported (here, with the plugin's fairseq side); this tool's output is its own lines, warnings aside
    from .. import models  # noqa: F401

    logging.getLogger().setLevel(logging.WARNING)
    try:
        lines = run(args)
    except InspectError as error:
        sys.stderr.write(f"{PROG}: error: {error}\n")
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
