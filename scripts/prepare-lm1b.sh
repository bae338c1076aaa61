#!/usr/bin/env bash
# The One Billion Word benchmark (Chelba et al. 2013) for fairseq language models.
#
#   bash scripts/prepare-lm1b.sh --out work/lm1b
#   bash scripts/prepare-lm1b.sh --raw-dir ~/archives   # archive you already have
#   bash scripts/prepare-lm1b.sh --help
#
# Splits (the standard ones):
#   train  training-monolingual.tokenized.shuffled/news.en-000{01..99}-of-00100
#          (all 99 training shards, about 30.3M sentences, 768M words)
#   test   heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050, the
#          benchmark's test shard used by Chelba et al. 2013, Jozefowicz et al. 2016
#          and Baevski & Auli 2019 (fairseq's transformer_lm_gbw)
#   valid  heldout-monolingual.tokenized.shuffled/news.en.heldout-00001-of-00050, a
#          different held-out shard, so that model selection never sees the test
#          shard (some recipes, e.g. Transformer-XL's, validate on shard 00000 too)
# The text is already tokenised and words seen fewer than 3 times are <UNK>, so it
# is binarised as is: fairseq-preprocess --only-source with the full vocabulary
# (about 793k types plus fairseq's 4 specials). That is the vocabulary that
# transformer_lm_gbw's adaptive softmax expects: train with
#   --criterion adaptive_loss --adaptive-softmax-cutoff 60000,100000,640000
# (see examples/wmt14/README.md).
PREP_NAME=prepare-lm1b
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

ARCHIVE_NAME=1-billion-word-language-modeling-benchmark-r13output.tar.gz
ARCHIVE_URL=http://www.statmt.org/lm-benchmark/$ARCHIVE_NAME
TOP=1-billion-word-language-modeling-benchmark-r13output
# Published checksum and size: TensorFlow Datasets' url_checksums/lm1b.txt.
CHECKSUM[$ARCHIVE_NAME]=sha256:01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e
SIZE[$ARCHIVE_NAME]=1792209805

usage() {
    cat <<USAGE
Usage: bash scripts/prepare-lm1b.sh [options]

Prepares the One Billion Word benchmark for fairseq (train: the 99 training shards;
valid: held-out shard 00001; test: held-out shard 00000), binarised with
fairseq-preprocess --only-source and the full (~793k) vocabulary.

Options (each also an environment variable):
  --out DIR          output directory (OUT_DIR; default work/lm1b)
  --raw-dir DIR      directory holding $ARCHIVE_NAME (RAW_DIR)
  --valid-shard N    held-out shard for validation (VALID_SHARD; default 1)
  --test-shard N     held-out shard for test (TEST_SHARD; default 0)
  --vocab-size N     keep only the N most frequent words, the rest become <unk>
                     (VOCAB_SIZE; default 0: the full vocabulary)
  --workers N        fairseq-preprocess workers (WORKERS; default: all cores)
  --checksums FILE   extra/overriding checksums, lines "HEX  ARCHIVE-NAME" (CHECKSUMS_FILE)
  --mirror URL       download from URL/$ARCHIVE_NAME instead (MIRROR)
  --offline          never download (OFFLINE=1)
  --force            redo every step (FORCE=1)
  -h, --help         this help

Outputs: data-bin/ (dict.txt, {train,valid,test}.{bin,idx}), text/, prep.json, .stamps/.
Rerunning skips finished steps; a killed or failed run resumes where it stopped.
USAGE
}

common_option_defaults work/lm1b
VALID_SHARD="${VALID_SHARD:-1}"
TEST_SHARD="${TEST_SHARD:-0}"
VOCAB_SIZE="${VOCAB_SIZE:-0}"
while [ $# -gt 0 ]; do
    common_option "$@"
    if [ "$OPTION_WORDS" -gt 0 ]; then shift "$OPTION_WORDS"; continue; fi
    case "$1" in
        --valid-shard) VALID_SHARD="$2"; shift 2 ;;
        --test-shard) TEST_SHARD="$2"; shift 2 ;;
        --vocab-size) VOCAB_SIZE="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
