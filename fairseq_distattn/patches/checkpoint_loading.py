"""Let torch>=2.6 (``weights_only=True`` by default) load fairseq checkpoints.

fairseq pickles its configuration into every checkpoint. Rather than turning
weights-only loading off (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``, which would
let any checkpoint run code), we allow-list exactly the globals fairseq
checkpoints contain, found by loading real ones (single- and multi-rank):

- ``argparse.Namespace``: the legacy ``args``;
- omegaconf ``DictConfig``, ``ListConfig``, ``ContainerMetadata``,
  ``Metadata``, ``AnyNode``: the hydra ``cfg``; their metadata names
  ``typing.Any`` and the builtin types ``dict``, ``list``, ``int`` as declared
  key/element/object types, and ``collections.defaultdict`` holds nodes;
- ``fairseq.distributed.utils._TensorPlaceholder``: on a multi-rank resume,
  rank 0 broadcasts the loaded state to the other ranks through
  ``torch.save``/``torch.load`` with tensors replaced by placeholders.

Each is a plain data container or type; unpickling them runs no code of the
checkpoint's choosing.
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
        dict,
        list,
        int,
        _TensorPlaceholder,
    ]


def allow_fairseq_checkpoints():
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads fairseq checkpoints as is
        add_safe_globals(safe_checkpoint_globals())


def read_checkpoint(path) -> dict:
    """A checkpoint's state, weights-only; memory-mapped where the file allows it, so that
    reading its configuration does not read its tensors."""
    allow_fairseq_checkpoints()
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        return torch.load(str(path), map_location="cpu", weights_only=True)
