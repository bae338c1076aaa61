#!/usr/bin/env bash
# WMT14 English->French for fairseq, as in fairseq's examples/translation recipe
# (Europarl v7 + Common Crawl + UN + News Commentary v9 + the 10^9 French-English
# corpus (giga-fren), about 36M pairs before cleaning), with newstest2013 as dev and
# newstest2014 as test, Moses tokenisation through sacremoses (no Perl Moses
# checkout), cleaning as clean-corpus-n.perl -ratio 1.5 (1-250 tokens), 40k joint
# BPE merges (subword-nmt; --spm for sentencepiece) and fairseq-preprocess
# --joined-dictionary.
#
#   bash scripts/prepare-wmt14en2fr.sh --out work/wmt14_en_fr
#   bash scripts/prepare-wmt14en2fr.sh --raw-dir ~/archives   # archives you already have
#   bash scripts/prepare-wmt14en2fr.sh --help
#
# See examples/wmt14/README.md for the training and evaluation commands.
PREP_NAME=prepare-wmt14en2fr
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/wmt14.sh
source "$LIB_DIR/wmt14.sh"

SRC=en
TGT=fr
TEST_PAIR=fren
DEFAULT_OUT=work/wmt14_en_fr
DEFAULT_BPE_TOKENS=40000

TRAIN_ARCHIVES=(
    "training-parallel-europarl-v7.tgz|http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "training-parallel-commoncrawl.tgz|http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "training-parallel-un.tgz|http://statmt.org/wmt13/training-parallel-un.tgz"
    "training-parallel-nc-v9.tgz|http://statmt.org/wmt14/training-parallel-nc-v9.tgz"
    "training-giga-fren.tar|http://statmt.org/wmt10/training-giga-fren.tar"
)
TRAIN_CORPORA=(
    "training-parallel-europarl-v7.tgz|training/europarl-v7.fr-en"
    "training-parallel-commoncrawl.tgz|commoncrawl.fr-en"
    "training-parallel-un.tgz|un/undoc.2000.fr-en"
    "training-parallel-nc-v9.tgz|training/news-commentary-v9.fr-en"
    "training-giga-fren.tar|giga-fren.release2.fixed|.gz"
)

# Published checksums. sha256 and sizes: TensorFlow Datasets' url_checksums
# (wmt14_translate.txt; wmt13_translate.txt for the UN and giga-fren archives); md5:
# sacreBLEU's dataset table (wmt14/full, wmt14). dev.tgz has no published checksum:
# it is reported (sha256) but not verified unless a --checksums file pins it.
CHECKSUM["training-parallel-europarl-v7.tgz"]=sha256:0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7
SIZE["training-parallel-europarl-v7.tgz"]=657632379
CHECKSUM["training-parallel-commoncrawl.tgz"]=sha256:c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5
SIZE["training-parallel-commoncrawl.tgz"]=918311367
CHECKSUM["training-parallel-un.tgz"]=sha256:29141b5c1eba149a94f7a59d3b1a834b2e47fe0f8758d68dcd77a3d3f497ee47
SIZE["training-parallel-un.tgz"]=2365634246
CHECKSUM["training-parallel-nc-v9.tgz"]=sha256:cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485
SIZE["training-parallel-nc-v9.tgz"]=80418416
CHECKSUM["training-giga-fren.tar"]=sha256:3ff8319f6919393520559bfbc7ad6a747ec81b3abc7be9993b338d4b017b4d9a
SIZE["training-giga-fren.tar"]=2595102720
CHECKSUM["test-full.tgz"]=md5:a8cd784e006feb32ac6f3d9ec7eb389a
CHECKSUM["test-filtered.tgz"]=md5:84c597844c1542e29c2aff23aaee4310

wmt14_main "$@"
