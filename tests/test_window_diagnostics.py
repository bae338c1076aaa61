"""``python -m benchmarks.diagnostics.window``: its statistics are the textbook
ones (entropy of known distributions, the width of known masks, eq. 9 for
uniform boundaries), its --tiny run writes well-formed results, and what it
measures on a model matches an independent computation from the model's own
projections."""

import json
import math
import shutil

import pytest
import torch

from benchmarks.diagnostics import window as wd
from fairseq_distattn import functional
from fairseq_distattn.modules.summary import attention_sites
from fairseq_distattn.tools.inspection import WindowInternals

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_row_entropy_of_known_distributions():
    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0]], dtype=torch.float64)
    expected = torch.tensor([math.log(4), 0.0, 1.5 * math.log(2)], dtype=torch.float64)
    torch.testing.assert_close(wd.row_entropy(rows), expected)
    # an MW row (softmax * M) is renormalised: scaling a row leaves its entropy
    torch.testing.assert_close(wd.row_entropy(rows * 0.3), expected)


def test_within_row_std_is_the_population_std_of_the_visible_keys():
    scores = torch.randn(3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    visible = wd.visible_keys("decoder self", 5, 5)
    result = wd.within_row_std(scores, visible)
    for row in range(5):
        expected = scores[:, row, : row + 1].std(dim=-1, unbiased=False)
        torch.testing.assert_close(result[:, row], expected)


@pytest.mark.parametrize("segment_size", [0, 2, 5])
@pytest.mark.parametrize("keys", [1, 4, 7, 13])
def test_uniform_boundary_mask_is_eq_9_of_uniform_pointers(keys, segment_size):
    zeros = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    key_zeros = torch.zeros(1, 1, keys, 4, dtype=torch.float64)
    package = functional.window_mask(zeros, key_zeros, zeros, key_zeros, segment_size)[0, 0]
    reference = wd.uniform_pointer_mask(keys, segment_size)
    torch.testing.assert_close(package, reference.expand(3, keys))
    if segment_size == 0:
        assert reference.sum().item() == pytest.approx(wd.uniform_pointer_width(keys))
        # the middle key of an odd n is the peak, the query's position plays no part
        assert reference.argmax().item() == (keys - 1) // 2


def statistics_of(kind, probs, window):
    stats = wd.SiteStatistics(kind, 0, "window-mw" if window is not None else "vanilla", window is not None)
    stats.add(probs, window, None)
    return stats.result()


def test_an_all_ones_mask_is_as_wide_as_the_visible_keys():
    heads, length = 2, 6
    visible = wd.visible_keys("decoder self", length, length).double()
    uniform = (visible / visible.sum(-1, keepdim=True)).expand(heads, length, length)
    window = WindowInternals(uniform, uniform, visible.expand(heads, length, length))
    result = statistics_of("decoder self", uniform, window)
    assert result["width"] == pytest.approx(sum(range(1, length + 1)) / length)  # row i sees i + 1 keys
    assert result["width_fraction"] == pytest.approx(1.0)
    assert result["mean_m"] == pytest.approx(1.0) and result["m_at_query"] == pytest.approx(1.0)
    assert result["entropy"] == pytest.approx(sum(math.log(n) for n in range(1, length + 1)) / length)
    assert result["left_entropy"] == pytest.approx(result["uniform_entropy"])

    encoder = torch.ones(heads, 4, 9, dtype=torch.float64)
    result = statistics_of("cross", encoder / 9, WindowInternals(encoder / 9, encoder / 9, encoder))
    assert result["width"] == pytest.approx(9) and result["m_by_offset"][wd.MAX_OFFSET] == pytest.approx(1.0)


def test_weight_on_a_key_the_query_may_not_see_is_reported():
    probs = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)  # a causal row attending to the future
    with pytest.raises(AssertionError, match="may not see"):
        statistics_of("decoder self", probs, None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("window_diagnostics")
    assert wd.main(["--tiny", "--sentences", "5", "--out", str(out)]) == 0
    return out, json.loads((out / "window_diagnostics.json").read_text(encoding="utf-8"))


def test_tiny_run_writes_well_formed_results(tiny):
    out, results = tiny
    for name in ("attention_entropy.png", "window_mask_profile.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    assert set(results["models"]) == {"window", "vanilla"}
    for model in ("window", "vanilla"):
        for state in ("trained", "init"):
            sites = results["models"][model][state]
            assert [(s["kind"], s["layer"]) for s in sites] == [(k, layer) for k in wd.KINDS for layer in (0, 1)]
            for s in sites:
                assert 0 <= s["entropy"] <= s["uniform_entropy"] + 1e-9
                if not s["mechanism"].startswith("window-mw"):
                    assert s["mass"] == pytest.approx(1.0)
    window_sites = results["models"]["window"]["init"]
    assert [s["mechanism"] for s in window_sites] == ["window-aw"] * 2 + ["window-mw"] * 2 + ["window-aw-seg"] * 2
    assert all(0 < s["mass"] < 2 and "width" in s and "global_std" in s for s in window_sites)
    assert all("window_term_std" in s for s in window_sites if s["mechanism"].startswith("window-aw"))
    assert all(
        results["checks"][name] < wd.CONSISTENT_LOGITS
        for name in ("batched_vs_single", "fused_vs_recorded", "incremental_vs_forced")
    )
    assert results["window_layers"] == {kind: [2, 2] for kind in wd.KINDS}
    text = (out / "window_diagnostics.md").read_text(encoding="utf-8")
    assert "## Findings" in text and "DEFECT" not in text and "/tmp/" not in text
    assert text.count("\n| encoder self | 0 | window-aw |") == 1  # the entropy table's row
    assert "no attention kind masks differently" in text


def test_findings_name_a_masking_defect(tiny):
    _, results = tiny
    broken = json.loads(json.dumps(results))
    broken["checks"]["incremental_vs_forced"] = 0.5
    text = " ".join(wd.findings(broken))
    assert "DEFECT" in text and "5.0e-01" in text


def test_measures_match_an_independent_computation():
    models, dictionary = wd.tiny_models(seed=3)
    window, vanilla = models["window"][1], models["vanilla"][0]
    with torch.no_grad():
        for site in attention_sites(window):
            for side in ("left_query", "right_query"):
                site.module.extra_query_proj[side].weight.zero_()
                site.module.extra_query_proj[side].bias.zero_()
    examples = wd.tiny_examples(dictionary, 3)
    # zero boundary queries: uniform boundary distributions, whose eq. 9 window is known in closed form
    by_site = {(s["kind"], s["layer"]): s for s in wd.measure(window, examples)}
    source_lengths = [len(e.source) for e in examples]
    target_lengths = [len(e.decoder_input) for e in examples]
    encoder = by_site[("encoder self", 1)]
    assert encoder["left_entropy"] == pytest.approx(encoder["uniform_entropy"])
    expected_width = sum(n * wd.uniform_pointer_width(n) for n in source_lengths) / sum(source_lengths)
    assert encoder["width"] == pytest.approx(expected_width)
    decoder = by_site[("decoder self", 0)]
    rows = [n for m in target_lengths for n in range(1, m + 1)]  # keys seen by each causal query
    assert decoder["m_at_query"] == pytest.approx(sum(2 / n for n in rows) / len(rows))
    assert decoder["width"] == pytest.approx(sum(wd.uniform_pointer_width(n) for n in rows) / len(rows))
    cross = by_site[("cross", 0)]
    segment = window.decoder.layers[0].encoder_attn.mechanism.segment_size
    expected = [
        wd.uniform_pointer_mask(n, segment).sum().item()
        for n, m in zip(source_lengths, target_lengths)
        for _ in range(m)
    ]
    assert cross["width"] == pytest.approx(sum(expected) / len(expected))

    # vanilla encoder self-attention of layer 0, from its own projections
    layer = vanilla.encoder.layers[0].self_attn
    captured = []
    handle = layer.register_forward_pre_hook(
        lambda module, args, kwargs: captured.append(kwargs.get("query", args[0] if args else None)), with_kwargs=True
    )
    try:
        measured = {(s["kind"], s["layer"]): s for s in wd.measure(vanilla, examples)}[("encoder self", 0)]
    finally:
        handle.remove()
    entropies = []
    with torch.no_grad():
        for x in captured:
            q = layer.q_proj(x).view(x.size(0), layer.num_heads, layer.head_dim).transpose(0, 1).double()
            k = layer.k_proj(x).view(x.size(0), layer.num_heads, layer.head_dim).transpose(0, 1).double()
            probs = torch.softmax(q @ k.transpose(1, 2) / layer.head_dim**0.5, dim=-1)
            entropies.append(-(probs * probs.log()).sum(-1).flatten())
    assert measured["entropy"] == pytest.approx(torch.cat(entropies).mean().item(), rel=1e-5)


def test_results_name_paths_relative_to_the_repository():
    args = wd.parse_args([])
    assert args.out == wd.DEFAULT_OUT
    assert wd.shown(args.checkpoint) == "work/quality/small/window-seed1/averaged.pt"
    assert wd.shown(args.data) == "work/quality/data-6000/data-bin"
    with pytest.raises(SystemExit):
        wd.parse_args(["--sentences", "0"])


def _quality_run(runs, config, seed, bleu, sacrebleu, ppl):
    record = {
        "config": config,
        "seed": seed,
        "note": f"{config} | note",
        "tokenized_bleu_compound_split": bleu,
        "sacrebleu": sacrebleu,
        "valid_ppl_averaged": ppl,
    }
    (runs / f"{config}-seed{seed}.json").write_text(json.dumps(record), encoding="utf-8")


def test_quality_table_reports_mean_std_and_delta_over_seeds(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    assert wd.quality_context(runs) is None  # no vanilla and window yet
    _quality_run(runs, "vanilla", 1, 36.0, 35.0, 6.5)
    _quality_run(runs, "vanilla", 2, 38.0, 37.0, 6.7)
    _quality_run(runs, "window", 1, 35.0, 34.5, 6.9)
    _quality_run(runs, "window-dec-only", 2, 37.5, 36.5, 6.4)
    _quality_run(runs, "rpr", 1, 40.0, 40.0, 6.0)  # not a window configuration
    quality = wd.quality_context(runs)
    assert list(quality) == ["vanilla", "window", "window-dec-only"]
    table = "\n".join(wd.quality_table(quality))
    # vanilla mean 37.00, sample std sqrt(2) = 1.41; window 35.00 - 37.00 = -2.00; sacreBLEU 34.50 - 36.00
    assert "| vanilla | 2 (1,2) | 37.00 +- 1.41 | - | 36.00 +- 1.41 | - | 6.60 +- 0.14 |" in table
    assert "| window | 1 (1) | 35.00 | -2.00 | 34.50 | -1.50 | 6.90 |" in table
    assert "| window-dec-only | 1 (2) | 37.50 | +0.50 | 36.50 | +0.50 | 6.40 |" in table
    assert "window-dec-only \\| note" in table and "rpr" not in table
    assert "Not run yet: window-expected-mask, window-enc-only, window-cross-only, window-mw." in table


def test_report_refreshes_the_bleu_context_from_new_runs(tiny, tmp_path):
    shared_out, results = tiny
    out = tmp_path / "out"  # the fixture's directory stays as the other tests read it
    shutil.copytree(shared_out, out)
    runs = tmp_path / "runs"
    runs.mkdir()
    _quality_run(runs, "vanilla", 1, 36.0, 35.0, 6.5)
    _quality_run(runs, "window", 1, 35.0, 34.5, 6.9)
    with_quality = dict(results, quality=wd.quality_context(runs))
    (out / "window_diagnostics.json").write_text(json.dumps(with_quality), encoding="utf-8")
    _quality_run(runs, "window", 2, 37.0, 36.5, 6.5)  # a seed lands after the measurement
    assert wd.main(["--report", "--out", str(out), "--quality-runs", str(runs)]) == 0
    text = (out / "window_diagnostics.md").read_text(encoding="utf-8")
    assert "| window | 2 (1,2) | 36.00 +- 1.41 | +0.00 |" in text
    assert "Window scores BLEU 36.00 +- 1.41 over 2 seed(s)" in text


def bleu_runs(values):
    return [{"bleu": value, "valid_ppl": 6.0} for value in values]


@pytest.mark.parametrize(
    "window, reading, verdict",
    [
        # -0.80 is over vanilla's std (0.71) but not over one standard error of the
        # difference (0.71 * sqrt(1/1 + 1/2) = 0.87): dropping the factor reads it worse
        ([35.7], "within noise", "does not train worse"),
        ([34.0], "worse, beyond noise", "trains worse"),
        ([38.0], "better, beyond noise", "trains better"),
    ],
)
def test_window_against_vanilla_is_read_with_the_tables_noise_rule(window, reading, verdict):
    quality = {"vanilla": bleu_runs([36.0, 37.0]), "window": bleu_runs(window)}
    finding = wd.quality_finding(quality)
    assert f", {reading} (one standard error of the difference" in finding
    assert "sqrt(1/1 + 1/2), 0.87 BLEU" in finding
    assert verdict in finding
    gap, noise, read = wd.window_vs_vanilla(quality)
    assert read == reading and noise == pytest.approx(math.sqrt(0.5) * math.sqrt(1.5))


def test_window_against_a_one_seed_vanilla_is_not_read():
    finding = wd.quality_finding({"vanilla": bleu_runs([36.0]), "window": bleu_runs([30.0])})
    assert "unread (no seed noise to read it against: vanilla has one seed), so these numbers cannot say." in finding