done
for n in "$VALID_SHARD" "$TEST_SHARD"; do
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$((10#$n))" -lt 50 ] || die "held-out shards are 0..49, not '$n'"
done
[ "$((10#$VALID_SHARD))" != "$((10#$TEST_SHARD))" ] || warn "validating on the test shard ($TEST_SHARD)"
[[ "$VOCAB_SIZE" =~ ^[0-9]+$ ]] || die "--vocab-size must be a number, not '$VOCAB_SIZE'"
check_common_options
TEXT="$OUT_DIR/text"
BIN="$OUT_DIR/data-bin"
mkdir -p "$TEXT" "$OUT_DIR/logs"

heldout() { printf '%s/heldout-monolingual.tokenized.shuffled/news.en.heldout-%05d-of-00050\n' "$TOP" "$((10#$1))"; }
TRAIN_MEMBERS=()
for i in $(seq 1 99); do
    TRAIN_MEMBERS+=("$(printf '%s/training-monolingual.tokenized.shuffled/news.en-%05d-of-00100' "$TOP" "$i")")
done
VALID_MEMBER="$(heldout "$VALID_SHARD")"
TEST_MEMBER="$(heldout "$TEST_SHARD")"

log "output: $OUT_DIR; valid: held-out shard $VALID_SHARD; test: held-out shard $TEST_SHARD${RAW_DIR:+; raw archive: $RAW_DIR}"

# ---- 1. fetch + verify, 2. extract --------------------------------------------------
ORIG="$OUT_DIR/orig/lm1b"
fetch_and_extract "$ARCHIVE_NAME" "$ARCHIVE_URL" "$ORIG" "${TRAIN_MEMBERS[@]}" "$VALID_MEMBER" "$TEST_MEMBER"

# ---- 3. train / valid / test text -----------------------------------------------------
if step_begin corpus "valid=$VALID_SHARD test=$TEST_SHARD"; then
    train_files=()
    for m in "${TRAIN_MEMBERS[@]}"; do train_files+=("$ORIG/$m"); done
    preplib concat "$TEXT/train.txt" "${train_files[@]}"
    preplib concat "$TEXT/valid.txt" "$ORIG/$VALID_MEMBER"
    preplib concat "$TEXT/test.txt" "$ORIG/$TEST_MEMBER"
    step_end
fi

# ---- 4. binarise (--only-source, full vocabulary) -------------------------------------
VOCAB_ARGS=()
[ "$VOCAB_SIZE" -gt 0 ] && VOCAB_ARGS=(--nwordssrc "$VOCAB_SIZE")
if step_begin binarise "only-source vocab=$VOCAB_SIZE"; then
    PREPROCESS="$(tool fairseq-preprocess)"
    rm -rf "$BIN.tmp"
    log "fairseq-preprocess --only-source (log: $OUT_DIR/logs/preprocess.log; about an hour on the full data)"
    if ! "$PREPROCESS" --only-source \
        --trainpref "$TEXT/train.txt" --validpref "$TEXT/valid.txt" --testpref "$TEXT/test.txt" \
        --destdir "$BIN.tmp" --workers "$WORKERS" ${VOCAB_ARGS[@]+"${VOCAB_ARGS[@]}"} 2>&1 \
        | tee "$OUT_DIR/logs/preprocess.log" | { grep --line-buffered -E 'tokens|Wrote' >&2 || true; }; then
        tail -n 20 "$OUT_DIR/logs/preprocess.log" >&2
        die "fairseq-preprocess failed (log: $OUT_DIR/logs/preprocess.log)"
    fi
    rm -rf "$BIN"
    mv "$BIN.tmp" "$BIN"
    step_end
fi

# ---- 5. settings ----------------------------------------------------------------------
VOCAB=$(lines_of "$BIN/dict.txt")
if step_begin finish "v1"; then
    cat > "$OUT_DIR/prep.json.tmp" <<JSON
{
  "recipe": "$PREP_NAME",
  "train": "news.en-000{01..99}-of-00100",
  "valid": "$(basename "$VALID_MEMBER")",
  "test": "$(basename "$TEST_MEMBER")",
  "dict_entries": $VOCAB,
  "vocab_size_limit": $VOCAB_SIZE,
  "adaptive_softmax_cutoff": "60000,100000,640000",
  "data_bin": "$BIN"
}
JSON
    mv -f "$OUT_DIR/prep.json.tmp" "$OUT_DIR/prep.json"
    step_end
fi
CURRENT_STEP="done"
log "done: fairseq data in $BIN ($VOCAB dictionary entries plus 4 specials)"
if [ "$VOCAB_SIZE" = 0 ] && [ "$VOCAB" -le 640000 ]; then
    warn "the dictionary has only $VOCAB entries: the adaptive softmax cut-offs" \
         "60000,100000,640000 of the 1B word recipe need more than 640000; pick smaller ones"
fi
