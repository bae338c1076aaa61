# WMT14 preparation pipeline shared by prepare-wmt14en2de.sh and prepare-wmt14en2fr.sh.
# Sourced after common.sh; the caller sets:
#   SRC TGT                  language codes (en de / en fr)
#   DEFAULT_OUT              default output directory
#   DEFAULT_BPE_TOKENS       joint BPE merges (32000 En-De, 40000 En-Fr)
#   TRAIN_ARCHIVES           "NAME|URL" per training archive
#   TRAIN_CORPORA            "ARCHIVE-NAME|MEMBER-PREFIX" per corpus: the files are
#                            MEMBER-PREFIX.$SRC and MEMBER-PREFIX.$TGT (".gz" allowed
#                            as a suffix of the prefix: "giga-fren.release2.fixed|.gz")
#   TEST_PAIR                "deen" / "fren" (newstest2014-<pair>-{src,ref}.*.sgm)
# and fills CHECKSUM[...] / SIZE[...] for the archives it knows.

DEV_ARCHIVE="dev.tgz|http://statmt.org/wmt14/dev.tgz"
TEST_FULL_ARCHIVE="test-full.tgz|http://statmt.org/wmt14/test-full.tgz"
TEST_FILTERED_ARCHIVE="test-filtered.tgz|http://statmt.org/wmt14/test-filtered.tgz"

wmt14_usage() {
    cat <<EOF
Usage: bash scripts/$PREP_NAME.sh [options]

Prepares WMT14 ${SRC^^}-${TGT^^} for fairseq: downloads (or takes from --raw-dir) the
training corpora, newstest2013 (dev) and newstest2014 (test); normalises and
tokenises with sacremoses (Moses tokenizer -a); learns joint BPE (subword-nmt, or
sentencepiece with --spm); cleans the training pairs (ratio 1.5, 1-250 tokens, as
fairseq's recipe); binarises with fairseq-preprocess --joined-dictionary.

Options (each also an environment variable):
  --out DIR            output directory (OUT_DIR; default $DEFAULT_OUT)
  --raw-dir DIR        directory holding archives you already have, under their
                       upstream names (RAW_DIR); missing ones are downloaded
  --test full|filtered newstest2014: the full 3003-sentence set (default) or the
                       filtered set (2737 sentences for En-De) (TEST_SET)
  --bpe-tokens N       BPE merges, or sentencepiece vocabulary size with --spm
                       (BPE_TOKENS; default $DEFAULT_BPE_TOKENS)
  --spm unigram|bpe    sentencepiece model instead of subword-nmt BPE (SPM_TYPE)
  --workers N          parallel processes (WORKERS; default: all cores)
  --checksums FILE     extra/overriding checksums, lines "HEX  ARCHIVE-NAME"
                       (CHECKSUMS_FILE)
  --mirror URL         download ARCHIVE-NAME from URL/ARCHIVE-NAME instead (MIRROR)
  --offline            never download; fail if an archive is missing (OFFLINE=1)
  --force              redo every step (FORCE=1)
  -h, --help           this help

Outputs in the output directory: data-bin/ (fairseq-preprocess), ref/ (raw and
tokenised references for scripts/evaluate.py), prep.json (settings), text/ (all
intermediate text), .stamps/ (finished steps). Rerunning skips finished steps; a
killed or failed run resumes where it stopped.
EOF
}

wmt14_parse_args() {
    common_option_defaults "$DEFAULT_OUT"
    TEST_SET="${TEST_SET:-full}"
    BPE_TOKENS="${BPE_TOKENS:-$DEFAULT_BPE_TOKENS}"
    SPM_TYPE="${SPM_TYPE:-}"
    while [ $# -gt 0 ]; do
        common_option "$@"
        if [ "$OPTION_WORDS" -gt 0 ]; then shift "$OPTION_WORDS"; continue; fi
        case "$1" in
            --test) TEST_SET="$2"; shift 2 ;;
            --bpe-tokens) BPE_TOKENS="$2"; shift 2 ;;
            --spm) SPM_TYPE="$2"; shift 2 ;;
            -h|--help) wmt14_usage; exit 0 ;;
            *) wmt14_usage >&2; die "unknown option $1" ;;
        esac
    done
    case "$TEST_SET" in full|filtered) ;; *) die "--test must be full or filtered, not '$TEST_SET'" ;; esac
    case "$SPM_TYPE" in ''|unigram|bpe) ;; *) die "--spm must be unigram or bpe, not '$SPM_TYPE'" ;; esac
    [[ "$BPE_TOKENS" =~ ^[0-9]+$ ]] || die "--bpe-tokens must be a number, not '$BPE_TOKENS'"
    check_common_options
}

