#!/usr/bin/env bash
# hdf5_114.sh - a second HDF5, 1.14, for the test leg that builds act-engine against it
# (scripts/test.sh): Debian 13's source package, fetched with apt from the suite after this
# machine's own (bookworm gives 1.10, which the main build uses), built once into
# .deps/hdf5-1.14 (git-ignored; kept for later runs). Prints that folder on stdout.
#
# Why: robotics machines carry either HDF5: Ubuntu 22.04/24.04 and Debian 12 ship 1.10, Debian 13,
# Fedora, conda and the h5py wheels 1.14. The episode reader's chunk table is built differently in
# each (engine/episode_index.h), and 1.14's API maps several calls to new versions: both must
# compile and pass.
#
# Exit 0: built (or already there); 2: the source could not be fetched (no registry reachable):
# the caller reports the leg skipped; 1: fetched but did not build (a real failure).
# ACT_HDF5_SUITE (default trixie) picks the suite, ACT_DEPS_DIR (default .deps) the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${ACT_HDF5_SUITE:-trixie}
deps=${ACT_DEPS_DIR:-$PWD/.deps}
mkdir -p "$deps"
deps=$(cd "$deps" && pwd)
prefix=$deps/hdf5-1.14
if [ -f "$prefix/.built" ]; then   # written only after a whole install
    echo "$prefix"
    exit 0
fi
log() { echo "hdf5_114: $*" >&2; }

# the Debian mirror this machine's apt already uses (deb822 .sources or a one-line sources.list)
uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1 || true)
[ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
                       awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\//) { print $i; break }}' |
                       grep -v security | head -1 || true)
if [ -z "$uri" ]; then
    log "no Debian mirror in this machine's apt sources: cannot fetch HDF5 1.14's source"
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/sp" "$work/lists/partial" "$work/src"
cat > "$work/sp/hdf5-src.sources" <<EOF
Types: deb-src
URIs: $uri
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$work/sp"
          -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root -qq)
log "fetching Debian $suite's hdf5 source package"
if ! (cd "$work/src" && apt-get "${apt_opts[@]}" update >&2 &&
      apt-get "${apt_opts[@]}" source --download-only hdf5 >&2); then
    log "could not fetch the hdf5 source package from $suite"
    exit 2
fi
# from here on a failure is a real one (exit 1), never the skip above (exit 2)
trap 'exit 1' ERR
orig=$(ls "$work"/src/hdf5_1.14*.orig.tar.* 2>/dev/null | head -1 || true)
if [ -z "$orig" ]; then
    log "$suite's hdf5 source is not 1.14: $(ls "$work/src" | tr '\n' ' ')"
    exit 2
fi
log "building $(basename "$orig") into $prefix (1-2 minutes on 2 cores)"
tar -xf "$orig" -C "$work/src"
srcdir=$(ls -d "$work"/src/hdf5-1.14*/ | head -1)
rm -rf "$prefix"
(cd "$srcdir" &&
 ./configure --prefix="$prefix" --disable-fortran --disable-cxx --disable-hl --disable-tests \
     --disable-tools --disable-static --enable-build-mode=production --with-zlib >"$work/configure.log" 2>&1 &&
 make -j"$(nproc)" >"$work/make.log" 2>&1 && make install >"$work/install.log" 2>&1) || {
    log "the build failed; the last lines of its logs:"
    tail -20 "$work"/configure.log "$work"/make.log "$work"/install.log 2>/dev/null >&2 || true
    exit 1
}
touch "$prefix/.built"
echo "$prefix"
