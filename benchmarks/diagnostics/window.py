"""What the trained window configuration attends to: ``python -m benchmarks.diagnostics.window``.

The translation grid's ``window`` model (Nguyen et al. 2020's best: encoder
AW, decoder MW, cross AW-seg in layers 0-2) against its ``vanilla`` model, to
tell whether the window learned to narrow attention or stayed where it
started. For the trained window model, the same model at step 0
(fairseq-train's initial parameters, rebuilt by
:func:`benchmarks.diagnostics.parameter_movement.initial_state`) and the
vanilla model trained and at step 0, over the first ``--sentences``
sentence pairs of a split (reference targets forced, one sentence a batch, so
no key is padding) it measures, per attention kind and layer:

1. attention entropy in nats, mean over query rows and heads, over the keys a
   row may see (MW rows, softmax * M, are renormalised first; their mass is
   reported separately);
2. for window layers, the entropy of the left and right boundary
   distributions (eqs. 7-8), the soft-window width ``sum_j M_ij`` in keys and
   as a fraction of the row's visible keys, against the width uniform
   boundary distributions give, M at the query's own key and the expected
   boundaries relative to the query;
3. the scale of the window terms: for AW the within-row std of the plain
   logits ``Q K^T / sqrt d``, of the local scores and of the additive term
   ``local * M``; for MW the mean of M and the attention mass left after the
   product (vanilla rows have mass 1).

It also checks the window model's masking three ways (batched with padding
against one sentence at a time, the fused training path against the
recorded one, incremental decoding against teacher forcing) and writes
``window_diagnostics.json``, ``window_diagnostics.md`` (tables and findings
generated from the numbers) and two PNGs under ``--out``. ``--tiny`` runs
the same code on tiny random models (the test's mode).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import tempfile
from dataclasses import dataclass
from inspect import signature
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fairseq_distattn.registry import CROSS, DECODER_SELF
from fairseq_distattn.registry import KINDS as ATTENTION_KINDS

from ..common import REPO_ROOT, at_least, shown
from ..harness.seeds import (
    BETTER,
    WITHIN_NOISE,
    WORSE,
    compare_means,
    difference_text,
    mean_std_text,
    seed_std,
    seeds_cell,
)
from ..tiny_models import NO_DROPOUT, TINY_WIDTHS

DEFAULT_WORK = REPO_ROOT / "work" / "quality"
DEFAULT_CHECKPOINT = DEFAULT_WORK / "small" / "window-seed1" / "averaged.pt"
DEFAULT_VANILLA = DEFAULT_WORK / "small" / "vanilla-seed1" / "averaged.pt"
DEFAULT_DATA = DEFAULT_WORK / "data-6000" / "data-bin"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "window_diagnostics"
DEFAULT_QUALITY_RUNS = REPO_ROOT / "benchmarks" / "results" / "quality" / "runs"
PROG = "python -m benchmarks.diagnostics.window"

KINDS = tuple(kind.label for kind in ATTENTION_KINDS)  # the registry's column names: "encoder self", ...
STATES = (("window", "trained"), ("window", "init"), ("vanilla", "trained"), ("vanilla", "init"))
# M is profiled over key offsets j - (the query's diagonal key) in [-MAX_OFFSET, MAX_OFFSET]
MAX_OFFSET = 12
# boundary entropy at least this share of log n reads as uniform boundaries
UNIFORM_POINTERS = 0.9
# two means within this relative distance read as "about the same"
NEAR = 0.05
# float32 models: logits agreeing to this are the same computation in another order
CONSISTENT_LOGITS = 1e-3
# the consistency checks' batch: enough sentences of different lengths for real padding
CHECK_SENTENCES = 16
# the quality runs shown beside the diagnostics, in this order: vanilla, the paper's
# configuration, the named departure from eq. 9, each kind alone, and MW everywhere
WINDOW_CONFIGS = (
    "vanilla",
    "window",
    "window-expected-mask",
    "window-enc-only",
    "window-dec-only",
    "window-cross-only",
    "window-mw",
)


# ----------------------------------------------------------------------------- statistics


def row_entropy(weights: Tensor) -> Tensor:
    """Entropy in nats of every row over the last dim, after normalising it to
    sum 1 (MW rows are softmax * M); zero weights (hidden keys) add nothing."""
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / total.clamp_min(torch.finfo(weights.dtype).tiny)
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def visible_keys(kind: str, tgt_len: int, src_len: int) -> Tensor:
    """``[Tq, Tk]`` bool, the keys each query may see in a one-sentence batch (no padding)."""
    visible = torch.ones(tgt_len, src_len, dtype=torch.bool)
    return visible.tril() if kind == DECODER_SELF.label else visible


def diagonal_keys(kind: str, tgt_len: int, src_len: int) -> Tensor:
    """The key each query is "at": itself in self-attention, the proportional
    source position in cross-attention (a reference point for offsets, no alignment)."""
    rows = torch.arange(tgt_len, dtype=torch.float64)
    if kind != CROSS.label:
        return rows.long()
    return torch.round(rows * (src_len - 1) / max(tgt_len - 1, 1)).long()


def uniform_pointer_mask(keys: int, segment_size: int = 0) -> Tensor:
    """Eq. 9 (eq. 11 with segments) for uniform boundary distributions over
    ``keys`` keys, from the probabilities directly: with ``l, r`` uniform,
    ``f_j = P(l <= end of j's segment)`` and ``g_j = P(r >= start of j's
    segment)``, and both terms of eq. 9 equal ``f_j g_j``."""
    size = max(segment_size, 1)
    position = torch.arange(1, keys + 1, dtype=torch.float64)
    segment_end = torch.clamp(size * torch.ceil(position / size), max=keys)
    segment_start = size * (torch.ceil(position / size) - 1) + 1
    return 2 * (segment_end / keys) * ((keys - segment_start + 1) / keys)


def uniform_pointer_width(keys: int) -> float:
    """``sum_j`` of :func:`uniform_pointer_mask` at token level, in closed form: (n+1)(n+2)/(3n)."""
    return (keys + 1) * (keys + 2) / (3 * keys)


def within_row_std(scores: Tensor, visible: Tensor) -> Tensor:
    """Population std over the visible keys of every row (softmax ignores a per-row
    shift, so this is the spread that shapes the distribution); rows with one key give 0."""
    count = visible.sum(dim=-1).clamp_min(1)
    values = scores.masked_fill(~visible, 0.0)
    mean = values.sum(dim=-1) / count
    centred = (scores - mean[..., None]).masked_fill(~visible, 0.0)
    return (centred.pow(2).sum(dim=-1) / count).sqrt()


class Pool:
    """Means of named quantities, each pooled over every value added (query rows of all sentences)."""

    def __init__(self):
        self.sums: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}

    def add(self, name: str, values: Tensor):
        values = values.double().flatten()
        self.sums[name] = self.sums.get(name, 0.0) + values.sum().item()
        self.counts[name] = self.counts.get(name, 0) + values.numel()

    def means(self) -> Dict[str, float]:
        return {name: self.sums[name] / self.counts[name] for name in self.sums if self.counts[name]}


# ----------------------------------------------------------------------------- capture


@dataclass
class WindowInputs:
    """What one window mechanism received for one sentence, float64, first batch element, ``[H, T, D]``."""

    queries: Dict[str, Tensor]
    keys: Dict[str, Tensor]


class WindowInputRecorder:
    """Forward hooks on the window mechanisms of ``sites`` that keep their
    queries and keys (the scale diagnostics need the local scores and the
    global logits, which no module returns)."""

    def __init__(self, sites):
        from fairseq_distattn.mechanisms.differentiable_window import DifferentiableWindow

        self.sites = [site for site in sites if isinstance(site.mechanism, DifferentiableWindow)]
        self.inputs: Dict[object, WindowInputs] = {}
        self._handles = []

    def __enter__(self) -> "WindowInputRecorder":
        for site in self.sites:
            self._handles.append(site.mechanism.register_forward_hook(self._hook(site), with_kwargs=True))
        return self

    def __exit__(self, *exc_info):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, site):
        def hook(mechanism, args, kwargs, output):
            inputs = signature(mechanism.forward).bind(*args, **kwargs).arguments
            self.inputs[site] = WindowInputs(
                {k: v[0].double() for k, v in inputs["queries"].items()},
                {k: v[0].double() for k, v in inputs["keys"].items()},
            )

        return hook


def kind_name(site) -> str:
    return site.kind.label


def site_key(site) -> str:
    return f"{kind_name(site)} {site.layer}"


class SiteStatistics:
    """Everything measured at one attention site, pooled over sentences."""

    def __init__(
        self, kind: str, layer: int, mechanism: str, is_window: bool, additive: bool = False, segment_size: int = 0
    ):
        self.kind, self.layer, self.mechanism = kind, layer, mechanism
        self.is_window, self.additive, self.segment_size = is_window, additive, segment_size
        self.pool = Pool()
        self.offset_sums = torch.zeros(2 * MAX_OFFSET + 1, dtype=torch.float64)
        self.offset_counts = torch.zeros(2 * MAX_OFFSET + 1, dtype=torch.float64)

    @classmethod
    def of_site(cls, site) -> "SiteStatistics":
        from fairseq_distattn.mechanisms.differentiable_window import DifferentiableWindow

        window = site.mechanism if isinstance(site.mechanism, DifferentiableWindow) else None
        if window is None:
            return cls(kind_name(site), site.layer, site.name, False)
        return cls(kind_name(site), site.layer, site.name, True, window.additive, window.segment_size)

    def add(self, probs: Tensor, window, inputs: Optional[WindowInputs]):
        """``probs`` ``[H, Tq, Tk]`` as the model weighted the values; ``window``
        the recorder's :class:`fairseq_distattn.tools.inspection.WindowInternals` or None."""
        heads, tgt_len, src_len = probs.shape
        visible = visible_keys(self.kind, tgt_len, src_len)
        if bool((probs.masked_fill(visible, 0.0) != 0).any()):
            raise AssertionError(f"{self.kind} layer {self.layer}: attention on a key the query may not see")
        keys_seen = visible.sum(dim=-1).double().expand(heads, tgt_len)
        pool = self.pool
        pool.add("entropy", row_entropy(probs))
        pool.add("uniform_entropy", keys_seen.log())
        pool.add("mass", probs.sum(dim=-1))
        if not self.is_window or self.additive:
            # a softmax row's log-probabilities are its logits up to a per-row shift
            logits = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
            pool.add("logit_std", within_row_std(logits, visible))
        if window is None:
            return
        mask = window.mask
        pool.add("left_entropy", row_entropy(window.left_pointer))
        pool.add("right_entropy", row_entropy(window.right_pointer))
        width = mask.sum(dim=-1)
        pool.add("width", width)
        pool.add("width_fraction", width / keys_seen)
        reference = torch.stack(
            [uniform_pointer_mask(int(n), self.segment_size).sum() for n in visible.sum(dim=-1).tolist()]
        )
        pool.add("uniform_width", reference.expand(heads, tgt_len))
        visible_m = mask.masked_select(visible.expand_as(mask))
        pool.add("mean_m", visible_m)
        # eq. 9 counts a key twice where both boundaries agree on it, so M exceeds 1 there
        pool.add("m_above_one", (visible_m > 1).double())
        pool.add("max_m", mask.amax(dim=-1))
        diagonal = diagonal_keys(self.kind, tgt_len, src_len)
        rows = torch.arange(tgt_len)
        pool.add("m_at_query", mask[:, rows, diagonal])
        left, right = window.expected_boundaries()
        pool.add("left_offset", left - diagonal.double())
        pool.add("right_offset", right - diagonal.double())
        offsets = torch.arange(src_len)[None, :] - diagonal[:, None]
        in_range = visible & (offsets.abs() <= MAX_OFFSET)
        bins = (offsets + MAX_OFFSET)[in_range]
        self.offset_sums.index_add_(0, bins, mask[:, in_range].sum(dim=0))
        self.offset_counts.index_add_(0, bins, torch.full(bins.shape, float(heads), dtype=torch.float64))
        if inputs is not None:
            self._add_scales(inputs, mask, visible)

    def _add_scales(self, inputs: WindowInputs, mask: Tensor, visible: Tensor):
        def scores(query: str, key: str) -> Tensor:
            q, k = inputs.queries[query], inputs.keys[key]
            return q @ k.transpose(-2, -1) / q.size(-1) ** 0.5

        global_logits = scores("query", "key")
        self.pool.add("global_std", within_row_std(global_logits, visible))
        if self.additive:
            local = scores("local_query", "local_key")
            self.pool.add("local_std", within_row_std(local, visible))
            self.pool.add("window_term_std", within_row_std(local * mask, visible))

    def result(self) -> Dict[str, object]:
        profile = (self.offset_sums / self.offset_counts.clamp_min(1)).tolist()
        return {
            "kind": self.kind,
            "layer": self.layer,
            "mechanism": self.mechanism,
            "segment_size": self.segment_size,
            **self.pool.means(),
            **(
                {"m_by_offset": [None if c == 0 else value for value, c in zip(profile, self.offset_counts.tolist())]}
                if self.is_window
                else {}
            ),
        }


