"""Rotary-embedding frequency variants used for long contexts, each equal (in float64, to
rounding) to the code users run: Llama 3.1's frequency scaling, LongRoPE's per-pair
factors (Phi-3), p-RoPE's truncation of the lowest frequencies, and Llama 4's attention
temperature in its NoPE layers.

Conventions are :mod:`.rotary`'s: ``theta`` is the float64 tensor of the ``dims / 2``
inverse frequencies of the rotated dimension pairs (pair i turns by ``position * theta_i``,
:func:`.rotary.turns`), ``theta_i = 1 / base^(2i / dims)`` before any scaling. A bad argument
raises a one-line ValueError that starts with the argument's name.

Sources read (the functions restate their arithmetic; the tests compare against them):

- Hugging Face transformers 4.57.1, ``transformers/modeling_rope_utils.py``:
  ``_compute_llama3_parameters`` (``ROPE_INIT_FUNCTIONS["llama3"]``),
  ``_compute_longrope_parameters`` (``ROPE_INIT_FUNCTIONS["longrope"]``) and the
  ``dynamic_rope_update`` decorator's ``longrope_frequency_update``;
  ``transformers/models/phi3/modeling_phi3.py`` (``Phi3RotaryEmbedding``,
  ``Phi3ForCausalLM.prepare_inputs_for_generation``);
  ``transformers/models/llama4/modeling_llama4.py`` (``Llama4TextAttention.forward``).
  HF computes these in float32; the functions here do the same operations in float64.
- torchtune, ``torchtune/models/llama3_1/_position_embeddings.py``, ``Llama3ScaledRoPE``
  (``rope_init`` and ``apply_scaling``), at commit bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1
  (the file last changed in e5ee1b2fcd25a411a4d0889849c1528189d56616).
- p-RoPE: Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional
  Encodings useful?" (ICLR 2025, arXiv 2410.06205). No code release by the authors was
  found; the arithmetic followed is Google DeepMind's gemma library,
  ``gemma/gm/math/_positional_embeddings.py``, ``apply_rope(..., rope_proportion=...)``
  (google-deepmind/gemma at commit 7691fd4e7f26c9ec5db38110dddb3addfab4d767, the file last
  changed in 74824c9446b929136d604fa9abed27791d63e1be), which is also what transformers
  5.x names ``rope_type="proportional"`` (``_compute_proportional_rope_parameters``, read in
  5.24.0). transformers 4.57.1 has no such rope_type.
"""

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

