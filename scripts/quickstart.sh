#!/usr/bin/env bash
# Quickstart: train and evaluate a small distance-aware Transformer on the shipped
# Multi30k En->De sample (data/multi30k), on CPU, in well under 15 minutes on 2 cores.
#
#   make quickstart                      # same as: bash scripts/quickstart.sh
#   MECH=rpr bash scripts/quickstart.sh  # another mechanism
#   UPDATES=2000 bash scripts/quickstart.sh
#
# Settings (environment variables):
#   MECH     window (default): --encoder-self-attention window-aw@0-2
#                              --decoder-self-attention window-mw@0-2
#                              --cross-attention window-aw-seg@0-2
#            vanilla:  no distance-aware attention (the baseline)
#            any other mechanism that both self-attentions accept (rpr, da, alibi, ...;
#            `python -m fairseq_distattn.docs --accepted-by encoder-self decoder-self`
#            lists them): --encoder-self-attention MECH --decoder-self-attention MECH
#   ATTN_ARGS  attention flags to use instead of the MECH preset (a string); give
#            MECH a new name with it, e.g. MECH=mine ATTN_ARGS='--encoder-self-attention
#            rpr@0,da@1-2': MECH names the output directory <WORK>/<MECH>
#   UPDATES  training updates (default 300)
#   MERGES   joint BPE merges (default 6000)
#   MAX_TOKENS  fairseq-train --max-tokens (default 2048)
#   WORK     work directory (default work/quickstart)
#   DATA     directory with {train,val,test_2016_flickr}.{en,de}[.gz] (default data/multi30k)
#   PREPARE_ONLY  set to stop after binarising (steps 1-3)
# Extra arguments to this script are passed on to fairseq-train.
#
# Steps: sacremoses tokenisation -> subword-nmt joint BPE -> fairseq-preprocess
# --joined-dictionary -> fairseq-train --user-dir fairseq_distattn -> fairseq-generate
# (beam 5) on test_2016_flickr -> Moses detokenisation -> sacreBLEU against the raw
# references.
#
# Reruns skip finished steps: data preparation is reused, and fairseq-train resumes
# from <WORK>/<MECH>/checkpoints/checkpoint_last.pt (it stops at once if UPDATES were
# already done). Delete <WORK> (or <WORK>/<MECH>) to start over.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MECH="${MECH:-window}"
UPDATES="${UPDATES:-300}"
MERGES="${MERGES:-6000}"
MAX_TOKENS="${MAX_TOKENS:-2048}"
WORK="${WORK:-work/quickstart}"
DATA="${DATA:-data/multi30k}"
SRC=en
TGT=de

start=$(date +%s)
log() { echo "[quickstart $(( $(date +%s) - start ))s] $*"; }

# --- environment -------------------------------------------------------------
# The Makefile creates .venv and installs the package (idempotent, a no-op when done).
if [ ! -f .venv/.installed ] && command -v make >/dev/null 2>&1; then
    make --no-print-directory install
fi
if [ ! -f .venv/bin/activate ]; then
    echo "quickstart: .venv is missing; run 'make quickstart' (or create .venv and" \
         "PIP_CONSTRAINT=constraints.txt pip install -e .)" >&2
    exit 1
fi
# shellcheck disable=SC1091
source .venv/bin/activate
# fairseq picks the device itself: no GPU here, so it trains on CPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc 2>/dev/null || echo 2)}"

case "$MECH" in
    window)
        ATTN_DEFAULT="--encoder-self-attention window-aw@0-2 --decoder-self-attention window-mw@0-2 --cross-attention window-aw-seg@0-2" ;;
    vanilla)
        ATTN_DEFAULT="" ;;
    *)
        # the mechanisms MECH may name come from the registry, so a new one is offered without an edit here
        SELF_MECHANISMS="$(python -m fairseq_distattn.docs --accepted-by encoder-self decoder-self | grep -vx vanilla)"
        if grep -qxF -e "$MECH" <<< "$SELF_MECHANISMS"; then
            ATTN_DEFAULT="--encoder-self-attention $MECH --decoder-self-attention $MECH"
        elif [ -n "${ATTN_ARGS:-}" ]; then
            ATTN_DEFAULT=""
        else
            echo "quickstart: unknown MECH=$MECH (use window, vanilla, one of" \
                 "$(echo $SELF_MECHANISMS | sed 's/ /, /g'), or set ATTN_ARGS)" >&2
            exit 2
        fi ;;