# the file that holds MEMBER-PREFIX.LANG[.gz] inside the extracted archive directory
_corpus_file() {  # _corpus_file ARCHIVE-NAME MEMBER LANG
    local prefix="$2" suffix=""
    case "$prefix" in *'|.gz') prefix="${prefix%|.gz}"; suffix=".gz" ;; esac
    printf '%s/orig/%s/%s.%s%s\n' "$OUT_DIR" "${1%%.t*}" "$prefix" "$3" "$suffix"
}

# newstest2013 from dev.tgz: plain text dev/newstest2013.LANG when present, else the
# SGML dev/newstest2013-{src,ref}.LANG.sgm
_dev_text() {  # _dev_text LANG OUTPUT
    local dir="$OUT_DIR/orig/dev" lang="$1" out="$2" f
    if [ -f "$dir/dev/newstest2013.$lang" ]; then
        cp "$dir/dev/newstest2013.$lang" "$out.tmp" && mv -f "$out.tmp" "$out"
        return
    fi
    for f in "$dir/dev/newstest2013-src.$lang.sgm" "$dir/dev/newstest2013-ref.$lang.sgm"; do
        if [ -f "$f" ]; then
            preplib sgm2txt "$f" "$out"
            return
        fi
    done
    die "dev.tgz has neither dev/newstest2013.$lang nor dev/newstest2013-{src,ref}.$lang.sgm"
}

