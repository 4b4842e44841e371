/* hdf5_probe.c - device_check.sh's test of a carried HDF5 before the build links it: write a
 * small dataset, read it back, print the library's and the headers' versions. Exit 0 only if the
 * bytes came back. Usage: hdf5_probe FILE.h5 (with HDF5_DISABLE_VERSION_CHECK=2 when the two
 * versions differ, or HDF5 aborts at the first call). */
#include <hdf5.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    unsigned char w[6] = {1, 2, 3, 250, 251, 252}, r[6] = {0};
    hsize_t dims[2] = {2, 3};
    unsigned maj, min, rel;
    if (argc != 2) {
        fprintf(stderr, "usage: hdf5_probe FILE.h5\n");
        return 2;
    }
    hid_t f = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t d = f < 0 ? -1 : H5Dcreate2(f, "x", H5T_NATIVE_UINT8, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, w) < 0) {
        fprintf(stderr, "hdf5_probe: cannot write %s\n", argv[1]);
        return 1;
    }
    H5Dclose(d);
    H5Sclose(sp);
    H5Fclose(f);
    f = H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT);
    d = f < 0 ? -1 : H5Dopen2(f, "x", H5P_DEFAULT);
    if (d < 0 || H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, r) < 0) {
        fprintf(stderr, "hdf5_probe: cannot read %s back\n", argv[1]);
        return 1;
    }
    H5Dclose(d);
    H5Fclose(f);
    if (memcmp(r, w, sizeof w) != 0) {
        fprintf(stderr, "hdf5_probe: %s read back other bytes\n", argv[1]);
        return 1;
    }
    H5get_libversion(&maj, &min, &rel);
    printf("library %u.%u.%u, headers %d.%d.%d\n", maj, min, rel, H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE);
    return 0;
}