esac
ATTN="${ATTN_ARGS-$ATTN_DEFAULT}"

mkdir -p "$WORK"
PREP="$WORK/prep"
BIN="$WORK/data-bin"
RUN="$WORK/$MECH"
mkdir -p "$PREP" "$RUN"

# --- 1. tokenise (sacremoses) ---------------------------------------------------
read_text() {  # read_text NAME.LANG -> raw text on stdout, from NAME.LANG or NAME.LANG.gz
    if [ -f "$DATA/$1" ]; then cat "$DATA/$1"
    elif [ -f "$DATA/$1.gz" ]; then gzip -dc "$DATA/$1.gz"
    else echo "quickstart: missing $DATA/$1(.gz)" >&2; return 1
    fi
}

TOKENISE_PY='
import sys
from sacremoses import MosesTokenizer
tok = MosesTokenizer(lang=sys.argv[1])
out = sys.stdout
for line in sys.stdin:
    out.write(tok.tokenize(line.strip(), escape=False, return_str=True) + "\n")
'
for split in train val test; do
    name=$split
    [ "$split" = test ] && name=test_2016_flickr
    for lang in $SRC $TGT; do
        if [ ! -s "$PREP/$split.tok.$lang" ]; then
            log "tokenising $name.$lang"
            read_text "$name.$lang" > "$PREP/$split.raw.$lang"
            python -c "$TOKENISE_PY" "$lang" < "$PREP/$split.raw.$lang" > "$PREP/$split.tok.$lang.tmp"
            mv "$PREP/$split.tok.$lang.tmp" "$PREP/$split.tok.$lang"
        fi
    done
done