@dataclass
class Example:
    """One sentence pair, reference target forced (see :class:`fairseq_distattn.tools.inspection.Example`)."""

    source: Tensor
    decoder_input: Tensor
    target: Tensor


def measure(model, examples: Sequence) -> List[Dict[str, object]]:
    """Per attention site (encoder self, decoder self, cross; by layer), the pooled diagnostics."""
    from fairseq_distattn.modules.summary import attention_sites
    from fairseq_distattn.tools import inspection as tool

    sites = attention_sites(model)
    statistics_by_site = {site: SiteStatistics.of_site(site) for site in sites}
    device = next(model.parameters()).device
    with tool.AttentionRecorder(model) as recorder, WindowInputRecorder(sites) as inputs, torch.no_grad():
        for example in examples:
            source = example.source[None].to(device)
            model(source, torch.tensor([source.size(1)], device=device), example.decoder_input[None].to(device))
            for record in recorder.take():
                statistics_by_site[record.site].add(record.probs, record.window, inputs.inputs.get(record.site))
            inputs.inputs.clear()
    return [statistics_by_site[site].result() for site in sites]


# ----------------------------------------------------------------------------- masking checks


def _logits(
    model, sources: List[Tensor], decoder_inputs: List[Tensor], pad: int, left_pad_source: bool = True
) -> Tensor:
    """Decoder logits ``[B, T, V]`` of a padded batch as fairseq's collater pads
    it (source left-padded, targets right-padded)."""
    from fairseq.data import data_utils

    device = next(model.parameters()).device
    src = data_utils.collate_tokens(sources, pad, left_pad=left_pad_source).to(device)
    prev = data_utils.collate_tokens(decoder_inputs, pad, left_pad=False).to(device)
    lengths = torch.tensor([len(s) for s in sources], device=device)
    return model(src, lengths, prev)[0].double().cpu()