Factors = Union[Sequence[float], Tensor]


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def _is_real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _shown(value) -> str:
    """``value`` for a one-line message: a tensor by its shape and dtype."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return " ".join(repr(value).split())


def _check_integer(name: str, value, minimum: int, meaning: str) -> None:
    if not _is_integer(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} ({meaning}), got {_shown(value)}")


def _check_positive(name: str, value, meaning: str) -> None:
    if not _is_real(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 ({meaning}), got {_shown(value)}")


def _check_dims(dims) -> None:
    if not _is_integer(dims) or dims < 2 or dims % 2:
        raise ValueError(f"dims must be an even integer >= 2 (the rotated dimensions of a head), got {_shown(dims)}")


def _base_frequencies(dims: int, base: float, device) -> Tensor:
    """``1 / base^(2i / dims)`` per pair, as HF's default init and torchtune form it (the
    reciprocal of a power, not a negative power: the two differ in the last bit)."""
    exponents = torch.arange(0, dims, 2, dtype=torch.float64, device=device) / dims
    return 1.0 / (base**exponents)


def llama3_frequencies(
    dims: int,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_length: int,
    device=None,
) -> Tensor:
    """Llama 3.1's scaled ``theta`` ``[dims / 2]`` (float64, on ``device``).

    Equal to HF transformers 4.57.1 ``ROPE_INIT_FUNCTIONS["llama3"]``
    (``_compute_llama3_parameters`` in ``transformers/modeling_rope_utils.py``, with
    ``rope_scaling = {"factor": factor, "low_freq_factor": low_freq_factor,
    "high_freq_factor": high_freq_factor, "original_max_position_embeddings":
    original_length}``, ``rope_theta = base`` and ``dims = int(head_dim *
    partial_rotary_factor)``) and to torchtune's ``Llama3ScaledRoPE.apply_scaling``
    (``torchtune/models/llama3_1/_position_embeddings.py``, commit bd2a0fc7), both of which
    compute it in float32. With ``L = original_length`` and pair i's wavelength
    ``lambda_i = 2 pi / theta_i``:

    - ``lambda_i < L / high_freq_factor``: ``theta_i`` is kept;
    - ``lambda_i > L / low_freq_factor``: ``theta_i / factor``;
    - otherwise (both bounds included) ``(1 - s) theta_i / factor + s theta_i`` with
      ``s = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``,
      which meets the other two cases at the bounds (s = 1 and s = 0).

    HF's and torchtune's branches and arithmetic are the same (torchtune loops over the
    pairs, HF uses ``torch.where``). The attention factor of this scaling is 1.0 (HF returns
    1.0 and multiplies cos and sin by it): the logits are not rescaled. Llama 3.1 8B: dims
    128, base 500000, factor 8, low 1, high 4, original length 8192."""
    _check_dims(dims)
    _check_positive("base", base, "theta_i = base^(-2i/dims)")
    if not _is_real(factor) or factor < 1:
        raise ValueError(f"factor must be a finite number >= 1 (the context-length scale), got {_shown(factor)}")
    _check_positive("low_freq_factor", low_freq_factor, "original_length / low_freq_factor is the longest kept band")
    if not _is_real(high_freq_factor) or high_freq_factor <= low_freq_factor:
        raise ValueError(
            f"high_freq_factor must be a finite number > low_freq_factor={_shown(low_freq_factor)}, "
            f"got {_shown(high_freq_factor)}"
        )
    _check_integer("original_length", original_length, 1, "the pretraining context length in tokens")
    theta = _base_frequencies(dims, float(base), device)
    wavelength = 2 * math.pi / theta
    longest_kept = original_length / high_freq_factor  # shorter wavelengths keep their frequency
    shortest_scaled = original_length / low_freq_factor  # longer wavelengths are divided by factor
    scaled = torch.where(wavelength > shortest_scaled, theta / factor, theta)
    smooth = (original_length / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    between = (wavelength >= longest_kept) & (wavelength <= shortest_scaled)
    return torch.where(between, blended, scaled)


def longrope_uses_long_factors(length: int, original_length: int) -> bool:
    """Whether HF's LongRoPE rotates with the long factors at sequence length ``length``:
    ``length > original_length``. HF compares ``max(position_ids) + 1`` (the largest
    position of the forward call, over the whole batch, plus one: with a cache, the cached
    length plus the new tokens) with ``config.original_max_position_embeddings`` (or
    ``max_position_embeddings`` where the config has none), in ``longrope_frequency_update``
    (transformers 4.57.1 ``modeling_rope_utils.dynamic_rope_update``); a module that has not
    run a forward pass has the short factors."""
    _check_integer("length", length, 1, "the largest position id plus one")
    _check_integer("original_length", original_length, 1, "original_max_position_embeddings")
    return length > original_length


def _factor_tensor(name: str, values: Factors, pairs: int, device) -> Tensor:
    try:
        factors = torch.as_tensor(values, dtype=torch.float64, device=device)
    except (TypeError, ValueError, RuntimeError):
        factors = None
    if factors is None or factors.dim() != 1 or factors.numel() != pairs:
        raise ValueError(f"{name} must be a sequence of dims/2 = {pairs} numbers, got {_shown(values)}")
    if not bool(torch.isfinite(factors).all()) or not bool((factors > 0).all()):
        raise ValueError(f"{name} must hold finite numbers > 0 (each divides a pair's frequency), got {_shown(values)}")
    return factors


def longrope_attention_factor(original_length: int, max_length: int, attention_factor: Optional[float] = None) -> float:
    """HF's LongRoPE attention factor: ``attention_factor`` where given, else 1 for a
    scale ``s = max_length / original_length <= 1`` and ``sqrt(1 + ln s / ln original_length)``
    above (``_compute_longrope_parameters``, transformers 4.57.1)."""
    _check_integer("original_length", original_length, 1, "original_max_position_embeddings")
    _check_integer("max_length", max_length, 1, "max_position_embeddings")
    if attention_factor is not None:
        _check_positive("attention_factor", attention_factor, "what cos and sin are multiplied by")
        return float(attention_factor)
    return longrope_default_attention_factor(max_length / original_length, original_length)


def longrope_default_attention_factor(scale: float, original_length: int) -> float:
    """HF's LongRoPE attention factor for the context-length scale ``scale`` (its
    ``rope_scaling["factor"]``, or ``max_position_embeddings / original_max_position_embeddings``):
    1 for ``scale <= 1``, else ``sqrt(1 + ln scale / ln original_length)``."""
    _check_integer("original_length", original_length, 1, "original_max_position_embeddings")
    if not _is_real(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0 (the context-length scale), got {_shown(scale)}")
    if scale <= 1.0:
        return 1.0
    if original_length < 2:
        raise ValueError("original_length must be >= 2 for the default attention factor (ln of it divides), got 1")
    return math.sqrt(1 + math.log(scale) / math.log(original_length))


def longrope_theta(dims: int, base: float, factors: Factors, device=None) -> Tensor:
    """``theta_i = 1 / (f_i * base^(2i / dims))`` ``[dims / 2]`` (float64) for one of LongRoPE's
    factor lists ``f`` (HF's ``inv_freq`` of ``_compute_longrope_parameters``)."""
    _check_dims(dims)
    _check_positive("base", base, "theta_i = 1 / (f_i base^(2i/dims))")
    factors = _factor_tensor("factors", factors, dims // 2, device)
    exponents = torch.arange(0, dims, 2, dtype=torch.float64, device=device) / dims
    return 1.0 / (factors * float(base) ** exponents)


def longrope_frequencies(
    dims: int,
    base: float,
    short_factor: Factors,
    long_factor: Factors,
    original_length: int,
    max_length: int,
    length: int,
    attention_factor: Optional[float] = None,
    device=None,
) -> Tuple[Tensor, float]:
    """LongRoPE's ``(theta [dims / 2], attention_factor)`` at sequence length ``length``.

    Equal to HF transformers 4.57.1 ``ROPE_INIT_FUNCTIONS["longrope"]``
    (``_compute_longrope_parameters`` in ``transformers/modeling_rope_utils.py``) as Phi-3
    runs it (``Phi3RotaryEmbedding`` with the ``dynamic_rope_update`` decorator):
    ``theta_i = 1 / (f_i * base^(2i / dims))`` with ``f = long_factor`` when
    :func:`longrope_uses_long_factors` (``length > original_length``, ``length`` being
    ``max(position_ids) + 1``), else ``f = short_factor``; and the attention factor
    (:func:`longrope_attention_factor`) that HF multiplies cos and sin by, so the rotated
    dimensions of queries and keys are both scaled by it and their share of each logit by its
    square, at every length, the short factors' included. Arguments from a Phi-3 config:
    ``original_length = original_max_position_embeddings``, ``max_length =
    max_position_embeddings``; from a config without ``original_max_position_embeddings``
    HF takes ``original_length = max_position_embeddings`` and ``rope_scaling["factor"]``
    as the scale, i.e. ``max_length = factor * original_length`` here. HF holds the factor
    lists in float32; here they are float64.

    A kv cache that crosses the switch: HF swaps the whole ``inv_freq`` buffer when the
    length crosses ``original_length`` (``longrope_frequency_update``), which changes the
    rotation of the queries and keys computed from then on; keys already in the cache keep
    the short-factor rotation they were cached with (nothing in the rotary module or the
    cache re-rotates them), so a query at a position past the switch, rotated with the long
    factors, meets short-rotated keys and their logits depend on more than the offset. The
    only repair in HF 4.57.1 is in generation: ``Phi3ForCausalLM.prepare_inputs_for_generation``
    (likewise PhiMoE and Phi-4-multimodal) drops the cache the first time the sequence
    reaches ``original_length + 1`` tokens while the cache holds at most
    ``original_length``, so ``generate()`` recomputes every key with the long factors (one
    slow step). A caller that runs ``forward`` with a cache itself, or another model class
    with ``rope_type="longrope"``, keeps the mixed rotations (the tests show both)."""
    _check_dims(dims)
    _check_positive("base", base, "theta_i = 1 / (f_i base^(2i/dims))")
    scale_factor = longrope_attention_factor(original_length, max_length, attention_factor)
    use_long = longrope_uses_long_factors(length, original_length)
    short = _factor_tensor("short_factor", short_factor, dims // 2, device)
    long = _factor_tensor("long_factor", long_factor, dims // 2, device)
    return longrope_theta(dims, base, long if use_long else short, device), scale_factor


def partial_frequencies(theta: Tensor, fraction: float) -> Tensor:
    """p-RoPE (Barbero et al. 2025, arXiv 2410.06205): ``theta`` (float64, on its device)
    with only the ``floor(fraction * len(theta))`` highest frequencies (largest ``theta``,
    ties to the earlier pair) kept and the others set to 0, so that those pairs are not
    rotated (their turn is 1 at every position). ``fraction`` 0 is NoPE, 1 is RoPE.

    The paper removes the lowest frequencies and keeps the fraction p of the highest (0-RoPE
    is NoPE, 1-RoPE is RoPE). Its authors' code was not found, so the count and the layout
    follow Google DeepMind's gemma library, ``apply_rope(rope_proportion=p)``
    (``gemma/gm/math/_positional_embeddings.py``, commit 74824c94) and HF 5.x's
    ``_compute_proportional_rope_parameters``: ``int(p * head_dim // 2)`` of the
    ``head_dim / 2`` pairs, the frequencies' exponents still over the whole head
    (``base^(-2i/head_dim)``, unlike GPT-NeoX's ``partial_rotary_factor``, whose exponents
    run over the rotated dimensions only). For RoPE's decreasing ``theta`` the kept pairs
    are the first ones, as there."""
    if not isinstance(theta, Tensor) or theta.dim() != 1 or not theta.is_floating_point():
        raise ValueError(f"theta must be a 1-d floating tensor of inverse frequencies, got {_shown(theta)}")
    if not _is_real(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number 0 <= fraction <= 1 (the share kept), got {_shown(fraction)}")
    pairs = theta.numel()
    kept = int(fraction * (2 * pairs) // 2)
    theta = theta.to(torch.float64)
    order = torch.sort(theta, descending=True, stable=True).indices
    keep = torch.zeros(pairs, dtype=torch.bool, device=theta.device)
    keep[order[:kept]] = True
    return torch.where(keep, theta, torch.zeros_like(theta))


def llama4_attention_scales(positions: Union[Tensor, Sequence[int]], floor_scale: float, attn_scale: float) -> Tensor:
    """Llama 4's attention temperature tuning: the factor its NoPE layers multiply each
    query by, per position (float64, the shape and device of ``positions``):
    ``1 + attn_scale * ln(1 + floor((p + 1) / floor_scale))``.

    Equal to HF transformers 4.57.1 ``Llama4TextAttention.forward``
    (``transformers/models/llama4/modeling_llama4.py``), which, when
    ``config.attn_temperature_tuning`` is set and the layer has no rope
    (``config.no_rope_layers[layer_idx] == 0``), multiplies ``query_states`` (after the
    projection, before the attention's ``1/sqrt(head_dim)``) by ``log1p(floor((p + 1) /
    floor_scale)) * attn_scale + 1`` in float32, where ``p`` is ``cache_position``: each
    query's 0-based index in the kv cache (``past_seen_tokens + i`` for the i-th token of the
    call), not its ``position_ids``, and the same for every sequence of a batch (left padding
    counts). Llama 4's values (HF's defaults) are ``floor_scale`` 8192 and ``attn_scale`` 0.1: the
    factor is 1 up to position 8190 and first exceeds 1 at position ``floor_scale - 1``.
    Earlier transformers releases (and the Meta-style reference code seen in public copies,
    over ``start_pos + i``: the same positions) write ``log(floor(...) + 1)``, equal to
    ``log1p`` up to the last bit; this follows 4.57.1's ``log1p``."""
    if not isinstance(positions, Tensor):
        listed = list(positions) if isinstance(positions, (list, tuple, range)) else None
        if listed is None or not all(_is_integer(p) for p in listed):
            raise ValueError(f"positions must be integer positions (cache_position, from 0), got {_shown(positions)}")
        positions = torch.as_tensor(listed, dtype=torch.int64)
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise ValueError(f"positions must be an integer tensor (cache_position, from 0), got dtype {positions.dtype}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0 (cache_position counts from 0), got minimum {int(positions.min())}")
    _check_positive("floor_scale", floor_scale, "the positions per step of the temperature")
    if not _is_real(attn_scale):
        raise ValueError(f"attn_scale must be a finite number (the slope of the temperature), got {_shown(attn_scale)}")
    steps = torch.floor((positions.to(torch.float64) + 1.0) / floor_scale)
    return torch.log1p(steps) * attn_scale + 1.0


__all__ = [
    "llama3_frequencies",
    "llama4_attention_scales",
    "longrope_attention_factor",
    "longrope_default_attention_factor",
    "longrope_frequencies",
    "longrope_theta",
    "longrope_uses_long_factors",
    "partial_frequencies",
]
