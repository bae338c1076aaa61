"""``python -m fairseq_distattn.inspect``: the summary's numbers are the model's,
every PNG is written and readable, and what it plots is what the model
computes (vanilla heads recomputed exactly, window masks by eqs. 9 and 11
from the plotted boundaries, DA coefficients by eq. 5, spans pooled over a
split)."""

import argparse
import logging
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import torch
from fairseq.data import Dictionary, indexed_dataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.translation import TranslationTask
from omegaconf import OmegaConf

from fairseq_distattn.mechanisms.differentiable_window import DifferentiableWindow
from fairseq_distattn.mechanisms.distance_aware import DistanceAware
from fairseq_distattn.mechanisms.relative_position import RelativePosition
from fairseq_distattn.tools import inspection as tool

from .conftest import REPO_ROOT, cli_env
from .model_helpers import TINY, TINY_LM, dictionary, parse, perturb_parameters

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# every mechanism at least once, hyperparameters away from their defaults, one
# vanilla self-attention layer (fairseq's fused path) and two vanilla cross layers
TRANSLATION_FLAGS = [
    *TINY,
    "-s",
    "en",
    "-t",
    "de",
    "--encoder-layers",
    "4",
    "--decoder-layers",
    "3",
    "--encoder-self-attention",
    "rpr@0,da@1,window-aw-seg@2",
    "--decoder-self-attention",
    "window-mw@0,qvi@1,distance-mask@2",
    "--cross-attention",
    "window-aw@1",
    "--distance-mask-alpha",
    "0.75",
]
LM_FLAGS = [*TINY_LM, "--decoder-layers", "3", "--decoder-self-attention", "da@0,window-mw@1,rpr@2"]
SOURCE, TARGET = "w3 w4 w5 w6 w7 w8 w9 w3", "w5 w6 w7 w11 w12"


def save_checkpoint(model, args, path: Path):
    """What fairseq-train writes: the configuration as a plain container and the weights."""
    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    torch.save(
        {
            "cfg": cfg,
            "args": None,
            "model": model.state_dict(),
            "optimizer_history": [
                {
                    "criterion_name": "CrossEntropyCriterion",
                    "optimizer_name": "Adam",
                    "lr_scheduler_state": {"best": None},
                    "num_updates": 7,
                }
            ],
            "extra_state": {"train_iterator": {"epoch": 1}},
            "last_optimizer_state": None,
        },
        path,
    )
    return path


def build(task_name, arch, flags, make_task, seed):
    torch.manual_seed(seed)
    args = parse(task_name, arch, flags)
    model = make_task(args).build_model(args).eval()
    perturb_parameters(model, seed)  # DA's w, v start at 0: move every parameter
    return model, args