def masking_checks(model, examples: Sequence[Example], pad: int, left_pad_source: bool = True) -> Dict[str, float]:
    """Largest |difference| of decoder logits between three ways of computing
    the same thing; each is ~1e-6 unless some padding, causal or cache handling differs:
    ``batched_vs_single`` (padded batch vs one sentence at a time, the model's
    own training path), ``fused_vs_recorded`` (need_weights=False paths, fused
    for AW, vs the weights-returning path the diagnostics read),
    ``incremental_vs_forced`` (step-by-step decoding with the cache vs teacher forcing)."""
    from fairseq_distattn.modules.summary import attention_sites
    from fairseq_distattn.tools import inspection as tool

    examples = list(examples)[:CHECK_SENTENCES]
    result = {"batched_vs_single": 0.0, "fused_vs_recorded": 0.0, "incremental_vs_forced": 0.0}
    with torch.no_grad():
        batched = _logits(
            model, [e.source for e in examples], [e.decoder_input for e in examples], pad, left_pad_source
        )
        device = next(model.parameters()).device
        for row, example in enumerate(examples):
            single = _logits(model, [example.source], [example.decoder_input], pad, left_pad_source)[0]
            length = len(example.decoder_input)
            result["batched_vs_single"] = max(
                result["batched_vs_single"], (batched[row, :length] - single).abs().max().item()
            )
            with tool.AttentionRecorder(model) as recorder:
                recorded = _logits(model, [example.source], [example.decoder_input], pad, left_pad_source)[0]
                recorder.take()
            result["fused_vs_recorded"] = max(result["fused_vs_recorded"], (recorded - single).abs().max().item())
            source = example.source[None].to(device)
            encoder_out = model.encoder(source, src_lengths=torch.tensor([source.size(1)], device=device))
            state: Dict = {}
            prev = example.decoder_input[None].to(device)
            for step in range(length):
                step_logits = model.decoder(prev[:, : step + 1], encoder_out=encoder_out, incremental_state=state)[0]
                difference = (step_logits[0, -1].double().cpu() - single[step]).abs().max().item()
                result["incremental_vs_forced"] = max(result["incremental_vs_forced"], difference)
    result["sentences"] = len(examples)
    result["sites"] = len(attention_sites(model))
    return result


# ----------------------------------------------------------------------------- models


def _checkpoint(path: Path) -> Path:
    """``path``, or the run's checkpoint_best.pt when the averaged model is missing."""
    if path.is_file():
        return path
    for fallback in (path.parent / "checkpoint_best.pt", path.parent / "checkpoints" / "checkpoint_best.pt"):
        if fallback.is_file():
            return fallback
    raise SystemExit(f"{PROG}: no checkpoint at {shown(path)} (nor a checkpoint_best.pt beside it)")


def load_pair(checkpoint: Path, data: Path):
    """``(trained model, the same model at fairseq-train's step 0, task)`` on the CPU, float32, eval mode."""
    from fairseq import checkpoint_utils

    from fairseq_distattn.tools import inspection as tool

    from .parameter_movement import initial_state

    options = argparse.Namespace(data=data, source_lang=None, target_lang=None, device=torch.device("cpu"))
    loaded = tool.load_model(checkpoint, options)
    cfg = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["cfg"]
    initial = copy.deepcopy(loaded.model)
    initial.load_state_dict(initial_state(cfg, str(data)), strict=True)
    return loaded.model.eval(), initial.eval(), loaded.task


def split_examples(model, task, split: str, count: int) -> List[Example]:
    """The first ``count`` sentence pairs of ``split``, reference targets forced."""
    from fairseq_distattn.tools import inspection as tool

    loaded = tool.LoadedModel(model, task, "")
    return [Example(e.source, e.decoder_input, e.target) for e in tool.subset_examples(loaded, split, count)]


TINY_DIMENSIONS = [*TINY_WIDTHS, *NO_DROPOUT]
TINY_WINDOW = [
    "--encoder-self-attention",
    "window-aw",
    "--decoder-self-attention",
    "window-mw",
    "--cross-attention",
    "window-aw-seg",
    "--window-segment-size",
    "2",
]


