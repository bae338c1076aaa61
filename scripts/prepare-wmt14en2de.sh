#!/usr/bin/env bash
# WMT14 English->German for fairseq, as in fairseq's examples/translation recipe
# (prepare-wmt14en2de.sh --icml17: Europarl v7 + Common Crawl + News Commentary v9,
# about 4.5M pairs), with newstest2013 as dev and newstest2014 as test, Moses
# tokenisation through sacremoses (no Perl Moses checkout), cleaning as
# clean-corpus-n.perl -ratio 1.5 (1-250 tokens), 32k joint BPE merges (subword-nmt;
# --spm for sentencepiece) and fairseq-preprocess --joined-dictionary.
#
#   bash scripts/prepare-wmt14en2de.sh --out work/wmt14_en_de
#   bash scripts/prepare-wmt14en2de.sh --raw-dir ~/archives   # archives you already have
#   bash scripts/prepare-wmt14en2de.sh --test filtered        # 2737-sentence newstest2014
#   bash scripts/prepare-wmt14en2de.sh --help
#
# See examples/wmt14/README.md for the training and evaluation commands.
PREP_NAME=prepare-wmt14en2de
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/wmt14.sh
source "$LIB_DIR/wmt14.sh"

SRC=en
TGT=de
TEST_PAIR=deen
DEFAULT_OUT=work/wmt14_en_de
DEFAULT_BPE_TOKENS=32000

TRAIN_ARCHIVES=(
    "training-parallel-europarl-v7.tgz|http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "training-parallel-commoncrawl.tgz|http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "training-parallel-nc-v9.tgz|http://statmt.org/wmt14/training-parallel-nc-v9.tgz"
)
TRAIN_CORPORA=(
    "training-parallel-europarl-v7.tgz|training/europarl-v7.de-en"
    "training-parallel-commoncrawl.tgz|commoncrawl.de-en"
    "training-parallel-nc-v9.tgz|training/news-commentary-v9.de-en"
)

# Published checksums. sha256 and sizes: TensorFlow Datasets' url_checksums
# (wmt14_translate.txt); md5: sacreBLEU's dataset table (wmt14/full, wmt14).
# dev.tgz has no published checksum: it is reported (sha256) but not verified unless a
# --checksums file pins it.
CHECKSUM["training-parallel-europarl-v7.tgz"]=sha256:0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7
SIZE["training-parallel-europarl-v7.tgz"]=657632379
CHECKSUM["training-parallel-commoncrawl.tgz"]=sha256:c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5
SIZE["training-parallel-commoncrawl.tgz"]=918311367
CHECKSUM["training-parallel-nc-v9.tgz"]=sha256:cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485
SIZE["training-parallel-nc-v9.tgz"]=80418416
CHECKSUM["test-full.tgz"]=md5:a8cd784e006feb32ac6f3d9ec7eb389a
CHECKSUM["test-filtered.tgz"]=md5:84c597844c1542e29c2aff23aaee4310

wmt14_main "$@"