@pytest.fixture(scope="module")
def translation(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    d = dictionary()
    for symbol in ("w1@@", "2"):  # the BPE pieces of the --bpe test
        d.add_symbol(symbol)
    model, args = build(
        "translation", "distattn_transformer", TRANSLATION_FLAGS, lambda args: TranslationTask(args, d, d), seed=3
    )
    data = root / "data-bin"
    data.mkdir()
    for lang in ("en", "de"):
        d.save(str(data / f"dict.{lang}.txt"))
    return {"model": model, "dictionary": d, "data": data, "checkpoint": save_checkpoint(model, args, root / "mt.pt")}


@pytest.fixture(scope="module")
def language_model_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect-lm")
    d = dictionary()
    model, args = build(
        "language_modeling",
        "distattn_lm",
        LM_FLAGS,
        lambda args: LanguageModelingTask(args, d, output_dictionary=d),
        seed=5,
    )
    d.save(str(root / "dict.txt"))
    return {"model": model, "dict": root / "dict.txt", "checkpoint": save_checkpoint(model, args, root / "lm.pt")}


def run_tool(capsys, *argv):
    status = tool.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def loaded(translation, **overrides):
    args = argparse.Namespace(
        data=translation["data"],
        source_dict=None,
        target_dict=None,
        dict=None,
        source_lang=None,
        target_lang=None,
        device=torch.device("cpu"),
        **overrides,
    )
    return tool.load_model(translation["checkpoint"], args)


def assert_valid_png(path: Path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, (path, pixels.shape)
    assert pixels.std() > 0, f"{path} is blank"


def numbers_after(prefix: str, text: str):
    line = next(line for line in text.splitlines() if line.strip().startswith(prefix))
    return [float(x) for x in line.split(":", 1)[1].split()]


# ----------------------------------------------------------------------------- summary


def test_the_summary_names_each_layer_with_the_model_s_hyperparameters_and_learned_values(
    translation, tmp_path, capsys
):
    status, out, _ = run_tool(
        capsys,
        translation["checkpoint"],
        "--data",
        translation["data"],
        "--sentence",
        SOURCE,
        "--target",
        TARGET,
        "--out",
        tmp_path,
    )
    assert status == 0
    model = translation["model"]
    assert f"{translation['checkpoint']}: distattn_transformer (--arch distattn_transformer), 7 updates" in out
    blocks = re.split(r"\n(?=encoder self-attention|decoder self-attention|encoder-decoder cross-attention)", out)
    encoder, decoder, cross = (
        next(b for b in blocks if b.startswith(kind))
        for kind in ("encoder self-attention", "decoder self-attention", "encoder-decoder cross-attention")
    )
    assert encoder.startswith("encoder self-attention: 4 layers, 2 heads of 8 dims")
    assert "  layer 0: rpr (k=3, relative_values=True)" in encoder
    assert "  layer 2: window-aw-seg (AW, segment_size=2)" in encoder
    assert "  layer 3: vanilla" in encoder
    assert "  layer 0: window-mw (MW, token-level)" in decoder
    assert "  layer 1: qvi (heads=2, head_dim=8)" in decoder
    assert "  layer 2: distance-mask (alpha=0.75, direction=none)" in decoder
    assert "  layer 0: vanilla" in cross and "  layer 1: window-aw (AW, token-level)" in cross

    da = model.encoder.layers[1].self_attn.mechanism
    da_block = encoder.split("  layer 1: da (heads=2)")[1]
    torch.testing.assert_close(
        torch.tensor(numbers_after("w per head", da_block)), da.distance_weight.detach(), atol=5e-5, rtol=0
    )
    torch.testing.assert_close(
        torch.tensor(numbers_after("v per head", da_block)), da.sharpness.detach(), atol=5e-5, rtol=0
    )
    rpr = model.encoder.layers[0].self_attn.mechanism
    for name, table in (("key table", rpr.relative_keys), ("value table", rpr.relative_values)):
        expected = table.detach().norm(dim=-1)[[0, 3, 6]]  # d = -k, 0, +k
        torch.testing.assert_close(torch.tensor(numbers_after(name, encoder)), expected, atol=5e-5, rtol=0)
    assert (tmp_path / "summary.txt").read_text().strip() == out.strip()


def test_building_a_model_logs_each_layer_s_mechanism_and_the_model_print_shows_hyperparameters(translation, caplog):
    with caplog.at_level(logging.INFO, logger="fairseq_distattn.modules.summary"):
        model, _ = build(
            "translation",
            "distattn_transformer",
            TRANSLATION_FLAGS,
            lambda args: TranslationTask(args, translation["dictionary"], translation["dictionary"]),
            seed=0,
        )
    logged = [record.getMessage() for record in caplog.records if record.name == "fairseq_distattn.modules.summary"]
    assert logged == [
        "encoder self-attention (4 layers, 2 heads): layers 0 rpr (k=3, relative_values=True), 1 da (heads=2), "
        "2 window-aw-seg (AW, segment_size=2), 3 vanilla",
        "decoder self-attention (3 layers, 2 heads): layers 0 window-mw (MW, token-level), "
        "1 qvi (heads=2, head_dim=8), 2 distance-mask (alpha=0.75, direction=none)",
        "encoder-decoder cross-attention (3 layers, 2 heads): layers 0 vanilla, 1 window-aw (AW, token-level), "
        "2 vanilla",
    ]
    printed = str(model)
    for text in (
        "RelativePosition(k=3, relative_values=True)",
        "DistanceAware(heads=2)",
        "DifferentiableWindow(AW, segment_size=2)",
        "DifferentiableWindow(MW, token-level)",
        "QueryValueInteraction(heads=2, head_dim=8)",
        "DistanceMask(alpha=0.75, direction=none)",
    ):
        assert text in printed


def test_the_language_model_summary_groups_equal_layers(caplog):
    with caplog.at_level(logging.INFO, logger="fairseq_distattn.modules.summary"):
        build(
            "language_modeling",
            "distattn_lm",
            [*TINY_LM, "--decoder-layers", "3", "--decoder-self-attention", "rpr@0-1", "--no-relative-values"],
            lambda args: LanguageModelingTask(args, dictionary(), output_dictionary=dictionary()),
            seed=0,
        )
    assert [record.getMessage() for record in caplog.records if record.name == "fairseq_distattn.modules.summary"] == [
        "decoder self-attention (3 layers, 2 heads): layers 0-1 rpr (k=3, relative_values=False), 2 vanilla"
    ]


# ----------------------------------------------------------------------------- PNGs


def test_every_layer_and_head_is_plotted_and_every_png_is_valid(translation, tmp_path, capsys):
    sentences = tmp_path / "input.txt"
    sentences.write_text(f"{SOURCE}\t{TARGET}\nw9 w8 w7\n", encoding="utf-8")
    status, out, _ = run_tool(
        capsys,
        translation["checkpoint"],
        "--data",
        translation["data"],
        "--input",
        sentences,
        "--beam",
        "2",
        "--max-len-b",
        "4",
        "--out",
        tmp_path,
    )
    assert status == 0
    sites = (
        [f"encoder-self-layer{i}" for i in range(4)]
        + [f"decoder-self-layer{i}" for i in range(3)]
        + [f"cross-layer{i}" for i in range(3)]
    )
    per_sentence = {f"attention-{site}.png" for site in sites} | {
        "window-encoder-self-layer2.png",
        "window-decoder-self-layer0.png",
        "window-cross-layer1.png",
        "da-coefficients-encoder-self-layer1.png",
        "distance-mask-decoder-self-layer2.png",
    }
    model_level = {
        "learned-rpr.png",
        "learned-da.png",
        "da-coefficients-curves.png",
        "learned-qvi.png",
        "distance-mask-curves.png",
        "window-spans.png",
    }
    assert {p.name for p in tmp_path.glob("*.png")} == model_level
    for sentence in ("sentence-0", "sentence-1"):
        assert {p.name for p in (tmp_path / sentence).iterdir()} == per_sentence
    for path in tmp_path.rglob("*.png"):
        assert_valid_png(path)
    assert "  target (given): w5 w6 w7 w11 w12" in out
    assert "  target (beam 2): " in out
    assert f"  {len(per_sentence)} PNGs in {tmp_path / 'sentence-1'}" in out


def write_split(data: Path, prefix: str, d: Dictionary, lines):
    """A binarised split as fairseq-preprocess writes it."""
    builder = indexed_dataset.make_builder(str(data / f"{prefix}.bin"), impl="mmap", vocab_size=len(d))
    for line in lines:
        builder.add_item(d.encode_line(line, add_if_not_exist=False, append_eos=True))
    builder.finalize(str(data / f"{prefix}.idx"))


def test_a_language_model_shows_its_decoder_layers(language_model_checkpoint, tmp_path, capsys):
    status, out, _ = run_tool(
        capsys,
        language_model_checkpoint["checkpoint"],
        "--dict",
        language_model_checkpoint["dict"],
        "--sentence",
        SOURCE,
        "--out",
        tmp_path,
    )
    assert status == 0, out
    assert {p.name for p in (tmp_path / "sentence-0").iterdir()} == {
        "attention-decoder-self-layer0.png",
        "attention-decoder-self-layer1.png",
        "attention-decoder-self-layer2.png",
        "da-coefficients-decoder-self-layer0.png",
        "window-decoder-self-layer1.png",
    }
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "learned-da.png",
        "da-coefficients-curves.png",
        "learned-rpr.png",
        "window-spans.png",
    }
    for path in tmp_path.rglob("*.png"):
        assert_valid_png(path)
    assert f"  text: {SOURCE}" in out
    decoder = language_model_checkpoint["model"].decoder
    da, rpr = decoder.layers[0].self_attn.mechanism, decoder.layers[2].self_attn.mechanism
    torch.testing.assert_close(
        torch.tensor(numbers_after("w per head", out)), da.distance_weight.detach(), atol=5e-5, rtol=0
    )
    # a causal layer never uses the rows j - i > 0, so the summary leaves them out
    torch.testing.assert_close(
        torch.tensor(numbers_after("key table row norms at d = -3, 0:", out)),
        rpr.relative_keys.detach().norm(dim=-1)[[0, 3]],
        atol=5e-5,
        rtol=0,
    )

    # window spans over a binarised split of --data
    data = tmp_path / "lm-bin"
    data.mkdir()
    d = Dictionary.load(str(language_model_checkpoint["dict"]))
    d.save(str(data / "dict.txt"))
    write_split(data, "test", d, ["w3 w4 w5 w6", "w7 w8"])
    status, out, _ = run_tool(
        capsys,
        language_model_checkpoint["checkpoint"],
        "--data",
        data,
        "--subset",
        "test",
        "--out",
        tmp_path / "subset",
    )
    assert status == 0
    assert re.search(r"over \d+ blocks of test\n  decoder self-attention, layer 1: window-mw: [0-9.]+ ", out), out


# ----------------------------------------------------------------------------- what is plotted


def test_recorded_attention_is_what_the_model_computes(translation):
    model = loaded(translation)
    encode = tool.TextEncoder(argparse.Namespace(tokenizer=None, bpe=None), None, model.source_dictionary)
    example = tool.Example.forced(encode(SOURCE), encode(TARGET), "given")
    outputs = {}
    hooks = [
        site.module.register_forward_hook(lambda m, a, out, site=site: outputs.__setitem__(site, out[0]))
        for site in tool.attention_sites(model.model)
    ]
    hooks += [
        site.module.register_forward_pre_hook(
            lambda m, a, kwargs, site=site: outputs.__setitem__((site, "value"), kwargs["value"]), with_kwargs=True
        )
        for site in tool.attention_sites(model.model)
    ]
    records = tool.record_attention(model, example)
    for hook in hooks:
        hook.remove()

    source_len, target_len = len(example.source), len(example.target)
    assert len(records) == 10
    for record in records:
        site = record.site
        rows, columns = (
            (source_len, source_len)
            if site.kind.flag == "--encoder-self-attention"
            else (
                (target_len, target_len) if site.kind.flag == "--decoder-self-attention" else (target_len, source_len)
            )
        )
        assert record.probs.shape == (2, rows, columns), site.title
        if site.kind.flag == "--decoder-self-attention":
            assert not record.probs.triu(1).any(), f"{site.title} attends to future tokens"
        if site.name != "window-mw":  # MW's weights are softmax * M: rows need not sum to 1
            torch.testing.assert_close(
                record.probs.sum(-1), torch.ones(2, rows, dtype=torch.float64), rtol=0, atol=1e-6
            )
        if site.mechanism is None:
            # fairseq's fused path returns no per-head weights: the recomputed ones
            # must give the module's own output
            module, value = site.module, outputs[(site, "value")]
            values = module.v_proj(value).view(columns, module.num_heads, module.head_dim).transpose(0, 1)  # [H, Tk, D]
            attended = (record.probs @ values.double()).transpose(0, 1).reshape(rows, 1, module.embed_dim)
            projection = module.out_proj
            output = torch.nn.functional.linear(attended, projection.weight.double(), projection.bias.double())
            torch.testing.assert_close(output.float(), outputs[site], atol=1e-5, rtol=1e-5)
    assert sum(record.site.mechanism is None for record in records) == 3


def window_reference(left, right, segment_size):
    """Eq. 9 (segment_size 0) or eq. 11 with an explicit J, in float64, 1-based as the paper."""
    length = left.size(-1)
    i = torch.arange(1, length + 1)[:, None]
    j = torch.arange(1, length + 1)[None, :]
    if segment_size:
        ones = (i <= segment_size * torch.ceil(j / segment_size)).double()  # J_ij
    else:
        ones = (i <= j).double()  # L_n: upper triangular ones
    left_f, right_f = left @ ones, right @ ones  # phi^T L (rightward)
    left_g, right_g = left @ ones.T, right @ ones.T  # phi^T L^T (leftward)
    return left_f * right_g + right_f * left_g


def test_window_masks_follow_from_the_plotted_boundaries_and_widths_are_their_mass(translation):
    model = loaded(translation)
    encode = tool.TextEncoder(argparse.Namespace(tokenizer=None, bpe=None), None, model.source_dictionary)
    records = tool.record_attention(model, tool.Example.forced(encode(SOURCE), encode(TARGET), "given"))
    windows = [record for record in records if isinstance(record.site.mechanism, DifferentiableWindow)]
    assert [record.site.slug for record in windows] == ["encoder-self-layer2", "decoder-self-layer0", "cross-layer1"]
    for record in windows:
        window = record.window
        torch.testing.assert_close(window.left_pointer.sum(-1), torch.ones(window.mask.shape[:2], dtype=torch.float64))
        reference = window_reference(window.left_pointer, window.right_pointer, record.site.mechanism.segment_size)
        torch.testing.assert_close(window.mask, reference, atol=1e-5, rtol=1e-5)
        if record.site.kind.flag == "--decoder-self-attention":
            assert not window.left_pointer.triu(1).any() and not window.right_pointer.triu(1).any()
            # the MW weights the model used are softmax * M, so never above M
            assert (record.probs - window.mask).max() < 1e-6
            assert (record.probs.sum(-1) < window.mask.sum(-1) + 1e-6).all()
        positions = torch.arange(window.mask.size(-1), dtype=torch.float64)
        left, right = window.expected_boundaries()
        torch.testing.assert_close(left, (window.left_pointer * positions).sum(-1))
        torch.testing.assert_close(right, (window.right_pointer * positions).sum(-1))
        if not record.site.mechanism.segment_size:
            # widths() documents sum_j M_ij = E|r - l| + 1 + P(l = r) for independent boundaries
            distance = (positions[:, None] - positions[None, :]).abs() + 1 + torch.eye(len(positions))
            expected = torch.einsum("hqa,hqb,ab->hq", window.left_pointer, window.right_pointer, distance)
            torch.testing.assert_close(window.widths(), expected, atol=1e-5, rtol=1e-5)


def test_da_s_position_term_is_eq_5(translation):
    da = translation["model"].encoder.layers[1].self_attn.mechanism
    assert isinstance(da, DistanceAware)
    coefficients = da.position_term(5, 7, causal=False).values
    w, v = da.distance_weight.detach().double(), da.sharpness.detach().double()
    distance = (torch.arange(5)[:, None] - torch.arange(7)[None, :]).abs().double()
    reference = (1 + torch.exp(v))[:, None, None] / (1 + torch.exp(v[:, None, None] - w[:, None, None] * distance))
    torch.testing.assert_close(coefficients, reference, rtol=1e-6, atol=1e-6)  # the model's float32


def test_a_da_ablation_shows_the_parameters_its_mapping_has(tmp_path):
    d = dictionary()
    model, _ = build(
        "translation",
        "distattn_transformer",
        [*TINY, "--encoder-self-attention", "da@0", "--da-mapping", "linear"],
        lambda args: TranslationTask(args, d, d),
        seed=2,
    )
    da = model.encoder.layers[0].self_attn.mechanism
    summary = "\n".join(tool.attention_summary(model))
    assert "  layer 0: da (heads=2, mapping=linear)" in summary and "v per head" not in summary
    for symbol, parameter in (("w", da.distance_weight), ("k", da.linear_slope), ("b", da.linear_intercept)):
        torch.testing.assert_close(
            torch.tensor(numbers_after(f"{symbol} per head", summary)), parameter.detach(), atol=5e-5, rtol=0
        )
    w, k, b = (p.detach().double()[:, None, None] for p in (da.distance_weight, da.linear_slope, da.linear_intercept))
    distance = (torch.arange(4)[:, None] - torch.arange(4)[None, :]).abs().double()
    torch.testing.assert_close(da.position_term(4, 4, False).values, k * w * distance + b, rtol=1e-6, atol=1e-6)
    written = []
    tool.plot_model(model, {}, "", 10, tmp_path, written)
    assert [path.name for path in written] == ["learned-da.png", "da-coefficients-curves.png"]
    for path in written:
        assert_valid_png(path)


def test_window_spans_pool_every_query_of_a_split(translation, tmp_path, capsys):
    d = translation["dictionary"]
    pairs = [("w3 w4 w5", "w6 w7"), ("w8 w9 w10 w11 w12 w13", "w14 w15 w16"), ("w5 w5", "w7 w8 w9 w10")]
    data = tmp_path / "data-bin"
    data.mkdir()
    for lang, column in (("en", 0), ("de", 1)):
        d.save(str(data / f"dict.{lang}.txt"))
        write_split(data, f"test.en-de.{lang}", d, [pair[column] for pair in pairs])
    status, out, _ = run_tool(
        capsys, translation["checkpoint"], "--data", data, "--subset", "test", "--out", tmp_path / "out"
    )
    assert status == 0
    assert "window spans: mean soft-mask width sum_j M_ij per query, in keys, over 3 sentences of test" in out
    assert not list((tmp_path / "out").glob("sentence-*"))

    model = loaded(translation)
    sums, counts = {}, {}
    for source, target in pairs:
        example = tool.Example.forced(
            d.encode_line(source, add_if_not_exist=False).long(),
            d.encode_line(target, add_if_not_exist=False).long(),
            "reference",
        )
        for record in tool.record_attention(model, example):
            if record.window is not None:
                sums[record.site.title] = sums.get(record.site.title, 0) + record.window.mask.sum(-1).sum(-1)
                counts[record.site.title] = counts.get(record.site.title, 0) + record.window.mask.size(1)
    assert len(sums) == 3
    for title, total in sums.items():
        line = next(line for line in out.splitlines() if line.startswith(f"  {title}: "))
        mean = total / counts[title]
        assert line == f"  {title}: {mean.mean().item():.3f} (per head: {' '.join(f'{m:.3f}' for m in mean.tolist())})"
    assert_valid_png(tmp_path / "out" / "window-spans.png")


def test_rpr_table_norms_are_plotted_for_keys_only_models_too(tmp_path, capsys):
    d = dictionary()
    model, args = build(
        "translation",
        "distattn_transformer",
        [*TINY, "-s", "en", "-t", "de", "--encoder-self-attention", "rpr", "--no-relative-values"],
        lambda args: TranslationTask(args, d, d),
        seed=1,
    )
    assert isinstance(model.encoder.layers[0].self_attn.mechanism, RelativePosition)
    for lang in ("en", "de"):
        d.save(str(tmp_path / f"dict.{lang}.txt"))
    checkpoint = save_checkpoint(model, args, tmp_path / "rpr.pt")
    status, out, _ = run_tool(
        capsys,
        checkpoint,
        "--source-dict",
        tmp_path / "dict.en.txt",
        "--target-dict",
        tmp_path / "dict.de.txt",
        "--sentence",
        SOURCE,
        "--target",
        TARGET,
        "--out",
        tmp_path / "out",
    )
    assert status == 0
    assert "value table" not in out and "key table row norms" in out
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {"learned-rpr.png"}
    assert_valid_png(tmp_path / "out" / "learned-rpr.png")


# ----------------------------------------------------------------------------- input


def test_raw_input_goes_through_moses_and_bpe_as_in_fairseq_interactive(translation, tmp_path, capsys):
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\nw 1\nw 5</w>\n", encoding="utf-8")
    status, out, _ = run_tool(
        capsys,
        translation["checkpoint"],
        "--data",
        translation["data"],
        "--tokenizer",
        "moses",
        "--bpe",
        "subword_nmt",
        "--bpe-codes",
        codes,
        "--sentence",
        "w12 w5",
        "--target",
        "w5 w12",
        "--out",
        tmp_path / "out",
    )
    assert status == 0
    assert "  source: w1@@ 2 w5\n  target (given): w5 w1@@ 2\n" in out and "<unk>" not in out


def test_the_beam_search_output_is_the_plotted_target(translation):
    model = loaded(translation)
    encode = tool.TextEncoder(argparse.Namespace(tokenizer=None, bpe=None), None, model.source_dictionary)
    source = encode(SOURCE)
    generation = argparse.Namespace(beam=3, max_len_a=0, max_len_b=5, lenpen=1.0)
    hypothesis = tool.beam_search(model, source, generation)
    assert hypothesis[-1] == model.target_dictionary.eos() and len(hypothesis) <= 6
    from_beam = tool.record_attention(model, tool.Example.forced(source, hypothesis, "beam 3"))
    retyped = encode(model.target_dictionary.string(hypothesis))
    given = tool.record_attention(model, tool.Example.forced(source, retyped, "given"))
    for beam_record, given_record in zip(from_beam, given):
        assert torch.equal(beam_record.probs, given_record.probs)


def test_the_module_runs_with_python_m_reading_standard_input(translation, tmp_path):
    help_run = subprocess.run(
        [sys.executable, "-m", "fairseq_distattn.inspect", "--help"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(REPO_ROOT),
        timeout=300,
    )
    assert help_run.returncode == 0 and "--sentence" in help_run.stdout and "--subset" in help_run.stdout
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairseq_distattn.inspect",
            str(translation["checkpoint"]),
            "--data",
            str(translation["data"]),
            "--out",
            str(out),
            "--beam",
            "2",
            "--max-len-b",
            "3",
        ],
        input=f"{SOURCE}\n\nw9 w8\t{TARGET}\n",
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(REPO_ROOT),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # no fairseq debug logging, no warnings
    assert "sentence 1\n  source: w9 w8\n  target (given): w5 w6 w7 w11 w12" in proc.stdout
    assert sorted(p.name for p in out.glob("sentence-*")) == ["sentence-0", "sentence-1"]
    for path in out.rglob("*.png"):
        assert_valid_png(path)


# ----------------------------------------------------------------------------- errors


def test_bad_command_lines_and_files_give_one_error_line(translation, language_model_checkpoint, tmp_path, capsys):
    checkpoint, data = translation["checkpoint"], translation["data"]
    with pytest.raises(SystemExit) as exit_info:
        tool.main([str(checkpoint), "--data", str(data), "--target", "w3", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "--target: needs --sentence" in capsys.readouterr().err

    status, _, err = run_tool(capsys, checkpoint, "--sentence", SOURCE, "--out", tmp_path)
    assert status == 1 and err.strip() == (
        "python -m fairseq_distattn.inspect: error: a translation model needs --data DATA_BIN, "
        "or both --source-dict and --target-dict"
    )

    status, _, err = run_tool(
        capsys,
        language_model_checkpoint["checkpoint"],
        "--dict",
        language_model_checkpoint["dict"],
        "--sentence",
        SOURCE,
        "--target",
        "w3",
        "--out",
        tmp_path,
    )
    assert status == 1 and "a language model has no target" in err

    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint\n")
    status, _, err = run_tool(capsys, broken, "--data", data, "--sentence", SOURCE, "--out", tmp_path)
    assert status == 1 and len(err.strip().splitlines()) == 1 and f"cannot read {broken}" in err

    small = Dictionary()
    small.add_symbol("w0")
    small.save(str(tmp_path / "small.txt"))
    status, _, err = run_tool(
        capsys,
        checkpoint,
        "--source-dict",
        tmp_path / "small.txt",
        "--target-dict",
        tmp_path / "small.txt",
        "--sentence",
        SOURCE,
        "--out",
        tmp_path,
    )
    assert status == 1 and "does not fit the model" in err and "size mismatch" in err
    assert len(err.strip().splitlines()) == 1

    status, _, err = run_tool(
        capsys, checkpoint, "--data", tmp_path / "missing", "--sentence", SOURCE, "--out", tmp_path
    )
    assert status == 1 and err.startswith("python -m fairseq_distattn.inspect: error: argument --data:")


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--data", "{data}", "--bpe", "subword_nmt", "--bpe-codes", "{missing}"],
            "--bpe-codes: no such file: {missing}",
        ),
        (["--data", "{data}", "--input", "{missing}"], "--input: no such file: {missing}"),
        (["--source-dict", "{missing}", "--target-dict", "{missing}"], "--source-dict: no such file: {missing}"),
        (["--data", "{data}", "--out", "{file}"], "--out: {file} exists and is not a directory"),
    ],
)
def test_a_missing_file_is_named_by_its_flag_before_any_work(translation, tmp_path, capsys, flags, message):
    """Each of these failed late, with a traceback from fairseq or subword-nmt."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    names = {"data": translation["data"], "missing": tmp_path / "missing.txt", "file": afile}
    argv = [str(translation["checkpoint"]), *(flag.format(**names) for flag in flags)]
    if "--out" not in flags:
        argv += ["--out", str(tmp_path / "out")]
    if "--input" not in flags:
        argv += ["--sentence", SOURCE]
    with pytest.raises(SystemExit) as exit_info:
        tool.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("usage: ") and "Traceback" not in err
    assert err.splitlines()[-1] == "python -m fairseq_distattn.inspect: error: argument " + message.format(**names)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- input length


REFUSED_TOO = "(fairseq-interactive and the hub refuse it too)"


def test_a_sentence_longer_than_the_model_s_positions_is_refused(
    translation, language_model_checkpoint, tmp_path, capsys
):
    """As fairseq-interactive and the hub refuse it: 1500 tokens and </s> past 1024 positions."""
    long = " ".join(["w3", "w4", "w5"] * 500)
    argv = [translation["checkpoint"], "--data", translation["data"], "--sentence", long, "--out", tmp_path / "out"]
    for forced in ([], ["--target", TARGET]):
        status, out, err = run_tool(capsys, *argv, *forced)
        assert status == 1 and out == ""
        assert err == (
            "python -m fairseq_distattn.inspect: error: sentence 0: the source is 1501 tokens long (after BPE, "
            f"with </s>), but the model takes at most 1024 source positions {REFUSED_TOO}\n"
        )
        assert not (tmp_path / "out").exists()

    lm = language_model_checkpoint
    status, out, err = run_tool(
        capsys, lm["checkpoint"], "--dict", lm["dict"], "--sentence", long, "--out", tmp_path / "lm"
    )
    assert status == 1 and out == "" and not (tmp_path / "lm").exists()
    assert err == (
        "python -m fairseq_distattn.inspect: error: sentence 0: the text is 1501 tokens long (after BPE, "
        f"with </s>), but the model takes at most 1024 target positions {REFUSED_TOO}\n"
    )


@pytest.fixture(scope="module")
def short_positions(tmp_path_factory):
    """A translation model of 8 source and 6 target positions."""
    root = tmp_path_factory.mktemp("inspect-short")
    d = dictionary()
    for symbol in ("w1@@", "2"):
        d.add_symbol(symbol)
    flags = [*TINY, "-s", "en", "-t", "de", "--max-source-positions", "8", "--max-target-positions", "6"]
    model, args = build("translation", "distattn_transformer", flags, lambda args: TranslationTask(args, d, d), seed=3)
    data = root / "data-bin"
    data.mkdir()
    for lang in ("en", "de"):
        d.save(str(data / f"dict.{lang}.txt"))
    codes = root / "codes"
    codes.write_text("#version: 0.2\nw 1\nw 5</w>\n", encoding="utf-8")  # w12 -> w1@@ 2
    return {"checkpoint": save_checkpoint(model, args, root / "short.pt"), "data": data, "codes": codes}


def test_the_length_limit_counts_tokens_after_bpe_with_eos_as_fairseq_does(short_positions, tmp_path, capsys):
    case = short_positions
    argv = [case["checkpoint"], "--data", case["data"], "--bpe", "subword_nmt", "--bpe-codes", case["codes"]]
    # 3 words, 6 BPE pieces and </s>: 7 of 8 source positions; 5 target tokens and </s>: all 6
    fits, target = "w12 w12 w12", "w5 w5 w5 w5 w5"
    status, out, err = run_tool(capsys, *argv, "--sentence", fits, "--target", target, "--out", tmp_path / "ok")
    assert status == 0 and "  source: w1@@ 2 w1@@ 2 w1@@ 2\n" in out, err

    # 4 words are 9 tokens: refused before the first sentence is looked at
    lines = tmp_path / "input.txt"
    lines.write_text(f"{fits}\t{target}\nw12 w12 w12 w12\n", encoding="utf-8")
    status, out, err = run_tool(capsys, *argv, "--input", lines, "--out", tmp_path / "out")
    assert status == 1 and not (tmp_path / "out").exists()
    assert err == (
        "python -m fairseq_distattn.inspect: error: sentence 1: the source is 9 tokens long (after BPE, "
        f"with </s>), but the model takes at most 8 source positions {REFUSED_TOO}\n"
    )
    status, out, err = run_tool(
        capsys, *argv, "--sentence", fits, "--target", target + " w5", "--out", tmp_path / "out"
    )
    assert status == 1 and err == (
        "python -m fairseq_distattn.inspect: error: sentence 0: the target is 7 tokens long (after BPE, "
        f"with </s>), but the model takes at most 6 target positions {REFUSED_TOO}\n"
    )

    # the limit is fairseq-interactive's: its batch iterator refuses 9 source tokens, not 8
    from fairseq import utils

    model = tool.load_model(
        case["checkpoint"],
        argparse.Namespace(
            data=case["data"],
            source_dict=None,
            target_dict=None,
            dict=None,
            source_lang=None,
            target_lang=None,
            device=torch.device("cpu"),
        ),
    )
    max_positions = utils.resolve_max_positions(model.task.max_positions(), model.model.max_positions())
    assert max_positions == (8, 6)

    def batches(length):
        tokens = [torch.full((length,), model.source_dictionary.index("w3"))]
        dataset = model.task.build_dataset_for_inference(tokens, [length])
        return list(
            model.task.get_batch_iterator(
                dataset=dataset, max_positions=max_positions, ignore_invalid_inputs=False
            ).next_epoch_itr(shuffle=False)
        )

    assert len(batches(8)) == 1
    with pytest.raises(Exception, match="Size of sample #0 is invalid"):
        batches(9)


def test_the_newer_relative_methods_show_what_they_learned(tmp_path, capsys):
    """KERPLE's kernel per head, FIRE's learned function of the distance (their position
    terms, per sentence and against the distance) and CoPE's contextual positions of the
    sentence (inspectable.HasSentenceTerm), through the per-mechanism hooks."""
    d = dictionary()
    flags = [*TINY_LM, "--decoder-layers", "3", "--decoder-self-attention", "cope@0,kerple@1,fire@2"]
    model, args = build(
        "language_modeling", "distattn_lm", flags, lambda args: LanguageModelingTask(args, d, output_dictionary=d), 6
    )
    d.save(str(tmp_path / "dict.txt"))
    checkpoint = save_checkpoint(model, args, tmp_path / "lm.pt")
    status, out, _ = run_tool(
        capsys, checkpoint, "--dict", tmp_path / "dict.txt", "--sentence", SOURCE, "--out", tmp_path / "out"
    )
    assert status == 0, out
    assert {p.name for p in (tmp_path / "out" / "sentence-0").iterdir()} == {
        "attention-decoder-self-layer0.png",
        "attention-decoder-self-layer1.png",
        "attention-decoder-self-layer2.png",
        "cope-positions-decoder-self-layer0.png",
        "kerple-log-bias-decoder-self-layer1.png",
        "fire-bias-decoder-self-layer2.png",
    }
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {
        "learned-cope.png",
        "learned-kerple.png",
        "learned-fire.png",
        "kerple-log-bias-curves.png",
        "fire-bias-curves.png",
    }
    for path in (tmp_path / "out").rglob("*.png"):
        assert_valid_png(path)
    kerple = model.decoder.layers[1].self_attn.mechanism
    torch.testing.assert_close(
        torch.tensor(numbers_after("r1 (scale) per head:", out)),
        kerple.scale.detach().clamp(min=0.01),
        atol=5e-5,
        rtol=0,
    )
