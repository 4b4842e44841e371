#!/usr/bin/env bash
# prepare_devdeps.sh - fill .devdeps/ (git-ignored) with what the GPU machine lacks, for
# device_check.sh to unpack there. Run it here, then call the device tool with carry [".devdeps"].
#   *.deb          Debian's OpenBLAS (the CPU oracle), zstd headers and libdeflate (gzip frames)
#   cudnn/include  cuDNN headers (the machine's cuDNN may come as a torch wheel without them)
#   hdf5/lib       HDF5 for the eval rows: the libraries of an h5py manylinux wheel (HDF5 1.14,
#                  built for glibc 2.17, needing only libz besides; Debian's libhdf5 would drag
#                  in libcurl and ~30 libraries more, built for this machine's glibc)
#   hdf5/include   this machine's HDF5 headers (1.10): the functions act-engine calls have the
#                  same signatures in 1.14; device_check.sh links a probe first and runs with
#                  HDF5_DISABLE_VERSION_CHECK=2, since the header and library versions differ
# Needs network (apt-get download, pip download) and libhdf5-dev (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
H5PY_VERSION=${ACT_DEVDEPS_H5PY:-3.14.0}
rm -rf .devdeps/hdf5
mkdir -p .devdeps/cudnn/include .devdeps/hdf5/lib .devdeps/hdf5/include
(cd .devdeps && apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev \
    libgfortran5 libzstd-dev libdeflate0 libdeflate-dev)
rm -f .devdeps/libhdf5*.deb .devdeps/libaec0*.deb .devdeps/libsz2*.deb .devdeps/libcurl3*.deb
cudnn_h=$(ls /usr/local/cuda/include/cudnn*.h /usr/include/cudnn*.h 2>/dev/null || true)
[ -n "$cudnn_h" ] && cp $cudnn_h .devdeps/cudnn/include/
h5inc=$(dirname "$(ls /usr/include/hdf5/serial/hdf5.h /usr/include/hdf5.h 2>/dev/null | head -1)")
if [ "$h5inc" = . ]; then
    echo "prepare_devdeps: no HDF5 headers here (apt install libhdf5-dev): the eval rows will be skipped" >&2
else
    cp "$h5inc"/*.h .devdeps/hdf5/include/
    whl=$(mktemp -d)
    if /usr/bin/python3 -m pip download --quiet "h5py==$H5PY_VERSION" --no-deps --only-binary=:all: \
            --python-version 3.12 --platform manylinux_2_17_x86_64 -d "$whl" &&
        /usr/bin/python3 - "$whl" .devdeps/hdf5/lib <<'EOF'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "h5py-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    libs = [n for n in z.namelist() if n.startswith("h5py.libs/") and ".so" in n]
    for n in libs:
        with open(os.path.join(sys.argv[2], os.path.basename(n)), "wb") as f:
            f.write(z.read(n))
print("prepare_devdeps: HDF5 libraries from %s: %s" % (os.path.basename(whl), " ".join(os.path.basename(n) for n in libs)))
EOF
    then :
    else echo "prepare_devdeps: could not fetch the h5py wheel: the eval rows will be skipped" >&2
         rm -rf .devdeps/hdf5
    fi
    rm -rf "$whl"
fi
du -sh .devdeps
