# Shared shell helpers for scripts/prepare-*.sh. Source it after setting PREP_NAME:
#
#   PREP_NAME=prepare-wmt14en2de
#   source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
#
# What it gives a prepare script:
#   - strict mode (set -Eeuo pipefail) and an EXIT trap that names the step that
#     failed (or was interrupted) and says that rerunning resumes;
#   - steps with stamp files: `if step_begin NAME KEY; then ...; step_end; fi` runs the
#     body only when NAME has no stamp for the same KEY (a string of the settings the
#     step depends on); once one step runs, every later step runs too;
#   - archive fetching: an archive in --raw-dir is used in place, otherwise it is
#     downloaded (resumably) from its URL or from --mirror; every archive is checked
#     against its size and checksum when one is known (built-in table, overridable
#     with a checksums file);
#   - python/tool lookup in the project's virtualenv.
#
# Test hooks (environment):
#   DISTATTN_PREP_FAIL_AT=STEP   fail at the end of STEP (after its work, before its
#                                stamp), to test resuming after a failure.

set -Eeuo pipefail

PREP_START=$(date +%s)
CURRENT_STEP="start-up"
LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$LIB_DIR/../.." && pwd)"

log() { printf '[%s %4ss] %s\n' "$PREP_NAME" "$(( $(date +%s) - PREP_START ))" "$*" >&2; }
warn() { printf '%s: warning: %s\n' "$PREP_NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PREP_NAME" "$*" >&2; exit 1; }

_on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        printf '%s: FAILED in step "%s" (exit status %s).\n' "$PREP_NAME" "$CURRENT_STEP" "$rc" >&2
        if [ -n "${OUT_DIR:-}" ]; then
            printf '%s: finished steps are kept (stamps in %s/.stamps); rerun the same command to resume.\n' \
                "$PREP_NAME" "$OUT_DIR" >&2
        fi
    fi
}
_on_signal() {
    printf '\n%s: interrupted (%s) in step "%s".\n' "$PREP_NAME" "$1" "$CURRENT_STEP" >&2
    trap - INT TERM
    exit "$2"
}
trap _on_exit EXIT
trap '_on_signal SIGINT 130' INT
trap '_on_signal SIGTERM 143' TERM

# --------------------------------------------------------------------------- tools

# PYTHON: explicit, else the project's .venv, else python3 on PATH.
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO_ROOT/.venv/bin/python" ]; then
        PYTHON="$REPO_ROOT/.venv/bin/python"
    else
        PYTHON="$(command -v python3 || true)"
    fi
fi
[ -n "$PYTHON" ] || die "no python3 found (set PYTHON, or run 'make install' for .venv)"
# The CLIs of the same environment (do not resolve symlinks: .venv/bin/python links
# to the base interpreter).
PY_BIN_DIR="$(dirname "$PYTHON")"

tool() {  # tool NAME -> path of a console script next to $PYTHON, else on PATH
    if [ -x "$PY_BIN_DIR/$1" ]; then
        printf '%s\n' "$PY_BIN_DIR/$1"
    elif command -v "$1" >/dev/null 2>&1; then
        command -v "$1"
    else
        die "$1 not found next to $PYTHON nor on PATH (install the project: make install)"
    fi
}

preplib() { "$PYTHON" "$LIB_DIR/preplib.py" "$@"; }

default_workers() { nproc 2>/dev/null || echo 2; }

# --------------------------------------------------------------------------- options
# The options every prepare script takes, each also an environment variable:
# --out, --raw-dir, --workers, --checksums, --mirror, --offline, --force.

common_option_defaults() {  # common_option_defaults DEFAULT_OUT_DIR
    OUT_DIR="${OUT_DIR:-$1}"
    RAW_DIR="${RAW_DIR:-}"
    WORKERS="${WORKERS:-$(default_workers)}"
    CHECKSUMS_FILE="${CHECKSUMS_FILE:-}"
    MIRROR="${MIRROR:-}"
    OFFLINE="${OFFLINE:-0}"
    FORCE="${FORCE:-0}"
}