def tiny_models(seed: int = 1):
    """``{"window": (trained stand-in, init), "vanilla": (...)}`` and the shared dictionary: tiny
    random models, the "trained" one the initial one with every parameter moved."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    import fairseq_distattn.models  # noqa: F401  (registers the architectures)

    dictionary = Dictionary()
    for index in range(24):
        dictionary.add_symbol(f"w{index}")
    models = {}
    for name, arch, flags in (("window", "distattn_transformer", TINY_WINDOW), ("vanilla", "transformer", [])):
        args = options.parse_args_and_arch(
            options.get_training_parser(), ["data", "--task", "translation", "--arch", arch, *TINY_DIMENSIONS, *flags]
        )
        torch.manual_seed(seed)
        initial = TranslationTask(args, dictionary, dictionary).build_model(args).eval()
        trained = copy.deepcopy(initial)
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for parameter in trained.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
        models[name] = (trained, initial)
    return models, dictionary


def tiny_examples(dictionary, count: int, seed: int = 2) -> List[Example]:
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(count):
        lengths = torch.randint(3, 12, (2,), generator=generator).tolist()
        source, target = (
            torch.cat(
                [
                    torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator),
                    torch.tensor([dictionary.eos()]),
                ]
            )
            for n in lengths
        )
        examples.append(Example(source, torch.cat([target[-1:], target[:-1]]), target))
    return examples


def window_layer_share(model) -> Dict[str, Tuple[int, int]]:
    """``{kind: (window layers, layers)}``."""
    from fairseq_distattn.modules.summary import attention_sites

    share: Dict[str, Tuple[int, int]] = {}
    for site in attention_sites(model):
        windowed, total = share.get(kind_name(site), (0, 0))
        share[kind_name(site)] = (windowed + site.name.startswith("window"), total + 1)
    return share


# ----------------------------------------------------------------------------- report


def quality_context(runs: Path) -> Optional[Dict[str, object]]:
    """BLEU, sacreBLEU and valid perplexity per seed of vanilla and the window
    configurations of :data:`WINDOW_CONFIGS` (the quality grid's committed run
    files); None until vanilla and window both have runs."""
    if not runs.is_dir():
        return None
    by_config: Dict[str, List[Dict]] = {}
    for path in sorted(runs.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("config") in WINDOW_CONFIGS:
            by_config.setdefault(record["config"], []).append(record)
    if not {"vanilla", "window"} <= set(by_config):
        return None
    return {
        name: [
            {
                "seed": r["seed"],
                "bleu": r["tokenized_bleu_compound_split"],
                "sacrebleu": r["sacrebleu"],
                "valid_ppl": r["valid_ppl_averaged"],
                "note": r.get("note", ""),
            }
            for r in sorted(by_config[name], key=lambda r: r["seed"])
        ]
        for name in WINDOW_CONFIGS
        if name in by_config
    }


def quality_table(quality: Dict[str, List[Dict]]) -> List[str]:
    """The quality runs of the window configurations: BLEU over seeds for vanilla, the paper's window
    configuration, the named departure and each single-kind ablation."""
    vanilla = [r["bleu"] for r in quality["vanilla"]]
    vanilla_sacre = [r["sacrebleu"] for r in quality["vanilla"] if "sacrebleu" in r]
    rows = []
    for name, records in quality.items():
        bleu = [r["bleu"] for r in records]
        sacre = [r["sacrebleu"] for r in records if "sacrebleu" in r]
        rows.append(
            [
                name,
                seeds_cell(records),
                mean_std_text(bleu),
                "-" if name == "vanilla" else difference_text(bleu, vanilla),
                mean_std_text(sacre) if sacre else "-",
                "-" if name == "vanilla" else difference_text(sacre, vanilla_sacre),
                mean_std_text([r["valid_ppl"] for r in records]),
                records[0].get("note", "").replace("|", "\\|"),
            ]
        )
    missing = [name for name in WINDOW_CONFIGS if name not in quality]
    return [
        "## BLEU of the window configurations (the quality grid's runs)",
        "",
        "`python -m benchmarks.quality.mt` (2000 updates, 3+3 layers x 256, average of the last 5 checkpoints, "
        "beam 5, test_2016_flickr); mean +- sample std over seeds. `window-expected-mask` is the named "
        "departure `--window-expected-mask` (M in [0, 1]); the `-only` rows keep one of the window "
        "configuration's three kinds and leave the others vanilla.",
        "",
        *_table(
            [
                "config",
                "runs (seeds)",
                "BLEU tok+compound",
                "delta vs vanilla",
                "sacreBLEU",
                "delta vs vanilla",
                "valid ppl",
                "what",
            ],
            rows,
        ),
        "",
        *([f"Not run yet: {', '.join(missing)}.", ""] if missing else []),
    ]


def _sites(results: Dict, model: str, state: str) -> List[Dict]:
    return results["models"][model][state]


def _by_site(results: Dict, model: str, state: str) -> Dict[Tuple[str, int], Dict]:
    return {(s["kind"], s["layer"]): s for s in _sites(results, model, state)}


def _kind_mean(sites: Sequence[Dict], kind: str, metric: str) -> Optional[float]:
    values = [s[metric] for s in sites if s["kind"] == kind and metric in s]
    return statistics.fmean(values) if values else None


def _f(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> List[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def window_vs_vanilla(quality: Dict[str, List[Dict]]) -> Tuple[float, Optional[float], str]:
    """Window's mean BLEU minus vanilla's, one standard error of that difference and its reading:
    the rule every table here uses (:mod:`..harness.seeds`); None and "unread" while vanilla has one seed."""
    vanilla = [r["bleu"] for r in quality["vanilla"]]
    window = [r["bleu"] for r in quality["window"]]
    gap, noise, reading = compare_means(window, vanilla, seed_std(vanilla), higher_is_better=True)
    return gap, noise, "unread" if noise is None else reading


def noise_text(quality: Dict[str, List[Dict]], noise: Optional[float]) -> str:
    if noise is None:
        return "no seed noise to read it against: vanilla has one seed"
    n_window, n_vanilla = len(quality["window"]), len(quality["vanilla"])
    return (
        f"one standard error of the difference: vanilla's seed std times sqrt(1/{n_window} + 1/{n_vanilla}), "
        f"{noise:.2f} BLEU"
    )


def quality_finding(quality: Dict[str, List[Dict]]) -> str:
    """Whether window trains worse than vanilla, read against seed noise."""
    vanilla_bleu = [r["bleu"] for r in quality["vanilla"]]
    window_bleu = [r["bleu"] for r in quality["window"]]
    gap, noise, reading = window_vs_vanilla(quality)
    verdict = {
        WITHIN_NOISE: "so on these numbers it does not train worse; seed noise alone could make a gap of this size.",
        BETTER: "so it trains better on these numbers.",
        WORSE: "so it trains worse on these numbers.",
    }.get(reading, "so these numbers cannot say.")
    return (
        f"**Is window worse?** Window scores BLEU {mean_std_text(window_bleu)} over {len(window_bleu)} "
        f"seed(s) ({', '.join(_f(b, 2) for b in window_bleu)}) against vanilla {mean_std_text(vanilla_bleu)} "
        f"over {len(vanilla_bleu)} seeds ({', '.join(_f(b, 2) for b in vanilla_bleu)}): a difference of "
        f"{gap:+.2f}, {reading} ({noise_text(quality, noise)}), {verdict}"
        f" Valid perplexity: window {', '.join(_f(r['valid_ppl'], 2) for r in quality['window'])}, vanilla "
        f"{', '.join(_f(r['valid_ppl'], 2) for r in quality['vanilla'])}."
    )


def placement_finding(share: Dict[str, Tuple[int, int]]) -> str:
    """How many layers of each kind are windowed, against the paper's lower half."""
    all_windowed = [kind for kind in KINDS if kind in share and share[kind][0] == share[kind][1]]
    return (
        "**Layer placement.** Window layers per kind: "
        + ", ".join(f"{kind} {share[kind][0]}/{share[kind][1]}" for kind in KINDS if kind in share)
        + (
            f". In {', '.join(all_windowed)} every layer is windowed: the paper windows only the lower 3 of 6 layers "
            "and keeps the upper layers global (sec. 4.3), which this model cannot do at its depth."
            if all_windowed
            else "."
        )
    )


