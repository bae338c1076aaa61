"""``python -m fairseq_distattn.docs``: the documentation the registry gives.

It prints the mechanism table, the flag table and the SPEC grammar; ``--write``
writes them to docs/ and copies them into the pages of README.md and docs/
that show them (between their markers), and rewrites the exports of
``functional/__init__.py`` from its modules' ``__all__``; ``--accepted-by KIND ...`` prints, one
per line, the mechanisms that every given attention kind accepts (what
``scripts/quickstart.sh`` offers as MECH)."""

import argparse
import re
import sys

from ..functional.paths import Path
from ..registry import EVALUATION, KINDS, RUNTIME, TRAINED, option_flag, registered
from ..spec import MECHANISMS, accepted_by, option_fields
from .functional_exports import FUNCTIONAL_INIT, functional_init
from .generated_blocks import REPO_ROOT, update_pages
from .path_profile import TABLE_PATHS, path_condition, recomputed_in_row_blocks

MECHANISM_TABLE = "docs/mechanisms.md"  # relative to the repository; copied into README.md

# the mechanism table's column for each path besides the eager one, in TABLE_PATHS' order
PATH_COLUMNS = {Path.FUSED: "fused path (SDPA)", Path.FLEX: "flex_attention (CUDA)"}


def mechanism_table() -> str:
    """The mechanism table of the README, from the registry (Markdown, with a title)."""
    lines = [
        "# Mechanisms",
        "",
        "| MECH | mechanism | paper | attention kinds | "
        + "".join(f"{PATH_COLUMNS[path]} | " for path in TABLE_PATHS)
        + "recomputed in row blocks | options |",
        "|---|---|---|---|---|---|---|---|",
        "| `vanilla` | fairseq's scaled dot-product attention | Vaswani et al. 2017 | all | fairseq's | - | - | - |",
    ]
    for info in registered():
        kinds = ", ".join(kind.label for kind in KINDS if kind.key in info.kinds)
        kinds += "".join(
            f"; not {kind.label}: {info.unsupported[kind.key]}" for kind in KINDS if kind.key in info.unsupported
        )
        flags = (
            ", ".join(
                f"`{option_flag(field).flag}`"
                for field in info.option_fields()
                if option_flag(field).applies_to is None or option_flag(field).applies_to(info.name)
            )
            or "-"
        )
        cells = [
            f"`{info.name}`",
            info.description,
            info.paper,
            kinds,
            *(path_condition(info, path) or "no" for path in TABLE_PATHS),
            recomputed_in_row_blocks(info),
            flags,
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines += [
        "",
        "*Fused path*: with `need_weights=False` (training, generation) the mechanism runs as one "
        "`F.scaled_dot_product_attention` with an additive bias. *flex_attention*: on CUDA, for full sequences "
        "without weights and without attention dropout whose keys reach `--attention-recompute-length` "
        "(`--attention-flex auto`; `always`: at every length), the mechanism's bias or score modification, a table "
        "read inside `score_mod`, runs in compiled `torch.nn.attention.flex_attention` (no attention matrix "
        "is kept, only what the mechanism itself builds, such as MW's window M; it takes precedence over the "
        "fused path). *Recomputed in row blocks*: from "
        "`--attention-recompute-length` on, a training step recomputes the mechanism in blocks of query rows "
        "instead of keeping `[B, H, Tq, Tk]` tensors for backward: row-wise mechanisms only, and not where the "
        "fused path keeps only a bias without a batch dimension, or none (so only when the weights are needed), "
        "nor where the flex path runs.",
    ]
    return "\n".join(lines) + "\n"


SPEC_GRAMMAR = "docs/spec-grammar.md"  # relative to the repository; copied into README.md


def spec_grammar(width: int = 80) -> str:
    """The README's SPEC grammar and the mechanisms each attention flag accepts,
    from the registry (Markdown, with a title), so that a new mechanism appears
    in both without an edit."""
    lead = "    MECH   := "
    lines, line = [], lead + MECHANISMS[0]
    for name in MECHANISMS[1:]:
        if len(line) + len(" | " + name) > width:
            lines.append(line)
            line = " " * (len(lead) - 2) + "| " + name
        else:
            line += " | " + name
    lines.append(line)
    table = ["| flag | accepts | refuses |", "|---|---|---|"]
    for kind in KINDS:
        refused = {}
        for name in MECHANISMS:
            if name not in kind.allowed:
                refused.setdefault(kind.disallowed_reason(name), []).append(f"`{name}`")
        accepts = ", ".join(f"`{name}`" for name in MECHANISMS if name in kind.allowed)
        refuses = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in refused.items()) or "-"
        table.append(f"| `{kind.flag}` | {accepts} | {refuses} |")
    return (
        "\n".join(
            [
                "# SPEC grammar",
                "",
                '    SPEC   := ITEM ( "," ITEM )*',
                '    ITEM   := MECH [ "@" LAYERS ]',
                "    LAYERS := i | i-j            0-based layer indices, inclusive",
                *lines,
                "",
                "What each attention flag accepts (`distattn_lm` has only `--decoder-self-attention`):",
                "",
                *table,
            ]
        )
        + "\n"
    )


