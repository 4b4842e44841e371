#!/bin/sh
# translate.sh SRC.cu OUT.cc - a CUDA kernel file as C++ for the CUDA emulator: every launch
# `k<<<grid, block, smem, stream>>>(args)` becomes `emu_launch(k, grid, block, smem, stream)(args)`
# and `extern __shared__ T name[];` a pointer to the block's dynamic shared memory.
# `__shared__ T name[N];` inside a function (an indented line) is followed, on the same line, by
# emu_static_smem(&name, sizeof name), so the emulator counts static shared memory against the
# 48 KB a launch may have in all. Nothing else changes, and #line keeps compiler messages
# pointing at the original file.
set -eu
src=$1
out=$2
{
    printf '#line 1 "%s"\n' "$src"
    sed -e 's/\([A-Za-z_][A-Za-z0-9_]*\)<<</emu_launch(\1, /g' \
        -e 's/>>>(/)(/g' \
        -e 's/^\([ \t][ \t]*__shared__ [A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_] \([A-Za-z_][A-Za-z0-9_]*\)\(\[[^]]*\]\)*;\)/\1 emu_static_smem(\&\2, sizeof \2);/' \
        -e 's/extern __shared__ \([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_]\) \([A-Za-z_][A-Za-z0-9_]*\)\[\];/\1 *\2 = (\1 *)emu_dyn_smem();/' \
        "$src"
} > "$out.tmp"
if grep -n '<<<\|>>>\|extern __shared__' "$out.tmp" >&2; then
    echo "translate.sh: $src: a launch or shared declaration the emulator cannot rewrite (above)" >&2
    rm -f "$out.tmp"
    exit 1
fi
mv "$out.tmp" "$out"