wmt14_main() {
    wmt14_parse_args "$@"
    local text="$OUT_DIR/text" ref="$OUT_DIR/ref" bin="$OUT_DIR/data-bin"
    mkdir -p "$text" "$ref" "$OUT_DIR/logs"
    local seg="subword-nmt"
    [ -n "$SPM_TYPE" ] && seg="sentencepiece-$SPM_TYPE"
    log "output: $OUT_DIR; test set: newstest2014 $TEST_SET; segmentation: $seg ($BPE_TOKENS);" \
        "workers: $WORKERS${RAW_DIR:+; raw archives: $RAW_DIR}"

    # ---- 1. fetch + verify, 2. extract ------------------------------------------
    local entry name url corpus archive_name member
    local test_entry="$TEST_FULL_ARCHIVE" test_dir="test-full"
    if [ "$TEST_SET" = filtered ]; then
        test_entry="$TEST_FILTERED_ARCHIVE"
        test_dir="test"
    fi
    for entry in "${TRAIN_ARCHIVES[@]}" "$DEV_ARCHIVE" "$test_entry"; do
        name="${entry%%|*}"; url="${entry#*|}"
        local members=()
        case "$name" in
            dev.tgz) members=("glob:dev/newstest2013*") ;;
            test-full.tgz|test-filtered.tgz)
                members=("$test_dir/newstest2014-$TEST_PAIR-src.$SRC.sgm"
                         "$test_dir/newstest2014-$TEST_PAIR-ref.$TGT.sgm") ;;
            *)
                for corpus in "${TRAIN_CORPORA[@]}"; do
                    archive_name="${corpus%%|*}"; member="${corpus#*|}"
                    [ "$archive_name" = "$name" ] || continue
                    local suffix=""
                    case "$member" in *'|.gz') member="${member%|.gz}"; suffix=".gz" ;; esac
                    members+=("$member.$SRC$suffix" "$member.$TGT$suffix")
                done ;;
        esac
        fetch_and_extract "$name" "$url" "$OUT_DIR/orig/${name%%.t*}" "${members[@]}"
    done

    # ---- 3. assemble raw train / valid / test text ------------------------------
    if step_begin corpus "test=$TEST_SET"; then
        local pairs=()
        for corpus in "${TRAIN_CORPORA[@]}"; do
            archive_name="${corpus%%|*}"; member="${corpus#*|}"
            pairs+=(--pair "$(_corpus_file "$archive_name" "$member" "$SRC")" \
                           "$(_corpus_file "$archive_name" "$member" "$TGT")")
        done
        preplib concat-parallel "${pairs[@]}" --src-out "$text/train.raw.$SRC" --tgt-out "$text/train.raw.$TGT"
        _dev_text "$SRC" "$text/valid.raw.$SRC"
        _dev_text "$TGT" "$text/valid.raw.$TGT"
        same_lines "$text/valid.raw.$SRC" "$text/valid.raw.$TGT"
        local tdir="$OUT_DIR/orig/${test_entry%%.t*}/$test_dir"
        preplib sgm2txt "$tdir/newstest2014-$TEST_PAIR-src.$SRC.sgm" "$text/test.raw.$SRC"
        preplib sgm2txt "$tdir/newstest2014-$TEST_PAIR-ref.$TGT.sgm" "$text/test.raw.$TGT"
        same_lines "$text/test.raw.$SRC" "$text/test.raw.$TGT"
        log "train: $(lines_of "$text/train.raw.$SRC") pairs; valid (newstest2013):" \
            "$(lines_of "$text/valid.raw.$SRC"); test (newstest2014 $TEST_SET): $(lines_of "$text/test.raw.$SRC")"
        step_end
    fi

    # ---- 4. normalise ----------------------------------------------------------
    # train: normalize-punctuation.perl + remove-non-printing-char.perl (fairseq's
    # recipe); dev/test: the recipe's ’ -> ' and the removal of non-printing characters.
    local split lang
    if step_begin normalise "v1"; then
        for lang in "$SRC" "$TGT"; do
            preplib normalise --lang "$lang" --punct --workers "$WORKERS" \
                "$text/train.raw.$lang" "$text/train.norm.$lang"
            preplib normalise --lang "$lang" --apostrophe --workers 1 \
                "$text/valid.raw.$lang" "$text/valid.norm.$lang" "$text/test.raw.$lang" "$text/test.norm.$lang"
        done
        step_end
    fi

    # ---- 5. tokenise (Moses tokenizer.perl -a, escaping on) --------------------
    # sentencepiece works on the untokenised text: only dev/test are tokenised then,
    # for the tokenised references of scripts/evaluate.py.
    local tok_splits=(train valid test)
    [ -n "$SPM_TYPE" ] && tok_splits=(valid test)
    if step_begin tokenise "${tok_splits[*]}"; then
        for lang in "$SRC" "$TGT"; do
            local files=()
            for split in "${tok_splits[@]}"; do
                files+=("$text/$split.norm.$lang" "$text/$split.tok.$lang")
            done
            preplib tokenise --lang "$lang" --workers "$WORKERS" "${files[@]}"
        done
        step_end
    fi

    # ---- 6. learn the joint subword model --------------------------------------
    if [ -z "$SPM_TYPE" ]; then
        if step_begin learn-bpe "subword-nmt $BPE_TOKENS"; then
            log "learning $BPE_TOKENS joint BPE merges (subword-nmt learn-bpe; hours on the full corpus)"
            local subword_nmt
            subword_nmt="$(tool subword-nmt)"
            cat "$text/train.tok.$SRC" "$text/train.tok.$TGT" > "$text/train.tok.joint.tmp"
            "$subword_nmt" learn-bpe -s "$BPE_TOKENS" --num-workers "$WORKERS" \
                -i "$text/train.tok.joint.tmp" -o "$OUT_DIR/code.tmp"
            rm -f "$text/train.tok.joint.tmp"
            mv -f "$OUT_DIR/code.tmp" "$OUT_DIR/code"
            step_end
        fi
    else
        if step_begin learn-spm "$SPM_TYPE $BPE_TOKENS"; then
            log "training a sentencepiece $SPM_TYPE model, vocabulary $BPE_TOKENS"
            preplib spm-train --model-prefix "$OUT_DIR/spm" --vocab-size "$BPE_TOKENS" \
                --model-type "$SPM_TYPE" --workers "$WORKERS" \
                "$text/train.norm.$SRC" "$text/train.norm.$TGT"
            step_end
        fi
    fi

    # ---- 7. apply it -------------------------------------------------------------
    if step_begin apply-bpe "$seg $BPE_TOKENS"; then
        for split in train valid test; do
            for lang in "$SRC" "$TGT"; do
                if [ -z "$SPM_TYPE" ]; then
                    preplib apply-bpe --codes "$OUT_DIR/code" --workers "$WORKERS" \
                        "$text/$split.tok.$lang" "$text/$split.bpe.$lang"
                else
                    preplib spm-encode --model "$OUT_DIR/spm.model" \
                        "$text/$split.norm.$lang" "$text/$split.bpe.$lang"
                fi
            done
            same_lines "$text/$split.bpe.$SRC" "$text/$split.bpe.$TGT"
        done
        step_end
    fi

    # ---- 8. clean the training pairs (clean-corpus-n.perl -ratio 1.5 ... 1 250) ----
    if step_begin clean "ratio=1.5 min=1 max=250"; then
        preplib clean --ratio 1.5 "$text/train.bpe" "$SRC" "$TGT" "$text/train.clean" 1 250
        step_end
    fi

    # ---- 9. binarise -------------------------------------------------------------
    if step_begin binarise "joined"; then
        local preprocess
        preprocess="$(tool fairseq-preprocess)"
        rm -rf "$bin.tmp"
        log "fairseq-preprocess --joined-dictionary (log: $OUT_DIR/logs/preprocess.log)"
        if ! "$preprocess" --source-lang "$SRC" --target-lang "$TGT" \
            --trainpref "$text/train.clean" --validpref "$text/valid.bpe" --testpref "$text/test.bpe" \
            --destdir "$bin.tmp" --joined-dictionary --workers "$WORKERS" 2>&1 \
            | tee "$OUT_DIR/logs/preprocess.log" | { grep --line-buffered -E 'tokens|Wrote' >&2 || true; }; then
            tail -n 20 "$OUT_DIR/logs/preprocess.log" >&2
            die "fairseq-preprocess failed (log: $OUT_DIR/logs/preprocess.log)"
        fi
        rm -rf "$bin"
        mv "$bin.tmp" "$bin"
        step_end
    fi

    # ---- 10. references + settings for scripts/evaluate.py ----------------------------
    if step_begin finish "v1"; then
        for split in valid test; do
            cp "$text/$split.raw.$SRC" "$ref/$split.raw.$SRC"
            cp "$text/$split.raw.$TGT" "$ref/$split.raw.$TGT"
            cp "$text/$split.tok.$TGT" "$ref/$split.tok.$TGT"
        done
        local segmentation="subword_nmt" spm_model="" bpe_codes="$OUT_DIR/code"
        if [ -n "$SPM_TYPE" ]; then
            segmentation="sentencepiece"
            spm_model="$OUT_DIR/spm.model"
            bpe_codes=""
        fi
        cat > "$OUT_DIR/prep.json.tmp" <<EOF
{
  "recipe": "$PREP_NAME",
  "source_lang": "$SRC",
  "target_lang": "$TGT",
  "test_set": "newstest2014-$TEST_SET",
  "valid_set": "newstest2013",
  "segmentation": "$segmentation",
  "subword_size": $BPE_TOKENS,
  "bpe_codes": "$bpe_codes",
  "spm_model": "$spm_model",
  "tokenizer": "sacremoses MosesTokenizer(lang), aggressive_dash_splits=True, escape=True",
  "data_bin": "$bin",
  "ref_dir": "$ref"
}
EOF
        mv -f "$OUT_DIR/prep.json.tmp" "$OUT_DIR/prep.json"
        step_end
    fi
    CURRENT_STEP="done"
    log "done: fairseq data in $bin ($(lines_of "$text/train.clean.$SRC") training pairs after cleaning);" \
        "references in $ref"
}
