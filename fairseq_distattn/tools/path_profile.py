"""What a registered mechanism's terms say about its execution paths, read from
example calls (:mod:`.examples`): nothing about paths is declared. For the docs'
mechanism table (:func:`path_condition`, :func:`recomputed_in_row_blocks`) and the
speed targets (:func:`fused_keeps`): each mechanism's terms under its default
options and under every value of each option with a few values (a choice, a
switch), :func:`functional.terms.candidate_paths` and
:func:`functional.terms.kept_for_backward` on them.
"""

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

import torch

from ..functional.paths import Call, CallOptions, Keeps, Path, choose_path
from ..functional.terms import Terms, candidate_paths, kept_for_backward
from ..mechanisms.base import Mechanism
from ..registry import REGISTRY, MechanismInfo, OptionContext, option_flag
from .examples import ExampleDraw, example_call

# the paths the mechanism table has a column for (the eager one is every mechanism's)
TABLE_PATHS = (Path.FUSED, Path.FLEX)


def example_terms(info: MechanismInfo, options=None) -> Terms:
    """The terms of ``info``'s module on a drawn full-sequence call (no weights needed)
    of a batch with padding, as a model's batches have it."""
    call = example_call(info, ExampleDraw(batch=2, heads=2, tgt_len=4, head_dim=4), options)
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[1, -1] = True
    with torch.no_grad():
        queries, keys = call.mechanism.encode_positions(call.queries, call.all_keys(), padding, 0)
        return call.mechanism.terms(queries, keys, CallOptions(padding, info.causal_only, need_weights=False))


