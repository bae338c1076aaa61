"""Smoke test of the benchmark harness (benchmarks/): it runs end to end at
tiny sizes (--quick) and writes well-formed outputs. No timing assertions:
the harness reports targets, it never asserts them."""
from __future__ import annotations

import json
import math
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from benchmarks.common import Summary, fit_exponent, run_paired
from benchmarks import configs as C
from benchmarks.configs import LM_FLOORS, LM_PRESETS, MT_PRESETS, mt_mechanism_configs
from benchmarks.floor import WINDOW_FLOOR_LAYERS
from benchmarks.report import TRAIN_TARGETS, md_table

REPO_ROOT = Path(__file__).resolve().parent.parent
QUICK_TIMEOUT = 300  # seconds; the quick run itself takes well under 90 s on 2 cores


# --------------------------------------------------------------------------- helpers


def png_info(data: bytes):
    """(width, height) of a PNG after checking its signature, every chunk CRC
    and that the image data decompresses to exactly the expected size."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in {kind!r} chunk"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert width > 0 and height > 0 and depth == 8 and interlace == 0
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    assert len(raw) == height * (1 + width * channels), "image data has the wrong size"
    return width, height


def sections(markdown: str):
    """{'## heading': [table rows as dicts]} for every table in the report."""
    out, heading, lines = {}, None, markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.strip()
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(---\|)+", lines[i + 1].strip()):
            header = split_row(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = split_row(lines[i])
                assert len(cells) == len(header), f"row has {len(cells)} cells, header {len(header)}: {lines[i]}"
                rows.append(dict(zip(header, cells)))
                i += 1
            assert heading not in out, f"two tables under {heading}"
            out[heading] = rows
            continue
        i += 1
    return out


def split_row(line: str):
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def number(text: str) -> float:
    value = float(text.replace(",", ""))
    assert math.isfinite(value), text
    return value


# --------------------------------------------------------------------------- the quick run


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)],
        cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=QUICK_TIMEOUT,
    )
    assert proc.returncode == 0, f"harness failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    return out, proc


def test_quick_run_writes_all_outputs(quick_run):
    out, proc = quick_run
    for name in ("results.md", "results.json", "benchmark.png", "summary.md"):
        assert (out / name).is_file(), f"{name} not written"
    summary = (out / "summary.md").read_text(encoding="utf-8")
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    targets = [t for t in results["targets"] if t["section"] != "ops"]
    assert f"of {len(results['targets'])} targets PASS in this run." in summary
    for target in targets:  # every row of the README's table comes from a measured target
        assert f"| `{target['candidate']}` |" in summary
        assert f"{target['median']:.2f}" in summary
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert proc.stdout == markdown, "stdout must be the markdown report"
    assert "![benchmark plot](benchmark.png)" in markdown
    width, height = png_info((out / "benchmark.png").read_bytes())
    assert width >= 200 and height >= 200


def test_machine_description(quick_run):
    out, _ = quick_run
    rows = {r["item"]: r["value"] for r in sections((out / "results.md").read_text())["## Machine"]}
    for item in ("CPU", "logical CPUs / physical cores", "torch threads (fixed)", "device",
                 "torch / fairseq / numpy / python", "scale", "command"):
        assert rows.get(item) and rows[item] != "None", f"machine row {item!r} missing"
    assert rows["scale"].startswith("tiny")
    assert "--quick" in rows["command"]


def test_targets_table(quick_run):
    out, _ = quick_run
    tables = sections((out / "results.md").read_text())
    rows = tables["## Targets"]
    assert list(rows[0]) == ["section", "candidate", "metric", "target", "measured (median)", "min", "max", "status"]
    by_section = {}
    for row in rows:
        assert row["status"] in ("PASS", "MISS")
        assert re.fullmatch(r"(>=|<=) \d+(\.\d+)?", row["target"]), row["target"]
        number(row["measured (median)"])
        by_section.setdefault(row["section"], []).append(row["candidate"])
    assert by_section["train"] == [key for key, _ in TRAIN_TARGETS]
    presets = [c.key for c in MT_PRESETS + LM_PRESETS]
    assert sorted(by_section["generate"]) == sorted(presets)
    assert sorted(by_section["memory"]) == sorted(presets)
    ops = json.loads((out / "results.json").read_text())["ops"]
    assert len(by_section["ops"]) == len([k for k, r in ops.items() if r["op"] != "sdpa"]) == 18
    for row in rows:
        if row["section"] in ("train", "generate", "memory"):
            assert number(row["measured (median)"]) > 0, row
    passed = sum(r["status"] == "PASS" for r in rows)
    assert f"{passed} of {len(rows)} targets PASS." in (out / "results.md").read_text()


def test_training_tables(quick_run):
    out, _ = quick_run
    tables = sections((out / "results.md").read_text())
    mt = tables["## Training throughput: translation"]
    expected = ["transformer"] + [c.key for c in MT_PRESETS] + [c.key for c in mt_mechanism_configs()]
    assert [r["config"] for r in mt] == expected
    lm = tables["## Training throughput: language model"]
    assert [r["config"] for r in lm] == ["transformer_lm"] + [c.key for c in LM_PRESETS]
    for row in mt + lm:
        assert number(row["params"]) > 0
        assert number(row["tokens/measurement"]) > 0
        low, median, high = (number(row[f"tokens/s {s}"]) for s in ("min", "median", "max"))
        assert 0 < low <= median <= high
        assert number(row["ratio median"]) > 0
        if row["config"] in ("transformer", "transformer_lm"):
            assert row["attention"] == "vanilla" and row["ratio median"] == "1.000"
        else:
            assert 0 < number(row["ratio min"]) <= number(row["ratio median"]) <= number(row["ratio max"])
    window = next(r for r in mt if r["config"] == "window-preset")
    assert "window-aw" in window["attention"] and "window-mw" in window["attention"]


def test_generation_tables(quick_run):
    out, _ = quick_run
    tables = sections((out / "results.md").read_text())
    for heading, baseline, presets in (("## Generation: translation, beam 5", "transformer", MT_PRESETS),
                                       ("## Generation: language model, beam 5", "transformer_lm",
                                        [*LM_PRESETS, *LM_FLOORS])):
        rows = tables[heading]
        assert [r["config"] for r in rows] == [baseline] + [c.key for c in presets]
        lengths = {r["tokens/sentence"] for r in rows}
        assert len(lengths) == 1, f"every model must generate the same number of tokens: {lengths}"
        for row in rows:
            assert number(row["sentences/s median"]) > 0 and number(row["tokens/s median"]) > 0
            assert number(row["ratio median"]) > 0


def test_window_floor_is_vanilla_plus_the_window_work_of_the_preset_layers():
    """lm-window-floor: fairseq's transformer_lm, unchanged outputs, with the
    MW window's per-step work (cached pointer keys) in exactly the layers
    that distattn_lm_window_gbw windows."""
    import torch
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(20):
        dictionary.add_symbol(f"w{i}")
    scale = C.SCALES["tiny"]
    preset = C.build(next(c for c in LM_PRESETS if c.key == "lm-window-preset"), scale, dictionary, "cpu").model
    windowed = tuple(i for i, plan in enumerate(preset.decoder.layer_plans) if plan.self_attention == "window-mw")
    assert windowed == WINDOW_FLOOR_LAYERS
    vanilla = C.build(C.LM_BASELINE, scale, dictionary, "cpu").model.eval()
    floor = C.build(LM_FLOORS[0], scale, dictionary, "cpu").model.eval()
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (2, 5), generator=torch.Generator().manual_seed(0))
    vanilla_state, floor_state = {}, {}
    with torch.no_grad():
        for step in range(tokens.size(1)):
            if step == 3:
                for model, state in ((vanilla, vanilla_state), (floor, floor_state)):
                    model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 1]))
                tokens[0] = tokens[1]
            expected = vanilla.decoder(tokens[:, :step + 1], incremental_state=vanilla_state)[0]
            out = floor.decoder(tokens[:, :step + 1], incremental_state=floor_state)[0]
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for index, layer in enumerate(floor.decoder.layers):
        buffer = layer.self_attn._get_input_buffer(floor_state)
        assert ("prev_left_key" in buffer) == (index in WINDOW_FLOOR_LAYERS)
        if index in WINDOW_FLOOR_LAYERS:
            assert buffer["prev_left_key"].shape == buffer["prev_key"].shape
            torch.testing.assert_close(buffer["prev_right_key"][0], buffer["prev_right_key"][1], rtol=0, atol=0)


def test_memory_table(quick_run):
    out, _ = quick_run
    rows = sections((out / "results.md").read_text())["## Peak memory, forward + backward"]
    assert [r["config"] for r in rows] == (["transformer"] + [c.key for c in MT_PRESETS]
                                           + ["transformer_lm"] + [c.key for c in LM_PRESETS])
    lengths = [int(h.split("=")[1]) for h in rows[0] if h.startswith("MiB L=")]
    assert lengths == [16, 32, 64]
    for row in rows:
        for n in lengths:
            assert number(row[f"MiB L={n}"]) > 0
            assert number(row[f"ratio L={n}"]) > 0
    results = json.loads((out / "results.json").read_text())["memory"]
    for key, r in results.items():
        peaks = [r["peak_bytes"][str(n)] for n in lengths]
        assert all(p > 0 for p in peaks) and peaks == sorted(peaks), f"{key}: peak memory must grow with L: {peaks}"


def test_memory_pass_time_table(quick_run):
    out, _ = quick_run
    rows = sections((out / "results.md").read_text())["## Time of the memory pass"]
    assert [r["config"] for r in rows] == (["transformer"] + [c.key for c in MT_PRESETS]
                                           + ["transformer_lm"] + [c.key for c in LM_PRESETS])
    for row in rows:
        for n in (16, 32, 64):
            assert number(row[f"ms L={n}"]) > 0
            assert number(row[f"time ratio L={n}"]) > 0
        if row["config"] in ("transformer", "transformer_lm"):
            assert row["time ratio L=64"] == "1.000"


def test_ops_table(quick_run):
    out, _ = quick_run
    rows = sections((out / "results.md").read_text())["## Attention ops vs scaled_dot_product_attention"]
    assert {r["mode"] for r in rows} == {"fwd", "fwd+bwd"}
    assert len(rows) == 20  # sdpa + 9 ops, two modes
    for row in rows:
        for n in (16, 32, 64):
            assert number(row[f"ms L={n}"]) > 0
        assert number(row["x sdpa L=64"]) > 0
        number(row["exponent (fit)"])
    assert [r["x sdpa L=64"] for r in rows if r["op"] == "sdpa"] == ["1.00", "1.00"]


def test_results_json_matches_report(quick_run):
    out, _ = quick_run
    results = json.loads((out / "results.json").read_text())
    assert {"meta", "machine", "train", "generate", "memory", "ops", "targets"} <= set(results)
    rows = sections((out / "results.md").read_text())["## Targets"]
    assert [(t["section"], t["candidate"], t["status"]) for t in results["targets"]] == \
        [(r["section"], r["candidate"], r["status"]) for r in rows]
    for section in ("translation", "lm"):
        for key, r in results["train"][section].items():
            assert r["throughput"]["n"] == len(r["samples"]) > 0
            if r["kind"] != "baseline":
                assert len(r["ratios"]) == results["meta"]["repeats"]
                assert all(x > 0 for x in r["ratios"])


def test_fallback_plot_is_a_valid_png(quick_run, tmp_path):
    """Without matplotlib the harness still writes a PNG (no labels)."""
    from benchmarks.plot import _fallback_plot

    out, _ = quick_run
    results = json.loads((out / "results.json").read_text())
    path = tmp_path / "fallback.png"
    _fallback_plot(results, path)
    assert png_info(path.read_bytes()) == (800, 600)


# --------------------------------------------------------------------------- pieces


def test_script_entry_point_and_bad_flags():
    help_text = subprocess.run([sys.executable, "benchmarks/run.py", "--help"], cwd=str(REPO_ROOT),
                               capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0
    for flag in ("--quick", "--out", "--device", "--repeats", "--sections"):
        assert flag in help_text.stdout
    bad = subprocess.run([sys.executable, "-m", "benchmarks.run", "--sections", "train,speed"], cwd=str(REPO_ROOT),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--sections" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--sections", "ops",
                              "--configs", "no-such-model"], cwd=str(REPO_ROOT), capture_output=True, text=True,
                             timeout=120)
    assert unknown.returncode == 2 and "no-such-model" in unknown.stderr


def test_fit_exponent_recovers_power_laws():
    lengths = [64, 128, 256, 512, 1024]
    assert fit_exponent(lengths, [3e-6 * n ** 2 for n in lengths]) == pytest.approx(2.0)
    assert fit_exponent(lengths, [1e-4 * n ** 1.5 for n in lengths]) == pytest.approx(1.5)


def test_run_paired_interleaves_and_pairs_ratios():
    calls = []
    speed = {"base": 100.0, "a": 50.0, "b": 200.0}

    def measure(name):
        calls.append(name)
        drift = 1 + 0.01 * len(calls)  # slow machine drift must cancel within pairs
        return speed[name] * drift

    results = run_paired("base", ["a", "b"], measure, repeats=2, warmup=1)
    assert calls[:3] == ["base", "a", "b"]  # warm-up, discarded
    assert calls[3:] == ["base", "a", "base", "b", "base", "base", "b", "base", "a", "base"]
    assert len(results["base"].throughputs) == 6
    assert results["a"].ratio.median == pytest.approx(0.5, rel=1e-3)
    assert results["b"].ratio.median == pytest.approx(2.0, rel=1e-3)
    assert results["base"].ratios == []


def test_summary_and_markdown_helpers():
    s = Summary.of([3.0, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    table = md_table(["a", "b"], [(1, "x|y")])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]
    assert sections("## T\n\n" + table) == {"## T": [{"a": "1", "b": "x|y"}]}


def test_committed_results_name_no_directory_of_the_machine_that_made_them():
    checkout = str(REPO_ROOT.parent)
    for path in sorted((REPO_ROOT / "benchmarks" / "results").rglob("*")):
        if path.suffix in (".md", ".json"):
            text = path.read_text(encoding="utf-8")
            assert checkout not in text and "/tmp/" not in text and "/root/" not in text, f"{path} embeds a machine path"


def test_data_descriptions_are_relative_to_the_repository(tmp_path):
    from benchmarks.data import shown

    assert shown(REPO_ROOT / "data" / "multi30k") == "data/multi30k"
    assert shown(REPO_ROOT.parent / "shared" / "data") == "../shared/data"