FLAG_TABLE = "docs/flags.md"  # relative to the repository; copied into README.md
_DEFAULT_IN_HELP = re.compile(r" \(default: [^)]*\)|; default: [^)]*(?=\))")


# what a trained model allows of an option (the last column of the flag table)
ON_A_TRAINED_MODEL = {
    TRAINED: "fixed",
    EVALUATION: "`--model-overrides`",
    RUNTIME: "any command",
}


def flag_table() -> str:
    """The README's table of the plugin's flags, from the registry and the
    flags' own help (Markdown, with a title): what ``--help`` says, with the
    default in a column of its own, and what a trained model allows of each:
    fixed (resuming, averaging and ``--model-overrides`` keep the trained value),
    changed by ``--model-overrides`` (parameter-free), or by any command."""
    rows = [
        "# Flags",
        "",
        "| flag | default | meaning | on a trained model |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        rows.append(
            f"| `{kind.flag} SPEC` | `vanilla` | mechanism per layer of {kind.description} "
            f"({_models_with(kind)}; the SPEC grammar below) | {ON_A_TRAINED_MODEL[TRAINED]} |"
        )
    for field in option_fields():
        flag = option_flag(field)
        switch = flag.argparse.get("action") == "store_true"
        metavar = flag.argparse.get("metavar") or ("" if switch else field.name.split("_")[-1].upper())
        usage = f"{flag.flag} {metavar}".strip()
        default = "off" if switch else f"`{flag.arg_default}`"
        meaning = _DEFAULT_IN_HELP.sub("", flag.help)
        cells = (f"`{usage}`", default, meaning, ON_A_TRAINED_MODEL[flag.role])
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def _models_with(kind) -> str:
    """Which models take an attention flag (the LM is a decoder only)."""
    return "both models; the LM's only attention" if kind.in_language_model else "`distattn_transformer` only"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_distattn.docs", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--write",
        action="store_true",
        help=f"write {MECHANISM_TABLE}, {FLAG_TABLE} and {SPEC_GRAMMAR} and their copies in README.md and docs/, "
        f"and the exports of {FUNCTIONAL_INIT}",
    )
    action.add_argument(
        "--accepted-by",
        nargs="+",
        choices=[kind.key for kind in KINDS],
        metavar="KIND",
        help=f"print the mechanisms every KIND accepts ({', '.join(kind.key for kind in KINDS)})",
    )
    args = parser.parse_args(argv)
    if args.accepted_by:
        sys.stdout.write("".join(f"{name}\n" for name in accepted_by(args.accepted_by)))
        return 0
    generated = {MECHANISM_TABLE: mechanism_table(), FLAG_TABLE: flag_table(), SPEC_GRAMMAR: spec_grammar()}
    if not args.write:
        sys.stdout.write("\n".join(generated.values()))
        return 0
    for relative, text in generated.items():
        path = REPO_ROOT / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pages = update_pages(path)
        if not pages:
            print(f"no page of README.md and docs/ shows {relative}", file=sys.stderr)
            return 1
        shown = ", ".join(page.relative_to(REPO_ROOT).as_posix() for page in pages)
        print(f"wrote {relative} and its copy in {shown}")
    init = REPO_ROOT / FUNCTIONAL_INIT
    init.write_text(functional_init(init.read_text(encoding="utf-8"), init.parent), encoding="utf-8")
    print(f"wrote the exports of {FUNCTIONAL_INIT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