# --- 2. joint BPE (subword-nmt) -------------------------------------------------
if [ ! -s "$PREP/codes.$MERGES" ]; then
    log "learning joint BPE, $MERGES merges"
    cat "$PREP/train.tok.$SRC" "$PREP/train.tok.$TGT" \
        | subword-nmt learn-bpe -s "$MERGES" > "$PREP/codes.$MERGES.tmp" 2> "$PREP/learn-bpe.log"
    mv "$PREP/codes.$MERGES.tmp" "$PREP/codes.$MERGES"
    rm -f "$PREP"/*.bpe.* "$BIN/.done"
fi
for split in train val test; do
    for lang in $SRC $TGT; do
        if [ ! -s "$PREP/$split.bpe.$lang" ]; then
            log "applying BPE to $split.$lang"
            subword-nmt apply-bpe -c "$PREP/codes.$MERGES" \
                < "$PREP/$split.tok.$lang" > "$PREP/$split.bpe.$lang.tmp"
            mv "$PREP/$split.bpe.$lang.tmp" "$PREP/$split.bpe.$lang"
        fi
    done
done

# --- 3. binarise (fairseq-preprocess) --------------------------------------------
if [ ! -f "$BIN/.done" ]; then
    log "binarising into $BIN"
    rm -rf "$BIN"
    fairseq-preprocess --source-lang $SRC --target-lang $TGT \
        --trainpref "$PREP/train.bpe" --validpref "$PREP/val.bpe" --testpref "$PREP/test.bpe" \
        --destdir "$BIN" --joined-dictionary --workers 2 > "$WORK/preprocess.log" 2>&1 \
        || { tail -20 "$WORK/preprocess.log" >&2; exit 1; }
    touch "$BIN/.done"
fi
if [ -n "${PREPARE_ONLY:-}" ]; then  # benchmarks/quality/mt.py prepares its data this way
    log "prepared $PREP and $BIN (PREPARE_ONLY: no training)"
    exit 0
fi

# --- 4. train (fairseq-train) -----------------------------------------------------
log "training MECH=$MECH for $UPDATES updates (attention flags: ${ATTN:-none}); log: $RUN/train.log"
WARMUP=$(( UPDATES < 800 ? UPDATES / 4 : 200 ))
[ "$WARMUP" -ge 1 ] || WARMUP=1
set +e
# shellcheck disable=SC2086
fairseq-train "$BIN" \
    --user-dir fairseq_distattn \
    --task translation --source-lang $SRC --target-lang $TGT \
    --arch distattn_transformer_iwslt_de_en \
    --encoder-embed-dim 256 --decoder-embed-dim 256 \
    --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
    --encoder-layers 3 --decoder-layers 3 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 \
    --share-all-embeddings --dropout 0.1 \
    $ATTN \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
    --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-7 \
    --max-tokens "$MAX_TOKENS" --max-update "$UPDATES" \
    --save-dir "$RUN/checkpoints" --no-epoch-checkpoints \
    --seed 1 --num-workers 0 \
    --log-format simple --log-interval 25 \
    "$@" 2>&1 | tee "$RUN/train.log" \
    | grep -E --line-buffered '\| (train_inner|train|valid) \||Loaded checkpoint|done training|Error|error:'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] || [ ! -f "$RUN/checkpoints/checkpoint_best.pt" ]; then
    echo "quickstart: fairseq-train failed (exit $rc); last lines of $RUN/train.log:" >&2
    tail -30 "$RUN/train.log" >&2
    exit 1
fi

# --- 5. translate the test set (fairseq-generate) ---------------------------------
log "translating test_2016_flickr (beam 5); output: $RUN/generate-test.txt"
fairseq-generate "$BIN" \
    --user-dir fairseq_distattn \
    --task translation --source-lang $SRC --target-lang $TGT \
    --path "$RUN/checkpoints/checkpoint_best.pt" \
    --gen-subset test --beam 5 --remove-bpe \
    --batch-size 64 --required-batch-size-multiple 1 \
    --num-workers 0 > "$RUN/generate-test.txt" 2> "$RUN/generate.log" \
    || { tail -30 "$RUN/generate.log" >&2; exit 1; }

# --- 6. score: tokenised BLEU with compound splitting and detokenised sacreBLEU -----
# scripts/evaluate.py also checks that every test sentence was translated.
log "MECH=$MECH UPDATES=$UPDATES: BLEU on Multi30k test_2016_flickr en-de"
python scripts/evaluate.py score "$RUN/generate-test.txt" \
    --source-lang $SRC --target-lang $TGT --segmentation subword_nmt \
    --src-raw "$PREP/test.raw.$SRC" --ref-raw "$PREP/test.raw.$TGT" --ref-tok "$PREP/test.tok.$TGT" \
    --output-dir "$RUN/eval"

# --- 7. one sentence through the Python hub API ----------------------------------
python - "$RUN/checkpoints" "$BIN" "$PREP/codes.$MERGES" <<'PY' 2> "$RUN/hub.log"
import os
import sys

from fairseq_distattn.models.distattn_transformer import DistAttnTransformerModel

checkpoints, data_bin, codes = (os.path.abspath(path) for path in sys.argv[1:4])
model = DistAttnTransformerModel.from_pretrained(
    checkpoints, checkpoint_file="checkpoint_best.pt", data_name_or_path=data_bin,
    tokenizer="moses", bpe="subword_nmt", bpe_codes=codes, source_lang="en", target_lang="de",
)
model.eval()
sentence = "A man in a blue shirt is riding a bicycle down the street."
print(f"hub API: {sentence!r} -> {model.translate(sentence, beam=5)!r}")
PY
log "done (hypotheses and scores: $RUN/eval)"