def layer_terms(mechanism: Mechanism) -> Terms:
    """The terms of a built layer's mechanism (its own parameters) on drawn projections of
    a full-sequence call of a padded batch, no weights needed."""
    shape = (2, mechanism.config.num_heads, 4, mechanism.config.head_dim)
    parameter = next(mechanism.parameters(), None)  # the projections in its parameters' dtype and device
    like = dict(dtype=torch.float32) if parameter is None else dict(dtype=parameter.dtype, device=parameter.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        queries = {name: torch.randn(shape, **like) for name in ("query", *mechanism.extra_queries)}
        keys = {name: torch.randn(shape, **like) for name in ("key", "value", *mechanism.extra_keys)}
        layer_input = torch.randn(4, 2, shape[1] * shape[3], **like)
    padding = torch.zeros(2, 4, dtype=torch.bool, device=like.get("device"))
    padding[1, -1] = True
    with torch.no_grad():
        keys.update(mechanism.inputs_from_layer(layer_input))
        queries, keys = mechanism.encode_positions(queries, keys, padding, 0)
        causal = mechanism.info.causal_only if mechanism.config.causal is None else mechanism.config.causal
        return mechanism.terms(queries, keys, CallOptions(padding, causal, need_weights=False))


def layer_path(mechanism: Mechanism, call: Call) -> Path:
    """The path a built layer takes for ``call`` (:func:`paths.choose_path` among the
    paths its terms allow)."""
    return choose_path(call, candidate_paths(layer_terms(mechanism)))


def may_take_flex_path(mechanism: Mechanism) -> bool:
    """Whether a built layer runs in flex_attention where that applies."""
    return Path.FLEX in candidate_paths(layer_terms(mechanism))


def may_take(info: MechanismInfo, path: Path) -> bool:
    """Whether ``info`` takes ``path`` with its default options or another value of one of them."""
    return any(path in paths for paths in _profile(info.name).values())


def _option_values(info: MechanismInfo) -> Tuple[Tuple[dataclasses.Field, Tuple[Any, ...]], ...]:
    """Each option of ``info`` that takes a few values (a choice, a switch), with them."""
    found = []
    for field in info.option_fields():
        flag = option_flag(field)
        if flag.applies_to is not None and not flag.applies_to(info.name):
            continue
        if flag.argparse.get("action") == "store_true":
            given = (flag.arg_default, True)
        elif "choices" in flag.argparse:
            given = tuple(flag.argparse["choices"])
        else:
            continue
        found.append((field, tuple(dict.fromkeys(flag.convert(value, OptionContext()) for value in given))))
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _profile(name: str) -> Dict[Tuple[str, Any], Dict[Path, Keeps]]:
    """For the defaults (key ``("", None)``) and each value of each few-valued option
    (``(field, value)``): the paths the terms allow besides the eager one, and what
    each keeps for backward. A value the example cannot run with is left out."""
    info = REGISTRY[name]
    defaults = info.default_options()
    variants = {("", None): defaults}
    for field, values in _option_values(info):
        for value in values:
            variants[(field.name, value)] = dataclasses.replace(defaults, **{field.name: value})
    profile = {}
    for key, options in variants.items():
        try:
            info.module.check_options(options)
            terms = example_terms(info, options)
        except ValueError:  # SpecError too: a combination the mechanism refuses
            continue
        profile[key] = {path: kept_for_backward(terms, path) for path in candidate_paths(terms) if path in TABLE_PATHS}
    return profile


def fused_keeps(info: MechanismInfo) -> Optional[Keeps]:
    """What the fused path keeps for backward under the default options (None: no fused path)."""
    return _profile(info.name)[("", None)].get(Path.FUSED)


def recomputed_in_row_blocks(info: MechanismInfo) -> str:
    """The table's words for when a training step of ``info`` recomputes in row blocks:
    never where a row depends on other rows' queries; only with the weights (the eager
    path) where its fused path keeps nothing per batch."""
    if not info.row_wise:
        return "no (not row-wise)"
    return "only with weights" if fused_keeps(info) in (Keeps.BIAS, Keeps.NOTHING) else "yes"


def path_condition(info: MechanismInfo, path: Path) -> str:
    """When ``info`` takes ``path``, in words read from its terms: "" where never;
    "without weights" where always; else the option values it takes it with."""
    profile = _profile(info.name)
    taking = {key for key, paths in profile.items() if path in paths}
    if not taking:
        return ""
    text = "without weights"
    if taking != set(profile):
        text = f"{_option_condition(info, profile, taking)}, {text}"
    note = _note(info, path, profile, taking)
    return f"{text} ({note})" if note else text


def _option_condition(info: MechanismInfo, profile, taking) -> str:
    """The values of the one option that decides, as the command line gives them."""
    default_takes = ("", None) in taking
    deciding = {name for name, _ in profile if name and (((name, _) in taking) != default_takes)}
    if len(deciding) != 1:
        raise ValueError(
            f"{info.name}: more than one option decides its paths ({sorted(deciding)}); say which in words"
        )
    (name,) = deciding
    field = next(field for field in info.option_fields() if field.name == name)
    flag = option_flag(field)
    values = [value for key, value in profile if key == name and (key, value) in taking]
    if flag.argparse.get("action") == "store_true":
        given = flag.convert(True, OptionContext())
        return f"`{flag.flag}`" if values == [given] else f"without `{flag.flag}`"
    first, *others = values
    return f"`{flag.flag} {first}`" + "".join(f" or `{value}`" for value in others)


def _note(info: MechanismInfo, path: Path, profile, taking) -> str:
    """How the terms run on ``path`` where that is more than an additive bias."""
    key = ("", None) if ("", None) in taking else sorted(taking, key=str)[0]
    options = (
        info.default_options() if key == ("", None) else dataclasses.replace(info.default_options(), **{key[0]: key[1]})
    )
    terms = example_terms(info, options)
    if path is Path.FLEX:
        if terms.window is not None:
            return "M as log M in score_mod, times each row's window mass"
        if terms.value_term is not None:
            return "the value term from flex's log-sum-exp"
        if terms.offset_table.combine != "add":
            return "the table as a score modification"
        return ""
    if terms.value is not None:
        return "on the values it makes"
    if terms.query is not None or terms.key is not None:
        return "vanilla's own call on its queries and keys" if terms.bias is None else "on its own queries"
    return ""


__all__ = [
    "example_terms",
    "fused_keeps",
    "layer_path",
    "layer_terms",
    "may_take",
    "may_take_flex_path",
    "path_condition",
    "recomputed_in_row_blocks",
]