def boundary_entropy(window_sites: Sequence[Dict]) -> float:
    """The mean entropy of the left and right boundaries as a share of the uniform one (log n)."""
    return statistics.fmean(
        (s["left_entropy"] + s["right_entropy"]) / 2 / s["uniform_entropy"]
        for s in window_sites
        if s["uniform_entropy"] > 0
    )


def initial_window_finding(initial: Sequence[Dict], kind: str) -> Optional[str]:
    """What the windows of ``kind`` are at step 0: uniform boundaries or not, how much they
    cover, and whether they favour the query's own key (None: no window of that kind)."""
    init_sites = [s for s in initial if s["kind"] == kind and "width" in s]
    if not init_sites:
        return None
    pointer = boundary_entropy(init_sites)
    width_ratio = statistics.fmean(s["width"] / s["uniform_width"] for s in init_sites)
    fraction = _kind_mean(initial, kind, "width_fraction")
    at_query, mean_m = _kind_mean(initial, kind, "m_at_query"), _kind_mean(initial, kind, "mean_m")
    uniform = pointer >= UNIFORM_POINTERS and abs(width_ratio - 1) <= 0.05
    shape, centre = window_coverage(fraction), window_centre(kind, at_query, mean_m)
    return (
        f"**{kind.capitalize()}, step 0.** Boundary entropy is {pointer:.1%} of log n and the width "
        f"{width_ratio:.3f} times what uniform boundaries give"
        + (
            ", so M is the uniform-boundary window, a tent peaked at the middle of the visible keys whatever the "
            "query: "
            if uniform
            else ": "
        )
        + f"it covers {fraction:.1%} of the visible keys on average, {shape}. {centre}"
        + (
            " (with uniform causal boundaries the newest key, the query's own, gets M = 2/n: the longer the "
            "prefix, the less the current token is seen)."
            if kind == DECODER_SELF.label and uniform
            else "."
        )
    )


def window_coverage(fraction: float) -> str:
    """How much of the visible keys a window that covers ``fraction`` of them shows, in words."""
    if fraction > 0.8:
        return "nearly everything visible"
    if fraction >= 0.2:
        return "neither everything visible (100%) nor a narrow window"
    return "a narrow window"


def window_centre(kind: str, at_query: float, mean_m: float) -> str:
    """Whether a window of ``kind`` favours the query's own key (cross-attention: the diagonal
    one): its M there against its mean M."""
    key = "own" if kind != CROSS.label else "diagonal"
    if abs(at_query - mean_m) <= NEAR * mean_m:
        return (
            f"M at the query's {key} key ({at_query:.3f}) is about the mean M ({mean_m:.3f}): the window "
            "does not favour the query's neighbourhood"
        )
    if at_query < mean_m:
        return (
            f"Its peak is not at the query: M at the query's {key} key is {at_query:.3f} against a mean M "
            f"of {mean_m:.3f}"
        )
    return f"M at the query's {key} key is {at_query:.3f}, above the mean M of {mean_m:.3f}"


def mw_scale_finding(initial: Sequence[Dict], trained: Sequence[Dict]) -> Optional[str]:
    """How much attention mass MW's product with M leaves (None: no MW layer)."""
    mw_init = [s for s in initial if s["mechanism"].startswith("window-mw")]
    if not mw_init:
        return None
    mass = statistics.fmean(s["mass"] for s in mw_init)
    mass_trained = statistics.fmean(s["mass"] for s in trained if s["mechanism"].startswith("window-mw"))
    return (
        f"**MW scale.** The product S(score) * M keeps {mass:.1%} of the attention mass at step 0 (vanilla: "
        f"100%): the MW layers' outputs start at about {mass:.2f} of a vanilla layer's size; after training "
        f"the mass is {mass_trained:.1%}."
    )


def aw_scale_finding(initial: Sequence[Dict], trained: Sequence[Dict]) -> Optional[str]:
    """How large AW's additive window term is beside the plain logits (None: no AW layer)."""
    aw_init = [s for s in initial if "window_term_std" in s]
    if not aw_init:
        return None
    ratio = statistics.fmean(s["window_term_std"] / s["global_std"] for s in aw_init)
    local = statistics.fmean(s["local_std"] / s["global_std"] for s in aw_init)
    aw_trained = [s for s in trained if "window_term_std" in s]
    ratio_trained = statistics.fmean(s["window_term_std"] / s["global_std"] for s in aw_trained)
    return (
        f"**AW scale.** At step 0 the additive window term local * M has {ratio:.2f} times the within-row std "
        f"of the plain logits Q K^T / sqrt d (the local scores alone {local:.2f} times): "
        + (
            "a small perturbation of vanilla attention, on a sane scale"
            if ratio < 1
            else "larger than the logits themselves"
        )
        + f"; after training the ratio is {ratio_trained:.2f}."
    )