# common_option "$@": takes the first word if it is a shared option and sets
# OPTION_WORDS to the number of words it used (0: not a shared option)
common_option() {
    OPTION_WORDS=2
    case "$1" in
        --out) OUT_DIR="$2" ;;
        --raw-dir) RAW_DIR="$2" ;;
        --workers) WORKERS="$2" ;;
        --checksums) CHECKSUMS_FILE="$2" ;;
        --mirror) MIRROR="$2" ;;
        --offline) OFFLINE=1; OPTION_WORDS=1 ;;
        --force) FORCE=1; OPTION_WORDS=1 ;;
        *) OPTION_WORDS=0 ;;
    esac
}

# validates the shared options, loads --checksums, creates OUT_DIR; paths become absolute
check_common_options() {
    [[ "$WORKERS" =~ ^[0-9]+$ ]] && [ "$WORKERS" -ge 1 ] || die "--workers must be >= 1"
    if [ -n "$RAW_DIR" ]; then
        [ -d "$RAW_DIR" ] || die "--raw-dir $RAW_DIR is not a directory"
        RAW_DIR="$(cd "$RAW_DIR" && pwd)"
    fi
    [ -z "$CHECKSUMS_FILE" ] || load_checksums_file "$CHECKSUMS_FILE"
    mkdir -p "$OUT_DIR"
    OUT_DIR="$(cd "$OUT_DIR" && pwd)"
}

# --------------------------------------------------------------------------- steps

STEPS_RUN_ALL=0   # set to 1 once any step ran: later steps must run too

step_begin() {  # step_begin NAME [KEY] -> 0: run the step, 1: it is done, skip it
    local name="$1" key="${2:-}"
    local stamp="$OUT_DIR/.stamps/$name.done"
    CURRENT_STEP="$name"
    if [ "${FORCE:-0}" != 1 ] && [ "$STEPS_RUN_ALL" = 0 ] && [ -f "$stamp" ] \
        && [ "$(cat "$stamp")" = "$key" ]; then
        log "skip $name (done)"
        return 1
    fi
    STEPS_RUN_ALL=1
    rm -f "$stamp"
    CURRENT_KEY="$key"
    log "step $name"
    return 0
}

step_end() {  # mark CURRENT_STEP done (atomically)
    local stamp="$OUT_DIR/.stamps/$CURRENT_STEP.done"
    if [ "${DISTATTN_PREP_FAIL_AT:-}" = "$CURRENT_STEP" ]; then
        echo "$PREP_NAME: injected failure at the end of step $CURRENT_STEP (DISTATTN_PREP_FAIL_AT)" >&2
        exit 1
    fi
    mkdir -p "$OUT_DIR/.stamps"
    printf '%s' "$CURRENT_KEY" > "$stamp.tmp"
    mv -f "$stamp.tmp" "$stamp"
}

file_key() {  # file_key PATH -> "path size mtime" (changes when the file does)
    stat -L -c '%n %s %Y' "$1"
}

# --------------------------------------------------------------------------- checksums

# Built-in checksums: a prepare script fills CHECKSUM[archive]="ALGO:HEX" and
# SIZE[archive]=BYTES for the archives it knows. A checksums file (--checksums FILE,
# or CHECKSUMS_FILE) adds or overrides entries; its lines are `HEX  NAME` (sha256sum
# or md5sum output; the algorithm follows from the length) or `ALGO:HEX  NAME`.
declare -A CHECKSUM=()
declare -A SIZE=()

load_checksums_file() {
    local file="$1" sum name
    [ -f "$file" ] || die "checksums file $file not found"
    while read -r sum name; do
        case "$sum" in ''|'#'*) continue ;; esac
        name="${name#\*}"           # sha256sum's binary-mode marker
        name="$(basename "$name")"
        CHECKSUM[$name]="$sum"
        unset "SIZE[$name]"         # a user-provided checksum replaces the built-in size too
    done < "$file"
}

verify_archive() {  # verify_archive PATH NAME
    local path="$1" name="$2"
    local expect="${CHECKSUM[$name]:-}" size="${SIZE[$name]:-}"
    if [ -z "$expect" ]; then
        local sum
        sum="$(preplib sha256 "$path")"
        warn "no published checksum for $name: not verified (its sha256 is $sum; put" \
             "'$sum  $name' in a checksums file to pin it)"
        local record="$OUT_DIR/unverified-archives.sha256"
        { grep -v "  $name\$" "$record" 2>/dev/null || true; printf '%s  %s\n' "$sum" "$name"; } > "$record.tmp"
        mv -f "$record.tmp" "$record"
        return 0
    fi
    local args=(--expect "$expect")
    [ -n "$size" ] && args+=(--size "$size")
    preplib verify "$path" "${args[@]}"
}

