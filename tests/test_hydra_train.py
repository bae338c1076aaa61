"""``fairseq-hydra-train`` (fairseq 0.12's YAML configuration system) trains the model
its ``model:`` section describes, as ``fairseq-train`` does with the same flags, or
refuses the section in one line (issue 47, section 4.8: the plugin's options used to be
dropped without a word, every layer built vanilla, exit status 0)."""

from __future__ import annotations

import re

import yaml

try:  # tests/ is a package (tests/__init__.py)
    from .conftest import REPO_ROOT, run_cli
except ImportError:  # rootdir-relative import mode without the package
    from conftest import REPO_ROOT, run_cli

TINY_LM = {
    "_name": "distattn_lm",
    "decoder_layers": 2,
    "decoder_embed_dim": 32,
    "decoder_ffn_embed_dim": 64,
    "decoder_attention_heads": 2,
}


def hydra_train(workdir, data_bin, model, name="distattn"):
    """Run fairseq-hydra-train on a YAML file that trains ``model`` (the ``model:``
    section) for one update on ``data_bin``; everything it writes stays in ``workdir``. The
    file is not named config.yaml: fairseq's own config.yaml would be composed instead."""
    config = {
        # absolute: hydra runs the job in its own directory
        "common": {"user_dir": str(REPO_ROOT / "fairseq_distattn"), "log_format": "simple", "log_interval": 1},
        "task": {"_name": "language_modeling", "data": str(data_bin), "tokens_per_sample": 64},
        "model": model,
        "criterion": {"_name": "cross_entropy"},
        "optimizer": {"_name": "adam"},
        "lr_scheduler": {"_name": "fixed"},
        "optimization": {"lr": [0.001], "max_update": 1},
        "dataset": {"max_tokens": 512, "num_workers": 0, "disable_validation": True},
        "checkpoint": {"save_dir": str(workdir / "checkpoints"), "no_save": True},
        "hydra": {"run": {"dir": str(workdir / "hydra")}},
    }
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return run_cli(["fairseq-hydra-train", "--config-dir", workdir, "--config-name", name], check=False)


def test_hydra_config_trains_the_mechanism_its_model_section_names(lm_data, workdir):
    proc = hydra_train(workdir, lm_data["bin"], {**TINY_LM, "decoder_self_attention": "alibi"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    summary = re.findall(r"decoder self-attention \(2 layers, 2 heads\): .*", log)
    assert summary, log[-3000:]
    assert "layers 0-1 alibi" in summary[0], summary[0]
    assert "vanilla" not in summary[0], summary[0]


def test_hydra_config_with_a_key_the_model_would_drop_is_refused_in_one_line(lm_data, workdir):
    # a misspelt option: fairseq keeps any key of a legacy model's section and checks none
    proc = hydra_train(workdir, lm_data["bin"], {**TINY_LM, "decoder_self_atention": "alibi"})
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [
        "fairseq-hydra-train: error: model.decoder_self_atention: not an option of --arch distattn_lm "
        "(fairseq-hydra-train would keep it in the configuration and build the model without it); its options "
        "are the model flags of 'fairseq-train --arch distattn_lm --help', with _ for -"
    ], proc.stderr[-3000:]
    assert not (workdir / "checkpoints").exists()


def test_hydra_config_gets_the_flag_checks_of_fairseq_train(lm_data, workdir):
    # the same one-line refusal as fairseq-train --arch distattn_lm --encoder-self-attention rpr
    proc = hydra_train(workdir, lm_data["bin"], {**TINY_LM, "encoder_self_attention": "rpr"})
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "argument --encoder-self-attention: invalid value 'rpr'" in errors[0], errors
    assert "distattn_lm is decoder-only" in errors[0], errors


def test_hydra_config_with_a_plugin_option_for_a_fairseq_legacy_model_is_refused(lm_data, workdir):
    # fairseq's lstm_lm has no dataclass either, so nothing of fairseq's checks its section; the plugin
    # refuses its options there, as fairseq-train refuses --decoder-self-attention with --arch lstm_lm
    model = {"_name": "lstm_lm", "decoder_layers": 1, "decoder_embed_dim": 32, "decoder_self_attention": "alibi"}
    proc = hydra_train(workdir, lm_data["bin"], model)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "model.decoder_self_attention" in errors[0], errors
    assert "no distance-aware attention" in errors[0] and "model._name: distattn_lm" in errors[0], errors