def trained_window_finding(trained: Sequence[Dict], vanilla_trained: Sequence[Dict], kind: str) -> Optional[str]:
    """Where the trained windows of ``kind`` sit and how peaked their attention is beside
    vanilla's (None: no window of that kind)."""
    window_sites = [s for s in trained if s["kind"] == kind and "width" in s]
    if not window_sites:
        return None
    pointer = boundary_entropy(window_sites)
    at_query, mean_m = _kind_mean(trained, kind, "m_at_query"), _kind_mean(trained, kind, "mean_m")
    return (
        f"**{kind.capitalize()}, trained.** Boundary entropy {pointer:.1%} of log n, window width "
        f"{_kind_mean(trained, kind, 'width_fraction'):.1%} of the visible keys "
        f"({_kind_mean(trained, kind, 'width'):.2f} keys), M at the query's key {at_query:.3f} vs mean M "
        f"{mean_m:.3f} ("
        + (
            "the windows moved onto the query's neighbourhood"
            if at_query > (1 + NEAR) * mean_m
            else "the windows are not centred on the query"
        )
        + f"), M above 1 on {_kind_mean(trained, kind, 'm_above_one'):.1%} of the visible keys (eq. 9's double "
        f"count where l = r); attention entropy {_kind_mean(trained, kind, 'entropy'):.3f} nats vs vanilla "
        f"{_kind_mean(vanilla_trained, kind, 'entropy'):.3f}."
    )


MASKING_CHECKS = ("batched_vs_single", "fused_vs_recorded", "incremental_vs_forced")


def worst_masking_difference(checks: Dict[str, float]) -> float:
    return max(checks[name] for name in MASKING_CHECKS)


def masking_finding(checks: Dict[str, float]) -> str:
    """Whether every path of the window model masks alike (the worst check against
    CONSISTENT_LOGITS)."""
    worst = worst_masking_difference(checks)
    return (
        f"**Masking.** Over {checks['sentences']} sentences the window model's logits agree batched with padding vs "
        f"alone ({checks['batched_vs_single']:.1e}), fused vs recorded path ({checks['fused_vs_recorded']:.1e}) "
        f"and incremental vs teacher-forced ({checks['incremental_vs_forced']:.1e}); "
        + (
            "no attention kind masks differently in any path."
            if worst <= CONSISTENT_LOGITS
            else f"**DEFECT: a difference of {worst:.1e} exceeds {CONSISTENT_LOGITS:.0e}: "
            "some path masks differently.**"
        )
        + " Every recorded attention row puts zero weight on keys its query may not see (checked per row)."
    )


def findings(results: Dict) -> List[str]:
    """The findings paragraph, every number in it read from ``results``."""
    trained, initial = _sites(results, "window", "trained"), _sites(results, "window", "init")
    vanilla_trained = _sites(results, "vanilla", "trained")
    quality = results.get("quality")
    paragraphs = [
        quality_finding(quality) if quality else None,
        placement_finding(results["window_layers"]),
        *(initial_window_finding(initial, kind) for kind in KINDS),
        mw_scale_finding(initial, trained),
        aw_scale_finding(initial, trained),
        *(trained_window_finding(trained, vanilla_trained, kind) for kind in KINDS),
        masking_finding(results["checks"]),
        conclusion(results, worst_masking_difference(results["checks"])),
    ]
    return [paragraph for paragraph in paragraphs if paragraph is not None]


def conclusion(results: Dict, worst_check: float) -> str:
    """One paragraph that puts the measurements above together."""
    trained, initial = _sites(results, "window", "trained"), _sites(results, "window", "init")
    quality = results.get("quality")
    parts = [
        *([quality_sentence(quality)] if quality else []),
        "No masking defect shows in any attention kind."
        if worst_check <= CONSISTENT_LOGITS
        else "A masking path disagrees (see Masking): that is a defect to fix before reading anything else.",
        *initial_window_sentences(initial),
        *trained_window_sentences(trained),
        *additive_window_sentences(initial),
    ]
    if any(windowed == total for windowed, total in results["window_layers"].values()):
        parts.append(
            "The one departure from the paper's recipe is placement: the quality grid's `@0-2` windows "
            "every layer of this 3-layer model, where the paper keeps the upper half global."
        )
    return "**Conclusion.** " + " ".join(parts)


def quality_sentence(quality: Dict[str, List[Dict]]) -> str:
    gap, noise, reading = window_vs_vanilla(quality)
    if reading == WORSE:
        return f"The window model trails vanilla by {-gap:.2f} BLEU, beyond seed noise ({noise:.2f} BLEU)."
    return (
        f"The window model does not train measurably worse: {gap:+.2f} BLEU, {reading} ({noise_text(quality, noise)})."
    )


def initial_window_sentences(initial: List[Dict]) -> List[str]:
    """What the windows are at step 0: the uniform-boundary tent, and MW's cost."""
    parts = []
    if all(abs(s["width"] / s["uniform_width"] - 1) <= NEAR for s in initial if "width" in s):
        parts.append(
            "At step 0 every window is the uniform-boundary tent of eq. 9, which is what the paper's "
            "formulation gives with any small random initialisation of W_L, W_R (the paper states none): "
            "a broad window over the middle of the visible keys, independent of the query, not an "
            "all-visible mask."
        )
    mw = [s for s in initial if s["mechanism"].startswith("window-mw")]
    if mw:
        recent_suppressed = all(s["m_at_query"] < s["mean_m"] for s in mw if s["kind"] == DECODER_SELF.label)
        parts.append(
            f"Its cost is in MW: {statistics.fmean(s['mass'] for s in mw):.0%} of the attention mass "
            "survives at step 0"
            + (" and a decoder query's own, newest key gets less than the average key" if recent_suppressed else "")
            + ", a handicap vanilla does not have and that training has to undo."
        )
    return parts


def trained_window_sentences(trained: List[Dict]) -> List[str]:
    """The kinds whose trained windows sit on the query's neighbourhood."""
    local = [
        kind
        for kind in KINDS
        if _kind_mean(trained, kind, "m_at_query") is not None
        and _kind_mean(trained, kind, "m_at_query") > (1 + NEAR) * _kind_mean(trained, kind, "mean_m")
    ]
    if not local:
        return []
    return [f"Training does undo it: in {', '.join(local)} the trained windows sit on the query's neighbourhood."]