# --------------------------------------------------------------------------- archives

# fetch_archive NAME URL -> sets ARCHIVE to a verified local copy of NAME.
# Looks in RAW_DIR first (used in place), then in $OUT_DIR/downloads, else downloads
# from MIRROR/NAME (when MIRROR is set) or URL. A downloaded archive that fails
# verification is renamed NAME.bad so that a rerun downloads it again.
fetch_archive() {
    local name="$1" url="$2"
    local downloads="$OUT_DIR/downloads"
    local source=""
    if [ -n "${RAW_DIR:-}" ] && [ -f "$RAW_DIR/$name" ]; then
        ARCHIVE="$RAW_DIR/$name"
        source=raw
    elif [ -f "$downloads/$name" ]; then
        ARCHIVE="$downloads/$name"
        source=download
    else
        ARCHIVE=""
    fi
    if step_begin "fetch-$name" "${ARCHIVE:+$(file_key "$ARCHIVE")} ${CHECKSUM[$name]:-}"; then
        if [ -z "$ARCHIVE" ]; then
            [ "${OFFLINE:-0}" != 1 ] || die "$name is not in ${RAW_DIR:-the raw directory} and OFFLINE=1"
            local from="$url"
            [ -n "${MIRROR:-}" ] && from="${MIRROR%/}/$name"
            log "downloading $from"
            mkdir -p "$downloads"
            preplib download --retries "${DOWNLOAD_RETRIES:-3}" "$from" "$downloads/$name"
            ARCHIVE="$downloads/$name"
            source=download
        else
            log "using $ARCHIVE"
        fi
        if ! verify_archive "$ARCHIVE" "$name"; then
            if [ "$source" = download ]; then
                mv -f "$ARCHIVE" "$ARCHIVE.bad"
                die "$name failed verification (moved to $ARCHIVE.bad); rerun to download it again"
            fi
            die "$ARCHIVE failed verification: replace it with a good copy (or fix the checksums file)"
        fi
        # the stamp key names the file we verified, so a changed file is verified again
        CURRENT_KEY="$(file_key "$ARCHIVE") ${CHECKSUM[$name]:-}"
        step_end
    fi
}

# extract_members NAME ARCHIVE DESTDIR MEMBER... -> DESTDIR holds the members
# (globs allowed with a leading 'glob:').
extract_members() {
    local name="$1" archive="$2" dest="$3"
    shift 3
    local args=() m
    for m in "$@"; do
        case "$m" in
            glob:*) args+=(--glob "${m#glob:}") ;;
            *) args+=(--member "$m") ;;
        esac
    done
    if step_begin "extract-$name" "$(file_key "$archive") $*"; then
        log "extracting $# member(s) from $name"
        preplib extract "$archive" "$dest" "${args[@]}"
        step_end
    fi
}

# fetch_and_extract NAME URL DESTDIR MEMBER... -> fetch_archive + extract_members.
# When the archive is gone (e.g. downloads/ deleted to save space) but its members
# were extracted by an earlier run and nothing before this step changed, both steps
# are skipped instead of downloading the archive again.
fetch_and_extract() {
    local name="$1" url="$2" dest="$3"
    shift 3
    if [ "${FORCE:-0}" != 1 ] && [ "$STEPS_RUN_ALL" = 0 ] && [ -f "$OUT_DIR/.stamps/extract-$name.done" ] \
        && [ -d "$dest" ] && ! { [ -n "${RAW_DIR:-}" ] && [ -f "$RAW_DIR/$name" ]; } \
        && [ ! -f "$OUT_DIR/downloads/$name" ]; then
        CURRENT_STEP="extract-$name"
        log "skip fetch-$name, extract-$name (done; the archive itself is no longer here)"
        return 0
    fi
    fetch_archive "$name" "$url"
    extract_members "$name" "$ARCHIVE" "$dest" "$@"
}

# --------------------------------------------------------------------------- misc

lines_of() { preplib count-lines "$1" | cut -f1; }

same_lines() {  # same_lines A B: fail unless A and B have the same number of lines
    local a b
    a=$(lines_of "$1"); b=$(lines_of "$2")
    [ "$a" = "$b" ] || die "$1 has $a lines but $2 has $b"
}
