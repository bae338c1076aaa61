"""Make a checkpoint fixture with the plugin of the working directory (run it from a
worktree of an old revision): a tiny language model trained for one update by
fairseq-train on the text below, and the log-probabilities it gives ``TOKENS``.

    cd <worktree of REV> && python <this file> OUT_DIR NAME -- FAIRSEQ_TRAIN_FLAGS...

writes OUT_DIR/dict.txt, OUT_DIR/NAME.checkpoint and OUT_DIR/NAME.logprobs (torch
tensors, ``[1, len(TOKENS), vocab]``) and OUT_DIR/NAME.revision (``git rev-parse``).
Tests load the checkpoint with today's code and compare.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TEXT = [
    "the cat sat on the mat and the dog sat on the log",
    "a bird flew over the house and the cat watched it",
    "the dog and the cat and the bird are friends now",
    "on the mat the cat sleeps while the dog sits by the door",
] * 8
TOKENS = "the dog sat on the mat and the cat flew over the house while the bird sleeps".split()


def main(out_dir: Path, name: str, flags) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    venv = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "train.txt").write_text("\n".join(TEXT) + "\n")
        (tmp / "valid.txt").write_text("\n".join(TEXT[:4]) + "\n")
        subprocess.run(
            [venv / "fairseq-preprocess", "--only-source", "--trainpref", tmp / "train.txt", "--validpref",
             tmp / "valid.txt", "--destdir", tmp / "bin", "--workers", "1"],
            check=True,
        )
        subprocess.run(
            [venv / "fairseq-train", tmp / "bin", "--user-dir", "fairseq_distattn", "--task", "language_modeling",
             "--tokens-per-sample", "16", "--max-target-positions", "64", "--optimizer", "adam", "--lr", "0.01",
             "--max-tokens", "256", "--max-update", "1", "--save-dir", tmp / "save", "--no-epoch-checkpoints",
             "--seed", "3", "--num-workers", "0", "--cpu", "--required-batch-size-multiple", "1",
             "--disable-validation", *flags],
            check=True,
        )
        shutil.copy(tmp / "bin" / "dict.txt", out_dir / "dict.txt")
        shutil.copy(tmp / "save" / "checkpoint_last.pt", out_dir / f"{name}.checkpoint")
    torch.save(log_probabilities(out_dir, name), out_dir / f"{name}.logprobs")
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    (out_dir / f"{name}.revision").write_text(revision)


def log_probabilities(out_dir: Path, name: str, overrides=None) -> torch.Tensor:
    """What the fixture's model gives ``TOKENS`` (with the code that imports this)."""
    from fairseq import checkpoint_utils, utils

    utils.import_user_module(type("Args", (), {"user_dir": str(Path("fairseq_distattn").resolve())})())
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(out_dir / f"{name}.checkpoint")], arg_overrides={"data": str(out_dir), **(overrides or {})}
    )
    model = models[0].eval()
    dictionary = task.source_dictionary
    tokens = torch.tensor([[dictionary.index(word) for word in TOKENS]])
    with torch.no_grad():
        return model.get_normalized_probs(model(tokens), log_probs=True).double()


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:])