def additive_window_sentences(initial: List[Dict]) -> List[str]:
    aw = [s for s in initial if "window_term_std" in s]
    if aw and all(s["window_term_std"] < s["global_std"] for s in aw):
        return ["The AW term starts smaller than the plain logits everywhere, so AW starts close to vanilla."]
    return []


SiteTables = Dict[Tuple[str, str], Dict[Tuple[str, int], Dict]]


def entropy_section(results: Dict, tables: SiteTables) -> List[str]:
    """Section 1: attention entropy per site, the window and vanilla models trained and at step 0."""
    keys = [(s["kind"], s["layer"]) for s in _sites(results, "window", "trained")]
    return [
        "## 1. Attention entropy (nats)",
        "",
        "MW rows (softmax * M) are renormalised for the entropy; log n is the uniform row's entropy.",
        "",
        *_table(
            ["kind", "layer", "window mechanism", "log n", *(f"{m} {s}" for m, s in STATES)],
            [
                [
                    kind,
                    layer,
                    tables[STATES[0]][(kind, layer)]["mechanism"],
                    _f(tables[STATES[0]][(kind, layer)]["uniform_entropy"]),
                    *(_f(tables[state].get((kind, layer), {}).get("entropy")) for state in STATES),
                ]
                for kind, layer in keys
            ],
        ),
    ]


def boundary_row(state: str, kind: str, layer: int, s: Dict) -> List[object]:
    return [
        state,
        kind,
        layer,
        s["mechanism"],
        _f(s["uniform_entropy"]),
        _f(s["left_entropy"]),
        _f(s["right_entropy"]),
        _f(s["width"], 2),
        _f(s["uniform_width"], 2),
        _f(s["width_fraction"]),
        _f(s["mean_m"]),
        _f(s["m_at_query"]),
        _f(s["max_m"]),
        _f(s["m_above_one"]),
        _f(s["left_offset"], 2),
        _f(s["right_offset"], 2),
    ]


def boundary_section(tables: SiteTables) -> List[str]:
    """Section 2: the window boundaries and the soft window's width, at step 0 and trained."""
    rows = [
        boundary_row(state[1], kind, layer, s)
        for state in (("window", "init"), ("window", "trained"))
        for (kind, layer), s in tables[state].items()
        if "width" in s
    ]
    return [
        "## 2. Window boundaries and soft-window width",
        "",
        "Boundary entropies of eqs. 7-8 (log n: uniform); width = sum_j M_ij in keys and as a fraction of n; "
        "uniform width: what uniform boundaries give (eq. 9: (n+1)(n+2)/(3n) keys); E[l], E[r]: expected "
        "boundaries minus the query's key (cross: its proportional source position).",
        "",
        *_table(
            [
                "state",
                "kind",
                "layer",
                "mechanism",
                "log n",
                "H(left)",
                "H(right)",
                "width (keys)",
                "uniform width",
                "width / n",
                "mean M",
                "M at query",
                "row max M",
                "share M > 1",
                "E[l] - q",
                "E[r] - q",
            ],
            rows,
        ),
    ]


def scale_row(state: str, kind: str, layer: int, s: Dict, vanilla: Dict) -> List[object]:
    return [
        state,
        kind,
        layer,
        s["mechanism"],
        _f(s["global_std"]),
        _f(s.get("local_std")),
        _f(s.get("window_term_std")),
        _f(s.get("logit_std")),
        _f(s["window_term_std"] / s["global_std"]) if "window_term_std" in s else "-",
        _f(s["mean_m"]),
        _f(s["mass"]),
        _f(vanilla.get("logit_std")),
    ]


def scale_section(tables: SiteTables) -> List[str]:
    """Section 3: the size of the window terms beside the plain logits (AW) and the
    attention mass M leaves (MW), at step 0 and trained, with vanilla's logits."""
    rows = [
        scale_row(state, kind, layer, s, tables[("vanilla", state)].get((kind, layer), {}))
        for state in ("init", "trained")
        for (kind, layer), s in tables[("window", state)].items()
        if "global_std" in s
    ]
    return [
        "## 3. Scale of the window terms",
        "",
        "Within-row std over the visible keys (softmax ignores a per-row shift). AW: plain logits "
        "Q K^T / sqrt d, local scores, the additive term local * M, and the total logits; MW: mean M and the "
        "attention mass sum_j S(score)_ij M_ij left per row (vanilla: 1). Vanilla's logit std for comparison.",
        "",
        *_table(
            [
                "state",
                "kind",
                "layer",
                "mechanism",
                "std QK^T/sqrt d",
                "std local",
                "std local*M",
                "std total logits",
                "local*M / QK^T",
                "mean M",
                "attention mass",
                "vanilla logit std",
            ],
            rows,
        ),
    ]


def masking_section(checks: Dict[str, float]) -> List[str]:
    return [
        "## Masking consistency of the window model (trained)",
        "",
        f"Largest |difference| of decoder logits over {checks['sentences']} sentences; float32.",
        "",
        *_table(
            ["check", "max abs difference"],
            [[name.replace("_", " "), f"{checks[name]:.2e}"] for name in MASKING_CHECKS],
        ),
    ]


def markdown(results: Dict) -> str:
    meta = results["meta"]
    tables = {state: _by_site(results, *state) for state in STATES}
    lines = [
        f"# Window diagnostics (generated by `{PROG}`)",
        "",
        f"Window model `{meta['checkpoint']}` and vanilla `{meta['vanilla']}`, each trained and at step 0 "
        f"(fairseq-train's initial parameters, same seed); {meta['sentences']} sentence pairs of `{meta['split']}` "
        f"(`{meta['data']}`), reference targets forced, one sentence a batch. Means over query rows and heads; "
        "entropies in nats over the keys a row may see; n = visible keys of a row.",
        "",
        "## Findings",
        "",
        *[line + "\n" for line in findings(results)],
        *(quality_table(results["quality"]) if results.get("quality") else []),
        *entropy_section(results, tables),
        "",
        *boundary_section(tables),
        "",
        *scale_section(tables),
        "",
        *masking_section(results["checks"]),
        "",
        "Figures: `attention_entropy.png` (section 1), `window_mask_profile.png` (mean M by key offset from "
        "the query's key, step 0 dashed, trained solid).",
        "",
    ]
    return "\n".join(lines)


def plot(results: Dict, out: Path) -> List[Path]:
    """The two figures of the report; returns their paths."""
    return [
        entropy_figure(results, out / "attention_entropy.png"),
        mask_profile_figure(results, out / "window_mask_profile.png"),
    ]


