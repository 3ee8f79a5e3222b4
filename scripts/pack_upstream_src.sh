#!/bin/bash
# Write upstream_src.tar.xz: the SGLang kernel files that `python -m bench kernel --upstream-src`
# loads by path (sglang/_version.py, sglang/kernels/ops/attention/verify_splitkv.py and verify_mla.py)
# plus MANIFEST (their sha256 and where they came from), taken from an installed SGLang (default:
# .venv23's, 0.5.23). A few tens of KB; scripts/pack_bundle.sh adds it to the carried bundle.
# Usage: bash scripts/pack_upstream_src.sh [SITE_SGLANG_DIR]   (env OUTD, default ./.device-bundle)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=${1:-$(ls -d "$ROOT"/.venv23/lib/python3*/site-packages/sglang 2>/dev/null | head -1)}
OUTD=${OUTD:-$ROOT/.device-bundle}
FILES="sglang/_version.py sglang/kernels/ops/attention/verify_splitkv.py sglang/kernels/ops/attention/verify_mla.py"
[ -n "$SRC" ] && [ -d "$SRC/kernels/ops/attention" ] || { echo "pack_upstream_src.sh: no sglang package at '${SRC}' (give its folder)" >&2; exit 2; }
BASE=$(dirname "$SRC")
for f in $FILES; do [ -f "$BASE/$f" ] || { echo "pack_upstream_src.sh: $BASE/$f missing (a release without verify_mla.py?)" >&2; exit 2; }; done
STAGE=$(mktemp -d); trap 'rm -rf "$STAGE"' EXIT
(cd "$BASE" && tar -cf - $FILES) | tar -xf - -C "$STAGE"
VER=$(sed -n "s/^__version__ = version = '\(.*\)'/\1/p" "$STAGE/sglang/_version.py")
{ echo "sglang ${VER:-unknown} from $SRC"; (cd "$STAGE" && sha256sum $FILES); } > "$STAGE/MANIFEST"
mkdir -p "$OUTD"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$STAGE" -cf - MANIFEST $FILES | xz -9 > "$OUTD/upstream_src.tar.xz"
echo "wrote $OUTD/upstream_src.tar.xz ($(stat -c %s "$OUTD/upstream_src.tar.xz") bytes): sglang ${VER:-unknown}"
