"""Let torch>=2.6 (``weights_only=True`` by default) load fairseq checkpoints.

fairseq pickles its configuration into every checkpoint. Rather than turning
weights-only loading off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``, which would
allow arbitrary code in any checkpoint), we allow-list exactly the classes a
fairseq checkpoint contains: ``argparse.Namespace`` (legacy ``args``); the
omegaconf containers and node metadata of the hydra ``cfg`` (DictConfig,
ListConfig, ContainerMetadata, Metadata, AnyNode) with ``typing.Any`` as their
declared element type and ``collections.defaultdict`` inside them; and
``_TensorPlaceholder``, which multi-rank training leaves in the optimizer
state of a checkpoint saved by rank 0. Each is a data container whose
unpickling runs no code of the checkpoint's choosing.
"""
import argparse
import collections
import typing

import torch


def safe_checkpoint_globals():
    from fairseq.distributed.utils import _TensorPlaceholder
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    return [
        argparse.Namespace,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        typing.Any,
        collections.defaultdict,
        _TensorPlaceholder,
    ]


def allow_fairseq_checkpoints():
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads fairseq checkpoints as is
        add_safe_globals(safe_checkpoint_globals())