def kind_panels(title: str):
    """A figure with one panel per attention kind, and its panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 3.8), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title, fontsize=10)
    return figure, figure.subplots(1, len(KINDS), squeeze=False)[0]


def entropy_figure(results: Dict, path: Path) -> Path:
    """Attention entropy per layer of each kind, window and vanilla, at step 0 and trained."""
    figure, axes = kind_panels("Attention entropy per layer: window vs vanilla, trained vs step 0")
    tables = {state: _by_site(results, *state) for state in STATES}
    for ax, kind in zip(axes, KINDS):
        layers = sorted(layer for k, layer in tables[STATES[0]] if k == kind)
        width = 0.8 / len(STATES)
        for index, state in enumerate(STATES):
            values = [tables[state].get((kind, layer), {}).get("entropy", float("nan")) for layer in layers]
            ax.bar(
                [layer + (index - 1.5) * width for layer in layers],
                values,
                width,
                label=" ".join(state),
                color=f"C{index // 2}",
                alpha=1.0 if state[1] == "trained" else 0.45,
            )
        ax.plot(
            layers,
            [tables[STATES[0]][(kind, layer)]["uniform_entropy"] for layer in layers],
            "k_",
            markersize=25,
            label="log n (uniform)",
        )
        ax.set_xticks(layers)
        ax.set_xlabel("layer")
        ax.set_ylabel("entropy (nats)")
        ax.set_title(kind, fontsize=10)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.savefig(path, dpi=100)
    return path


def mask_profile_figure(results: Dict, path: Path) -> Path:
    """The soft window M by key offset from the query, per layer of each kind, at step 0 and trained."""
    figure, axes = kind_panels("Soft window M by key offset from the query (step 0 dashed, trained solid)")
    offsets = list(range(-MAX_OFFSET, MAX_OFFSET + 1))
    for ax, kind in zip(axes, KINDS):
        for state, style in (("init", "--"), ("trained", "-")):
            for s in _sites(results, "window", state):
                if s["kind"] == kind and "m_by_offset" in s:
                    ax.plot(
                        offsets,
                        [float("nan") if v is None else v for v in s["m_by_offset"]],
                        style,
                        color=f"C{s['layer']}",
                        label=f"layer {s['layer']} {state}",
                    )
        ax.set_xlabel("key offset j - query's key" + (" (proportional)" if kind == CROSS.label else ""))
        ax.set_ylabel("mean M")
        ax.set_title(kind, fontsize=10)
        ax.axvline(0, color="k", linewidth=0.5)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- command line


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=DEFAULT_CHECKPOINT,
        help=f"the window model (default: {shown(DEFAULT_CHECKPOINT)}, else checkpoint_best.pt beside it)",
    )
    p.add_argument(
        "--vanilla", type=Path, default=DEFAULT_VANILLA, help=f"the vanilla model (default: {shown(DEFAULT_VANILLA)})"
    )
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"data-bin (default: {shown(DEFAULT_DATA)})")
    p.add_argument("--split", default="test", help="split of --data (default: test, i.e. test_2016_flickr)")
    p.add_argument("--sentences", type=int, default=200, help="the first N sentence pairs (default: 200)")
    p.add_argument(
        "--quality-runs",
        type=Path,
        default=DEFAULT_QUALITY_RUNS,
        help=f"the quality grid's run files, for the BLEU context (default: {shown(DEFAULT_QUALITY_RUNS)})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default: {shown(DEFAULT_OUT)}; with --tiny a temporary directory)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny random models and sentences: a smoke test in seconds")
    p.add_argument("--threads", type=at_least(1), default=1, help="torch threads (default: 1)")
    p.add_argument(
        "--report", action="store_true", help="only rebuild the markdown and PNGs from --out's window_diagnostics.json"
    )
    args = p.parse_args(argv)
    if args.sentences < 1:
        p.error(f"argument --sentences: must be >= 1, got {args.sentences}")
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="window_diagnostics_")) if args.tiny else DEFAULT_OUT
    return args


def run(args: argparse.Namespace) -> Dict[str, object]:
    """Measure everything; returns the results written as JSON."""
    torch.set_num_threads(args.threads)
    if args.tiny:
        models, dictionary = tiny_models()
        examples = tiny_examples(dictionary, args.sentences)
        pad, left_pad_source = dictionary.pad(), True
        meta = {
            "checkpoint": "tiny random window model",
            "vanilla": "tiny random vanilla model",
            "data": "random tokens",
            "split": "random",
        }
        quality = None
    else:
        checkpoint, vanilla = _checkpoint(args.checkpoint), _checkpoint(args.vanilla)
        window_trained, window_init, task = load_pair(checkpoint, args.data)
        vanilla_trained, vanilla_init, _ = load_pair(vanilla, args.data)
        models = {"window": (window_trained, window_init), "vanilla": (vanilla_trained, vanilla_init)}
        examples = split_examples(window_trained, task, args.split, args.sentences)
        pad, left_pad_source = task.source_dictionary.pad(), bool(task.cfg.left_pad_source)
        meta = {
            "checkpoint": shown(checkpoint),
            "vanilla": shown(vanilla),
            "data": shown(args.data),
            "split": args.split,
        }
        quality = quality_context(args.quality_runs)
    meta["sentences"] = len(examples)
    results: Dict[str, object] = {"meta": meta, "models": {}}
    for name, (trained, initial) in models.items():
        results["models"][name] = {"trained": measure(trained, examples), "init": measure(initial, examples)}
    results["checks"] = masking_checks(models["window"][0], examples, pad, left_pad_source)
    results["window_layers"] = window_layer_share(models["window"][0])
    if quality is not None:
        results["quality"] = quality
    return results


def write(results: Dict, out: Path) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "window_diagnostics.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (out / "window_diagnostics.md").write_text(markdown(results), encoding="utf-8")
    return [out / "window_diagnostics.json", out / "window_diagnostics.md", *plot(results, out)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    # importing fairseq sets the root logger to DEBUG (matplotlib's font search would fill the output)
    logging.getLogger().setLevel(logging.WARNING)
    if args.report:
        results = json.loads((args.out / "window_diagnostics.json").read_text(encoding="utf-8"))
        # the BLEU context follows the quality runs committed since the measurement
        quality = quality_context(args.quality_runs) if "quality" in results else None
        if quality is not None:
            results["quality"] = quality
    else:
        results = run(args)
    written = write(results, args.out)
    print("\n".join(shown(path) for path in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
