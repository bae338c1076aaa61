"""The fairseq layers the plugin subclasses, as in fairseq's own ``modules/``:

- :mod:`.multihead_attention`: :class:`MechanismMultiheadAttention`, the one
  attention module; it composes a registered mechanism
  (:mod:`fairseq_distattn.mechanisms`) and owns the incremental state;
- :mod:`.transformer_layer`: encoder and decoder layers that build it (build hooks only);
- :mod:`.transformer`: the encoder and decoder that give each layer its mechanism;
- :mod:`.summary`: what attention a built model has, per layer.
"""
