"""Two CPU ranks train, save, and resume from the checkpoint with no
environment variable: the multi-rank resume path broadcasts the loaded state
through torch.save/torch.load, which needs the plugin's safe globals."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "multi30k"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_translation_data(tmp_path_factory):
    source = SHARED if SHARED.exists() else None
    if source is None:
        pytest.skip("needs ../shared/data/multi30k")
    work = tmp_path_factory.mktemp("distributed")
    for split, name, lines in (("train", "train", 300), ("valid", "val", 20)):
        for lang in ("en", "de"):
            text = (source / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:lines]
            (work / f"{split}.{lang}").write_text("\n".join(text) + "\n", encoding="utf-8")
    subprocess.run(
        [
            BIN / "fairseq-preprocess",
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--trainpref",
            work / "train",
            "--validpref",
            work / "valid",
            "--destdir",
            work / "bin",
            "--joined-dictionary",
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return work / "bin"


def train_two_ranks(data, save_dir, max_update):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    common = [
        BIN / "fairseq-train",
        data,
        "--user-dir",
        REPO / "fairseq_distattn",
        "--task",
        "translation",
        "--arch",
        "distattn_transformer",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--encoder-embed-dim",
        "32",
        "--decoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--decoder-ffn-embed-dim",
        "64",
        "--encoder-attention-heads",
        "2",
        "--decoder-attention-heads",
        "2",
        "--encoder-self-attention",
        "rpr",
        "--decoder-self-attention",
        "da@0",
        "--cross-attention",
        "window-aw-seg@1",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-tokens",
        "500",
        "--save-dir",
        save_dir,
        "--num-workers",
        "0",
        "--cpu",
        "--ddp-backend",
        "legacy_ddp",
        "--distributed-backend",
        "gloo",
        "--distributed-world-size",
        "2",
        "--distributed-init-method",
        f"tcp://127.0.0.1:{port}",
        "--distributed-no-spawn",
        "--no-epoch-checkpoints",
        "--disable-validation",
        "--max-update",
        str(max_update),
    ]
    ranks = [
        subprocess.Popen(
            [*common, "--distributed-rank", str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [rank.communicate(timeout=300)[0] for rank in ranks]
    for rank, log in zip(ranks, logs):
        assert rank.returncode == 0, log[-3000:]
    return logs


def test_two_rank_training_resumes_from_checkpoint(tiny_translation_data, tmp_path):
    save_dir = tmp_path / "checkpoints"
    train_two_ranks(tiny_translation_data, save_dir, max_update=2)
    assert (save_dir / "checkpoint_last.pt").exists()
    logs = train_two_ranks(tiny_translation_data, save_dir, max_update=4)
    assert "Loaded checkpoint" in logs[0] and "@ 2 updates" in logs[0]
    assert "num_updates 4" in logs[0]
    shutil.rmtree(save_dir)
